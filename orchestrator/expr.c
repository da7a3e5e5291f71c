/* expr.c - lexer, recursive-descent parser and typed evaluator of the expression language.
 * The grammar and the typing rules are documented in expr.h. */
#include "expr.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deep trees would make the recursive evaluator (and expr_free) use unbounded stack:
 * a chain like 1+1+1+... nests to the left.  Real filters are a few dozen nodes. */
#define EXPR_MAX_HEIGHT 512

typedef enum {
    T_END = 0, T_NUM, T_STR, T_KEY, T_TRUE, T_FALSE, T_AND, T_OR, T_NOT,
    T_LPAREN, T_RPAREN, T_PLUS, T_MINUS, T_STAR, T_SLASH, T_PERCENT,
    T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE,
} tok_kind;

typedef struct {
    tok_kind kind;
    int col;            /* 1-based */
    const char *start;  /* into the source */
    size_t len;
    double num;
    int is_int;
    char *str;          /* T_STR: unescaped, T_KEY: the key (malloc'd, handed to a node) */
} token;

typedef struct {
    const char *src;
    size_t pos;
    token tok;          /* the current (look-ahead) token */
    int depth;          /* recursion through '(', unary '-' and 'not' */
    int failed;
    int err_col;
    int err_code;
    char msg[512];
} parser;

