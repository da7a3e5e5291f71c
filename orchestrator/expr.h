/* expr.h - Hearth's small expression language: the spec's `where` and query filters.
 *
 * Grammar (fixed; lowest precedence first):
 *
 *     expr    := or
 *     or      := and ( "or" and )*
 *     and     := not ( "and" not )*
 *     not     := "not" not | cmp
 *     cmp     := add ( ("=="|"!="|"<"|"<="|">"|">=") add )?    -- no chaining: a<b<c is an error
 *     add     := mul ( ("+"|"-") mul )*
 *     mul     := unary ( ("*"|"/"|"%") unary )*
 *     unary   := "-" unary | primary
 *     primary := NUMBER | STRING | "true" | "false" | KEY | "(" expr ")"
 *     NUMBER  := digits [ "." digits ] [ ("e"|"E") ["+"|"-"] digits ]   (also ".5")
 *     STRING  := '...' or "..." ; a backslash escapes the next character
 *     KEY     := IDENT ( "." IDENT )*      IDENT := [A-Za-z_][A-Za-z0-9_]*
 *
 * `and`, `or`, `not`, `true`, `false` are reserved words (as a KEY's first part only).
 *
 * Values are typed: number (double), string, bool, or null (a key that exists but holds no
 * value, e.g. a result field that is missing; comparisons with null are false, arithmetic
 * with null is null, null in a condition counts as false).  Arithmetic needs numbers,
 * `and`/`or`/`not` need bools, == and != need two values of one type, ordering needs two
 * numbers or two strings; anything else is an error naming the column of the operator.
 * `/` is real division; `%` needs integral operands; dividing by zero is an error.
 * `and`/`or` short-circuit, so `pp > 1 and 8 / (pp - 1) > 2` is safe.
 *
 * The text of an expression is never handed to a shell or pasted into SQL: the AST below
 * is what callers walk (the results DB compiles it to parameterised SQL, with literals as
 * bound parameters and keys mapped through its own table of known columns).
 *
 * Errors: functions return 0 or a negative herr_code.  The message has the form
 * "NAME:1:COL: what is wrong" when a NAME is given, else just "what is wrong"; the 1-based
 * column (byte offset + 1 into the expression text) is also returned through `err_col`
 * (may be NULL) so a caller can translate it into a spec file's FILE:LINE:COL. */
#ifndef HEARTH_EXPR_H
#define HEARTH_EXPR_H

#include "shape/err.h"

typedef enum {
    EXPR_NUM = 0,   /* number literal: `num` (`is_int` when written without '.'/exponent) */
    EXPR_STR,       /* string literal: `str`, quotes removed, escapes resolved */
    EXPR_BOOL,      /* true / false: `boolean` */
    EXPR_KEY,       /* dotted key: `str` holds it as written, e.g. "parallel.tp" */
    EXPR_UNARY,     /* `op` is EXPR_OP_NEG or EXPR_OP_NOT; operand in `lhs` */
    EXPR_BINARY,    /* `lhs` `op` `rhs` */
} expr_kind;

typedef enum {
    EXPR_OP_NONE = 0,
    EXPR_OP_ADD, EXPR_OP_SUB, EXPR_OP_MUL, EXPR_OP_DIV, EXPR_OP_MOD,   /* arithmetic */
    EXPR_OP_EQ, EXPR_OP_NE, EXPR_OP_LT, EXPR_OP_LE, EXPR_OP_GT, EXPR_OP_GE,  /* comparison */
    EXPR_OP_AND, EXPR_OP_OR,                                           /* logic */
    EXPR_OP_NEG, EXPR_OP_NOT,                                          /* unary */
} expr_op;

