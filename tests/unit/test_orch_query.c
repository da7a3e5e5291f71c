/* test_orch_query.c - hearth query / top / export / show / compare over a real database.
 *
 * The central check is differential: random well-typed filters over config keys, result
 * fields and run fields are compiled to SQL by query_sql.c and, independently, evaluated
 * by the expression language's own evaluator (expr_eval_bool) over the test's copy of the
 * data; both must select exactly the same runs.  Then: static type errors with their
 * columns, order (ascending, descending, nulls last, limit), columns in every format
 * parsed back and compared with the data, SQL injection attempts in filters, columns,
 * orders, experiment names and config keys (inert: errors or no rows, tables intact),
 * top, export, show and compare against values computed here.
 * Fresh random data in a real SQLite file in a temporary directory every run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "db.h"
#include "expr.h"
#include "ingest.h"
#include "query.h"
#include "query_sql.h"
#include "runs_db.h"
#include "tests/unit/support/dbtest.h"
#include "tests/unit/support/testutil.h"
#include "tests/unit/support/tmpdir.h"

/* ---- the data: a reference copy of every run ------------------------------------------- */

typedef struct {
    char *run_id;
    const char *exp;
    int seq;
    const char *state;
    int attempts;
    json_t *config;   /* as inserted */
    json_t *flat;     /* flattened: dotted key -> value */
    json_t *result;   /* result.json as written, or NULL */
} ref_run;

typedef struct {
    char dir[256];
    char path[300];
    hearth_db *db;
    tu_rng rng;
    ref_run *runs;
    int n;
} fixture;

static const char *const exps[] = {"alpha", "beta"};
static const char *const models[] = {"tiny-vlm", "tiny-vlm-moe", "gpt2-124m"};
static const char *const strategies[] = {"uniform", "hetero_tp", "hetero_dp", "full_separation"};

/* Paths through the state machine to each final state used here. */
static const char *const paths[][5] = {
    {NULL},
    {"submitted", NULL},
    {"submitted", "running", NULL},
    {"submitted", "running", "completed", NULL},
    {"submitted", "running", "completed", NULL},
    {"submitted", "running", "completed", NULL},
    {"submitted", "running", "failed", NULL},
    {"submitted", "running", "requeued", NULL},
    {"pending", NULL},
};

static json_t *random_config(tu_rng *r)
{
    json_t *c = json_pack("{s:s, s:s, s:{s:i, s:i, s:i, s:{s:s, s:b}}, s:{s:f, s:i, s:i}, s:{s:n}}",
                          "model", models[tu_randint(r, 0, 3)],
                          "device", tu_randint(r, 0, 2) ? "cpu" : "cuda",
                          "parallel", "tp", 1 << tu_randint(r, 0, 3), "pp", tu_randint(r, 1, 3),
                          "dp", tu_randint(r, 1, 9), "encoder", "strategy",
                          strategies[tu_randint(r, 0, 4)], "offload", tu_randint(r, 0, 2),
                          "train", "lr", 1e-4 * tu_randint(r, 1, 20), "steps",
                          10 * tu_randint(r, 1, 10), "seq_len", 64 * tu_randint(r, 1, 9),
                          "data", "note");
    json_t *data = json_object_get(c, "data");
    json_object_set_new(data, "mrope", json_pack("[iii]", 16, 24, 24));
    if (tu_randint(r, 0, 3) == 0)   /* keys that only some runs have */
        json_object_set_new(c, "opt", json_pack("{s:i, s:b}", "rare", tu_randint(r, 0, 50),
                                                "flag", tu_randint(r, 0, 2)));
    return c;
}

