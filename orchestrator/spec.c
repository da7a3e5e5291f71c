/* spec.c - reads an experiment spec (spec.h) through the shape module's YAML tree and
 * checks every key and every swept value, so that errors point at their own line. */
#include "spec.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/fields.h"
#include "shape/file_read.h"
#include "shape/model_shape.h"
#include "shape/run_config.h"
#include "spec_emit.h"
#include "spec_set.h"

/* A spec sweeping more keys than this is surely a mistake; it also bounds point sizes. */
#define SPEC_MAX_KEYS 256

static const char *const top_keys[] = {
    "name", "trainer", "base", "resources", "matrix", "zip", "include", "exclude",
    "where", "repeat", "retries", "after", "max_points", "auto", NULL,
};

/* Scalar resources keys (those a point may override) and the list ones. */
static const char *const resource_int_keys[] = {
    "nodes", "gpus_per_node", "cpus_per_task", "max_concurrent", NULL,
};
static const char *const resource_str_keys[] = {
    "time", "partition", "account", "qos", "constraint", NULL,
};
static const char *const resource_list_keys[] = { "setup", "sbatch", NULL };
/* Boolean resources keys: the spec's own, not swept by a point (like the lists). */
static const char *const resource_bool_keys[] = { "retry_timeout", NULL };
/* Integer resources keys of the spec's own, not swept by a point. */
static const char *const resource_spec_int_keys[] = { "pack", NULL };
/* Numeric resources keys of the spec's own: GiB per GPU (rule fits_gpu_mem). */
static const char *const resource_spec_num_keys[] = { "gpu_mem", NULL };

typedef struct {
    spec *s;
    const char *text;      /* the file's text, to locate the `where` expression */
    size_t len;
    hearth_err *err;
} reader;

static int in_list(const char *const *list, const char *key)
{
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], key) == 0)
            return 1;
    return 0;
}