static int fail_at(parser *p, int col, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail_at(parser *p, int col, int code, const char *fmt, ...)
{
    if (p->failed)
        return -1;
    p->failed = 1;
    p->err_col = col;
    p->err_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int is_ident_start(int c) { return isalpha(c) || c == '_'; }
static int is_ident_char(int c) { return isalnum(c) || c == '_'; }

/* Describes the current token for "unexpected ..." messages. */
static void tok_describe(const token *t, char *buf, size_t n)
{
    if (t->kind == T_END)
        snprintf(buf, n, "end of expression");
    else
        snprintf(buf, n, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->start);
}

static int lex_string(parser *p, token *t)
{
    const char *s = p->src;
    char quote = s[p->pos];
    size_t i = p->pos + 1;
    size_t cap = 16, n = 0;
    char *out = malloc(cap);
    if (!out)
        return fail_at(p, t->col, HERR_NOMEM, "out of memory");
    for (;;) {
        char c = s[i];
        if (c == '\0') {
            free(out);
            return fail_at(p, t->col, HERR_CONFIG, "unterminated string");
        }
        if (c == quote)
            break;
        if (c == '\\') {
            if (s[i + 1] == '\0') {
                free(out);
                return fail_at(p, t->col, HERR_CONFIG, "unterminated string");
            }
            c = s[++i];
        }
        if (n + 2 > cap) {
            cap *= 2;
            char *grown = realloc(out, cap);
            if (!grown) {
                free(out);
                return fail_at(p, t->col, HERR_NOMEM, "out of memory");
            }
            out = grown;
        }
        out[n++] = c;
        i++;
    }
    out[n] = '\0';
    t->kind = T_STR;
    t->str = out;
    t->len = i + 1 - p->pos;
    p->pos = i + 1;
    return 0;
}

static int lex_number(parser *p, token *t)
{
    const char *s = p->src;
    size_t i = p->pos;
    int is_int = 1;
    while (isdigit((unsigned char)s[i]))
        i++;
    if (s[i] == '.') {
        is_int = 0;
        i++;
        while (isdigit((unsigned char)s[i]))
            i++;
    }
    if ((s[i] == 'e' || s[i] == 'E') &&
        (isdigit((unsigned char)s[i + 1]) ||
         ((s[i + 1] == '+' || s[i + 1] == '-') && isdigit((unsigned char)s[i + 2])))) {
        is_int = 0;
        i += 2;
        while (isdigit((unsigned char)s[i]))
            i++;
    }
    if (is_ident_start((unsigned char)s[i]) || s[i] == '.')
        return fail_at(p, t->col, HERR_CONFIG, "malformed number '%.*s'",
                       (int)(i + 1 - p->pos), s + p->pos);
    char buf[64];
    size_t len = i - p->pos;
    if (len >= sizeof buf)
        return fail_at(p, t->col, HERR_CONFIG, "number too long");
    memcpy(buf, s + p->pos, len);
    buf[len] = '\0';
    t->kind = T_NUM;
    t->num = strtod(buf, NULL);
    t->is_int = is_int;
    if (!isfinite(t->num))
        return fail_at(p, t->col, HERR_CONFIG, "number out of range '%s'", buf);
    t->len = len;
    p->pos = i;
    return 0;
}

static int lex_key(parser *p, token *t)
{
    const char *s = p->src;
    size_t i = p->pos;
    for (;;) {
        while (is_ident_char((unsigned char)s[i]))
            i++;
        if (s[i] != '.')
            break;
        if (!is_ident_start((unsigned char)s[i + 1]))
            return fail_at(p, (int)(i + 2), HERR_CONFIG, "expected a name after '.'");
        i++;
    }
    size_t len = i - p->pos;
    t->len = len;
    static const struct { const char *w; tok_kind k; } words[] = {
        {"and", T_AND}, {"or", T_OR}, {"not", T_NOT}, {"true", T_TRUE}, {"false", T_FALSE},
    };
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
        if (strlen(words[w].w) == len && memcmp(words[w].w, s + p->pos, len) == 0) {
            t->kind = words[w].k;
            p->pos = i;
            return 0;
        }
    }
    t->str = strndup(s + p->pos, len);
    if (!t->str)
        return fail_at(p, t->col, HERR_NOMEM, "out of memory");
    t->kind = T_KEY;
    p->pos = i;
    return 0;
}

/* Reads the next token into p->tok (freeing nothing: the previous token's str, if any, has
 * been taken by a node or freed by the caller). */
static int lex_next(parser *p)
{
    const char *s = p->src;
    while (s[p->pos] == ' ' || s[p->pos] == '\t' || s[p->pos] == '\n' || s[p->pos] == '\r')
        p->pos++;
    token *t = &p->tok;
    memset(t, 0, sizeof *t);
    t->col = (int)p->pos + 1;
    t->start = s + p->pos;
    char c = s[p->pos], d = c ? s[p->pos + 1] : '\0';
    if (c == '\0') {
        /* The end is reported just after the last character written, not after trailing
         * blanks or the newline that ends a YAML block scalar. */
        size_t end = p->pos;
        while (end > 0 && (s[end - 1] == ' ' || s[end - 1] == '\t' || s[end - 1] == '\n' ||
                           s[end - 1] == '\r'))
            end--;
        t->col = (int)end + 1;
        t->kind = T_END;
        return 0;
    }
    if (c == '\'' || c == '"')
        return lex_string(p, t);
    if (isdigit((unsigned char)c) || (c == '.' && isdigit((unsigned char)d)))
        return lex_number(p, t);
    if (is_ident_start((unsigned char)c))
        return lex_key(p, t);
    t->len = 1;
    switch (c) {
    case '(': t->kind = T_LPAREN; break;
    case ')': t->kind = T_RPAREN; break;
    case '+': t->kind = T_PLUS; break;
    case '-': t->kind = T_MINUS; break;
    case '*': t->kind = T_STAR; break;
    case '/': t->kind = T_SLASH; break;
    case '%': t->kind = T_PERCENT; break;
    case '<':
        if (d == '=') { t->kind = T_LE; t->len = 2; } else t->kind = T_LT;
        break;
    case '>':
        if (d == '=') { t->kind = T_GE; t->len = 2; } else t->kind = T_GT;
        break;
    case '=':
        if (d != '=')
            return fail_at(p, t->col, HERR_CONFIG, "'=' is not an operator, use '=='");
        t->kind = T_EQ; t->len = 2;
        break;
    case '!':
        if (d != '=')
            return fail_at(p, t->col, HERR_CONFIG, "'!' is not an operator, use 'not'");
        t->kind = T_NE; t->len = 2;
        break;
    case '&':
        return fail_at(p, t->col, HERR_CONFIG, "'&' is not an operator, use 'and'");
    case '|':
        return fail_at(p, t->col, HERR_CONFIG, "'|' is not an operator, use 'or'");
    default:
        if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f)
            return fail_at(p, t->col, HERR_CONFIG, "unexpected character '%c'", c);
        return fail_at(p, t->col, HERR_CONFIG, "unexpected byte 0x%02x",
                       (unsigned)(unsigned char)c);
    }
    p->pos += t->len;
    return 0;
}