static json_t *random_result(tu_rng *r, const char *hash)
{
    json_t *o = json_pack("{s:s, s:i, s:f, s:f, s:I, s:f, s:s, s:i}", "config_hash", hash,
                          "steps", tu_randint(r, 1, 500), "step_ms_median",
                          (double)tu_randint(r, 1, 4000) / 8, "tokens_per_s",
                          (double)tu_randint(r, 0, 100000) / 4,
                          "peak_mem_bytes", (json_int_t)tu_randint(r, 1, 1 << 30),
                          "final_loss", tu_uniform(r) * 8, "device",
                          tu_randint(r, 0, 2) ? "cpu" : "NVIDIA H200", "device_count",
                          tu_randint(r, 1, 9));
    /* Equal throughputs now and then, so that ties are exercised. */
    if (tu_randint(r, 0, 5) == 0)
        json_object_set_new(o, "tokens_per_s", json_real(1000.0));
    json_object_set_new(o, "mfu", tu_randint(r, 0, 3) == 0 ? json_null()
                                                            : json_real(tu_uniform(r) / 2));
    json_object_set_new(o, "versions", json_pack("{s:s}", "git", "v1"));
    return o;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (tu_tmpdir_make(f->dir, sizeof f->dir, "query"))
        return -1;
    snprintf(f->path, sizeof f->path, "%s/test.db", f->dir);
    f->rng = tu_rng_fresh();
    hearth_err err = {{0}};
    if (db_open(f->path, &f->db, &err))
        return -1;
    for (int e = 0; e < 2; e++)
        if (runs_db_experiment_upsert(f->db, exps[e], NULL, NULL, NULL, &err))
            return -1;
    f->n = tu_randint(&f->rng, 40, 120);
    f->runs = calloc((size_t)f->n, sizeof *f->runs);
    int seq[2] = {0, 0};
    for (int i = 0; i < f->n; i++) {
        ref_run *r = &f->runs[i];
        int e = tu_randint(&f->rng, 0, 2);
        r->exp = exps[e];
        r->seq = ++seq[e];
        r->config = random_config(&f->rng);
        r->flat = json_object();
        dbt_flatten(r->config, "", r->flat);
        char hash[65], rdir[400];
        dbt_random_hash(&f->rng, hash);
        snprintf(rdir, sizeof rdir, "%s/%s-%d", f->dir, r->exp, r->seq);
        mkdir(rdir, 0755);
        char *text = json_dumps(r->config, JSON_COMPACT | JSON_REAL_PRECISION(17));
        run_new rn = {r->exp, text, hash, rdir};
        if (runs_db_insert(f->db, &rn, &r->run_id, NULL, &err)) {
            fprintf(stderr, "insert: %s\n", err.msg);
            return -1;
        }
        free(text);
        const char *const *path = paths[tu_randint(&f->rng, 0, 9)];
        r->state = "pending";
        for (int k = 0; path[k]; k++) {
            run_state s;
            if (strcmp(path[k], "pending") == 0)
                break;
            run_state_parse(path[k], &s, &err);
            if (runs_db_transition(f->db, r->run_id, s, NULL, &err)) {
                fprintf(stderr, "transition: %s\n", err.msg);
                return -1;
            }
            r->state = path[k];
            r->attempts += strcmp(path[k], "submitted") == 0;
        }
        if (tu_randint(&f->rng, 0, 10) < 7) {
            r->result = random_result(&f->rng, hash);
            char p[500];
            snprintf(p, sizeof p, "%s/result.json", rdir);
            char *rt = json_dumps(r->result, JSON_REAL_PRECISION(17));
            assert_int_equal(tu_write_text(p, rt), 0);
            free(rt);
            if (ingest_run(f->db, r->run_id, NULL, NULL, &err)) {
                fprintf(stderr, "ingest: %s\n", err.msg);
                return -1;
            }
        }
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    db_close(f->db);
    for (int i = 0; i < f->n; i++) {
        free(f->runs[i].run_id);
        json_decref(f->runs[i].config);
        json_decref(f->runs[i].flat);
        json_decref(f->runs[i].result);
    }
    free(f->runs);
    tu_tmpdir_remove(f->dir);
    free(f);
    return 0;
}

/* ---- the reference evaluator's view of a run ------------------------------------------- */

static int is_result_field(const char *k)
{
    static const char *const names[] = {"steps", "step_ms_median", "step_ms_p10", "step_ms_p90",
                                        "tokens_per_s", "tokens_per_s_per_gpu",
                                        "flops_per_token", "mfu", "peak_mem_bytes",
                                        "final_loss", "exit_status", "device", "device_count",
                                        "nodes", "versions"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(names[i], k) == 0)
            return 1;
    return 0;
}

static void json_to_value(json_t *v, expr_value *out)
{
    memset(out, 0, sizeof *out);
    if (!v || json_is_null(v))
        out->type = EXPR_V_NULL;
    else if (json_is_number(v)) {
        out->type = EXPR_V_NUM;
        out->num = json_number_value(v);
    } else if (json_is_string(v)) {
        out->type = EXPR_V_STR;
        out->str = json_string_value(v);
    } else if (json_is_boolean(v)) {
        out->type = EXPR_V_BOOL;
        out->boolean = json_is_true(v);
    } else {
        out->type = EXPR_V_NULL;
    }
}

static int ref_lookup(void *ctx, const char *key, expr_value *out, hearth_err *err)
{
    (void)err;
    ref_run *r = ctx;
    memset(out, 0, sizeof *out);
    const char *k = key;
    int want = 0;   /* 1 run, 2 result, 3 config */
    if (strncmp(k, "run.", 4) == 0) {
        want = 1;
        k += 4;
    } else if (strncmp(k, "result.", 7) == 0) {
        want = 2;
        k += 7;
    } else if (strncmp(k, "config.", 7) == 0) {
        want = 3;
        k += 7;
    }
    int is_run = strcmp(k, "run_id") == 0 || strcmp(k, "experiment") == 0 ||
                 strcmp(k, "state") == 0 || strcmp(k, "seq") == 0 || strcmp(k, "attempts") == 0;
    if (want == 1 || (want == 0 && is_run)) {
        if (strcmp(k, "run_id") == 0) {
            out->type = EXPR_V_STR;
            out->str = r->run_id;
        } else if (strcmp(k, "experiment") == 0) {
            out->type = EXPR_V_STR;
            out->str = r->exp;
        } else if (strcmp(k, "state") == 0) {
            out->type = EXPR_V_STR;
            out->str = r->state;
        } else if (strcmp(k, "seq") == 0) {
            out->type = EXPR_V_NUM;
            out->num = r->seq;
        } else if (strcmp(k, "attempts") == 0) {
            out->type = EXPR_V_NUM;
            out->num = r->attempts;
        } else {
            return EXPR_UNKNOWN_KEY;
        }
        return 0;
    }
    if (want == 2 || (want == 0 && is_result_field(k))) {
        json_to_value(r->result ? json_object_get(r->result, k) : NULL, out);
        return 0;
    }
    json_to_value(json_object_get(r->flat, k), out);
    return 0;
}

/* ---- random well-typed filters --------------------------------------------------------- */

static const char *const int_keys[] = {"parallel.tp", "parallel.dp", "train.steps", "seq",
                                       "steps", "opt.rare", "attempts", "parallel.pp"};
static const char *const real_keys[] = {"tokens_per_s", "mfu", "step_ms_median", "train.lr",
                                        "final_loss", "result.tokens_per_s", "config.train.lr"};
static const char *const str_keys[] = {"model", "parallel.encoder.strategy", "config.device",
                                       "result.device", "state", "experiment", "run_id",
                                       "data.note", "run.state"};
static const char *const bool_keys[] = {"parallel.encoder.offload", "opt.flag",
                                        "config.parallel.encoder.offload"};
static const char *const str_lits[] = {"tiny-vlm", "gpt2-124m", "uniform", "hetero_tp",
                                       "full_separation", "cpu", "cuda", "NVIDIA H200",
                                       "completed", "pending", "failed", "alpha-3", "beta-1",
                                       "zzz", "", "x' OR '1'='1", "a\"b", "alpha"};
#define PICK(r, a) (a)[tu_randint((r), 0, (int)(sizeof(a) / sizeof *(a)))]

typedef struct {
    char *s;
    size_t len, cap;
} gbuf;

static void g_add(gbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void g_add(gbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (b->len + (size_t)n + 1 > b->cap) {
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->s = realloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, tmp, (size_t)n + 1);
    b->len += (size_t)n;
}

static void gen_num(tu_rng *r, gbuf *b, int depth);

static void gen_num_atom(tu_rng *r, gbuf *b)
{
    switch (tu_randint(r, 0, 5)) {
    case 0: g_add(b, "%s", PICK(r, int_keys)); break;
    case 1: g_add(b, "%s", PICK(r, real_keys)); break;
    case 2: g_add(b, "%d", tu_randint(r, 0, 200)); break;
    case 3: g_add(b, "%g", (double)tu_randint(r, 0, 4000) / 8); break;
    default: g_add(b, "%.4g", tu_uniform(r)); break;
    }
}

static void gen_num(tu_rng *r, gbuf *b, int depth)
{
    int k = depth <= 0 ? 0 : tu_randint(r, 0, 7);
    switch (k) {
    case 0:
    case 1: gen_num_atom(r, b); break;
    case 2:
    case 3: {
        static const char *const ops[] = {"+", "-", "*"};
        g_add(b, "(");
        gen_num(r, b, depth - 1);
        g_add(b, " %s ", PICK(r, ops));
        gen_num(r, b, depth - 1);
        g_add(b, ")");
        break;
    }
    case 4:
        g_add(b, "(");
        gen_num(r, b, depth - 1);
        g_add(b, " / %d)", tu_randint(r, 1, 9));
        break;
    case 5: g_add(b, "(%s %% %d)", PICK(r, int_keys), tu_randint(r, 1, 7)); break;
    default:
        g_add(b, "-");
        gen_num(r, b, depth - 1);
        break;
    }
}

static void gen_str_atom(tu_rng *r, gbuf *b)
{
    if (tu_randint(r, 0, 2)) {
        g_add(b, "%s", PICK(r, str_keys));
        return;
    }
    const char *s = PICK(r, str_lits);
    g_add(b, "\"");
    for (; *s; s++)
        g_add(b, "%s%c", (*s == '"' || *s == '\\') ? "\\" : "", *s);
    g_add(b, "\"");
}

static const char *const cmp_ops[] = {"==", "!=", "<", "<=", ">", ">="};

static void gen_bool(tu_rng *r, gbuf *b, int depth)
{
    int k = depth <= 0 ? tu_randint(r, 0, 4) : tu_randint(r, 0, 9);
    switch (k) {
    case 0:
    case 1:
        gen_num(r, b, 2);
        g_add(b, " %s ", PICK(r, cmp_ops));
        gen_num(r, b, 2);
        break;
    case 2:
        gen_str_atom(r, b);
        g_add(b, " %s ", PICK(r, cmp_ops));
        gen_str_atom(r, b);
        break;
    case 3:
        switch (tu_randint(r, 0, 4)) {
        case 0: g_add(b, "%s", PICK(r, bool_keys)); break;
        case 1: g_add(b, "%s == %s", PICK(r, bool_keys), tu_randint(r, 0, 2) ? "true" : "false"); break;
        case 2: g_add(b, "%s != %s", PICK(r, bool_keys), PICK(r, bool_keys)); break;
        default: g_add(b, "not %s", PICK(r, bool_keys)); break;
        }
        break;
    case 4:
    case 5:
        g_add(b, "(");
        gen_bool(r, b, depth - 1);
        g_add(b, tu_randint(r, 0, 2) ? " and " : " or ");
        gen_bool(r, b, depth - 1);
        g_add(b, ")");
        break;
    case 6:
        g_add(b, "not (");
        gen_bool(r, b, depth - 1);
        g_add(b, ")");
        break;
    case 7:   /* conditions compared as values */
        g_add(b, "(");
        gen_bool(r, b, depth - 1);
        g_add(b, ") %s (", tu_randint(r, 0, 2) ? "==" : "!=");
        gen_bool(r, b, depth - 1);
        g_add(b, ")");
        break;
    default:
        g_add(b, "%s", tu_randint(r, 0, 2) ? "true" : "false");
        break;
    }
}

/* ---- running queries -------------------------------------------------------------------- */

/* Runs a query and returns its output (malloc'd) or NULL with *rc set. */
static char *run_query(fixture *f, const query_opts *o, int *rc, hearth_err *err)
{
    char *out = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&out, &len);
    *rc = query_runs(f->db, o, m, NULL, err);
    fclose(m);
    if (*rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* Splits CSV text into rows of fields (RFC 4180 quoting); returns the number of rows. */
typedef struct {
    char **fields;
    int n;
} csv_row;

static int csv_parse(const char *s, csv_row **rows_out)
{
    csv_row *rows = NULL;
    int nrows = 0;
    while (*s) {
        csv_row row = {NULL, 0};
        for (;;) {
            char *field = malloc(strlen(s) + 1);
            size_t n = 0;
            if (*s == '"') {
                s++;
                for (;;) {
                    if (*s == '"' && s[1] == '"') {
                        field[n++] = '"';
                        s += 2;
                    } else if (*s == '"') {
                        s++;
                        break;
                    } else {
                        field[n++] = *s++;
                    }
                }
            } else {
                while (*s && *s != ',' && *s != '\n')
                    field[n++] = *s++;
            }
            field[n] = '\0';
            row.fields = realloc(row.fields, (size_t)(row.n + 1) * sizeof *row.fields);
            row.fields[row.n++] = field;
            if (*s == ',') {
                s++;
                continue;
            }
            if (*s == '\n')
                s++;
            break;
        }
        rows = realloc(rows, (size_t)(nrows + 1) * sizeof *rows);
        rows[nrows++] = row;
    }
    *rows_out = rows;
    return nrows;
}

static void csv_free(csv_row *rows, int n)
{
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < rows[i].n; k++)
            free(rows[i].fields[k]);
        free(rows[i].fields);
    }
    free(rows);
}

static ref_run *find_run(fixture *f, const char *id)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->runs[i].run_id, id) == 0)
            return &f->runs[i];
    return NULL;
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_filters_match_evaluator(void **state)
{
    fixture *f = *state;
    int n_filters = 300, skipped = 0, nonempty = 0;
    for (int t = 0; t < n_filters; t++) {
        gbuf b = {0};
        gen_bool(&f->rng, &b, 3);
        expr_node *e = NULL;
        hearth_err err = {{0}};
        if (expr_parse(b.s, "f", &e, NULL, &err))
            fail_msg("generated filter does not parse: %s: %s", b.s, err.msg);
        /* the reference selection */
        char *want = calloc((size_t)f->n, 1);
        int ok = 1;
        for (int i = 0; i < f->n && ok; i++) {
            int v;
            if (expr_eval_bool(e, ref_lookup, &f->runs[i], "f", &v, NULL, &err))
                ok = 0;
            else
                want[i] = (char)v;
        }
        expr_free(e);
        if (!ok) {   /* e.g. a string ordering against null is fine, but be safe */
            skipped++;
            free(want);
            free(b.s);
            continue;
        }
        query_opts o = {.filter = b.s, .columns = "run_id", .format = REPORT_CSV};
        int rc;
        char *out = run_query(f, &o, &rc, &err);
        if (!out)
            fail_msg("query '%s' failed: %s (seed %llu)", b.s, err.msg,
                     (unsigned long long)f->rng.seed);
        csv_row *rows;
        int n = csv_parse(out, &rows);
        assert_true(n >= 1);
        assert_string_equal(rows[0].fields[0], "run_id");
        char *got = calloc((size_t)f->n, 1);
        for (int i = 1; i < n; i++) {
            ref_run *r = find_run(f, rows[i].fields[0]);
            assert_non_null(r);
            if (got[r - f->runs])
                fail_msg("'%s': %s twice", b.s, r->run_id);
            got[r - f->runs] = 1;
        }
        for (int i = 0; i < f->n; i++)
            if (got[i] != want[i])
                fail_msg("filter '%s': run %s is %s by SQL but %s by the evaluator (seed %llu)",
                         b.s, f->runs[i].run_id, got[i] ? "selected" : "not selected",
                         want[i] ? "selected" : "not selected",
                         (unsigned long long)f->rng.seed);
        nonempty += n > 1;
        csv_free(rows, n);
        free(got);
        free(out);
        free(want);
        free(b.s);
    }
    assert_true(skipped < n_filters / 10);
    assert_true(nonempty > n_filters / 10);   /* the filters are not all trivially empty */
}