static int fail(reader *r, int line, int col, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* "FILE:LINE:COL: KEY: what", or "--set KEY: what" where an override wrote the node
 * (KEY once when the override's key ends with it: "--set matrix.train.lr: expected ..."). */
static int fail(reader *r, int line, int col, const char *key, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (line < 0 && -line <= r->s->n_sets) {
        const char *sk = r->s->set_keys[-line - 1];
        size_t ls = strlen(sk), lk = strlen(key);
        int same = strcmp(sk, key) == 0 ||
                   (ls > lk && sk[ls - lk - 1] == '.' && strcmp(sk + ls - lk, key) == 0);
        if (same)
            return herr_set(r->err, HERR_CONFIG, "--set %s: %s", sk, what);
        return herr_set(r->err, HERR_CONFIG, "--set %s: %s: %s", sk, key, what);
    }
    if (line > 0)
        return herr_set(r->err, HERR_CONFIG, "%s:%d:%d: %s: %s", r->s->file, line, col, key,
                        what);
    return herr_set(r->err, HERR_CONFIG, "%s: %s: %s", r->s->file, key, what);
}

static int nomem(reader *r)
{
    return herr_set(r->err, HERR_NOMEM, "%s: out of memory", r->s->file);
}

/* Keeps a malloc'd string for the spec's lifetime. */
static const char *own(reader *r, char *str)
{
    spec *s = r->s;
    if (!str)
        return NULL;
    if (s->n_owned == s->cap_owned) {
        int cap = s->cap_owned ? 2 * s->cap_owned : 16;
        char **grown = realloc(s->owned, (size_t)cap * sizeof *grown);
        if (!grown) {
            free(str);
            return NULL;
        }
        s->owned = grown;
        s->cap_owned = cap;
    }
    s->owned[s->n_owned++] = str;
    return str;
}

/* Slurm time limits ------------------------------------------------------------------ */

static int parse_uint(const char **p, int64_t *v)
{
    if (!isdigit((unsigned char)**p))
        return -1;
    *v = 0;
    while (isdigit((unsigned char)**p)) {
        *v = *v * 10 + (**p - '0');
        if (*v > 100000000)
            return -1;
        (*p)++;
    }
    return 0;
}

int spec_time_seconds(const char *text, int64_t *seconds)
{
    /* MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS */
    const char *p = text;
    int64_t part[3], days = 0;
    int n = 0, has_days = 0;
    if (!p || !*p)
        return -1;
    if (strchr(p, '-')) {
        if (parse_uint(&p, &days) || *p != '-')
            return -1;
        p++;
        has_days = 1;
    }
    for (;;) {
        if (n == 3 || parse_uint(&p, &part[n]))
            return -1;
        n++;
        if (*p == '\0')
            break;
        if (*p != ':')
            return -1;
        p++;
    }
    int64_t s;
    if (has_days) {   /* D-HH[:MM[:SS]] */
        int64_t h = part[0], m = n > 1 ? part[1] : 0, sec = n > 2 ? part[2] : 0;
        s = ((days * 24 + h) * 60 + m) * 60 + sec;
    } else if (n == 1) {
        s = part[0] * 60;                          /* MM */
    } else if (n == 2) {
        s = part[0] * 60 + part[1];                /* MM:SS */
    } else {
        s = (part[0] * 60 + part[1]) * 60 + part[2];   /* HH:MM:SS */
    }
    if (s <= 0)
        return -1;
    if (seconds)
        *seconds = s;
    return 0;
}

/* Keys --------------------------------------------------------------------------------- */

int spec_key_is_resource(const char *key)
{
    if (strncmp(key, "resources.", 10) != 0)
        return 0;
    return in_list(resource_int_keys, key + 10) || in_list(resource_str_keys, key + 10);
}

/* Is `key` a leaf run-config key?  Sets *model_row / *config_row to the table row. */
static int run_key_row(const char *key, int *config_row, int *model_row)
{
    int n;
    *config_row = *model_row = -1;
    if (strcmp(key, "model") == 0 || strcmp(key, "model.preset") == 0)
        return 1;
    if (strncmp(key, "model.", 6) == 0) {
        const field_desc *t = model_fields(&n);
        *model_row = field_find(t, n, key + 6);
        return *model_row >= 0;
    }
    const field_desc *t = config_fields(&n);
    *config_row = field_find(t, n, key);
    return *config_row >= 0;
}

void spec_key_suggest(field_suggestion *sg, const char *key)
{
    int n;
    char buf[192];
    const field_desc *t = config_fields(&n);
    for (int i = 0; i < n; i++)
        field_suggest_add(sg, key, t[i].key);
    t = model_fields(&n);
    for (int i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "model.%s", t[i].key);
        field_suggest_add(sg, key, buf);
    }
    field_suggest_add(sg, key, "model");
    for (int i = 0; resource_int_keys[i]; i++) {
        snprintf(buf, sizeof buf, "resources.%s", resource_int_keys[i]);
        field_suggest_add(sg, key, buf);
    }
    for (int i = 0; resource_str_keys[i]; i++) {
        snprintf(buf, sizeof buf, "resources.%s", resource_str_keys[i]);
        field_suggest_add(sg, key, buf);
    }
}

int spec_key_known(const char *key, char *hint, size_t hint_size)
{
    int cr, mr;
    if (hint_size)
        hint[0] = '\0';
    if (spec_key_is_resource(key) || run_key_row(key, &cr, &mr))
        return 1;
    if (hint_size) {
        field_suggestion sg;
        field_suggest_init(&sg);
        spec_key_suggest(&sg, key);
        const char *best = field_suggest_result(&sg, key);
        if (best)
            snprintf(hint, hint_size, " (did you mean '%s'?)", best);
    }
    return 0;
}

/* "model.preset" and "model" name one key; points use "model". */
static const char *canon_key(const char *key)
{
    return strcmp(key, "model.preset") == 0 ? "model" : key;
}

static int check_key(reader *r, const char *where, const char *key, int line, int col)
{
    char hint[200];
    if (spec_key_known(key, hint, sizeof hint))
        return 0;
    if (strncmp(key, "resources.", 10) == 0 && in_list(resource_list_keys, key + 10))
        return fail(r, line, col, key, "%s cannot be swept (set it under resources)", where);
    int cr, mr;
    int n_rows;
    const field_desc *rows = config_fields(&n_rows);
    if (strncmp(key, "model.", 6) == 0 || run_key_row(key, &cr, &mr) ||
        field_is_section(rows, n_rows, key))
        return fail(r, line, col, key, "not a run-config value key in %s%s", where, hint);
    return fail(r, line, col, key, "unknown key in %s%s", where, hint);
}

/* Values ------------------------------------------------------------------------------- */

/* Flow text of a list value, "[16, 24, 24]" (nested lists too). */
static int flow_text(const yaml_tree_node *n, char **buf, size_t *len, size_t *cap)
{
    const char *piece;
    char tmp[2] = {0, 0};
    if (n->kind == YAML_TREE_SEQ) {
        tmp[0] = '[';
        if (flow_text(&(yaml_tree_node){.kind = YAML_TREE_SCALAR, .text = tmp}, buf, len, cap))
            return -1;
        for (int i = 0; i < n->n_items; i++) {
            if (i && flow_text(&(yaml_tree_node){.kind = YAML_TREE_SCALAR, .text = ", "}, buf,
                               len, cap))
                return -1;
            if (flow_text(n->items[i], buf, len, cap))
                return -1;
        }
        tmp[0] = ']';
        return flow_text(&(yaml_tree_node){.kind = YAML_TREE_SCALAR, .text = tmp}, buf, len,
                         cap);
    }
    if (n->kind == YAML_TREE_MAP)
        piece = "{...}";
    else
        piece = n->text ? n->text : "";
    size_t add = strlen(piece);
    if (*len + add + 1 > *cap) {
        size_t c = (*cap ? *cap : 32);
        while (c < *len + add + 1)
            c *= 2;
        char *grown = realloc(*buf, c);
        if (!grown)
            return -1;
        *buf = grown;
        *cap = c;
    }
    memcpy(*buf + *len, piece, add + 1);
    *len += add;
    return 0;
}

void spec_value_typed(const yaml_tree_node *n, const char *text, const char *key,
                      expr_value *out)
{
    memset(out, 0, sizeof *out);
    out->type = EXPR_V_STR;
    out->str = text ? text : "";
    if (!n || n->kind != YAML_TREE_SCALAR)
        return;
    expr_vtype want = key ? spec_key_type(key) : EXPR_V_NULL;
    if (want == EXPR_V_STR || n->quoted)
        return;
    double d;
    if (yaml_tree_is_null(n)) {
        out->type = EXPR_V_NULL;
    } else if (yaml_tree_as_bool(n, &out->boolean)) {
        out->type = EXPR_V_BOOL;
    } else if (yaml_tree_as_double(n, &d) == 1) {
        out->type = EXPR_V_NUM;
        out->num = d;
    }
}

/* `auto` values that the orchestrator resolves from the results database at plan time
 * (docs/select.md): the run config itself does not accept them, so the node is given the
 * key's default as a placeholder (what the shape module reads) while the spec value keeps
 * its text "auto" (what plan's hook and expressions see). */
static const struct { const char *key; const char *placeholder; unsigned bit; } auto_keys[] = {
    { "parallel.encoder.strategy", "uniform", SPEC_AUTO_ENCODER },
    { "precision.fp8", "off", SPEC_AUTO_FP8 },
};

/* The SPEC_AUTO_* bit when `n` is an unquoted `auto` of a key resolved at plan time. */
static unsigned auto_bit(const char *key, const yaml_tree_node *n)
{
    if (!n || n->kind != YAML_TREE_SCALAR || n->quoted || strcmp(n->text, "auto") != 0)
        return 0;
    for (size_t i = 0; i < sizeof auto_keys / sizeof auto_keys[0]; i++)
        if (strcmp(key, auto_keys[i].key) == 0)
            return auto_keys[i].bit;
    return 0;
}

/* Gives an `auto` node its placeholder; the original text stays alive (owned), since a
 * spec value may point at it. */
static int claim_auto(reader *r, unsigned bit, const yaml_tree_node *cn)
{
    yaml_tree_node *n = (yaml_tree_node *)cn;   /* the spec owns its tree */
    const char *ph = NULL;
    for (size_t i = 0; i < sizeof auto_keys / sizeof auto_keys[0]; i++)
        if (auto_keys[i].bit == bit)
            ph = auto_keys[i].placeholder;
    char *copy = strdup(ph), *orig = n->text;
    if (!copy)
        return nomem(r);
    n->text = copy;
    n->len = strlen(copy);
    if (!own(r, orig))   /* own freed it: the spec is being abandoned anyway */
        return nomem(r);
    r->s->any_auto |= bit;
    return 0;
}

/* `auto` in base: nested (parallel: {encoder: {strategy: auto}}) or a dotted key. */
static int claim_base_auto(reader *r, const yaml_tree_node *base)
{
    for (size_t i = 0; i < sizeof auto_keys / sizeof auto_keys[0]; i++) {
        const char *key = auto_keys[i].key;
        const yaml_tree_node *n = yaml_tree_get(base, key), *m = base;
        const char *p = key;
        while (!n && m) {
            char part[64];
            size_t len = strcspn(p, ".");
            snprintf(part, sizeof part, "%.*s", (int)len, p);
            const yaml_tree_node *next = yaml_tree_get(m, part);
            if (!p[len]) {
                n = next;
                break;
            }
            m = next;
            p += len + 1;
        }
        unsigned bit = auto_bit(key, n);
        if (bit) {
            int rc = claim_auto(r, bit, n);
            if (rc)
                return rc;
            r->s->base_auto |= bit;
        }
    }
    return 0;
}

/* Types are worked out once here: a sweep reads them for every point. */
static int make_value(reader *r, const char *key, const yaml_tree_node *n, spec_value *v)
{
    v->node = n;
    if (n->kind == YAML_TREE_SCALAR) {
        v->text = n->text ? n->text : "";
    } else {
        char *buf = NULL;
        size_t len = 0, cap = 0;
        if (flow_text(n, &buf, &len, &cap)) {
            free(buf);
            return nomem(r);
        }
        if (!own(r, buf))   /* own freed it */
            return nomem(r);
        v->text = buf;
    }
    spec_value_typed(n, v->text, key, &v->typed);
    unsigned bit = auto_bit(key, n);
    return bit ? claim_auto(r, bit, n) : 0;
}

static int is_list_type(const field_desc *f)
{
    return f->type == FT_INT3 || f->type == FT_INTLIST;
}

/* Type-checks one value of `key` against its row by reading it into a scratch struct,
 * which gives the shape module's own message ("expected an integer, got ..."). */
static int check_value(reader *r, const char *where, const char *key, const yaml_tree_node *n)
{
    char got[96];
    if (auto_bit(key, n))
        return 0;
    if (spec_key_is_resource(key)) {
        const char *rk = key + 10;
        if (in_list(resource_int_keys, rk)) {
            int64_t v;
            int min = strcmp(rk, "max_concurrent") == 0 ? 0 : 1;
            if (yaml_tree_as_int(n, &v) != 1 || v < min || v > 1000000) {
                yaml_tree_describe(n, got, sizeof got);
                return fail(r, n->line, n->col, key, "expected an integer >= %d, got %s", min,
                            got);
            }
            return 0;
        }
        if (n->kind != YAML_TREE_SCALAR || yaml_tree_is_null(n) || strlen(n->text) != n->len) {
            yaml_tree_describe(n, got, sizeof got);
            return fail(r, n->line, n->col, key, "expected a string, got %s", got);
        }
        if (strcmp(rk, "time") == 0 && spec_time_seconds(n->text, NULL) < 0)
            return fail(r, n->line, n->col, key,
                        "expected a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                        "D-HH:MM:SS), got \"%s\"", n->text);
        return 0;
    }
    if (strcmp(key, "model") == 0) {
        if (n->kind != YAML_TREE_SCALAR || yaml_tree_is_null(n) || strlen(n->text) != n->len ||
            n->len >= sizeof(((run_config *)0)->model_preset)) {
            yaml_tree_describe(n, got, sizeof got);
            return fail(r, n->line, n->col, key, "expected a preset name or path, got %s", got);
        }
        return 0;
    }
    int cr, mr, rows;
    run_key_row(key, &cr, &mr);
    const field_desc *t = cr >= 0 ? config_fields(&rows) : model_fields(&rows);
    int row = cr >= 0 ? cr : mr;
    /* Scratch space: the struct the table describes (the larger of the two). */
    union {
        run_config rc;
        model_shape ms;
    } *scratch = calloc(1, sizeof *scratch);
    if (!scratch)
        return nomem(r);
    field_state *st = malloc(sizeof *st);
    if (!st) {
        free(scratch);
        return nomem(r);
    }
    field_state_init(st, t, rows, scratch);
    field_src src;
    spec_node_src(r->s, n, key, &src);
    int rc = field_apply(st, row, n, &src, r->err);
    free(st);
    free(scratch);
    if (rc && is_list_type(&t[row]) && n->kind == YAML_TREE_SCALAR && where &&
        strcmp(where, "matrix") == 0) {
        char hint[] = " (each matrix value of a list key is a list: write [[a, b, c], ...])";
        size_t used = strlen(r->err->msg);
        if (used + sizeof hint < sizeof r->err->msg)
            memcpy(r->err->msg + used, hint, sizeof hint);
    }
    return rc;
}