/* Nodes ---------------------------------------------------------------------------------- */

/* The height is kept beside the public node so that the public struct stays plain. */
typedef struct {
    expr_node n;
    int height;
} node_box;

static int height_of(const expr_node *e)
{
    return e ? ((const node_box *)e)->height : 0;
}

static expr_node *node_new(parser *p, expr_kind kind, int col)
{
    node_box *b = calloc(1, sizeof *b);
    if (!b) {
        fail_at(p, col, HERR_NOMEM, "out of memory");
        return NULL;
    }
    b->n.kind = kind;
    b->n.col = col;
    b->height = 1;
    return &b->n;
}

void expr_free(expr_node *e)
{
    if (!e)
        return;
    expr_free(e->lhs);
    expr_free(e->rhs);
    free(e->str);
    free((node_box *)e);
}

static expr_node *node_op(parser *p, expr_kind kind, expr_op op, int col, expr_node *lhs,
                          expr_node *rhs)
{
    int h = 1 + (height_of(lhs) > height_of(rhs) ? height_of(lhs) : height_of(rhs));
    if (h > EXPR_MAX_HEIGHT) {
        fail_at(p, col, HERR_CONFIG, "expression too deeply nested (more than %d levels)",
                EXPR_MAX_HEIGHT);
        expr_free(lhs);
        expr_free(rhs);
        return NULL;
    }
    expr_node *e = node_new(p, kind, col);
    if (!e) {
        expr_free(lhs);
        expr_free(rhs);
        return NULL;
    }
    e->op = op;
    e->lhs = lhs;
    e->rhs = rhs;
    ((node_box *)e)->height = h;
    return e;
}

/* Parser --------------------------------------------------------------------------------- */

static expr_node *parse_or(parser *p);

/* Bounds the parser's own recursion (the height check in node_op comes too late for
 * "((((((...": the stack would be gone before any node is built). */
static int enter(parser *p, int col)
{
    if (++p->depth > EXPR_MAX_HEIGHT)
        return fail_at(p, col, HERR_CONFIG, "expression too deeply nested (more than %d levels)",
                       EXPR_MAX_HEIGHT);
    return 0;
}

static expr_node *parse_primary(parser *p)
{
    token *t = &p->tok;
    expr_node *e = NULL;
    switch (t->kind) {
    case T_NUM:
        if (!(e = node_new(p, EXPR_NUM, t->col)))
            return NULL;
        e->num = t->num;
        e->is_int = t->is_int;
        break;
    case T_STR:
    case T_KEY:
        if (!(e = node_new(p, t->kind == T_STR ? EXPR_STR : EXPR_KEY, t->col)))
            return NULL;
        e->str = t->str;
        t->str = NULL;
        break;
    case T_TRUE:
    case T_FALSE:
        if (!(e = node_new(p, EXPR_BOOL, t->col)))
            return NULL;
        e->boolean = t->kind == T_TRUE;
        break;
    case T_LPAREN: {
        int open_col = t->col;
        if (enter(p, open_col) < 0 || lex_next(p) < 0)
            return NULL;
        e = parse_or(p);
        p->depth--;
        if (!e)
            return NULL;
        if (p->tok.kind != T_RPAREN) {
            char what[64];
            tok_describe(&p->tok, what, sizeof what);
            fail_at(p, p->tok.col, HERR_CONFIG, "expected ')' to close '(' at column %d, got %s",
                    open_col, what);
            expr_free(e);
            return NULL;
        }
        break;
    }
    default: {
        char what[64];
        tok_describe(t, what, sizeof what);
        fail_at(p, t->col, HERR_CONFIG, "expected a value, got %s", what);
        return NULL;
    }
    }
    if (lex_next(p) < 0) {
        expr_free(e);
        return NULL;
    }
    return e;
}

/* A prefix operator at the current token: consumes it and parses its operand with
 * `operand_fn` one nesting level deeper (so long chains hit the depth limit). */