/* Values of `key` per run as the reference sees them. */
static void ref_value(ref_run *r, const char *key, expr_value *v)
{
    hearth_err err;
    if (ref_lookup(r, key, v, &err))
        v->type = EXPR_V_NULL;
}

static int cmp_values(const expr_value *a, const expr_value *b)
{
    if (a->type == EXPR_V_NUM)
        return a->num < b->num ? -1 : a->num > b->num;
    if (a->type == EXPR_V_STR)
        return strcmp(a->str, b->str);
    return (a->boolean != 0) - (b->boolean != 0);
}

/* Every query shape the planner can choose (a result index, a config key index, the
 * experiment, walking the order index, SQLite's own choice) returns the same rows in the
 * same order as the reference: filter, experiment, order with missing values last and
 * ties in run order, limit.  Small probe caps reach every shape with little data. */
static void test_plans_agree(void **state)
{
    fixture *f = *state;
    static const char *const orders[] = {NULL, "-tokens_per_s", "-mfu", "tokens_per_s",
                                         "parallel.tp", "-train.lr", "-step_ms_median",
                                         "model"};
    static const long caps[] = {0, 1, 3, 10, 1000000};
    /* Filters shaped like real ones: conjunctions of key-vs-literal comparisons. */
    static const char *const leaves[] = {
        "tokens_per_s > 12000", "tokens_per_s >= 1000", "mfu > 0.25", "mfu <= 0.1",
        "step_ms_median < 100", "parallel.tp == 4", "parallel.tp >= 2", "train.lr < 0.0005",
        "model == \"tiny-vlm\"", "parallel.encoder.strategy == \"hetero_tp\"",
        "parallel.encoder.offload == true", "final_loss > 2", "peak_mem_bytes < 500000000",
        "opt.rare > 20", "state == \"completed\"", "2 * parallel.dp > 7",
        "tokens_per_s > 1000 or parallel.pp == 2", "not (mfu > 0.3)",
    };
    for (int t = 0; t < 150; t++) {
        char filter[512] = "";
        int nl = tu_randint(&f->rng, 1, 4);
        for (int i = 0; i < nl; i++) {
            if (i)
                strcat(filter, " and ");
            strcat(filter, PICK(&f->rng, leaves));
        }
        const char *order = PICK(&f->rng, orders);
        const char *exp = tu_randint(&f->rng, 0, 3) == 0 ? exps[tu_randint(&f->rng, 0, 2)] : NULL;
        long limit = tu_randint(&f->rng, 0, 2) ? tu_randint(&f->rng, 1, 25) : 0;
        long cap = PICK(&f->rng, caps);
        hearth_err err = {{0}};
        qsql *q = qsql_new(f->db);
        assert_non_null(q);
        int rc = qsql_filter(q, filter, "filter", &err);
        if (!rc && exp)
            rc = qsql_experiment(q, exp, &err);
        if (!rc)
            rc = qsql_column(q, "run_id", NULL, &err);
        if (!rc && order)
            rc = qsql_order(q, order, "--order", &err);
        qsql_limit(q, limit);
        qsql_probe_cap(q, cap);
        sqlite3_stmt *st = NULL;
        if (!rc)
            rc = qsql_prepare(q, &st, &err);
        if (rc)
            fail_msg("'%s': %s", filter, err.msg);
        int *got = malloc((size_t)f->n * sizeof *got);
        int n_got = 0;
        while (sqlite3_step(st) == SQLITE_ROW) {
            ref_run *r = find_run(f, (const char *)sqlite3_column_text(st, 1));
            assert_non_null(r);
            assert_true(n_got < f->n);
            got[n_got++] = (int)(r - f->runs);
        }
        sqlite3_finalize(st);

        /* reference */
        expr_node *e;
        assert_int_equal(expr_parse(filter, "f", &e, NULL, &err), 0);
        int *want = malloc((size_t)f->n * sizeof *want);
        int n_want = 0;
        for (int i = 0; i < f->n; i++) {
            int v;
            if (expr_eval_bool(e, ref_lookup, &f->runs[i], "f", &v, NULL, &err))
                fail_msg("reference '%s': %s", filter, err.msg);
            if (v && (!exp || f->runs[i].exp == exp))
                want[n_want++] = i;
        }
        expr_free(e);
        if (order) {
            int desc = order[0] == '-';
            const char *key = order + desc;
            for (int i = 1; i < n_want; i++)   /* stable insertion sort */
                for (int j = i; j > 0; j--) {
                    expr_value a, b;
                    ref_value(&f->runs[want[j - 1]], key, &a);
                    ref_value(&f->runs[want[j]], key, &b);
                    int swap;
                    if (a.type == EXPR_V_NULL)
                        swap = b.type != EXPR_V_NULL;
                    else if (b.type == EXPR_V_NULL)
                        swap = 0;
                    else
                        swap = desc ? cmp_values(&a, &b) < 0 : cmp_values(&a, &b) > 0;
                    if (!swap)
                        break;
                    int tmp = want[j];
                    want[j] = want[j - 1];
                    want[j - 1] = tmp;
                }
        }
        if (limit > 0 && n_want > limit)
            n_want = (int)limit;
        int same = n_got == n_want;
        for (int i = 0; same && i < n_got; i++)
            same = got[i] == want[i];
        if (!same)
            fail_msg("'%s' exp %s order %s limit %ld cap %ld: %d rows, expected %d, or another "
                     "order (seed %llu)\nSQL: %s", filter, exp ? exp : "-", order ? order : "-",
                     limit, cap, n_got, n_want, (unsigned long long)f->rng.seed, qsql_text(q));
        free(got);
        free(want);
        qsql_free(q);
    }
}