/* Sections ----------------------------------------------------------------------------- */

static int expect_kind(reader *r, const char *key, const yaml_tree_node *n,
                       yaml_tree_kind kind, const char *what)
{
    if (n && n->kind == kind)
        return 0;
    char got[96];
    yaml_tree_describe(n, got, sizeof got);
    int line = n ? n->line : 0, col = n ? n->col : 0;
    return fail(r, line, col, key, "expected %s, got %s", what, got);
}

static int read_string(reader *r, const yaml_tree_pair *p, const char **out)
{
    const yaml_tree_node *n = p->value;
    if (!n || n->kind != YAML_TREE_SCALAR || yaml_tree_is_null(n) || strlen(n->text) != n->len) {
        char got[96];
        yaml_tree_describe(n, got, sizeof got);
        return fail(r, n ? n->line : p->line, n ? n->col : p->col, p->key,
                    "expected a string, got %s", got);
    }
    *out = n->text;
    return 0;
}

static int read_int(reader *r, const yaml_tree_pair *p, int64_t min, int64_t max, int64_t *out)
{
    const yaml_tree_node *n = p->value;
    int64_t v;
    if (!n || yaml_tree_as_int(n, &v) != 1 || v < min || v > max) {
        char got[96];
        yaml_tree_describe(n, got, sizeof got);
        return fail(r, n ? n->line : p->line, n ? n->col : p->col, p->key,
                    "expected an integer between %lld and %lld, got %s", (long long)min,
                    (long long)max, got);
    }
    *out = v;
    return 0;
}

/* Experiment names become run ids and directory names: keep them plain. */
static int check_name(reader *r, const char *key, const yaml_tree_node *n, const char *name)
{
    size_t len = strlen(name);
    int ok = len > 0 && len <= 64 && isalnum((unsigned char)name[0]);
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum((unsigned char)name[i]) || name[i] == '-' || name[i] == '_' ||
             name[i] == '.';
    if (!ok)
        return fail(r, n->line, n->col, key,
                    "must be 1 to 64 letters, digits, '-', '_' or '.', starting with a letter "
                    "or digit, got \"%.40s\"", name);
    return 0;
}

