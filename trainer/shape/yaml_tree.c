/* yaml_tree.c - libyaml events -> a tree of nodes with line/column marks (yaml_tree.h). */
#include "shape/yaml_tree.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "shape/file_read.h"

/* Bounds that keep hostile input from exhausting memory or the stack. */
#define YT_MAX_NODES 1000000L
#define YT_MAX_DEPTH 200

typedef struct {
    char *name;
    const yaml_tree_node *node;
} yt_anchor;

typedef struct {
    yaml_parser_t parser;
    const char *name;
    hearth_err *err;
    long nodes;
    yt_anchor *anchors;
    int n_anchors, cap_anchors;
} yt_reader;

static void node_free(yaml_tree_node *n)
{
    if (!n)
        return;
    free(n->text);
    for (int i = 0; i < n->n_items; i++)
        node_free(n->items[i]);
    free(n->items);
    for (int i = 0; i < n->n_pairs; i++) {
        free(n->pairs[i].key);
        node_free(n->pairs[i].value);
    }
    free(n->pairs);
    free(n);
}

void yaml_tree_free(yaml_tree *t)
{
    if (!t)
        return;
    node_free(t->root);
    free(t->name);
    free(t);
}

static int nomem(yt_reader *r)
{
    return herr_set(r->err, HERR_NOMEM, "%s: out of memory while reading YAML", r->name);
}

static int at(yt_reader *r, const yaml_mark_t *m, const char *fmt, const char *arg)
{
    char what[512];
    snprintf(what, sizeof what, fmt, arg);
    return herr_set(r->err, HERR_CONFIG, "%s:%zu:%zu: %s", r->name, m->line + 1,
                    m->column + 1, what);
}

static int next_event(yt_reader *r, yaml_event_t *ev)
{
    if (yaml_parser_parse(&r->parser, ev))
        return 0;
    if (r->parser.error == YAML_MEMORY_ERROR)
        return nomem(r);
    const yaml_parser_t *p = &r->parser;
    const char *problem = p->problem ? p->problem : "cannot parse";
    if (p->context)
        return herr_set(r->err, HERR_CONFIG, "%s:%zu:%zu: YAML syntax error: %s %s",
                        r->name, p->problem_mark.line + 1, p->problem_mark.column + 1,
                        problem, p->context);
    return herr_set(r->err, HERR_CONFIG, "%s:%zu:%zu: YAML syntax error: %s", r->name,
                    p->problem_mark.line + 1, p->problem_mark.column + 1, problem);
}

static yaml_tree_node *node_new(yt_reader *r, yaml_tree_kind kind, const yaml_mark_t *m)
{
    if (++r->nodes > YT_MAX_NODES)
        return NULL;
    yaml_tree_node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->kind = kind;
    n->line = (int)m->line + 1;
    n->col = (int)m->column + 1;
    return n;
}

static int too_big(yt_reader *r, const yaml_mark_t *m)
{
    if (r->nodes > YT_MAX_NODES)
        return at(r, m, "the document has more than %s nodes", "1000000");
    return nomem(r);
}

static char *dup_bytes(const void *s, size_t len)
{
    char *d = malloc(len + 1);
    if (d) {
        memcpy(d, s, len);
        d[len] = 0;
    }
    return d;
}

static yaml_tree_node *node_copy(yt_reader *r, const yaml_tree_node *s)
{
    yaml_mark_t m = { 0, (size_t)s->line - 1, (size_t)s->col - 1 };
    yaml_tree_node *n = node_new(r, s->kind, &m);
    if (!n)
        return NULL;
    n->quoted = s->quoted;
    if (s->kind == YAML_TREE_SCALAR) {
        n->len = s->len;
        if (!(n->text = dup_bytes(s->text, s->len)))
            goto fail;
    }
    if (s->n_items) {
        if (!(n->items = calloc((size_t)s->n_items, sizeof *n->items)))
            goto fail;
        for (; n->n_items < s->n_items; n->n_items++)
            if (!(n->items[n->n_items] = node_copy(r, s->items[n->n_items])))
                goto fail;
    }
    if (s->n_pairs) {
        if (!(n->pairs = calloc((size_t)s->n_pairs, sizeof *n->pairs)))
            goto fail;
        for (; n->n_pairs < s->n_pairs; n->n_pairs++) {
            const yaml_tree_pair *sp = &s->pairs[n->n_pairs];
            yaml_tree_pair *dp = &n->pairs[n->n_pairs];
            *dp = *sp;
            dp->value = NULL;
            if (!(dp->key = strdup(sp->key)) || !(dp->value = node_copy(r, sp->value))) {
                free(dp->key);
                goto fail;
            }
        }
    }
    return n;
fail:
    node_free(n);
    return NULL;
}