/* Static type errors are reported at the operator's column, like the evaluator does. */
static void test_type_errors_and_unknown_keys(void **state)
{
    fixture *f = *state;
    static const struct {
        const char *filter;
        int col;
        const char *what;
    } cases[] = {
        {"tokens_per_s == \"fast\"", 14, "cannot compare"},
        {"model + 1 > 2", 7, "needs numbers"},
        {"parallel.tp and true", 13, "needs a condition"},
        {"-model == 1", 1, "unary '-'"},
        {"parallel.encoder.offload < true", 26, "bools"},
        {"tokens_per_s", 1, "expected a condition"},
        {"nosuch.key > 1", 1, "unknown key 'nosuch.key'"},
        {"tp > 1 and nosuch == 2", 1, "unknown key 'tp'"},
        {"state == 3", 7, "cannot compare"},
        {"device == \"cpu\"", 1, "config.device"},
        {"result.nope == 1", 1, "unknown result field"},
        {"config.nope == 1", 1, "unknown config key"},
        {"tokens_per_s >", 15, ""},   /* syntax: from the parser */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        query_opts o = {.filter = cases[i].filter, .format = REPORT_JSON};
        hearth_err err = {{0}};
        int rc;
        char *out = run_query(f, &o, &rc, &err);
        if (out || rc != HERR_CONFIG)
            fail_msg("'%s' accepted", cases[i].filter);
        char where[32];
        snprintf(where, sizeof where, "filter:1:%d:", cases[i].col);
        if (strncmp(err.msg, where, strlen(where)) != 0 || !strstr(err.msg, cases[i].what))
            fail_msg("'%s': message '%s', expected '%s ... %s'", cases[i].filter, err.msg,
                     where, cases[i].what);
    }
    /* Unknown columns and orders are errors too. */
    hearth_err err = {{0}};
    int rc;
    query_opts o = {.columns = "run_id,, state", .format = REPORT_CSV};
    assert_null(run_query(f, &o, &rc, &err));
    o.columns = "run_id,bogus";
    assert_null(run_query(f, &o, &rc, &err));
    assert_non_null(strstr(err.msg, "--columns"));
    o.columns = NULL;
    o.order = "-bogus";
    assert_null(run_query(f, &o, &rc, &err));
    assert_non_null(strstr(err.msg, "--order"));
}