static int read_resources(reader *r, const yaml_tree_node *map)
{
    spec_resources *res = &r->s->resources;
    int rc;
    if (yaml_tree_is_null(map))
        return 0;
    if ((rc = expect_kind(r, "resources", map, YAML_TREE_MAP, "a mapping")))
        return rc;
    for (int i = 0; i < map->n_pairs; i++) {
        const yaml_tree_pair *p = &map->pairs[i];
        char key[200];
        snprintf(key, sizeof key, "resources.%s", p->key);
        if (in_list(resource_list_keys, p->key)) {
            const yaml_tree_node *n = p->value;
            if ((rc = expect_kind(r, key, n, YAML_TREE_SEQ, "a list of strings")))
                return rc;
            const char **items = calloc((size_t)n->n_items + 1, sizeof *items);
            if (!items || !own(r, (char *)items))   /* own freed it */
                return nomem(r);
            for (int k = 0; k < n->n_items; k++) {
                const yaml_tree_node *it = n->items[k];
                if (!it || it->kind != YAML_TREE_SCALAR || yaml_tree_is_null(it) ||
                    strlen(it->text) != it->len) {
                    char got[96];
                    yaml_tree_describe(it, got, sizeof got);
                    return fail(r, it ? it->line : n->line, it ? it->col : n->col, key,
                                "expected a string, got %s", got);
                }
                items[k] = it->text;
            }
            if (strcmp(p->key, "setup") == 0) {
                res->setup = items;
                res->n_setup = n->n_items;
            } else {
                res->sbatch = items;
                res->n_sbatch = n->n_items;
            }
            continue;
        }
        if (in_list(resource_bool_keys, p->key)) {
            int b = 0;
            if (yaml_tree_as_bool(p->value, &b) != 1) {
                char got[96];
                yaml_tree_describe(p->value, got, sizeof got);
                return fail(r, p->value->line, p->value->col, key,
                            "expected true or false, got %s", got);
            }
            res->retry_timeout = b;
            continue;
        }
        if (in_list(resource_spec_int_keys, p->key)) {
            int64_t v;
            if (yaml_tree_as_int(p->value, &v) != 1 || v < 1 || v > 1000000) {
                char got[96];
                yaml_tree_describe(p->value, got, sizeof got);
                return fail(r, p->value->line, p->value->col, key,
                            "expected an integer >= 1, got %s", got);
            }
            res->pack = v;
            continue;
        }
        if (in_list(resource_spec_num_keys, p->key)) {
            double v;
            if (yaml_tree_as_double(p->value, &v) != 1 || !(v > 0) || v > 1e9) {
                char got[96];
                yaml_tree_describe(p->value, got, sizeof got);
                return fail(r, p->value->line, p->value->col, key,
                            "expected a number of GiB > 0, got %s", got);
            }
            res->gpu_mem = v;
            continue;
        }
        if (!spec_key_is_resource(key)) {
            field_suggestion sg;
            field_suggest_init(&sg);
            for (int k = 0; resource_int_keys[k]; k++)
                field_suggest_add(&sg, p->key, resource_int_keys[k]);
            for (int k = 0; resource_str_keys[k]; k++)
                field_suggest_add(&sg, p->key, resource_str_keys[k]);
            for (int k = 0; resource_list_keys[k]; k++)
                field_suggest_add(&sg, p->key, resource_list_keys[k]);
            for (int k = 0; resource_bool_keys[k]; k++)
                field_suggest_add(&sg, p->key, resource_bool_keys[k]);
            for (int k = 0; resource_spec_int_keys[k]; k++)
                field_suggest_add(&sg, p->key, resource_spec_int_keys[k]);
            for (int k = 0; resource_spec_num_keys[k]; k++)
                field_suggest_add(&sg, p->key, resource_spec_num_keys[k]);
            const char *best = field_suggest_result(&sg, p->key);
            char hint[200] = "";
            if (best)
                snprintf(hint, sizeof hint, " (did you mean 'resources.%s'?)", best);
            return fail(r, p->line, p->col, key, "unknown key%s", hint);
        }
        if ((rc = check_value(r, NULL, key, p->value)))
            return rc;
        const char *k = p->key;
        int64_t v = 0;
        if (in_list(resource_int_keys, k))
            yaml_tree_as_int(p->value, &v);
        if (strcmp(k, "nodes") == 0) res->nodes = v;
        else if (strcmp(k, "gpus_per_node") == 0) res->gpus_per_node = v;
        else if (strcmp(k, "cpus_per_task") == 0) res->cpus_per_task = v;
        else if (strcmp(k, "max_concurrent") == 0) res->max_concurrent = v;
        else if (strcmp(k, "time") == 0) res->time = p->value->text;
        else if (strcmp(k, "partition") == 0) res->partition = p->value->text;
        else if (strcmp(k, "account") == 0) res->account = p->value->text;
        else if (strcmp(k, "qos") == 0) res->qos = p->value->text;
        else if (strcmp(k, "constraint") == 0) res->constraint = p->value->text;
    }
    return 0;
}

/* Where a key is already swept, for "also swept at" messages. */
static const spec_axis *find_swept(const spec *s, const char *key)
{
    for (int i = 0; i < s->n_matrix; i++)
        if (s->matrix[i].key && strcmp(s->matrix[i].key, key) == 0)
            return &s->matrix[i];
    for (int g = 0; g < s->n_zip; g++)
        for (int i = 0; i < s->zip[g].n_axes; i++)
            if (s->zip[g].axes[i].key && strcmp(s->zip[g].axes[i].key, key) == 0)
                return &s->zip[g].axes[i];
    return NULL;
}

static int count_swept(const spec *s)
{
    int n = s->n_matrix;
    for (int g = 0; g < s->n_zip; g++)
        n += s->zip[g].n_axes;
    return n;
}

/* Reads `key: [values]` into an axis. */
static int read_axis(reader *r, const char *where, const yaml_tree_pair *p, spec_axis *ax)
{
    int rc;
    const char *key = canon_key(p->key);
    if ((rc = check_key(r, where, p->key, p->line, p->col)))
        return rc;
    const spec_axis *dup = find_swept(r->s, key);
    if (dup && dup->line < 0) {
        char at[300];
        spec_position_format(r->s, dup->line, dup->col, at, sizeof at);
        return fail(r, p->line, p->col, p->key, "already swept by %s", at);
    }
    if (dup)
        return fail(r, p->line, p->col, p->key, "already swept at line %d", dup->line);
    if (count_swept(r->s) >= SPEC_MAX_KEYS)
        return fail(r, p->line, p->col, p->key, "more than %d swept keys", SPEC_MAX_KEYS);
    const yaml_tree_node *n = p->value;
    if (!n || n->kind != YAML_TREE_SEQ || n->n_items == 0) {
        char got[96];
        yaml_tree_describe(n, got, sizeof got);
        if (n && n->kind == YAML_TREE_SEQ)
            snprintf(got, sizeof got, "an empty list");
        return fail(r, n ? n->line : p->line, n ? n->col : p->col, p->key,
                    "expected a non-empty list of values in %s, got %s", where, got);
    }
    ax->key = key;
    ax->line = p->line;
    ax->col = p->col;
    ax->values = calloc((size_t)n->n_items, sizeof *ax->values);
    if (!ax->values)
        return nomem(r);
    ax->n_values = n->n_items;   /* the caller has counted the axis: spec_free frees it */
    for (int i = 0; i < n->n_items; i++) {
        if ((rc = check_value(r, where, key, n->items[i])))
            return rc;
        if ((rc = make_value(r, key, n->items[i], &ax->values[i])))
            return rc;
    }
    return 0;
}