static expr_node *parse_prefix(parser *p, expr_op op, expr_node *(*operand_fn)(parser *))
{
    int col = p->tok.col;
    if (enter(p, col) < 0 || lex_next(p) < 0)
        return NULL;
    expr_node *operand = operand_fn(p);
    p->depth--;
    if (!operand)
        return NULL;
    return node_op(p, EXPR_UNARY, op, col, operand, NULL);
}

static expr_node *parse_unary(parser *p)
{
    if (p->tok.kind == T_MINUS)
        return parse_prefix(p, EXPR_OP_NEG, parse_unary);
    return parse_primary(p);
}

static expr_node *parse_binary_level(parser *p, int level);

/* Levels of left-associative binary operators, from loosest (0) to tightest. */
static expr_op tok_binop(tok_kind k, int level)
{
    switch (level) {
    case 0: return k == T_OR ? EXPR_OP_OR : EXPR_OP_NONE;
    case 1: return k == T_AND ? EXPR_OP_AND : EXPR_OP_NONE;
    case 3:
        return k == T_PLUS ? EXPR_OP_ADD : k == T_MINUS ? EXPR_OP_SUB : EXPR_OP_NONE;
    case 4:
        return k == T_STAR ? EXPR_OP_MUL : k == T_SLASH ? EXPR_OP_DIV
             : k == T_PERCENT ? EXPR_OP_MOD : EXPR_OP_NONE;
    }
    return EXPR_OP_NONE;
}

static expr_op tok_cmpop(tok_kind k)
{
    switch (k) {
    case T_EQ: return EXPR_OP_EQ;
    case T_NE: return EXPR_OP_NE;
    case T_LT: return EXPR_OP_LT;
    case T_LE: return EXPR_OP_LE;
    case T_GT: return EXPR_OP_GT;
    case T_GE: return EXPR_OP_GE;
    default: return EXPR_OP_NONE;
    }
}

/* Skips a binary operator token and parses its right operand at `level`.  On failure
 * it frees `lhs` too (the caller has nothing left to clean up) and returns NULL. */
static expr_node *parse_operand_after_op(parser *p, expr_node *lhs, int level)
{
    expr_node *rhs = lex_next(p) < 0 ? NULL : parse_binary_level(p, level);
    if (!rhs)
        expr_free(lhs);
    return rhs;
}

/* level 2 is `not` + one optional comparison */
static expr_node *parse_not_cmp(parser *p)
{
    if (p->tok.kind == T_NOT)
        return parse_prefix(p, EXPR_OP_NOT, parse_not_cmp);
    expr_node *lhs = parse_binary_level(p, 3);
    if (!lhs)
        return NULL;
    expr_op op = tok_cmpop(p->tok.kind);
    if (op == EXPR_OP_NONE)
        return lhs;
    int col = p->tok.col;
    expr_node *rhs = parse_operand_after_op(p, lhs, 3);
    if (!rhs)
        return NULL;
    if (tok_cmpop(p->tok.kind) != EXPR_OP_NONE) {
        fail_at(p, p->tok.col, HERR_CONFIG,
                "comparisons cannot be chained, join them with 'and'");
        expr_free(lhs);
        expr_free(rhs);
        return NULL;
    }
    return node_op(p, EXPR_BINARY, op, col, lhs, rhs);
}

static expr_node *parse_binary_level(parser *p, int level)
{
    if (level == 2)
        return parse_not_cmp(p);
    if (level == 5)
        return parse_unary(p);
    expr_node *lhs = parse_binary_level(p, level + 1);
    if (!lhs)
        return NULL;
    for (;;) {
        expr_op op = tok_binop(p->tok.kind, level);
        if (op == EXPR_OP_NONE)
            return lhs;
        int col = p->tok.col;
        expr_node *rhs = parse_operand_after_op(p, lhs, level + 1);
        if (!rhs)
            return NULL;
        lhs = node_op(p, EXPR_BINARY, op, col, lhs, rhs);
        if (!lhs)
            return NULL;
    }
}

static expr_node *parse_or(parser *p)
{
    return parse_binary_level(p, 0);
}

/* Formats a failure as documented in expr.h. */
static int report(hearth_err *err, int code, const char *name, int col, const char *msg,
                  int *err_col)
{
    if (err_col)
        *err_col = col;
    if (name)
        return herr_set(err, code, "%s:1:%d: %s", name, col, msg);
    return herr_set(err, code, "%s", msg);
}