static void test_order_and_limit(void **state)
{
    fixture *f = *state;
    static const char *const keys[] = {"tokens_per_s", "parallel.tp", "model", "mfu",
                                       "train.lr", "run_id", "opt.rare", "step_ms_median",
                                       "parallel.encoder.offload", "config.device"};
    for (int t = 0; t < 20; t++) {
        const char *key = PICK(&f->rng, keys);
        int desc = tu_randint(&f->rng, 0, 2);
        char order[64], cols[80];
        snprintf(order, sizeof order, "%s%s", desc ? "-" : "", key);
        snprintf(cols, sizeof cols, "run_id,%s", key);
        query_opts o = {.order = order, .columns = cols, .format = REPORT_CSV};
        hearth_err err = {{0}};
        int rc;
        char *out = run_query(f, &o, &rc, &err);
        if (!out)
            fail_msg("order %s: %s", order, err.msg);
        csv_row *rows;
        int n = csv_parse(out, &rows);
        assert_int_equal(n - 1, f->n);
        int seen_null = 0;
        ref_run *prev = NULL;
        for (int i = 1; i < n; i++) {
            ref_run *r = find_run(f, rows[i].fields[0]);
            assert_non_null(r);
            expr_value v;
            ref_value(r, key, &v);
            if (v.type == EXPR_V_NULL) {
                seen_null = 1;
            } else {
                if (seen_null)
                    fail_msg("order %s: a value after a null (seed %llu)", order,
                             (unsigned long long)f->rng.seed);
                if (prev) {
                    expr_value pv;
                    ref_value(prev, key, &pv);
                    int c = cmp_values(&pv, &v);
                    if (desc ? c < 0 : c > 0)
                        fail_msg("order %s: %s before %s (seed %llu)", order, prev->run_id,
                                 r->run_id, (unsigned long long)f->rng.seed);
                    if (c == 0 && strcmp(prev->exp, r->exp) == 0 && prev->seq > r->seq)
                        fail_msg("order %s: ties not in run order", order);
                }
                prev = r;
            }
        }
        /* With a limit: the first rows of the same order. */
        int limit = tu_randint(&f->rng, 1, f->n + 2);
        o.limit = limit;
        char *lim = run_query(f, &o, &rc, &err);
        assert_non_null(lim);
        csv_row *lrows;
        int ln = csv_parse(lim, &lrows);
        assert_int_equal(ln - 1, limit < f->n ? limit : f->n);
        for (int i = 1; i < ln; i++)
            assert_string_equal(lrows[i].fields[0], rows[i].fields[0]);
        csv_free(lrows, ln);
        free(lim);
        csv_free(rows, n);
        free(out);
    }
}

/* A JSON value from the query output equals the reference value. */
static int json_matches(json_t *got, ref_run *r, const char *key)
{
    if (strcmp(key, "data.mrope") == 0)
        return json_equal(got, json_object_get(r->flat, "data.mrope"));
    if (strcmp(key, "versions") == 0)
        return r->result ? json_equal(got, json_object_get(r->result, "versions"))
                         : json_is_null(got);
    expr_value v;
    ref_value(r, key, &v);
    switch (v.type) {
    case EXPR_V_NULL: return json_is_null(got);
    case EXPR_V_NUM: return json_is_number(got) && json_number_value(got) == v.num;
    case EXPR_V_STR: return json_is_string(got) && strcmp(json_string_value(got), v.str) == 0;
    case EXPR_V_BOOL: return json_is_boolean(got) && json_is_true(got) == (v.boolean != 0);
    }
    return 0;
}