static int read_matrix(reader *r, const yaml_tree_node *map)
{
    int rc;
    spec *s = r->s;
    if ((rc = expect_kind(r, "matrix", map, YAML_TREE_MAP, "a mapping of dotted keys to lists")))
        return rc;
    s->matrix = calloc((size_t)map->n_pairs + 1, sizeof *s->matrix);
    if (!s->matrix)
        return nomem(r);
    for (int i = 0; i < map->n_pairs; i++) {
        spec_axis *ax = &s->matrix[s->n_matrix++];
        if ((rc = read_axis(r, "matrix", &map->pairs[i], ax)))
            return rc;
    }
    return 0;
}

static int read_zip(reader *r, const yaml_tree_node *seq)
{
    int rc;
    spec *s = r->s;
    if ((rc = expect_kind(r, "zip", seq, YAML_TREE_SEQ, "a list of mappings")))
        return rc;
    s->zip = calloc((size_t)seq->n_items + 1, sizeof *s->zip);
    if (!s->zip)
        return nomem(r);
    for (int g = 0; g < seq->n_items; g++) {
        const yaml_tree_node *map = seq->items[g];
        char where[32];
        snprintf(where, sizeof where, "zip[%d]", g);
        if ((rc = expect_kind(r, where, map, YAML_TREE_MAP, "a mapping of dotted keys to lists")))
            return rc;
        if (map->n_pairs == 0)
            return fail(r, map->line, map->col, where, "expected at least one key");
        spec_zip *z = &s->zip[s->n_zip++];
        z->line = map->line;
        z->col = map->col;
        z->axes = calloc((size_t)map->n_pairs, sizeof *z->axes);
        if (!z->axes)
            return nomem(r);
        for (int i = 0; i < map->n_pairs; i++) {
            const yaml_tree_pair *p = &map->pairs[i];
            spec_axis *slot = &z->axes[z->n_axes++];
            if ((rc = read_axis(r, "zip", p, slot)))
                return rc;
            const spec_axis *first = &z->axes[0], *ax = &z->axes[i];
            if (ax->n_values != first->n_values)
                return fail(r, ax->line, ax->col, where,
                            "%s has %d values but %s has %d; the lists of a zip group must "
                            "have equal lengths", ax->key, ax->n_values, first->key,
                            first->n_values);
        }
    }
    return 0;
}

static int read_entries(reader *r, const char *what, const yaml_tree_node *seq,
                        spec_entry **out, int *n_out)
{
    int rc;
    if ((rc = expect_kind(r, what, seq, YAML_TREE_SEQ, "a list of mappings")))
        return rc;
    *out = calloc((size_t)seq->n_items + 1, sizeof **out);
    if (!*out)
        return nomem(r);
    for (int e = 0; e < seq->n_items; e++) {
        const yaml_tree_node *map = seq->items[e];
        char where[32];
        snprintf(where, sizeof where, "%s[%d]", what, e);
        if ((rc = expect_kind(r, where, map, YAML_TREE_MAP, "a mapping of dotted keys to values")))
            return rc;
        if (map->n_pairs == 0)
            return fail(r, map->line, map->col, where, "expected at least one key");
        if (map->n_pairs > SPEC_MAX_KEYS)
            return fail(r, map->line, map->col, where, "more than %d keys", SPEC_MAX_KEYS);
        spec_entry *en = &(*out)[(*n_out)++];
        en->line = map->line;
        en->col = map->col;
        en->settings = calloc((size_t)map->n_pairs, sizeof *en->settings);
        if (!en->settings)
            return nomem(r);
        for (int i = 0; i < map->n_pairs; i++) {
            const yaml_tree_pair *p = &map->pairs[i];
            if ((rc = check_key(r, what, p->key, p->line, p->col)))
                return rc;
            const char *key = canon_key(p->key);
            for (int k = 0; k < en->n; k++)
                if (strcmp(en->settings[k].key, key) == 0)
                    return fail(r, p->line, p->col, p->key, "given twice in %s", where);
            if ((rc = check_value(r, what, key, p->value)))
                return rc;
            spec_setting *st = &en->settings[en->n];
            st->key = key;
            st->line = p->line;
            st->col = p->col;
            if ((rc = make_value(r, key, p->value, &st->value)))
                return rc;
            en->n++;
        }
    }
    return 0;
}

/* Finds the byte offset of 1-based (line, col) in the text, or len. */
static size_t offset_of(const char *text, size_t len, int line, int col)
{
    size_t off = 0;
    for (int l = 1; l < line && off < len; off++)
        if (text[off] == '\n')
            l++;
    off += (size_t)(col - 1);
    return off < len ? off : len;
}

/* Works out where the expression's first character is in the file: after the quote of a
 * quoted scalar, on the first content line of a block scalar, or the node itself. */
static void locate_where(reader *r, const yaml_tree_node *n)
{
    spec *s = r->s;
    s->where_line = n->line;
    s->where_col = n->col;
    if (!r->text || n->line <= 0)   /* an override's: no place in the file */
        return;
    size_t off = offset_of(r->text, r->len, n->line, n->col);
    char c = off < r->len ? r->text[off] : '\0';
    if (c == '"' || c == '\'') {
        s->where_col = n->col + 1;
    } else if (c == '|' || c == '>') {
        /* block scalar: the first non-blank line after the indicator */
        size_t o = off;
        int line = n->line;
        while (o < r->len && r->text[o] != '\n')
            o++;
        while (o < r->len) {
            o++;
            line++;
            size_t start = o;
            while (o < r->len && r->text[o] == ' ')
                o++;
            if (o < r->len && r->text[o] != '\n') {
                s->where_line = line;
                s->where_col = (int)(o - start) + 1;
                break;
            }
        }
    }
}

void spec_where_position(const spec *s, int expr_col, int *line, int *col)
{
    *line = s->where_line;
    *col = s->where_col;
    if (!s->where_src || expr_col < 1 || s->where_line <= 0)
        return;
    /* lines of a literal block scalar map one to one onto lines of the file */
    int l = 0, c = 0;
    for (int i = 0; i < expr_col - 1 && s->where_src[i]; i++) {
        if (s->where_src[i] == '\n') {
            l++;
            c = 0;
        } else {
            c++;
        }
    }
    *line = s->where_line + l;
    *col = s->where_col + c;
}