/* One AST node.  Nodes own their children and their `str`; free the root with expr_free. */
typedef struct expr_node {
    expr_kind kind;
    expr_op op;             /* EXPR_UNARY / EXPR_BINARY */
    int col;                /* 1-based column of the node's token (operator, literal, key) */
    double num;             /* EXPR_NUM */
    int is_int;             /* EXPR_NUM: written as an integer */
    int boolean;            /* EXPR_BOOL: 0 or 1 */
    char *str;              /* EXPR_STR, EXPR_KEY */
    struct expr_node *lhs;  /* EXPR_UNARY, EXPR_BINARY */
    struct expr_node *rhs;  /* EXPR_BINARY */
} expr_node;

/* The operator's spelling ("+", "<=", "and", "not", unary "-"), for messages and SQL. */
const char *expr_op_name(expr_op op);
/* 1 for comparisons, 2 for and/or, 3 for arithmetic, 0 otherwise. */
int expr_op_class(expr_op op);

/* Parses `src` into a new AST stored in *out (caller frees with expr_free).  `name` (may be
 * NULL) prefixes messages.  Fails with HERR_CONFIG on a syntax error, HERR_NOMEM. */
int expr_parse(const char *src, const char *name, expr_node **out, int *err_col,
               hearth_err *err);
void expr_free(expr_node *e);

/* Calls fn(ctx, key, col) once per key occurrence, left to right; stops at the first
 * non-zero return and returns it.  Used to check keys when the expression is parsed. */
typedef int (*expr_key_fn)(void *ctx, const char *key, int col);
int expr_keys(const expr_node *e, expr_key_fn fn, void *ctx);

/* A value.  `str` is borrowed: from the AST or from the lookup's storage, valid while the
 * evaluation runs (and afterwards as long as those live). */
typedef enum { EXPR_V_NULL = 0, EXPR_V_NUM, EXPR_V_STR, EXPR_V_BOOL } expr_vtype;
typedef struct {
    expr_vtype type;
    double num;
    const char *str;
    int boolean;
} expr_value;

const char *expr_vtype_name(expr_vtype t);   /* "number", "string", "bool", "null" */

/* Looks up a key: fills *out and returns 0, or returns EXPR_UNKNOWN_KEY when the key is
 * not known (evaluation fails "unknown key 'KEY'"), or a negative herr_code (with err set,
 * which evaluation then prefixes with the key's column). */
#define EXPR_UNKNOWN_KEY 1
typedef int (*expr_lookup_fn)(void *ctx, const char *key, expr_value *out, hearth_err *err);

/* Evaluates `e`.  Type errors, unknown keys, division by zero fail with HERR_CONFIG. */
int expr_eval(const expr_node *e, expr_lookup_fn lookup, void *ctx, const char *name,
              expr_value *out, int *err_col, hearth_err *err);
/* Evaluates a condition: the result must be a bool (null counts as false). */
int expr_eval_bool(const expr_node *e, expr_lookup_fn lookup, void *ctx, const char *name,
                   int *out, int *err_col, hearth_err *err);

/* Checks types without values: `type_of` gives the type a key will have (EXPR_V_NULL when
 * it cannot say: then anything goes for that operand).  Reports the same errors that
 * evaluation would for every point, e.g. comparing a number key with a string, at parse
 * time.  *out_type is the result type (EXPR_V_NULL: unknown). */
typedef expr_vtype (*expr_type_fn)(void *ctx, const char *key);
int expr_check_types(const expr_node *e, expr_type_fn type_of, void *ctx, const char *name,
                     expr_vtype *out_type, int *err_col, hearth_err *err);

/* Types the text of a config value the way the language sees it: when `quoted` is 0,
 * "true"/"false" become bools and text that is entirely a number (strtod, finite)
 * becomes a number; everything else (and all quoted text) is a string pointing at `text`. */
void expr_value_from_text(const char *text, int quoted, expr_value *out);

/* Equality of two values as `==` sees it (numbers numerically, strings bytewise);
 * values of different types are not equal. */
int expr_value_equal(const expr_value *a, const expr_value *b);

#endif