static void test_columns_and_formats(void **state)
{
    fixture *f = *state;
    static const char *const pool[] = {"experiment", "state", "tokens_per_s", "mfu",
                                       "peak_mem_bytes", "parallel.tp", "train.lr", "model",
                                       "parallel.encoder.offload", "data.mrope", "data.note",
                                       "opt.rare", "config.device", "result.device", "versions",
                                       "attempts", "seq"};
    for (int t = 0; t < 10; t++) {
        int nc = tu_randint(&f->rng, 1, 7);
        const char *chosen[8];
        char cols[512] = "run_id";
        for (int i = 0; i < nc; i++) {
            chosen[i] = PICK(&f->rng, pool);
            strcat(cols, tu_randint(&f->rng, 0, 2) ? "," : " , ");
            strcat(cols, chosen[i]);
        }
        hearth_err err = {{0}};
        int rc;
        query_opts o = {.columns = cols, .format = REPORT_JSON};
        char *js = run_query(f, &o, &rc, &err);
        if (!js)
            fail_msg("columns %s: %s", cols, err.msg);
        json_error_t je;
        json_t *arr = json_loads(js, 0, &je);
        if (!arr)
            fail_msg("JSON output does not parse: %s\n%s", je.text, js);
        assert_int_equal(json_array_size(arr), (size_t)f->n);
        size_t i;
        json_t *obj;
        json_array_foreach(arr, i, obj) {
            ref_run *r = find_run(f, json_string_value(json_object_get(obj, "run_id")));
            assert_non_null(r);
            for (int c = 0; c < nc; c++) {
                json_t *got = json_object_get(obj, chosen[c]);
                assert_non_null(got);
                if (!json_matches(got, r, chosen[c])) {
                    char *d = json_dumps(got, JSON_ENCODE_ANY);
                    fail_msg("run %s column %s: got %s (seed %llu)", r->run_id, chosen[c], d,
                             (unsigned long long)f->rng.seed);
                }
            }
        }
        /* CSV carries the same values. */
        o.format = REPORT_CSV;
        char *csv = run_query(f, &o, &rc, &err);
        assert_non_null(csv);
        csv_row *rows;
        int n = csv_parse(csv, &rows);
        assert_int_equal(n - 1, f->n);
        assert_int_equal(rows[0].n, nc + 1);
        for (int k = 1; k < n; k++) {
            json_t *o2 = json_array_get(arr, (size_t)(k - 1));
            assert_string_equal(rows[k].fields[0],
                                json_string_value(json_object_get(o2, "run_id")));
            for (int c = 0; c < nc; c++) {
                json_t *v = json_object_get(o2, chosen[c]);
                const char *s = rows[k].fields[c + 1];
                int ok;
                if (json_is_null(v))
                    ok = *s == '\0';
                else if (json_is_number(v))
                    ok = strtod(s, NULL) == json_number_value(v);
                else if (json_is_string(v))
                    ok = strcmp(s, json_string_value(v)) == 0;
                else if (json_is_boolean(v))
                    ok = strcmp(s, json_is_true(v) ? "true" : "false") == 0;
                else {
                    json_t *back = json_loads(s, 0, &je);
                    ok = back && json_equal(back, v);
                    json_decref(back);
                }
                if (!ok)
                    fail_msg("csv row %d column %s: '%s'", k, chosen[c], s);
            }
        }
        csv_free(rows, n);
        /* Table: a header, a rule, one line per run. */
        o.format = REPORT_TABLE;
        char *table = run_query(f, &o, &rc, &err);
        assert_non_null(table);
        int lines = 0;
        for (const char *p = table; *p; p++)
            lines += *p == '\n';
        assert_int_equal(lines, f->n + 2);
        assert_true(strncmp(table, "run_id", 6) == 0);
        for (int k = 0; k < f->n; k++)
            assert_non_null(strstr(table, f->runs[k].run_id));
        free(table);
        free(csv);
        json_decref(arr);
        free(js);
    }
}

static void test_injection_is_inert(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    long long runs = dbt_sql_int(f->db, "SELECT count(*) FROM runs");
    long long objects = dbt_sql_int(f->db, "SELECT count(*) FROM sqlite_master");
    /* A run whose config has a key that is SQL. */
    static const char evil_key[] = "evil'); DROP TABLE runs; --";
    char hash[65];
    dbt_random_hash(&f->rng, hash);
    int evil_value = tu_randint(&f->rng, 1, 1000);
    json_t *cfg = json_pack("{s:i, s:s}", evil_key, evil_value, "model", "x' OR 1=1 --");
    char *text = json_dumps(cfg, JSON_COMPACT);
    run_new rn = {"alpha", text, hash, NULL};
    char *id = NULL;
    assert_int_equal(runs_db_insert(f->db, &rn, &id, NULL, &err), 0);
    runs++;

    static const char *const filters[] = {
        "run_id == \"x\\\" OR 1=1 --\"",
        "state == 'completed\\'; DROP TABLE runs; --'",
        "model == \"tiny-vlm' OR '1'='1\"",
        "experiment == \"alpha\\\"); DELETE FROM runs; --\"",
        "run_id == 'a' or run_id == \"b'; DROP TABLE results; --\"",
        "model == \"'\" or model == \"\\\"\" or model == \"\\\\\"",
    };
    for (size_t i = 0; i < sizeof filters / sizeof *filters; i++) {
        query_opts o = {.filter = filters[i], .format = REPORT_CSV, .columns = "run_id"};
        int rc;
        char *out = run_query(f, &o, &rc, &err);
        if (!out)
            fail_msg("'%s': %s", filters[i], err.msg);
        csv_row *rows;
        int n = csv_parse(out, &rows);
        if (n != 1)
            fail_msg("'%s' selected %d rows", filters[i], n - 1);
        csv_free(rows, n);
        free(out);
    }
    /* A string that is SQL matches itself as data. */
    query_opts o = {.filter = "model == \"x' OR 1=1 --\"", .format = REPORT_CSV,
                    .columns = "run_id"};
    int rc;
    char *out = run_query(f, &o, &rc, &err);
    assert_non_null(out);
    csv_row *rows;
    int n = csv_parse(out, &rows);
    assert_int_equal(n, 2);
    assert_string_equal(rows[1].fields[0], id);
    csv_free(rows, n);
    free(out);

    static const char *const bad_columns[] = {
        "run_id; DROP TABLE runs",
        "run_id) FROM runs; DROP TABLE runs; --",
        "r.id",
        "res.tokens_per_s",
        "run_id, (SELECT count(*) FROM runs)",
        "config.x'||(SELECT 1)||'",
        "*",
    };
    for (size_t i = 0; i < sizeof bad_columns / sizeof *bad_columns; i++) {
        query_opts q = {.columns = bad_columns[i], .format = REPORT_JSON};
        if ((out = run_query(f, &q, &rc, &err)))
            fail_msg("columns '%s' accepted:\n%s", bad_columns[i], out);
    }
    static const char *const bad_orders[] = {
        "-tokens_per_s; DELETE FROM runs", "tokens_per_s DESC, (SELECT 1)",
        "1", "-(SELECT 1)", "tokens_per_s--",
    };
    for (size_t i = 0; i < sizeof bad_orders / sizeof *bad_orders; i++) {
        query_opts q = {.order = bad_orders[i], .format = REPORT_JSON};
        if ((out = run_query(f, &q, &rc, &err)))
            fail_msg("order '%s' accepted", bad_orders[i]);
    }
    query_opts q = {.experiment = "alpha' OR '1'='1", .format = REPORT_CSV};
    out = run_query(f, &q, &rc, &err);
    assert_non_null(out);
    n = csv_parse(out, &rows);
    assert_int_equal(n, 1);
    csv_free(rows, n);
    free(out);

    /* The SQL-named key is an ordinary column. */
    char col[128];
    snprintf(col, sizeof col, "run_id,config.%s", evil_key);
    query_opts qe = {.columns = col, .filter = "model == \"x' OR 1=1 --\"",
                     .format = REPORT_JSON};
    out = run_query(f, &qe, &rc, &err);
    if (!out)
        fail_msg("evil key column: %s", err.msg);
    json_error_t je;
    json_t *arr = json_loads(out, 0, &je);
    assert_non_null(arr);
    assert_int_equal(json_array_size(arr), 1);
    char label[128];
    snprintf(label, sizeof label, "config.%s", evil_key);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(arr, 0), label)),
                     evil_value);
    json_decref(arr);
    free(out);

    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM runs"), runs);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM sqlite_master"), objects);
    free(id);
    free(text);
    json_decref(cfg);
}