int expr_parse(const char *src, const char *name, expr_node **out, int *err_col,
               hearth_err *err)
{
    *out = NULL;
    if (err_col)
        *err_col = 0;
    parser p;
    memset(&p, 0, sizeof p);
    p.src = src ? src : "";
    expr_node *e = NULL;
    if (lex_next(&p) == 0) {
        if (p.tok.kind == T_END) {
            fail_at(&p, p.tok.col, HERR_CONFIG, "empty expression");
        } else {
            e = parse_or(&p);
            if (e && p.tok.kind != T_END) {
                char what[64];
                tok_describe(&p.tok, what, sizeof what);
                if (p.tok.kind == T_RPAREN)
                    fail_at(&p, p.tok.col, HERR_CONFIG, "unmatched ')'");
                else
                    fail_at(&p, p.tok.col, HERR_CONFIG,
                            "expected an operator or the end, got %s", what);
            }
        }
    }
    free(p.tok.str);   /* a look-ahead token that no node took */
    if (p.failed) {
        expr_free(e);
        return report(err, p.err_code, name, p.err_col, p.msg, err_col);
    }
    *out = e;
    return 0;
}

int expr_keys(const expr_node *e, expr_key_fn fn, void *ctx)
{
    if (!e)
        return 0;
    if (e->kind == EXPR_KEY)
        return fn(ctx, e->str, e->col);
    int rc = expr_keys(e->lhs, fn, ctx);
    if (rc)
        return rc;
    return expr_keys(e->rhs, fn, ctx);
}

const char *expr_op_name(expr_op op)
{
    switch (op) {
    case EXPR_OP_ADD: return "+";
    case EXPR_OP_SUB: return "-";
    case EXPR_OP_MUL: return "*";
    case EXPR_OP_DIV: return "/";
    case EXPR_OP_MOD: return "%";
    case EXPR_OP_EQ: return "==";
    case EXPR_OP_NE: return "!=";
    case EXPR_OP_LT: return "<";
    case EXPR_OP_LE: return "<=";
    case EXPR_OP_GT: return ">";
    case EXPR_OP_GE: return ">=";
    case EXPR_OP_AND: return "and";
    case EXPR_OP_OR: return "or";
    case EXPR_OP_NEG: return "-";
    case EXPR_OP_NOT: return "not";
    case EXPR_OP_NONE: break;
    }
    return "?";
}

int expr_op_class(expr_op op)
{
    switch (op) {
    case EXPR_OP_EQ: case EXPR_OP_NE: case EXPR_OP_LT:
    case EXPR_OP_LE: case EXPR_OP_GT: case EXPR_OP_GE:
        return 1;
    case EXPR_OP_AND: case EXPR_OP_OR:
        return 2;
    case EXPR_OP_ADD: case EXPR_OP_SUB: case EXPR_OP_MUL:
    case EXPR_OP_DIV: case EXPR_OP_MOD:
        return 3;
    default:
        return 0;
    }
}

const char *expr_vtype_name(expr_vtype t)
{
    switch (t) {
    case EXPR_V_NUM: return "number";
    case EXPR_V_STR: return "string";
    case EXPR_V_BOOL: return "bool";
    case EXPR_V_NULL: break;
    }
    return "null";
}

/* Evaluation ----------------------------------------------------------------------------- */

typedef struct {
    expr_lookup_fn lookup;
    void *ctx;
    hearth_err *err;
    int err_col;
    int failed;
} evaluator;

static int eval_fail(evaluator *ev, int col, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int eval_fail(evaluator *ev, int col, const char *fmt, ...)
{
    ev->failed = 1;
    ev->err_col = col;
    if (ev->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ev->err->msg, sizeof ev->err->msg, fmt, ap);
        va_end(ap);
    }
    return HERR_CONFIG;
}

static int eval_node(evaluator *ev, const expr_node *e, expr_value *out);

/* A condition operand: bool, or null read as false. */
static int eval_cond(evaluator *ev, const expr_node *e, const expr_node *op_node, int *b)
{
    expr_value v;
    int rc = eval_node(ev, e, &v);
    if (rc)
        return rc;
    if (v.type == EXPR_V_NULL) {
        *b = 0;
        return 0;
    }
    if (v.type != EXPR_V_BOOL)
        return eval_fail(ev, op_node->col, "'%s' needs a condition (true/false), got a %s",
                         expr_op_name(op_node->op), expr_vtype_name(v.type));
    *b = v.boolean;
    return 0;
}