static int anchor_add(yt_reader *r, const yaml_char_t *name, const yaml_tree_node *n)
{
    if (!name)
        return 0;
    if (r->n_anchors == r->cap_anchors) {
        int cap = r->cap_anchors ? 2 * r->cap_anchors : 8;
        yt_anchor *a = realloc(r->anchors, (size_t)cap * sizeof *a);
        if (!a)
            return nomem(r);
        r->anchors = a;
        r->cap_anchors = cap;
    }
    if (!(r->anchors[r->n_anchors].name = strdup((const char *)name)))
        return nomem(r);
    r->anchors[r->n_anchors++].node = n;
    return 0;
}

static int is_str_tag(const yaml_char_t *tag)
{
    return tag && strcmp((const char *)tag, YAML_STR_TAG) == 0;
}

/* Builds the node that starts with event `ev` (consumed here) and everything up to its
 * end event. */
static int read_node(yt_reader *r, yaml_event_t *ev, int depth, const char *path,
                     yaml_tree_node **out)
{
    int rc = 0;
    yaml_tree_node *n = NULL;
    *out = NULL;
    if (depth > YT_MAX_DEPTH) {
        rc = at(r, &ev->start_mark, "nesting deeper than %s levels", "200");
        yaml_event_delete(ev);
        return rc;
    }
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        if (!(n = node_new(r, YAML_TREE_SCALAR, &ev->start_mark))) {
            rc = too_big(r, &ev->start_mark);
            break;
        }
        n->len = ev->data.scalar.length;
        n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ||
                    is_str_tag(ev->data.scalar.tag);
        if (!(n->text = dup_bytes(ev->data.scalar.value, n->len)))
            rc = nomem(r);
        else
            rc = anchor_add(r, ev->data.scalar.anchor, n);
        break;
    case YAML_ALIAS_EVENT: {
        const char *name = (const char *)ev->data.alias.anchor;
        const yaml_tree_node *target = NULL;
        for (int i = r->n_anchors - 1; i >= 0 && !target; i--)
            if (strcmp(r->anchors[i].name, name) == 0)
                target = r->anchors[i].node;
        if (!target)
            rc = at(r, &ev->start_mark, "unknown anchor *%s", name);
        else if (!(n = node_copy(r, target)))
            rc = too_big(r, &ev->start_mark);
        else {
            n->line = (int)ev->start_mark.line + 1;
            n->col = (int)ev->start_mark.column + 1;
        }
        break;
    }
    case YAML_SEQUENCE_START_EVENT: {
        int cap = 0;
        if (!(n = node_new(r, YAML_TREE_SEQ, &ev->start_mark))) {
            rc = too_big(r, &ev->start_mark);
            break;
        }
        for (;;) {
            yaml_event_t child;
            if ((rc = next_event(r, &child)))
                break;
            if (child.type == YAML_SEQUENCE_END_EVENT) {
                yaml_event_delete(&child);
                break;
            }
            if (n->n_items == cap) {
                cap = cap ? 2 * cap : 4;
                yaml_tree_node **items = realloc(n->items, (size_t)cap * sizeof *items);
                if (!items) {
                    yaml_event_delete(&child);
                    rc = nomem(r);
                    break;
                }
                n->items = items;
            }
            yaml_tree_node *c;
            char cpath[256];
            snprintf(cpath, sizeof cpath, "%s[%d]", path, n->n_items);
            if ((rc = read_node(r, &child, depth + 1, cpath, &c)))
                break;
            n->items[n->n_items++] = c;
        }
        if (!rc)
            rc = anchor_add(r, ev->data.sequence_start.anchor, n);
        break;
    }
    case YAML_MAPPING_START_EVENT: {
        int cap = 0;
        if (!(n = node_new(r, YAML_TREE_MAP, &ev->start_mark))) {
            rc = too_big(r, &ev->start_mark);
            break;
        }
        for (;;) {
            yaml_event_t kev, vev;
            if ((rc = next_event(r, &kev)))
                break;
            if (kev.type == YAML_MAPPING_END_EVENT) {
                yaml_event_delete(&kev);
                break;
            }
            if (kev.type != YAML_SCALAR_EVENT) {
                rc = at(r, &kev.start_mark, "mapping keys must be plain %s", "scalars");
                yaml_event_delete(&kev);
                break;
            }
            const char *key = (const char *)kev.data.scalar.value;
            char kpath[256];
            snprintf(kpath, sizeof kpath, "%s%s%.200s", path, path[0] ? "." : "", key);
            for (int i = 0; i < n->n_pairs; i++) {
                if (strcmp(n->pairs[i].key, key) == 0) {
                    char what[400];
                    snprintf(what, sizeof what, "%s: duplicate key (first at %d:%d)", kpath,
                             n->pairs[i].line, n->pairs[i].col);
                    rc = at(r, &kev.start_mark, "%s", what);
                    break;
                }
            }
            if (rc) {
                yaml_event_delete(&kev);
                break;
            }
            if (n->n_pairs == cap) {
                cap = cap ? 2 * cap : 8;
                yaml_tree_pair *pairs = realloc(n->pairs, (size_t)cap * sizeof *pairs);
                if (!pairs) {
                    yaml_event_delete(&kev);
                    rc = nomem(r);
                    break;
                }
                n->pairs = pairs;
            }
            yaml_tree_pair *p = &n->pairs[n->n_pairs];
            p->line = (int)kev.start_mark.line + 1;
            p->col = (int)kev.start_mark.column + 1;
            p->value = NULL;
            p->key = strdup(key);
            yaml_event_delete(&kev);
            if (!p->key) {
                rc = nomem(r);
                break;
            }
            n->n_pairs++;
            if ((rc = next_event(r, &vev)) ||
                (rc = read_node(r, &vev, depth + 1, kpath, &p->value)))
                break;
        }
        if (!rc)
            rc = anchor_add(r, ev->data.mapping_start.anchor, n);
        break;
    }
    default:
        rc = at(r, &ev->start_mark, "unexpected YAML event %s", "");
        break;
    }
    yaml_event_delete(ev);
    if (rc) {
        node_free(n);
        return rc;
    }
    *out = n;
    return 0;
}