static int cmp_double_desc(double a, double b) { return a > b ? -1 : a < b; }

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void test_top(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    for (int e = 0; e < 2; e++) {
        /* Reference: completed runs of the experiment with their throughput, best first,
         * nulls last, ties in run order. */
        ref_run *list[256];
        int n = 0;
        for (int i = 0; i < f->n; i++)
            if (f->runs[i].exp == exps[e] && strcmp(f->runs[i].state, "completed") == 0)
                list[n++] = &f->runs[i];
        for (int i = 1; i < n; i++)   /* insertion sort: stable */
            for (int j = i; j > 0; j--) {
                expr_value a, b;
                ref_value(list[j - 1], "tokens_per_s", &a);
                ref_value(list[j], "tokens_per_s", &b);
                int swap;
                if (a.type == EXPR_V_NULL)
                    swap = b.type != EXPR_V_NULL;
                else
                    swap = b.type != EXPR_V_NULL && cmp_double_desc(a.num, b.num) > 0;
                if (!swap)
                    break;
                ref_run *t = list[j];
                list[j] = list[j - 1];
                list[j - 1] = t;
            }
        int limit = tu_randint(&f->rng, 1, 15);
        query_top_opts o = {.limit = limit, .format = REPORT_CSV};
        char *out = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&out, &len);
        int rc = query_top(f->db, exps[e], &o, m, &err);
        fclose(m);
        if (rc)
            fail_msg("top: %s", err.msg);
        csv_row *rows;
        int rn = csv_parse(out, &rows);
        assert_int_equal(rn - 1, n < limit ? n : limit);
        for (int i = 1; i < rn; i++)
            if (strcmp(rows[i].fields[0], list[i - 1]->run_id) != 0)
                fail_msg("top %s row %d: %s, expected %s (seed %llu)", exps[e], i,
                         rows[i].fields[0], list[i - 1]->run_id, (unsigned long long)f->rng.seed);
        /* The columns after run_id are the config keys that differ among those runs (or
         * that some lack), sorted, at most 8; "device" is written config.device. */
        json_t *all = json_object();
        for (int i = 0; i < n; i++) {
            const char *k;
            json_t *v;
            json_object_foreach(list[i]->flat, k, v) json_object_set_new(all, k, json_true());
        }
        const char *keys[64];
        size_t nk = 0;
        const char *k;
        json_t *v;
        json_object_foreach(all, k, v) {
            int present = 0, differs = 0;
            json_t *first = NULL;
            for (int i = 0; i < n; i++) {
                json_t *x = json_object_get(list[i]->flat, k);
                if (!x)
                    continue;
                present++;
                if (json_is_null(x))
                    continue;
                if (!first)
                    first = x;
                else if (!json_equal(first, x))
                    differs = 1;
            }
            if (differs || present < n)
                keys[nk++] = k;
        }
        qsort(keys, nk, sizeof *keys, cmp_str);
        if (nk > 8)
            nk = 8;
        for (size_t c = 0; c < nk; c++) {
            char label[128];
            snprintf(label, sizeof label, "%s%s", strcmp(keys[c], "device") == 0 ? "config." : "",
                     keys[c]);
            assert_true(rows[0].n > (int)c + 1);
            if (strcmp(rows[0].fields[c + 1], label) != 0)
                fail_msg("top %s column %zu: %s, expected %s (seed %llu)", exps[e], c + 1,
                         rows[0].fields[c + 1], label, (unsigned long long)f->rng.seed);
        }
        assert_string_equal(rows[0].fields[nk + 1], "tokens_per_s");
        json_decref(all);
        csv_free(rows, rn);
        free(out);

        /* --by a lower-is-better field sorts ascending. */
        query_top_opts o2 = {.by = "step_ms_median", .format = REPORT_JSON};
        out = NULL;
        m = open_memstream(&out, &len);
        assert_int_equal(query_top(f->db, exps[e], &o2, m, &err), 0);
        fclose(m);
        json_error_t je;
        json_t *arr = json_loads(out, 0, &je);
        assert_non_null(arr);
        for (size_t i = 1; i < json_array_size(arr); i++) {
            json_t *a = json_object_get(json_array_get(arr, i - 1), "step_ms_median");
            json_t *b = json_object_get(json_array_get(arr, i), "step_ms_median");
            if (!json_is_null(a) && !json_is_null(b))
                assert_true(json_number_value(a) <= json_number_value(b));
            else
                assert_true(json_is_null(b));
        }
        json_decref(arr);
        free(out);
    }
    query_top_opts o = {0};
    FILE *null = fopen("/dev/null", "w");
    assert_int_equal(query_top(f->db, "no-such-experiment", &o, null, &err), HERR_CONFIG);
    fclose(null);
}