static int is_integral(double x)
{
    return isfinite(x) && x == floor(x);
}

static int eval_binary(evaluator *ev, const expr_node *e, expr_value *out)
{
    expr_op op = e->op;
    if (op == EXPR_OP_AND || op == EXPR_OP_OR) {
        int a, b, rc;
        if ((rc = eval_cond(ev, e->lhs, e, &a)))
            return rc;
        out->type = EXPR_V_BOOL;
        if ((op == EXPR_OP_AND && !a) || (op == EXPR_OP_OR && a)) {
            out->boolean = a;
            return 0;
        }
        if ((rc = eval_cond(ev, e->rhs, e, &b)))
            return rc;
        out->boolean = b;
        return 0;
    }
    expr_value l, r;
    int rc;
    if ((rc = eval_node(ev, e->lhs, &l)) || (rc = eval_node(ev, e->rhs, &r)))
        return rc;
    memset(out, 0, sizeof *out);
    if (expr_op_class(op) == 3) {
        if ((l.type != EXPR_V_NUM && l.type != EXPR_V_NULL) ||
            (r.type != EXPR_V_NUM && r.type != EXPR_V_NULL))
            return eval_fail(ev, e->col, "'%s' needs numbers, got %s and %s",
                             expr_op_name(op), expr_vtype_name(l.type),
                             expr_vtype_name(r.type));
        if (l.type == EXPR_V_NULL || r.type == EXPR_V_NULL) {
            out->type = EXPR_V_NULL;
            return 0;
        }
        out->type = EXPR_V_NUM;
        switch (op) {
        case EXPR_OP_ADD: out->num = l.num + r.num; break;
        case EXPR_OP_SUB: out->num = l.num - r.num; break;
        case EXPR_OP_MUL: out->num = l.num * r.num; break;
        case EXPR_OP_DIV:
            if (r.num == 0)
                return eval_fail(ev, e->col, "division by zero");
            out->num = l.num / r.num;
            break;
        default: /* EXPR_OP_MOD */
            if (!is_integral(l.num) || !is_integral(r.num))
                return eval_fail(ev, e->col, "'%%' needs integers, got %g and %g", l.num,
                                 r.num);
            if (r.num == 0)
                return eval_fail(ev, e->col, "modulo by zero");
            out->num = fmod(l.num, r.num);
            break;
        }
        return 0;
    }
    /* comparison */
    out->type = EXPR_V_BOOL;
    if (l.type == EXPR_V_NULL || r.type == EXPR_V_NULL) {
        out->boolean = 0;
        return 0;
    }
    if (l.type != r.type)
        return eval_fail(ev, e->col, "'%s' cannot compare a %s with a %s", expr_op_name(op),
                         expr_vtype_name(l.type), expr_vtype_name(r.type));
    int c;
    if (l.type == EXPR_V_NUM) {
        c = l.num < r.num ? -1 : l.num > r.num ? 1 : 0;
    } else if (l.type == EXPR_V_STR) {
        c = strcmp(l.str, r.str);
    } else {
        if (op != EXPR_OP_EQ && op != EXPR_OP_NE)
            return eval_fail(ev, e->col, "'%s' needs numbers or strings, got bools",
                             expr_op_name(op));
        c = (l.boolean != 0) != (r.boolean != 0);
    }
    switch (op) {
    case EXPR_OP_EQ: out->boolean = c == 0; break;
    case EXPR_OP_NE: out->boolean = c != 0; break;
    case EXPR_OP_LT: out->boolean = c < 0; break;
    case EXPR_OP_LE: out->boolean = c <= 0; break;
    case EXPR_OP_GT: out->boolean = c > 0; break;
    default: out->boolean = c >= 0; break;
    }
    return 0;
}