static int expect(yt_reader *r, yaml_event_type_t type, const char *what)
{
    yaml_event_t ev;
    int rc = next_event(r, &ev);
    if (rc)
        return rc;
    if (ev.type != type)
        rc = at(r, &ev.start_mark, "%s", what);
    yaml_event_delete(&ev);
    return rc;
}

static int read_stream(yt_reader *r, yaml_tree *t)
{
    yaml_event_t ev;
    int rc;
    if ((rc = expect(r, YAML_STREAM_START_EVENT, "expected the start of a YAML stream")))
        return rc;
    if ((rc = next_event(r, &ev)))
        return rc;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        return 0;
    }
    yaml_event_delete(&ev);     /* DOCUMENT_START */
    if ((rc = next_event(r, &ev)) || (rc = read_node(r, &ev, 0, "", &t->root)))
        return rc;
    if ((rc = expect(r, YAML_DOCUMENT_END_EVENT, "expected the end of the document")))
        return rc;
    return expect(r, YAML_STREAM_END_EVENT, "only one YAML document is allowed here");
}

int yaml_tree_parse(yaml_tree **out, const char *name, const char *text, size_t len,
                    hearth_err *err)
{
    *out = NULL;
    yaml_tree *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name))) {
        free(t);
        return herr_set(err, HERR_NOMEM, "%s: out of memory", name);
    }
    yt_reader r = { .name = t->name, .err = err };
    if (!yaml_parser_initialize(&r.parser)) {
        yaml_tree_free(t);
        return herr_set(err, HERR_NOMEM, "%s: cannot start the YAML parser", name);
    }
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)text, len);
    int rc = read_stream(&r, t);
    yaml_parser_delete(&r.parser);
    for (int i = 0; i < r.n_anchors; i++)
        free(r.anchors[i].name);
    free(r.anchors);
    if (rc) {
        yaml_tree_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int yaml_tree_load(yaml_tree **out, const char *path, hearth_err *err)
{
    *out = NULL;
    char *buf;
    size_t len;
    int rc = file_read_bounded(path, FILE_READ_MAX_TEXT, &buf, &len, err);
    if (rc)
        return rc;
    rc = yaml_tree_parse(out, path, buf, len, err);
    free(buf);
    return rc;
}

const yaml_tree_pair *yaml_tree_get_pair(const yaml_tree_node *map, const char *key)
{
    if (!map || map->kind != YAML_TREE_MAP)
        return NULL;
    for (int i = 0; i < map->n_pairs; i++)
        if (strcmp(map->pairs[i].key, key) == 0)
            return &map->pairs[i];
    return NULL;
}

const yaml_tree_node *yaml_tree_get(const yaml_tree_node *map, const char *key)
{
    const yaml_tree_pair *p = yaml_tree_get_pair(map, key);
    return p ? p->value : NULL;
}

static int plain(const yaml_tree_node *n)
{
    return n && n->kind == YAML_TREE_SCALAR && !n->quoted && strlen(n->text) == n->len;
}

int yaml_tree_is_null(const yaml_tree_node *n)
{
    if (!plain(n))
        return 0;
    const char *s = n->text;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

int yaml_tree_as_bool(const yaml_tree_node *n, int *out)
{
    if (!plain(n))
        return 0;
    const char *s = n->text;
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
        *out = 1;
        return 1;
    }
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
        *out = 0;
        return 1;
    }
    return 0;
}

