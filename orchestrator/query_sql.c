/* query_sql.c - compiling filters, columns and orders to parameterised SQL.  See
 * query_sql.h for the semantics.
 *
 * The SQL text is assembled only from constant fragments in this file, the `sql` of
 * whitelisted fields (db_fields.c), aliases and parameter numbers that this file makes up
 * ("k3", "?7").  Everything a user wrote reaches SQLite as a bound parameter. */
#include "query_sql.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_kv.h"
#include "db_fields.h"
#include "expr.h"

/* SQLite joins at most 64 tables; runs, experiments and results take three. */
#define QSQL_MAX_KEYS 56
/* Filters kept per query (qsql_filter calls). */
#define QSQL_MAX_FILTERS 4
/* Planner probes count matching index entries up to this many (see plan()). */
#define PROBE_CAP 25000

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_add(sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

typedef enum { B_INT, B_REAL, B_TEXT } bind_kind;

typedef struct {
    bind_kind kind;
    int64_t i;
    double d;
    char *s;
} qbind;

/* A config key joined as alias k<alias>. */
typedef struct {
    char *key;
    int64_t id;
    int types;
} qkey;

/* Static types of compiled expressions. */
typedef enum { T_NULL, T_NUM, T_STR, T_BOOL, T_ANY } stype;

/* What a name resolved to. */
typedef struct {
    const db_field *field;  /* a run or result field, or NULL for a config key */
    int key;                /* index into q->keys */
} qref;

/* An output column: a field (one SQL column) or a config key (num, txt, flag). */
typedef struct {
    qref ref;
    int first;              /* first SQL result column */
} qcol;

struct qsql {
    hearth_db *db;
    expr_node *filters[QSQL_MAX_FILTERS];   /* parsed and checked, compiled at prepare */
    size_t n_filters;
    char *experiment;       /* qsql_experiment, or NULL */
    char *state;            /* qsql_state, or NULL */
    int hide_archived;      /* qsql_hide_archived */
    qref order_first;       /* the first order key, when order_set */
    int order_set;
    int order_first_desc;
    int res_inner;          /* join results as an inner join */
    long probe_cap;         /* PROBE_CAP unless a test changed it */
    unsigned char key_inner[QSQL_MAX_KEYS];
    qbind *binds;
    size_t n_binds, cap_binds;
    qkey keys[QSQL_MAX_KEYS];
    size_t n_keys;
    qcol *cols;
    char **labels;
    size_t n_cols, cap_cols;
    int n_sql_cols;         /* result columns after runs.id */
    sbuf order;             /* ", ..." terms */
    long limit;
    char *sql;
};

qsql *qsql_new(hearth_db *db)
{
    qsql *q = calloc(1, sizeof *q);
    if (q) {
        q->db = db;
        q->probe_cap = PROBE_CAP;
    }
    return q;
}

void qsql_free(qsql *q)
{
    if (!q)
        return;
    for (size_t i = 0; i < q->n_filters; i++)
        expr_free(q->filters[i]);
    free(q->experiment);
    free(q->state);
    for (size_t i = 0; i < q->n_binds; i++)
        free(q->binds[i].s);
    free(q->binds);
    for (size_t i = 0; i < q->n_keys; i++)
        free(q->keys[i].key);
    for (size_t i = 0; i < q->n_cols; i++)
        free(q->labels[i]);
    free(q->cols);
    free(q->labels);
    free(q->order.s);
    free(q->sql);
    free(q);
}

/* Adds a parameter; returns its number (?N), or 0 when out of memory. */
static int bind_add(qsql *q, bind_kind kind, int64_t i, double d, const char *s)
{
    if (q->n_binds == q->cap_binds) {
        size_t cap = q->cap_binds ? 2 * q->cap_binds : 16;
        qbind *n = realloc(q->binds, cap * sizeof *n);
        if (!n)
            return 0;
        q->binds = n;
        q->cap_binds = cap;
    }
    qbind *b = &q->binds[q->n_binds];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->i = i;
    b->d = d;
    if (s && !(b->s = strdup(s)))
        return 0;
    q->n_binds++;
    return (int)q->n_binds;
}

/* ---- name resolution ------------------------------------------------------------------ */

/* Joins config key `key` (or finds its join); returns 1 and sets *idx when the key is
 * known, 0 when no run has it, or a negative code. */
static int key_join(qsql *q, const char *key, size_t *idx, hearth_err *err)
{
    for (size_t i = 0; i < q->n_keys; i++)
        if (strcmp(q->keys[i].key, key) == 0) {
            *idx = i;
            return 1;
        }
    int64_t id;
    int types;
    int rc = config_key_find(q->db, key, &id, &types, err);
    if (rc <= 0)
        return rc;
    if (q->n_keys == QSQL_MAX_KEYS)
        return herr_set(err, HERR_CONFIG, "too many config keys in one query (at most %d)",
                        QSQL_MAX_KEYS);
    if (!(q->keys[q->n_keys].key = strdup(key)))
        return herr_set(err, HERR_NOMEM, "out of memory");
    q->keys[q->n_keys].id = id;
    q->keys[q->n_keys].types = types;
    *idx = q->n_keys++;
    return 1;
}

static const db_field *find_field(const char *name)
{
    const db_field *f = db_field_find(&db_run_fields, name);
    return f ? f : db_field_find(&db_result_fields, name);
}

/* Resolves a name as documented in query_sql.h.  Messages have no place prefix. */
static int resolve(qsql *q, const char *name, qref *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    size_t idx;
    int rc;
    if (strncmp(name, "run.", 4) == 0 || strncmp(name, "result.", 7) == 0) {
        int is_run = name[1] == 'u';
        const char *rest = name + (is_run ? 4 : 7);
        out->field = db_field_find(is_run ? &db_run_fields : &db_result_fields, rest);
        if (!out->field)
            return herr_set(err, HERR_CONFIG, "unknown %s field '%s'",
                            is_run ? "run" : "result", rest);
        return 0;
    }
    if (strncmp(name, "config.", 7) == 0) {
        rc = key_join(q, name + 7, &idx, err);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return herr_set(err, HERR_CONFIG, "unknown config key '%s' (no recorded run has it)",
                            name + 7);
        out->key = (int)idx;
        return 0;
    }
    const db_field *f = find_field(name);
    int64_t id;
    int types;
    rc = config_key_find(q->db, name, &id, &types, err);
    if (rc < 0)
        return rc;
    if (f && rc == 1) {
        const char *kind = db_field_find(&db_run_fields, name) ? "run" : "result";
        return herr_set(err, HERR_CONFIG,
                        "'%s' is both a %s field and a config key: write %s.%s or config.%s",
                        name, kind, kind, name, name);
    }
    if (f) {
        out->field = f;
        return 0;
    }
    if (rc == 0)
        return herr_set(err, HERR_CONFIG,
                        "unknown key '%s' (not a run field, a result field or a config key "
                        "of any recorded run)", name);
    if ((rc = key_join(q, name, &idx, err)) < 0)
        return rc;
    out->key = (int)idx;
    return 0;
}

int qsql_is_config_key(qsql *q, const char *name, hearth_err *err)
{
    qref r;
    int rc = resolve(q, name, &r, err);
    return rc ? rc : r.field == NULL;
}

/* The static type of a reference. */
static stype ref_type(const qsql *q, const qref *r)
{
    if (r->field) {
        switch (r->field->kind) {
        case FIELD_INT:
        case FIELD_REAL: return T_NUM;
        case FIELD_TEXT:
        case FIELD_JSON: return T_STR;
        case FIELD_ANY: return T_ANY;
        }
        return T_ANY;
    }
    int t = q->keys[r->key].types & ~CFG_T_NULL;
    if (t == 0)
        return T_NULL;
    if (t == CFG_T_NUM)
        return T_NUM;
    if ((t & ~(CFG_T_STR | CFG_T_JSON)) == 0)
        return T_STR;
    if (t == CFG_T_BOOL)
        return T_BOOL;
    return T_ANY;
}

/* SQL for reference r read as type `want` (T_NUM, T_STR or T_BOOL); values of another
 * type read as NULL. */
static void ref_sql(sbuf *b, const qref *r, stype want)
{
    if (r->field) {
        if (r->field->kind != FIELD_ANY) {
            sb_add(b, "%s", r->field->sql);
            return;
        }
        if (want == T_NUM)
            sb_add(b, "(CASE WHEN typeof(%s) IN ('integer', 'real') THEN %s END)",
                   r->field->sql, r->field->sql);
        else if (want == T_STR)
            sb_add(b, "(CASE WHEN typeof(%s) = 'text' THEN %s END)", r->field->sql,
                   r->field->sql);
        else
            sb_add(b, "NULL");
        return;
    }
    sb_add(b, "k%d.%s", r->key, want == T_NUM ? "num" : want == T_STR ? "txt" : "flag");
}

/* ---- expression compilation ------------------------------------------------------------ */

typedef struct {
    qsql *q;
    hearth_err *err;
    int err_col;
    int dry;                        /* checking only: no parameters are recorded */
    const expr_node *const *noindex;   /* comparisons whose key must not use an index */
    size_t n_noindex;
} cctx;

/* A parameter for the statement being compiled (a dummy number when dry). */
static int cbind(cctx *c, bind_kind kind, int64_t i, double d, const char *s)
{
    return c->dry ? 1 : bind_add(c->q, kind, i, d, s);
}

static int is_noindex(const cctx *c, const expr_node *e)
{
    for (size_t i = 0; i < c->n_noindex; i++)
        if (c->noindex[i] == e)
            return 1;
    return 0;
}

static int cfail(cctx *c, int col, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int cfail(cctx *c, int col, int code, const char *fmt, ...)
{
    c->err_col = col;
    if (c->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err->msg, sizeof c->err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

static const char *stype_name(stype t)
{
    switch (t) {
    case T_NUM: return "number";
    case T_STR: return "string";
    case T_BOOL: return "bool";
    case T_NULL: return "null";
    case T_ANY: break;
    }
    return "value";
}

static int infer(cctx *c, const expr_node *e, stype *out);

/* Static types of a binary node's two operands, left first. */
static int infer_operands(cctx *c, const expr_node *e, stype *l, stype *r)
{
    int rc = infer(c, e->lhs, l);
    return rc ? rc : infer(c, e->rhs, r);
}

/* Static type of a node; resolves (and joins) keys on the way. */
static int infer(cctx *c, const expr_node *e, stype *out)
{
    switch (e->kind) {
    case EXPR_NUM: *out = T_NUM; return 0;
    case EXPR_STR: *out = T_STR; return 0;
    case EXPR_BOOL: *out = T_BOOL; return 0;
    case EXPR_KEY: {
        qref r;
        int rc = resolve(c->q, e->str, &r, c->err);
        if (rc) {
            c->err_col = e->col;
            return rc;
        }
        *out = ref_type(c->q, &r);
        return 0;
    }
    case EXPR_UNARY:
        if (e->op == EXPR_OP_NOT) {
            *out = T_BOOL;
        } else {
            stype t;
            int rc = infer(c, e->lhs, &t);
            if (rc)
                return rc;
            if (t == T_STR || t == T_BOOL)
                return cfail(c, e->col, HERR_CONFIG, "unary '-' needs a number, got a %s",
                             stype_name(t));
            *out = t == T_NULL ? T_NULL : T_NUM;
        }
        return 0;
    case EXPR_BINARY:
        if (expr_op_class(e->op) == 3) {
            stype l, r;
            int rc = infer_operands(c, e, &l, &r);
            if (rc)
                return rc;
            if (l == T_STR || l == T_BOOL || r == T_STR || r == T_BOOL)
                return cfail(c, e->col, HERR_CONFIG, "'%s' needs numbers, got %s and %s",
                             expr_op_name(e->op), stype_name(l), stype_name(r));
            *out = (l == T_NULL || r == T_NULL) ? T_NULL : T_NUM;
            return 0;
        }
        *out = T_BOOL;
        return 0;
    }
    return cfail(c, e->col, HERR_CONFIG, "bad expression node");
}

static int compile(cctx *c, const expr_node *e, stype want, sbuf *b);

/* A condition operand (of and/or/not, or the whole filter): must be a bool. */
static int compile_cond(cctx *c, const expr_node *e, const expr_node *op, sbuf *b)
{
    stype t;
    int rc = infer(c, e, &t);
    if (rc)
        return rc;
    if (t == T_NUM || t == T_STR) {
        if (op)
            return cfail(c, op->col, HERR_CONFIG, "'%s' needs a condition (true/false), got a %s",
                         expr_op_name(op->op), stype_name(t));
        return cfail(c, e->col, HERR_CONFIG, "expected a condition (true/false), got a %s",
                     stype_name(t));
    }
    return compile(c, e, T_BOOL, b);
}

/* Whether a bool-valued node can be null in SQL although the language says it is a
 * definite true/false (comparisons and logic): those are wrapped in coalesce(.., 0) where
 * null and false differ (operands of not, == and !=). */
static int is_condition_node(const expr_node *e)
{
    return (e->kind == EXPR_UNARY && e->op == EXPR_OP_NOT) ||
           (e->kind == EXPR_BINARY && expr_op_class(e->op) != 3);
}

static const char *sql_cmp(expr_op op)
{
    switch (op) {
    case EXPR_OP_EQ: return "=";
    case EXPR_OP_NE: return "<>";
    case EXPR_OP_LT: return "<";
    case EXPR_OP_LE: return "<=";
    case EXPR_OP_GT: return ">";
    default: return ">=";
    }
}

/* An operand of a comparison read as type t.  A condition compared with == / != must be a
 * definite 0/1, as in the language, not SQL's null. */
static int compile_operand(cctx *c, const expr_node *e, stype t, sbuf *b)
{
    if (t != T_BOOL || !is_condition_node(e))
        return compile(c, e, t, b);
    sb_add(b, "coalesce(");
    int rc = compile(c, e, t, b);
    sb_add(b, ", 0)");
    return rc;
}

static int compile_cmp(cctx *c, const expr_node *e, sbuf *b)
{
    stype l, r;
    int rc = infer_operands(c, e, &l, &r);
    if (rc)
        return rc;
    int ordering = e->op != EXPR_OP_EQ && e->op != EXPR_OP_NE;
    if (l == T_NULL || r == T_NULL) {   /* a key that never held a value: never true */
        sb_add(b, "0");
        return 0;
    }
    if (l != T_ANY && r != T_ANY && l != r)
        return cfail(c, e->col, HERR_CONFIG, "'%s' cannot compare a %s with a %s",
                     expr_op_name(e->op), stype_name(l), stype_name(r));
    stype t = l != T_ANY ? l : r;
    if (t == T_BOOL && ordering)
        return cfail(c, e->col, HERR_CONFIG, "'%s' needs numbers or strings, got bools",
                     expr_op_name(e->op));
    if (t != T_ANY) {
        /* A unary + keeps SQLite from using an index for this term (plan() decided
         * that another term drives the query). */
        int plus = is_noindex(c, e);
        sb_add(b, "(%s", plus && e->lhs->kind == EXPR_KEY ? "+" : "");
        if ((rc = compile_operand(c, e->lhs, t, b)))
            return rc;
        sb_add(b, " %s %s", sql_cmp(e->op), plus && e->rhs->kind == EXPR_KEY ? "+" : "");
        if ((rc = compile_operand(c, e->rhs, t, b)))
            return rc;
        sb_add(b, ")");
        return 0;
    }
    /* Two keys of mixed types: they match when they hold comparable values of one type. */
    static const stype kinds[] = {T_NUM, T_STR, T_BOOL};
    sb_add(b, "(");
    for (int i = 0; i < (ordering ? 2 : 3); i++) {
        if (i)
            sb_add(b, " OR ");
        sb_add(b, "(");
        if ((rc = compile(c, e->lhs, kinds[i], b)))
            return rc;
        sb_add(b, " %s ", sql_cmp(e->op));
        if ((rc = compile(c, e->rhs, kinds[i], b)))
            return rc;
        sb_add(b, ")");
    }
    sb_add(b, ")");
    return 0;
}

/* Emits SQL for `e` read as type `want` (the caller has checked that e can be one). */
static int compile(cctx *c, const expr_node *e, stype want, sbuf *b)
{
    int rc, n;
    switch (e->kind) {
    case EXPR_NUM:
        if (e->is_int && fabs(e->num) < 9.0e15)
            n = cbind(c, B_INT, (int64_t)e->num, 0, NULL);
        else
            n = cbind(c, B_REAL, 0, e->num, NULL);
        if (!n)
            return cfail(c, e->col, HERR_NOMEM, "out of memory");
        sb_add(b, "?%d", n);
        return 0;
    case EXPR_STR:
        if (!(n = cbind(c, B_TEXT, 0, 0, e->str)))
            return cfail(c, e->col, HERR_NOMEM, "out of memory");
        sb_add(b, "?%d", n);
        return 0;
    case EXPR_BOOL:
        if (!(n = cbind(c, B_INT, e->boolean ? 1 : 0, 0, NULL)))
            return cfail(c, e->col, HERR_NOMEM, "out of memory");
        sb_add(b, "?%d", n);
        return 0;
    case EXPR_KEY: {
        qref r;
        if ((rc = resolve(c->q, e->str, &r, c->err))) {
            c->err_col = e->col;
            return rc;
        }
        if (ref_type(c->q, &r) == T_NULL)
            sb_add(b, "NULL");
        else
            ref_sql(b, &r, want);
        return 0;
    }
    case EXPR_UNARY:
        if (e->op == EXPR_OP_NOT) {
            sb_add(b, "(NOT coalesce(");
            if ((rc = compile_cond(c, e->lhs, e, b)))
                return rc;
            sb_add(b, ", 0))");
            return 0;
        }
        sb_add(b, "(- ");
        if ((rc = compile(c, e->lhs, T_NUM, b)))
            return rc;
        sb_add(b, ")");
        return 0;
    case EXPR_BINARY:
        break;
    }
    int cls = expr_op_class(e->op);
    if (cls == 2) {
        sb_add(b, "(");
        if ((rc = compile_cond(c, e->lhs, e, b)))
            return rc;
        sb_add(b, e->op == EXPR_OP_AND ? " AND " : " OR ");
        if ((rc = compile_cond(c, e->rhs, e, b)))
            return rc;
        sb_add(b, ")");
        return 0;
    }
    if (cls == 1)
        return compile_cmp(c, e, b);
    stype t;
    if ((rc = infer(c, e, &t)))   /* checks the operand types */
        return rc;
    if (t == T_NULL) {
        sb_add(b, "NULL");
        return 0;
    }
    sb_add(b, e->op == EXPR_OP_DIV ? "(CAST(" : "(");
    if ((rc = compile(c, e->lhs, T_NUM, b)))
        return rc;
    switch (e->op) {
    case EXPR_OP_ADD: sb_add(b, " + "); break;
    case EXPR_OP_SUB: sb_add(b, " - "); break;
    case EXPR_OP_MUL: sb_add(b, " * "); break;
    case EXPR_OP_DIV: sb_add(b, " AS REAL) / "); break;
    default: sb_add(b, " %% "); break;
    }
    if ((rc = compile(c, e->rhs, T_NUM, b)))
        return rc;
    sb_add(b, ")");
    return 0;
}

int qsql_filter(qsql *q, const char *expr_text, const char *name, hearth_err *err)
{
    if (!expr_text)
        return 0;
    const char *p = expr_text;
    while (*p == ' ' || *p == '\t' || *p == '\n')
        p++;
    if (!*p)
        return 0;
    if (q->n_filters == QSQL_MAX_FILTERS)
        return herr_set(err, HERR_CONFIG, "too many filters");
    expr_node *e;
    int rc = expr_parse(expr_text, name, &e, NULL, err);
    if (rc)
        return rc;
    /* Compiled once now for its errors (types, unknown keys); again by qsql_prepare. */
    cctx c = {q, err, 0, 1, NULL, 0};
    sbuf b = {0};
    rc = compile_cond(&c, e, NULL, &b);
    if (rc == 0 && b.oom)
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    free(b.s);
    if (rc) {
        expr_free(e);
        if (name && c.err_col)
            herr_prefix(err, rc, "%s:1:%d", name, c.err_col);
        return rc;
    }
    q->filters[q->n_filters++] = e;
    return 0;
}

static int set_str(char **dst, const char *s, hearth_err *err)
{
    free(*dst);
    *dst = strdup(s ? s : "");
    return *dst ? 0 : herr_set(err, HERR_NOMEM, "out of memory");
}

int qsql_experiment(qsql *q, const char *experiment, hearth_err *err)
{
    return set_str(&q->experiment, experiment, err);
}

void qsql_hide_archived(qsql *q)
{
    q->hide_archived = 1;
}

int qsql_state(qsql *q, const char *state, hearth_err *err)
{
    return set_str(&q->state, state, err);
}

/* ---- columns and order ------------------------------------------------------------------ */

int qsql_column(qsql *q, const char *name, const char *label, hearth_err *err)
{
    qref r;
    int rc = resolve(q, name, &r, err);
    if (rc)
        return rc;
    if (q->n_cols == q->cap_cols) {
        size_t cap = q->cap_cols ? 2 * q->cap_cols : 16;
        qcol *nc = realloc(q->cols, cap * sizeof *nc);
        if (!nc)
            return herr_set(err, HERR_NOMEM, "out of memory");
        q->cols = nc;
        char **nl = realloc(q->labels, cap * sizeof *nl);
        if (!nl)
            return herr_set(err, HERR_NOMEM, "out of memory");
        q->labels = nl;
        q->cap_cols = cap;
    }
    if (!(q->labels[q->n_cols] = strdup(label ? label : name)))
        return herr_set(err, HERR_NOMEM, "out of memory");
    q->cols[q->n_cols].ref = r;
    q->cols[q->n_cols].first = 1 + q->n_sql_cols;
    q->n_sql_cols += r.field ? 1 : 3;
    q->n_cols++;
    return 0;
}

static char *trim_dup(const char *s, size_t n)
{
    while (n && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    return strndup(s, n);
}

int qsql_columns(qsql *q, const char *list, const char *what, hearth_err *err)
{
    const char *p = list;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char *name = trim_dup(p, n);
        if (!name)
            return herr_set(err, HERR_NOMEM, "out of memory");
        int rc = 0;
        if (!*name)
            rc = herr_set(err, HERR_CONFIG, "%s: empty column name in '%s'", what, list);
        else if ((rc = qsql_column(q, name, NULL, err)))
            herr_prefix(err, rc, "%s", what);
        free(name);
        if (rc)
            return rc;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

/* SQL that orders by reference r. */
static void order_sql(qsql *q, const qref *r, int desc)
{
    const char *dir = desc ? "DESC" : "ASC";
    if (r->field) {
        sb_add(&q->order, ", %s %s NULLS LAST", r->field->sql, dir);
        return;
    }
    stype t = ref_type(q, r);
    if (t == T_NUM || t == T_STR || t == T_BOOL) {
        sb_add(&q->order, ", ");
        ref_sql(&q->order, r, t);
        sb_add(&q->order, " %s NULLS LAST", dir);
    } else {   /* mixed types: SQLite orders numbers before text */
        sb_add(&q->order, ", coalesce(k%d.num, k%d.txt, k%d.flag) %s NULLS LAST", r->key,
               r->key, r->key, dir);
    }
}

static int order_common(qsql *q, const char *spec, const char *what, int best,
                        hearth_err *err)
{
    const char *name = spec;
    int sign = 0;
    if (*name == '-' || *name == '+') {
        sign = *name == '-' ? -1 : 1;
        name++;
    }
    char *n = trim_dup(name, strlen(name));
    if (!n)
        return herr_set(err, HERR_NOMEM, "out of memory");
    qref r;
    int rc = *n ? resolve(q, n, &r, err) : herr_set(err, HERR_CONFIG, "empty key");
    free(n);
    if (rc)
        return herr_prefix(err, rc, "%s", what);
    int desc;
    if (sign)
        desc = sign < 0;
    else if (best)
        desc = !(r.field && r.field->better < 0);
    else
        desc = 0;
    order_sql(q, &r, desc);
    if (!q->order_set) {
        q->order_first = r;
        q->order_first_desc = desc;
        q->order_set = 1;
    }
    return q->order.oom ? herr_set(err, HERR_NOMEM, "out of memory") : 0;
}

int qsql_order(qsql *q, const char *spec, const char *what, hearth_err *err)
{
    return order_common(q, spec, what, 0, err);
}

int qsql_order_best(qsql *q, const char *spec, const char *what, hearth_err *err)
{
    return order_common(q, spec, what, 1, err);
}

void qsql_limit(qsql *q, long limit)
{
    q->limit = limit;
}

void qsql_probe_cap(qsql *q, long cap)
{
    q->probe_cap = cap < 0 ? 0 : cap;
}

/* ---- the statement ---------------------------------------------------------------------- */

/* ---- planning ------------------------------------------------------------------------------
 *
 * Without histograms (this SQLite has no STAT4) the planner cannot tell that
 * "tokens_per_s > 9900" matches 1% of the runs and "parallel.tp == 4" a quarter, and over a
 * million runs the wrong choice costs a hundred milliseconds or more.  So before running a
 * query, each top-level conjunct of the form `KEY op literal` on an indexed column (a
 * result field with an index, a config key) and the experiment restriction are probed:
 * their matching index entries are counted, up to PROBE_CAP.  The smallest one under the cap
 * drives the query: its table becomes the outer loop (the left side of a CROSS JOIN, which
 * SQLite never reorders) and the other comparisons are written with a unary + (which keeps
 * SQLite from using an index for them).  When none is under the cap but the query walks an
 * indexed result field in descending order with a limit, results become the outer loop so
 * that SQLite walks that index and stops at the limit.  Otherwise SQLite decides alone. */

typedef enum { DRIVE_ANY = 0, DRIVE_RESULTS, DRIVE_KEY, DRIVE_EXPERIMENT } drive_kind;

typedef struct {
    drive_kind kind;
    int key;                 /* DRIVE_KEY: the key's join */
    const expr_node *noindex[32];
    size_t n_noindex;
} qplan;

typedef struct {
    const expr_node *leaf;   /* the comparison; NULL for the experiment (and state) */
    qref ref;
    stype t;
    expr_op op;              /* with the key on the left */
    const expr_node *lit;
    long count;
} cand;

static void conjuncts(const expr_node *e, const expr_node **out, size_t *n, size_t max)
{
    if (e->kind == EXPR_BINARY && e->op == EXPR_OP_AND) {
        conjuncts(e->lhs, out, n, max);
        conjuncts(e->rhs, out, n, max);
    } else if (*n < max) {
        out[(*n)++] = e;
    }
}

/* Marks the joins read by value expression e (keys under arithmetic) as inner joins: a
 * missing row makes the value null and the conjunct false, so no run is lost. */
static void mark_inner(qsql *q, const expr_node *e)
{
    if (e->kind == EXPR_KEY) {
        qref r;
        if (resolve(q, e->str, &r, NULL) == 0) {
            if (!r.field)
                q->key_inner[r.key] = 1;
            else if (strncmp(r.field->sql, "res.", 4) == 0)
                q->res_inner = 1;
        }
    } else if (e->kind == EXPR_UNARY && e->op == EXPR_OP_NEG) {
        mark_inner(q, e->lhs);
    } else if (e->kind == EXPR_BINARY && expr_op_class(e->op) == 3) {
        mark_inner(q, e->lhs);
        mark_inner(q, e->rhs);
    }
}

static expr_op flip(expr_op op)
{
    switch (op) {
    case EXPR_OP_LT: return EXPR_OP_GT;
    case EXPR_OP_LE: return EXPR_OP_GE;
    case EXPR_OP_GT: return EXPR_OP_LT;
    case EXPR_OP_GE: return EXPR_OP_LE;
    default: return op;
    }
}

/* Fills *c when conjunct e can be probed and driven by an index. */
static int as_candidate(qsql *q, const expr_node *e, cand *c)
{
    if (e->kind != EXPR_BINARY || expr_op_class(e->op) != 1 || e->op == EXPR_OP_NE)
        return 0;
    const expr_node *key = e->lhs, *lit = e->rhs;
    expr_op op = e->op;
    if (key->kind != EXPR_KEY) {
        key = e->rhs;
        lit = e->lhs;
        op = flip(op);
    }
    if (key->kind != EXPR_KEY || (lit->kind != EXPR_NUM && lit->kind != EXPR_STR &&
                                  lit->kind != EXPR_BOOL))
        return 0;
    memset(c, 0, sizeof *c);
    if (resolve(q, key->str, &c->ref, NULL))
        return 0;
    c->t = ref_type(q, &c->ref);
    stype lt = lit->kind == EXPR_NUM ? T_NUM : lit->kind == EXPR_STR ? T_STR : T_BOOL;
    if (c->t != lt || (lt == T_BOOL && op != EXPR_OP_EQ))
        return 0;
    if (c->ref.field && (!c->ref.field->indexed || strncmp(c->ref.field->sql, "res.", 4) != 0))
        return 0;
    c->leaf = e;
    c->op = op;
    c->lit = lit;
    return 1;
}

static void bind_literal(sqlite3_stmt *st, int i, const expr_node *lit)
{
    if (lit->kind == EXPR_STR)
        sqlite3_bind_text(st, i, lit->str, -1, SQLITE_STATIC);
    else if (lit->kind == EXPR_BOOL)
        sqlite3_bind_int(st, i, lit->boolean != 0);
    else if (lit->is_int && fabs(lit->num) < 9.0e15)
        sqlite3_bind_int64(st, i, (sqlite3_int64)lit->num);
    else
        sqlite3_bind_double(st, i, lit->num);
}

/* Counts c's matching index entries, at most `cap`. */
static int probe(qsql *q, cand *c, long cap, hearth_err *err)
{
    char sql[320];
    if (!c->leaf)
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM (SELECT 1 FROM runs WHERE experiment_id = "
                 "(SELECT id FROM experiments WHERE name = ?1)%s LIMIT ?2)",
                 q->state ? " AND state = ?3" : "");
    else if (c->ref.field)   /* the column name of a whitelisted result field */
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM (SELECT 1 FROM results WHERE %s %s ?1 LIMIT ?2)",
                 c->ref.field->name, sql_cmp(c->op));
    else
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM (SELECT 1 FROM run_config_kv WHERE key_id = ?3 "
                 "AND %s %s ?1 LIMIT ?2)",
                 c->t == T_NUM ? "num" : c->t == T_STR ? "txt" : "flag", sql_cmp(c->op));
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db_sqlite(q->db), sql, -1, &st, NULL) != SQLITE_OK)
        return db_fail(q->db, err, "planning a query");
    if (!c->leaf) {
        sqlite3_bind_text(st, 1, q->experiment, -1, SQLITE_STATIC);
        if (q->state)
            sqlite3_bind_text(st, 3, q->state, -1, SQLITE_STATIC);
    } else {
        bind_literal(st, 1, c->lit);
        if (!c->ref.field)
            sqlite3_bind_int64(st, 3, q->keys[c->ref.key].id);
    }
    sqlite3_bind_int64(st, 2, cap);
    int rc = 0;
    if (sqlite3_step(st) == SQLITE_ROW)
        c->count = sqlite3_column_int64(st, 0);
    else
        rc = db_fail(q->db, err, "planning a query");
    sqlite3_finalize(st);
    return rc;
}

#define MAX_CANDS 32

/* Decides the join kinds, the outer loop and which comparisons must not use an index. */
static int plan(qsql *q, qplan *p, hearth_err *err)
{
    const expr_node *conj[64];
    size_t n_conj = 0;
    for (size_t i = 0; i < q->n_filters; i++)
        conjuncts(q->filters[i], conj, &n_conj, 64);
    cand cands[MAX_CANDS];
    size_t n = 0;
    for (size_t i = 0; i < n_conj; i++) {
        const expr_node *e = conj[i];
        if (e->kind == EXPR_KEY) {
            mark_inner(q, e);
        } else if (e->kind == EXPR_BINARY && expr_op_class(e->op) == 1) {
            mark_inner(q, e->lhs);
            mark_inner(q, e->rhs);
        }
        if (n < MAX_CANDS && as_candidate(q, e, &cands[n]))
            n++;
    }
    if (q->experiment && n < MAX_CANDS) {
        memset(&cands[n], 0, sizeof cands[n]);
        n++;
    }
    memset(p, 0, sizeof *p);
    long best = -1;
    /* Each probe only needs to count up to the best so far. */
    for (size_t i = 0; i < n; i++) {
        int rc = probe(q, &cands[i], best < 0 ? q->probe_cap : cands[best].count, err);
        if (rc)
            return rc;
        if (best < 0 || cands[i].count < cands[best].count)
            best = (long)i;
    }
    /* Descending, missing values last: the index order read backwards.  Only when the
     * filter already needs a result row (an inner join), so that the walk loses no run. */
    int walk_order = q->order_set && q->order_first.field && q->order_first.field->indexed &&
                     q->order_first_desc && q->limit > 0 && q->res_inner;
    if (best >= 0 && cands[best].count < q->probe_cap) {
        for (size_t i = 0; i < n; i++)
            if ((long)i != best && cands[i].leaf)
                p->noindex[p->n_noindex++] = cands[i].leaf;
        const cand *b = &cands[best];
        p->kind = !b->leaf ? DRIVE_EXPERIMENT : b->ref.field ? DRIVE_RESULTS : DRIVE_KEY;
        p->key = b->ref.key;
    } else if (walk_order) {
        for (size_t i = 0; i < n; i++)
            if (cands[i].leaf)
                p->noindex[p->n_noindex++] = cands[i].leaf;
        p->kind = DRIVE_RESULTS;
    }
    return 0;
}

/* ---- the statement ---------------------------------------------------------------------- */

int qsql_prepare(qsql *q, sqlite3_stmt **out, hearth_err *err)
{
    *out = NULL;
    for (size_t i = 0; i < q->n_binds; i++)
        free(q->binds[i].s);
    q->n_binds = 0;
    qplan p;
    int rc = plan(q, &p, err);
    if (rc)
        return rc;

    sbuf where = {0};
    cctx c = {q, err, 0, 0, p.noindex, p.n_noindex};
    for (size_t i = 0; i < q->n_filters && rc == 0; i++) {
        sbuf b = {0};
        rc = compile_cond(&c, q->filters[i], NULL, &b);
        /* A condition cut short by a failed allocation must not drop the filter. */
        if (rc == 0 && b.oom)
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        if (rc == 0)
            sb_add(&where, " AND %s", b.s ? b.s : "1");
        free(b.s);
    }
    int n;
    if (rc == 0 && q->experiment) {
        if (!(n = bind_add(q, B_TEXT, 0, 0, q->experiment)))
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        sb_add(&where, " AND e.name = ?%d", n);
    }
    if (rc == 0 && q->state) {
        if (!(n = bind_add(q, B_TEXT, 0, 0, q->state)))
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        sb_add(&where, " AND r.state = ?%d", n);
    }
    /* Every shape of the statement joins experiments as e. */
    if (rc == 0 && q->hide_archived)
        sb_add(&where, " AND e.archived_at IS NULL");

    sbuf s = {0};
    sb_add(&s, "SELECT r.id");
    for (size_t i = 0; i < q->n_cols; i++) {
        const qref *r = &q->cols[i].ref;
        if (r->field)
            sb_add(&s, ", %s", r->field->sql);
        else
            sb_add(&s, ", k%d.num, k%d.txt, k%d.flag", r->key, r->key, r->key);
    }
    /* Key ids are bound too, although they are our own integers. */
    int key_param[QSQL_MAX_KEYS];
    for (size_t i = 0; i < q->n_keys && rc == 0; i++)
        if (!(key_param[i] = bind_add(q, B_INT, q->keys[i].id, 0, NULL)))
            rc = herr_set(err, HERR_NOMEM, "out of memory");
    /* With a driver every inner join is a CROSS JOIN: SQLite keeps the written order, so
     * the driver is the outer loop and every other table is reached by its key. */
    const char *inner = p.kind == DRIVE_ANY ? "JOIN" : "CROSS JOIN";
    switch (p.kind) {
    case DRIVE_RESULTS:
        sb_add(&s, " FROM results res CROSS JOIN runs r ON r.id = res.run"
                   " CROSS JOIN experiments e ON e.id = r.experiment_id");
        break;
    case DRIVE_KEY:
        sb_add(&s, " FROM run_config_kv k%d CROSS JOIN runs r ON r.id = k%d.run AND "
                   "k%d.key_id = ?%d CROSS JOIN experiments e ON e.id = r.experiment_id",
               p.key, p.key, p.key, rc ? 0 : key_param[p.key]);
        break;
    case DRIVE_EXPERIMENT:
        sb_add(&s, " FROM experiments e CROSS JOIN runs r ON r.experiment_id = e.id");
        break;
    default:
        sb_add(&s, " FROM runs r JOIN experiments e ON e.id = r.experiment_id");
        break;
    }
    if (p.kind != DRIVE_RESULTS)
        sb_add(&s, " %s results res ON res.run = r.id", q->res_inner ? inner : "LEFT JOIN");
    for (size_t i = 0; i < q->n_keys && rc == 0; i++) {
        if (p.kind == DRIVE_KEY && (int)i == p.key)
            continue;
        sb_add(&s, " %s run_config_kv k%zu ON k%zu.run = r.id AND k%zu.key_id = ?%d",
               q->key_inner[i] ? inner : "LEFT JOIN", i, i, i, key_param[i]);
    }
    sb_add(&s, " WHERE 1%s ORDER BY %s%sr.id", where.s ? where.s : "",
           q->order.s ? q->order.s + 2 : "", q->order.s ? ", " : "");
    if (rc == 0 && q->limit > 0) {
        if (!(n = bind_add(q, B_INT, q->limit, 0, NULL)))
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        sb_add(&s, " LIMIT ?%d", n);
    }
    free(where.s);
    if (rc == 0 && (s.oom || where.oom || q->order.oom))
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    if (rc) {
        free(s.s);
        return rc;
    }
    free(q->sql);
    q->sql = s.s;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db_sqlite(q->db), q->sql, -1, &st, NULL) != SQLITE_OK)
        return db_fail(q->db, err, "preparing a query");
    for (size_t i = 0; i < q->n_binds; i++) {
        const qbind *b = &q->binds[i];
        int k = (int)i + 1;
        if (b->kind == B_INT)
            sqlite3_bind_int64(st, k, b->i);
        else if (b->kind == B_REAL)
            sqlite3_bind_double(st, k, b->d);
        else
            sqlite3_bind_text(st, k, b->s, -1, SQLITE_STATIC);
    }
    *out = st;
    return 0;
}

size_t qsql_ncols(const qsql *q) { return q->n_cols; }
const char *const *qsql_labels(const qsql *q) { return (const char *const *)q->labels; }
const char *qsql_text(const qsql *q) { return q->sql; }

static void cell_from(sqlite3_stmt *st, int i, report_cell *c, int json_text)
{
    memset(c, 0, sizeof *c);
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_INTEGER:
        c->kind = CELL_INT;
        c->i = sqlite3_column_int64(st, i);
        break;
    case SQLITE_FLOAT:
        c->kind = CELL_REAL;
        c->d = sqlite3_column_double(st, i);
        break;
    case SQLITE_NULL:
        c->kind = CELL_NULL;
        break;
    default:
        c->kind = json_text ? CELL_JSON : CELL_TEXT;
        c->s = (const char *)sqlite3_column_text(st, i);
        break;
    }
}

void qsql_cells(const qsql *q, sqlite3_stmt *st, report_cell *cells)
{
    for (size_t i = 0; i < q->n_cols; i++) {
        const qcol *col = &q->cols[i];
        int k = col->first;
        if (col->ref.field) {
            cell_from(st, k, &cells[i], col->ref.field->kind == FIELD_JSON);
            continue;
        }
        int types = q->keys[col->ref.key].types;
        if (sqlite3_column_type(st, k + 2) != SQLITE_NULL) {
            memset(&cells[i], 0, sizeof cells[i]);
            cells[i].kind = CELL_BOOL;
            cells[i].i = sqlite3_column_int(st, k + 2) != 0;
        } else if (sqlite3_column_type(st, k) != SQLITE_NULL) {
            cell_from(st, k, &cells[i], 0);
        } else {
            /* Text is JSON (a list) when the key never held a plain string. */
            cell_from(st, k + 1, &cells[i], (types & CFG_T_JSON) && !(types & CFG_T_STR));
        }
    }
}