static int eval_node(evaluator *ev, const expr_node *e, expr_value *out)
{
    memset(out, 0, sizeof *out);
    switch (e->kind) {
    case EXPR_NUM:
        out->type = EXPR_V_NUM;
        out->num = e->num;
        return 0;
    case EXPR_STR:
        out->type = EXPR_V_STR;
        out->str = e->str;
        return 0;
    case EXPR_BOOL:
        out->type = EXPR_V_BOOL;
        out->boolean = e->boolean;
        return 0;
    case EXPR_KEY: {
        int rc = ev->lookup ? ev->lookup(ev->ctx, e->str, out, ev->err) : EXPR_UNKNOWN_KEY;
        if (rc == EXPR_UNKNOWN_KEY)
            return eval_fail(ev, e->col, "unknown key '%s'", e->str);
        if (rc < 0) {
            ev->failed = 1;
            ev->err_col = e->col;
            return rc;
        }
        if (out->type == EXPR_V_STR && !out->str)
            out->str = "";
        return 0;
    }
    case EXPR_UNARY:
        if (e->op == EXPR_OP_NOT) {
            int b, rc = eval_cond(ev, e->lhs, e, &b);
            if (rc)
                return rc;
            out->type = EXPR_V_BOOL;
            out->boolean = !b;
            return 0;
        } else {
            int rc = eval_node(ev, e->lhs, out);
            if (rc)
                return rc;
            if (out->type == EXPR_V_NULL)
                return 0;
            if (out->type != EXPR_V_NUM)
                return eval_fail(ev, e->col, "unary '-' needs a number, got a %s",
                                 expr_vtype_name(out->type));
            out->num = -out->num;
            return 0;
        }
    case EXPR_BINARY:
        return eval_binary(ev, e, out);
    }
    return eval_fail(ev, e->col, "bad expression node");
}

int expr_eval(const expr_node *e, expr_lookup_fn lookup, void *ctx, const char *name,
              expr_value *out, int *err_col, hearth_err *err)
{
    if (err_col)
        *err_col = 0;
    evaluator ev = {lookup, ctx, err, 0, 0};
    int rc = eval_node(&ev, e, out);
    if (rc) {
        if (err_col)
            *err_col = ev.err_col;
        if (name)
            herr_prefix(err, rc, "%s:1:%d", name, ev.err_col);
        return rc;
    }
    return 0;
}

int expr_eval_bool(const expr_node *e, expr_lookup_fn lookup, void *ctx, const char *name,
                   int *out, int *err_col, hearth_err *err)
{
    expr_value v;
    int rc = expr_eval(e, lookup, ctx, name, &v, err_col, err);
    if (rc)
        return rc;
    if (v.type == EXPR_V_NULL) {
        *out = 0;
        return 0;
    }
    if (v.type != EXPR_V_BOOL) {
        if (err_col)
            *err_col = e->col;
        if (name)
            return herr_set(err, HERR_CONFIG, "%s:1:%d: expected a condition (true/false), "
                            "got a %s", name, e->col, expr_vtype_name(v.type));
        return herr_set(err, HERR_CONFIG, "expected a condition (true/false), got a %s",
                        expr_vtype_name(v.type));
    }
    *out = v.boolean;
    return 0;
}

void expr_value_from_text(const char *text, int quoted, expr_value *out)
{
    memset(out, 0, sizeof *out);
    out->type = EXPR_V_STR;
    out->str = text ? text : "";
    if (quoted || !text || !*text)
        return;
    if (strcmp(text, "true") == 0 || strcmp(text, "false") == 0) {
        out->type = EXPR_V_BOOL;
        out->boolean = text[0] == 't';
        return;
    }
    /* Only decimal numbers: strtod would also take "inf", "nan", hex and leading space. */
    const char *s = text;
    if (*s == '+' || *s == '-')
        s++;
    if (!isdigit((unsigned char)*s) && !(*s == '.' && isdigit((unsigned char)s[1])))
        return;
    char *end;
    double x = strtod(text, &end);
    if (*end != '\0' || !isfinite(x) || strpbrk(text, "xXpP"))
        return;
    out->type = EXPR_V_NUM;
    out->num = x;
}

int expr_value_equal(const expr_value *a, const expr_value *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case EXPR_V_NUM: return a->num == b->num;
    case EXPR_V_STR: return strcmp(a->str, b->str) == 0;
    case EXPR_V_BOOL: return (a->boolean != 0) == (b->boolean != 0);
    case EXPR_V_NULL: return 1;
    }
    return 0;
}