typedef struct {
    reader *r;
    int rc;
} where_key_ctx;

static int where_key_check(void *ctx, const char *key, int col)
{
    where_key_ctx *w = ctx;
    char hint[200];
    if (spec_key_known(key, hint, sizeof hint))
        return 0;
    int line, fcol;
    spec_where_position(w->r->s, col, &line, &fcol);
    w->rc = fail(w->r, line, fcol, "where", "unknown key '%s'%s", key, hint);
    return 1;
}

expr_vtype spec_key_type(const char *key)
{
    if (spec_key_is_resource(key))
        return in_list(resource_int_keys, key + 10) ? EXPR_V_NUM : EXPR_V_STR;
    int cr, mr, n;
    if (!run_key_row(key, &cr, &mr))
        return EXPR_V_NULL;
    if (cr < 0 && mr < 0)
        return EXPR_V_STR;   /* model */
    const field_desc *t = cr >= 0 ? config_fields(&n) : model_fields(&n);
    switch (t[cr >= 0 ? cr : mr].type) {
    case FT_INT: case FT_I64: case FT_DOUBLE: case FT_FLOAT:
        return EXPR_V_NUM;
    case FT_BOOL: case FT_BIAS_ALL:
        return EXPR_V_BOOL;
    default:
        return EXPR_V_STR;   /* enums, strings, lists (as their flow text) */
    }
}

static expr_vtype key_type(void *ctx, const char *key)
{
    (void)ctx;
    return spec_key_type(key);
}

/* A number in [lo, hi] at KEY (p's value). */
static int read_number(reader *r, const char *key, const yaml_tree_pair *p, double lo,
                       double hi, double *out)
{
    if (yaml_tree_as_double(p->value, out) != 1 || !(*out >= lo && *out <= hi)) {
        char got[96];
        yaml_tree_describe(p->value, got, sizeof got);
        return fail(r, p->value->line, p->value->col, key, "expected a number in [%g, %g], "
                    "got %s", lo, hi, got);
    }
    return 0;
}

/* One key of auto.fp8 (`name`: threshold or max_err) with its value in q. */
static int read_auto_fp8(reader *r, const char *name, const yaml_tree_pair *q)
{
    static const char *const fp8_keys[] = { "threshold", "max_err", NULL };
    char fk[300];
    snprintf(fk, sizeof fk, "auto.fp8.%s", name);
    if (!in_list(fp8_keys, name)) {
        field_suggestion sg;
        field_suggest_init(&sg);
        for (int j = 0; fp8_keys[j]; j++)
            field_suggest_add(&sg, name, fp8_keys[j]);
        const char *best = field_suggest_result(&sg, name);
        char hint[120] = "";
        if (best)
            snprintf(hint, sizeof hint, " (did you mean 'auto.fp8.%s'?)", best);
        return fail(r, q->line, q->col, fk, "unknown key%s", hint);
    }
    if (strcmp(name, "threshold") == 0)
        return read_number(r, fk, q, 1.0, 1000.0, &r->s->fp8_threshold);
    return read_number(r, fk, q, 0.0, 1.0, &r->s->fp8_max_err);
}

/* auto: how `auto` values resolve (docs/select.md); today auto.fp8.threshold and
 * auto.fp8.max_err, nested or dotted (`fp8.threshold: 1.1`, what --set writes). */
static int read_auto(reader *r, const yaml_tree_node *map)
{
    int rc;
    if (yaml_tree_is_null(map))
        return 0;
    if ((rc = expect_kind(r, "auto", map, YAML_TREE_MAP, "a mapping (auto.fp8: ...)")))
        return rc;
    for (int i = 0; i < map->n_pairs; i++) {
        const yaml_tree_pair *p = &map->pairs[i];
        char key[200];
        snprintf(key, sizeof key, "auto.%s", p->key);
        if (strncmp(p->key, "fp8.", 4) == 0) {
            if ((rc = read_auto_fp8(r, p->key + 4, p)))
                return rc;
            continue;
        }
        if (strcmp(p->key, "fp8") != 0)
            return fail(r, p->line, p->col, key, "unknown key (auto has fp8)");
        const yaml_tree_node *f = p->value;
        if (yaml_tree_is_null(f))
            continue;
        if ((rc = expect_kind(r, key, f, YAML_TREE_MAP, "a mapping (threshold, max_err)")))
            return rc;
        for (int k = 0; k < f->n_pairs; k++)
            if ((rc = read_auto_fp8(r, f->pairs[k].key, &f->pairs[k])))
                return rc;
    }
    return 0;
}

static int read_where(reader *r, const yaml_tree_node *n)
{
    spec *s = r->s;
    int rc;
    if (!n || n->kind != YAML_TREE_SCALAR || yaml_tree_is_null(n) || strlen(n->text) != n->len) {
        char got[96];
        yaml_tree_describe(n, got, sizeof got);
        return fail(r, n ? n->line : 0, n ? n->col : 0, "where",
                    "expected an expression (a string), got %s", got);
    }
    s->where_src = n->text;
    locate_where(r, n);
    int col = 0;
    hearth_err perr;
    if ((rc = expr_parse(n->text, NULL, &s->where, &col, &perr))) {
        if (rc == HERR_NOMEM)
            return nomem(r);
        int line, fcol;
        spec_where_position(s, col, &line, &fcol);
        return fail(r, line, fcol, "where", "%s", perr.msg);
    }
    where_key_ctx w = { r, 0 };
    expr_keys(s->where, where_key_check, &w);
    if (w.rc)
        return w.rc;
    expr_vtype type;
    int line, fcol;
    if (expr_check_types(s->where, key_type, NULL, NULL, &type, &col, &perr)) {
        spec_where_position(s, col, &line, &fcol);
        return fail(r, line, fcol, "where", "%s", perr.msg);
    }
    if (type != EXPR_V_BOOL && type != EXPR_V_NULL) {
        spec_where_position(s, s->where->col, &line, &fcol);
        return fail(r, line, fcol, "where", "expected a condition (true/false), got a %s",
                    expr_vtype_name(type));
    }
    return 0;
}