static const char *skip_digits(const char *s)
{
    while (*s >= '0' && *s <= '9')
        s++;
    return s;
}

int yaml_tree_as_int(const yaml_tree_node *n, int64_t *out)
{
    if (!plain(n))
        return 0;
    const char *s = n->text, *p = s;
    if (*p == '-' || *p == '+')
        p++;
    const char *e = skip_digits(p);
    if (e == p || *e)
        return 0;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE)
        return -1;
    *out = v;
    return 1;
}

int yaml_tree_as_double(const yaml_tree_node *n, double *out)
{
    if (!plain(n))
        return 0;
    /* [-+]? ( \.[0-9]+ | [0-9]+ (\.[0-9]*)? ) ([eE][-+]?[0-9]+)? */
    const char *s = n->text, *p = s;
    if (*p == '-' || *p == '+')
        p++;
    if (*p == '.') {
        const char *e = skip_digits(p + 1);
        if (e == p + 1)
            return 0;
        p = e;
    } else {
        const char *e = skip_digits(p);
        if (e == p)
            return 0;
        p = e;
        if (*p == '.')
            p = skip_digits(p + 1);
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '-' || *p == '+')
            p++;
        const char *e = skip_digits(p);
        if (e == p)
            return 0;
        p = e;
    }
    if (*p)
        return 0;
    double v = strtod(s, NULL);
    if (!isfinite(v))
        return -1;
    *out = v;
    return 1;
}

void yaml_tree_describe(const yaml_tree_node *n, char *buf, size_t size)
{
    if (!n) {
        snprintf(buf, size, "nothing");
        return;
    }
    if (n->kind == YAML_TREE_SEQ) {
        snprintf(buf, size, "a list");
        return;
    }
    if (n->kind == YAML_TREE_MAP) {
        snprintf(buf, size, "a mapping");
        return;
    }
    if (yaml_tree_is_null(n)) {
        snprintf(buf, size, "%s", n->len ? "null" : "nothing");
        return;
    }
    char text[48];
    size_t k = 0;
    for (size_t i = 0; i < n->len && k < 40; i++) {
        unsigned char c = (unsigned char)n->text[i];
        text[k++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    text[k] = 0;
    snprintf(buf, size, "%s\"%s%s\"", n->quoted ? "the string " : "", text,
             n->len > 40 ? "..." : "");
}