static void test_export_show_compare(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    char *out = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&out, &len);
    assert_int_equal(query_export(f->db, "beta", REPORT_JSON, m, &err), 0);
    fclose(m);
    json_error_t je;
    json_t *arr = json_loads(out, 0, &je);
    if (!arr)
        fail_msg("export JSON: %s", je.text);
    int n_beta = 0;
    for (int i = 0; i < f->n; i++)
        n_beta += f->runs[i].exp == exps[1];
    assert_int_equal(json_array_size(arr), (size_t)n_beta);
    size_t i;
    json_t *obj;
    json_array_foreach(arr, i, obj) {
        ref_run *r = find_run(f, json_string_value(json_object_get(obj, "run_id")));
        assert_non_null(r);
        assert_string_equal(json_string_value(json_object_get(obj, "state")), r->state);
        /* every config leaf, "device" written config.device since it is also a field */
        const char *k;
        json_t *v;
        json_object_foreach(r->flat, k, v) {
            char label[128];
            snprintf(label, sizeof label, "%s%s",
                     strcmp(k, "device") == 0 ? "config." : "", k);
            json_t *got = json_object_get(obj, label);
            if (!got || !(json_equal(got, v) ||
                          (json_is_number(v) && json_number_value(got) == json_number_value(v))))
                fail_msg("export %s: %s differs", r->run_id, label);
        }
        json_t *tps = json_object_get(obj, "tokens_per_s");
        if (r->result)
            assert_true(json_number_value(tps) ==
                        json_number_value(json_object_get(r->result, "tokens_per_s")));
        else
            assert_true(json_is_null(tps));
    }
    json_decref(arr);
    free(out);
    /* CSV export has one line per run plus the header. */
    out = NULL;
    m = open_memstream(&out, &len);
    assert_int_equal(query_export(f->db, "beta", REPORT_CSV, m, &err), 0);
    fclose(m);
    csv_row *rows;
    int rn = csv_parse(out, &rows);
    assert_int_equal(rn, n_beta + 1);
    csv_free(rows, rn);
    free(out);

    /* show */
    ref_run *r = &f->runs[tu_randint(&f->rng, 0, f->n)];
    out = NULL;
    m = open_memstream(&out, &len);
    assert_int_equal(query_show(f->db, r->run_id, REPORT_JSON, m, &err), 0);
    fclose(m);
    json_t *show = json_loads(out, 0, &je);
    if (!show)
        fail_msg("show JSON: %s\n%s", je.text, out);
    assert_string_equal(json_string_value(json_object_get(json_object_get(show, "run"), "run_id")),
                        r->run_id);
    json_t *cfg = json_object_get(show, "config");
    assert_int_equal(json_object_size(cfg), json_object_size(r->flat));
    const char *k;
    json_t *v;
    json_object_foreach(r->flat, k, v) {
        json_t *got = json_object_get(cfg, k);
        assert_non_null(got);
        assert_true(json_equal(got, v) ||
                    (json_is_number(v) && json_number_value(got) == json_number_value(v)));
    }
    json_t *res = json_object_get(show, "result");
    if (r->result)
        assert_true(json_number_value(json_object_get(res, "tokens_per_s")) ==
                    json_number_value(json_object_get(r->result, "tokens_per_s")));
    else
        assert_int_equal(json_object_size(res), 0);
    json_decref(show);
    free(out);
    for (int fmt = 0; fmt < 2; fmt++) {
        out = NULL;
        m = open_memstream(&out, &len);
        assert_int_equal(query_show(f->db, r->run_id, fmt ? REPORT_CSV : REPORT_TABLE, m, &err), 0);
        fclose(m);
        assert_non_null(strstr(out, r->run_id));
        assert_non_null(strstr(out, "parallel.encoder.strategy"));
        free(out);
    }
    m = fopen("/dev/null", "w");
    assert_int_equal(query_show(f->db, "alpha-999999", REPORT_TABLE, m, &err), HERR_CONFIG);
    fclose(m);

    /* compare: the differing keys exactly, and B/A ratios */
    ref_run *a = &f->runs[tu_randint(&f->rng, 0, f->n)];
    ref_run *b = &f->runs[tu_randint(&f->rng, 0, f->n)];
    out = NULL;
    m = open_memstream(&out, &len);
    assert_int_equal(query_compare(f->db, a->run_id, b->run_id, REPORT_JSON, m, &err), 0);
    fclose(m);
    json_t *cmp = json_loads(out, 0, &je);
    if (!cmp)
        fail_msg("compare JSON: %s\n%s", je.text, out);
    int n_diff = 0;
    json_object_foreach(a->flat, k, v) {
        if (!json_equal(v, json_object_get(b->flat, k)))
            n_diff++;
    }
    json_object_foreach(b->flat, k, v) {
        if (!json_object_get(a->flat, k))
            n_diff++;
    }
    json_t *diff = json_object_get(cmp, "config");
    assert_int_equal(json_array_size(diff), (size_t)n_diff);
    json_array_foreach(diff, i, obj) {
        const char *key = json_string_value(json_object_get(obj, "key"));
        json_t *va = json_object_get(a->flat, key), *vb = json_object_get(b->flat, key);
        assert_false(va && vb && json_equal(va, vb));
        if (i > 0)
            assert_true(strcmp(json_string_value(json_object_get(json_array_get(diff, i - 1), "key")),
                               key) < 0);
    }
    json_t *results = json_object_get(cmp, "results");
    json_array_foreach(results, i, obj) {
        if (strcmp(json_string_value(json_object_get(obj, "key")), "tokens_per_s") != 0)
            continue;
        json_t *ratio = json_object_get(obj, "ratio");
        double x = a->result ? json_number_value(json_object_get(a->result, "tokens_per_s")) : 0;
        double y = b->result ? json_number_value(json_object_get(b->result, "tokens_per_s")) : 0;
        if (a->result && b->result && x != 0)
            assert_true(json_number_value(ratio) == y / x);
        else
            assert_true(json_is_null(ratio));
    }
    json_decref(cmp);
    free(out);
    for (int fmt = 0; fmt < 2; fmt++) {
        out = NULL;
        m = open_memstream(&out, &len);
        assert_int_equal(query_compare(f->db, a->run_id, b->run_id,
                                       fmt ? REPORT_CSV : REPORT_TABLE, m, &err), 0);
        fclose(m);
        assert_non_null(strstr(out, "tokens_per_s"));
        free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_filters_match_evaluator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plans_agree, setup, teardown),
        cmocka_unit_test_setup_teardown(test_type_errors_and_unknown_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_and_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_columns_and_formats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_injection_is_inert, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_show_compare, setup, teardown),
    };
    return cmocka_run_group_tests_name("orch_query", tests, NULL, NULL);
}