static int read_after(reader *r, const yaml_tree_node *map)
{
    spec *s = r->s;
    int rc;
    if ((rc = expect_kind(r, "after", map, YAML_TREE_MAP, "a mapping {experiment: NAME, on: ok|any}")))
        return rc;
    s->after_line = map->line;
    s->after_col = map->col;
    for (int i = 0; i < map->n_pairs; i++) {
        const yaml_tree_pair *p = &map->pairs[i];
        if (strcmp(p->key, "experiment") == 0) {
            if ((rc = read_string(r, p, &s->after_experiment)))
                return rc;
            if ((rc = check_name(r, "after.experiment", p->value, s->after_experiment)))
                return rc;
        } else if (strcmp(p->key, "on") == 0) {
            const yaml_tree_node *n = p->value;
            if (n && n->kind == YAML_TREE_SCALAR && strcmp(n->text, "ok") == 0) {
                s->after_on = SPEC_AFTER_OK;
            } else if (n && n->kind == YAML_TREE_SCALAR && strcmp(n->text, "any") == 0) {
                s->after_on = SPEC_AFTER_ANY;
            } else {
                char got[96];
                yaml_tree_describe(n, got, sizeof got);
                return fail(r, n ? n->line : p->line, n ? n->col : p->col, "after.on",
                            "expected ok or any, got %s", got);
            }
        } else {
            const char *hint = strncmp(p->key, "exp", 3) == 0 ? " (did you mean 'experiment'?)"
                                                               : "";
            return fail(r, p->line, p->col, "after", "unknown key '%s'%s", p->key, hint);
        }
    }
    if (!s->after_experiment)
        return fail(r, map->line, map->col, "after.experiment", "required, but not given");
    return 0;
}

/* The base keys that overrides wrote (nodes with negative lines, spec.h) are checked here,
 * so that a bad one names its --set argument; the file's own base keys are checked by the
 * shape module when the plan reads the base. */
static int check_base_sets(reader *r, const yaml_tree_node *map, const char *prefix)
{
    int rc;
    for (int i = 0; map && map->kind == YAML_TREE_MAP && i < map->n_pairs; i++) {
        const yaml_tree_pair *p = &map->pairs[i];
        const yaml_tree_node *v = p->value;
        char key[200];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", p->key);
        int cr, mr;
        if (v->kind == YAML_TREE_MAP && !run_key_row(key, &cr, &mr)) {
            if ((rc = check_base_sets(r, v, key)))
                return rc;
            continue;
        }
        if (v->line >= 0)
            continue;
        if (spec_key_is_resource(key))
            return fail(r, v->line, v->col, key, "not a run-config key (resources are set "
                        "with --set %s)", key);
        if ((rc = check_key(r, "base", key, v->line, v->col)) ||
            (rc = check_value(r, NULL, canon_key(key), v)))
            return rc;
        if (strcmp(canon_key(key), "model") == 0) {
            /* a misspelt preset is this override's error, with the name it meant */
            model_shape *ms = malloc(sizeof *ms);
            hearth_err perr;
            if (!ms)
                return nomem(r);
            rc = preset_load(ms, v->text, &perr);
            free(ms);
            if (rc == HERR_NOMEM)
                return nomem(r);
            if (rc)
                return fail(r, v->line, v->col, key, "%s", perr.msg);
        }
    }
    return 0;
}

static int read_spec(reader *r)
{
    spec *s = r->s;
    const yaml_tree_node *root = s->tree->root;
    int rc;
    if (!root)
        return herr_set(r->err, HERR_CONFIG, "%s: the spec is empty", s->file);
    if ((rc = expect_kind(r, "spec", root, YAML_TREE_MAP, "a mapping")))
        return rc;
    s->repeat = 1;
    s->max_points = SPEC_MAX_POINTS_DEFAULT;
    s->fp8_max_err = -1;   /* unset: the default */
    const yaml_tree_pair *name_pair = NULL;
    /* Sections are read in a fixed order (matrix before zip, ...) whatever the file's
     * order, so "already swept" checks see the matrix first. */
    for (int i = 0; i < root->n_pairs; i++) {
        const yaml_tree_pair *p = &root->pairs[i];
        if (!in_list(top_keys, p->key)) {
            field_suggestion sg;
            field_suggest_init(&sg);
            for (int k = 0; top_keys[k]; k++)
                field_suggest_add(&sg, p->key, top_keys[k]);
            const char *best = field_suggest_result(&sg, p->key);
            char hint[200] = "";
            if (strchr(p->key, '.') && spec_key_known(p->key, NULL, 0))
                snprintf(hint, sizeof hint, " (run-config keys go under base: or matrix:)");
            else if (best)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
            return fail(r, p->line, p->col, p->key, "unknown key%s", hint);
        }
    }
    static const char *const order[] = {
        "name", "trainer", "base", "resources", "matrix", "zip", "include", "exclude",
        "where", "repeat", "retries", "after", "max_points", "auto", NULL,
    };
    for (int o = 0; order[o]; o++) {
        const yaml_tree_pair *p = yaml_tree_get_pair(root, order[o]);
        if (!p)
            continue;
        const char *k = p->key;
        const yaml_tree_node *v = p->value;
        int64_t n;
        if (strcmp(k, "name") == 0) {
            name_pair = p;
            if ((rc = read_string(r, p, &s->name)) || (rc = check_name(r, k, v, s->name)))
                return rc;
        } else if (strcmp(k, "trainer") == 0) {
            if ((rc = read_string(r, p, &s->trainer)))
                return rc;
        } else if (strcmp(k, "base") == 0) {
            if (yaml_tree_is_null(v))
                continue;
            if ((rc = expect_kind(r, k, v, YAML_TREE_MAP, "a run config (a mapping)")))
                return rc;
            s->base = v;
            if ((rc = check_base_sets(r, v, "")) || (rc = claim_base_auto(r, v)))
                return rc;
        } else if (strcmp(k, "resources") == 0) {
            if ((rc = read_resources(r, v)))
                return rc;
        } else if (strcmp(k, "matrix") == 0) {
            if (yaml_tree_is_null(v))
                continue;
            if ((rc = read_matrix(r, v)))
                return rc;
        } else if (strcmp(k, "zip") == 0) {
            if (yaml_tree_is_null(v))
                continue;
            if ((rc = read_zip(r, v)))
                return rc;
        } else if (strcmp(k, "include") == 0) {
            if (yaml_tree_is_null(v))
                continue;
            if ((rc = read_entries(r, "include", v, &s->include, &s->n_include)))
                return rc;
        } else if (strcmp(k, "exclude") == 0) {
            if (yaml_tree_is_null(v))
                continue;
            if ((rc = read_entries(r, "exclude", v, &s->exclude, &s->n_exclude)))
                return rc;
        } else if (strcmp(k, "where") == 0) {
            if ((rc = read_where(r, v)))
                return rc;
        } else if (strcmp(k, "repeat") == 0) {
            if ((rc = read_int(r, p, 1, 1000000, &n)))
                return rc;
            s->repeat = (int)n;
        } else if (strcmp(k, "retries") == 0) {
            if ((rc = read_int(r, p, 0, 1000, &n)))
                return rc;
            s->retries = (int)n;
        } else if (strcmp(k, "auto") == 0) {
            if ((rc = read_auto(r, v)))
                return rc;
        } else if (strcmp(k, "max_points") == 0) {
            if ((rc = read_int(r, p, 1, INT64_MAX, &n)))
                return rc;
            s->max_points = n;
        } else if (strcmp(k, "after") == 0) {
            if ((rc = read_after(r, v)))
                return rc;
        }
    }
    if (!name_pair)
        return fail(r, 0, 0, "name", "required, but not given");
    return 0;
}