/* Static typing ---------------------------------------------------------------------------
 * Mirrors eval_node with types only; EXPR_V_NULL stands for "not known", which is accepted
 * wherever a value is (null values are accepted at run time too). */

typedef struct {
    expr_type_fn type_of;
    void *ctx;
    int col;
    char msg[256];
} typer;

static int type_fail(typer *t, int col, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int type_fail(typer *t, int col, const char *fmt, ...)
{
    t->col = col;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->msg, sizeof t->msg, fmt, ap);
    va_end(ap);
    return HERR_CONFIG;
}

static int type_node(typer *t, const expr_node *e, expr_vtype *out)
{
    expr_vtype l = EXPR_V_NULL, r = EXPR_V_NULL;
    int rc;
    switch (e->kind) {
    case EXPR_NUM: *out = EXPR_V_NUM; return 0;
    case EXPR_STR: *out = EXPR_V_STR; return 0;
    case EXPR_BOOL: *out = EXPR_V_BOOL; return 0;
    case EXPR_KEY: *out = t->type_of ? t->type_of(t->ctx, e->str) : EXPR_V_NULL; return 0;
    case EXPR_UNARY:
        if ((rc = type_node(t, e->lhs, &l)))
            return rc;
        if (e->op == EXPR_OP_NOT) {
            if (l != EXPR_V_NULL && l != EXPR_V_BOOL)
                return type_fail(t, e->col, "'not' needs a condition (true/false), got a %s",
                                 expr_vtype_name(l));
            *out = EXPR_V_BOOL;
        } else {
            if (l != EXPR_V_NULL && l != EXPR_V_NUM)
                return type_fail(t, e->col, "unary '-' needs a number, got a %s",
                                 expr_vtype_name(l));
            *out = EXPR_V_NUM;
        }
        return 0;
    case EXPR_BINARY:
        break;
    }
    if ((rc = type_node(t, e->lhs, &l)) || (rc = type_node(t, e->rhs, &r)))
        return rc;
    const char *op = expr_op_name(e->op);
    switch (expr_op_class(e->op)) {
    case 2:
        if (l != EXPR_V_NULL && l != EXPR_V_BOOL)
            return type_fail(t, e->col, "'%s' needs a condition (true/false), got a %s", op,
                             expr_vtype_name(l));
        if (r != EXPR_V_NULL && r != EXPR_V_BOOL)
            return type_fail(t, e->col, "'%s' needs a condition (true/false), got a %s", op,
                             expr_vtype_name(r));
        *out = EXPR_V_BOOL;
        return 0;
    case 3:
        if ((l != EXPR_V_NUM && l != EXPR_V_NULL) || (r != EXPR_V_NUM && r != EXPR_V_NULL))
            return type_fail(t, e->col, "'%s' needs numbers, got %s and %s", op,
                             l == EXPR_V_NULL ? "a value" : expr_vtype_name(l),
                             r == EXPR_V_NULL ? "a value" : expr_vtype_name(r));
        *out = EXPR_V_NUM;
        return 0;
    default:
        if (l != EXPR_V_NULL && r != EXPR_V_NULL && l != r)
            return type_fail(t, e->col, "'%s' cannot compare a %s with a %s", op,
                             expr_vtype_name(l), expr_vtype_name(r));
        if ((l == EXPR_V_BOOL || r == EXPR_V_BOOL) && e->op != EXPR_OP_EQ &&
            e->op != EXPR_OP_NE)
            return type_fail(t, e->col, "'%s' needs numbers or strings, got bools", op);
        *out = EXPR_V_BOOL;
        return 0;
    }
}

int expr_check_types(const expr_node *e, expr_type_fn type_of, void *ctx, const char *name,
                     expr_vtype *out_type, int *err_col, hearth_err *err)
{
    typer t = { type_of, ctx, 0, "" };
    expr_vtype v = EXPR_V_NULL;
    int rc = type_node(&t, e, &v);
    if (out_type)
        *out_type = v;
    if (!rc) {
        if (err_col)
            *err_col = 0;
        return 0;
    }
    return report(err, rc, name, t.col, t.msg, err_col);
}