/* The text an experiment records: the file's own (comments kept) without overrides; with
 * them, the tree written out under a comment naming the file and the overrides. */
static int resolved_text(reader *r, const char *text, size_t len, const char *const *sets)
{
    spec *s = r->s;
    char *out;
    if (s->n_sets == 0) {
        out = malloc(len + 1);
        if (out) {
            memcpy(out, text, len);
            out[len] = '\0';
        }
    } else {
        size_t hl = strlen(s->file) + 64;
        for (int i = 0; i < s->n_sets; i++)
            hl += strlen(sets[i]) + 8;
        char *header = malloc(hl);
        if (!header)
            return nomem(r);
        size_t used = (size_t)snprintf(header, hl, "%s with", s->file);
        for (int i = 0; i < s->n_sets; i++)
            used += (size_t)snprintf(header + used, hl - used, " --set %s", sets[i]);
        for (char *c = header; *c; c++)   /* one comment line, whatever the values hold */
            if (*c == '\n' || *c == '\r')
                *c = ' ';
        int rc = spec_emit(s->tree->root, header, &out, r->err);
        free(header);
        if (rc)
            return rc;
    }
    if (!own(r, out))   /* own freed it */
        return nomem(r);
    s->text = out;
    return 0;
}

int spec_parse_set(spec **out, const char *file, const char *text, size_t len,
                   const char *const *sets, int n_sets, hearth_err *err)
{
    *out = NULL;
    spec *s = calloc(1, sizeof *s);
    if (!s)
        return herr_set(err, HERR_NOMEM, "%s: out of memory", file);
    int rc = yaml_tree_parse(&s->tree, file, text, len, err);
    if (rc) {
        free(s);
        return rc;
    }
    s->file = s->tree->name;
    reader r = { s, text, len, err };
    if (n_sets > 0) {
        s->set_trees = calloc((size_t)n_sets, sizeof *s->set_trees);
        s->set_keys = calloc((size_t)n_sets, sizeof *s->set_keys);
        if (!s->set_trees || !s->set_keys) {
            spec_free(s);
            return herr_set(err, HERR_NOMEM, "%s: out of memory", file);
        }
        s->n_sets = n_sets;   /* spec_free frees what spec_set_apply made */
        rc = spec_set_apply(s->tree, file, sets, n_sets, s->set_trees, (char **)s->set_keys,
                            err);
    }
    /* written out before reading: reading replaces `auto` with placeholders */
    if (!rc)
        rc = resolved_text(&r, text, len, sets);
    if (!rc)
        rc = read_spec(&r);
    if (rc) {
        spec_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int spec_parse(spec **out, const char *file, const char *text, size_t len, hearth_err *err)
{
    return spec_parse_set(out, file, text, len, NULL, 0, err);
}

int spec_load_set(spec **out, const char *path, const char *const *sets, int n_sets,
                  hearth_err *err)
{
    *out = NULL;
    char *buf;
    size_t len;
    int rc = file_read_bounded(path, FILE_READ_MAX_TEXT, &buf, &len, err);
    if (rc)
        return rc;
    rc = spec_parse_set(out, path, buf, len, sets, n_sets, err);
    free(buf);
    return rc;
}

int spec_load(spec **out, const char *path, hearth_err *err)
{
    return spec_load_set(out, path, NULL, 0, err);
}

void spec_position_format(const spec *s, int line, int col, char *buf, size_t size)
{
    if (line < 0 && -line <= s->n_sets)
        snprintf(buf, size, "--set %s", s->set_keys[-line - 1]);
    else if (line > 0)
        snprintf(buf, size, "%s:%d:%d", s->file, line, col);
    else
        snprintf(buf, size, "%s", s->file);
}

void spec_node_src(const spec *s, const yaml_tree_node *n, const char *key, field_src *src)
{
    memset(src, 0, sizeof *src);
    if (n && n->line < 0 && -n->line <= s->n_sets) {
        src->file = NULL;   /* field_src_format: "--set KEY" */
        snprintf(src->key, sizeof src->key, "%s", s->set_keys[-n->line - 1]);
        return;
    }
    src->file = s->file;
    src->line = n ? n->line : 0;
    src->col = n ? n->col : 0;
    snprintf(src->key, sizeof src->key, "%s", key);
}

void spec_free(spec *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_matrix; i++)
        free(s->matrix[i].values);
    free(s->matrix);
    for (int g = 0; g < s->n_zip; g++) {
        for (int i = 0; i < s->zip[g].n_axes; i++)
            free(s->zip[g].axes[i].values);
        free(s->zip[g].axes);
    }
    free(s->zip);
    for (int i = 0; i < s->n_include; i++)
        free(s->include[i].settings);
    free(s->include);
    for (int i = 0; i < s->n_exclude; i++)
        free(s->exclude[i].settings);
    free(s->exclude);
    expr_free(s->where);
    for (int i = 0; i < s->n_sets; i++) {
        if (s->set_trees)
            yaml_tree_free(s->set_trees[i]);
        if (s->set_keys)
            free((char *)s->set_keys[i]);
    }
    free(s->set_trees);
    free(s->set_keys);
    for (int i = 0; i < s->n_owned; i++)
        free(s->owned[i]);
    free(s->owned);
    yaml_tree_free(s->tree);
    free(s);
}

const char *const *spec_keys(spec_key_group g)
{
    switch (g) {
    case SPEC_KEYS_TOP: return top_keys;
    case SPEC_KEYS_RES_INT: return resource_int_keys;
    case SPEC_KEYS_RES_STR: return resource_str_keys;
    case SPEC_KEYS_RES_LIST: return resource_list_keys;
    case SPEC_KEYS_RES_BOOL: return resource_bool_keys;
    case SPEC_KEYS_RES_SPEC_INT: return resource_spec_int_keys;
    case SPEC_KEYS_RES_SPEC_NUM: return resource_spec_num_keys;
    }
    return NULL;
}
