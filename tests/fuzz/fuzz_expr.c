/* fuzz_expr.c - libFuzzer target: the expression language (orchestrator/expr.h).
 * Parses the input as an expression; when it parses, type-checks it and evaluates it
 * against a small table of typed keys, so that the evaluator (division, modulo, string
 * comparison, short-circuit) sees every tree the parser accepts. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"

typedef struct {
    const char *key;
    expr_value v;
} fuzz_kv;

static const fuzz_kv fuzz_keys[] = {
    { "train.lr", { EXPR_V_NUM, 1e-3, NULL, 0 } },
    { "parallel.tp", { EXPR_V_NUM, 2, NULL, 0 } },
    { "parallel.pp", { EXPR_V_NUM, 0, NULL, 0 } },
    { "model", { EXPR_V_STR, 0, "tiny-vlm", 0 } },
    { "precision.fp8", { EXPR_V_BOOL, 0, NULL, 1 } },
    { "final_loss", { EXPR_V_NULL, 0, NULL, 0 } },
};
#define FUZZ_NKEYS (sizeof fuzz_keys / sizeof fuzz_keys[0])

static int fuzz_lookup(void *ctx, const char *key, expr_value *out, hearth_err *err)
{
    (void)ctx;
    (void)err;
    for (size_t i = 0; i < FUZZ_NKEYS; i++) {
        if (strcmp(fuzz_keys[i].key, key) == 0) {
            *out = fuzz_keys[i].v;
            return 0;
        }
    }
    return EXPR_UNKNOWN_KEY;
}

static expr_vtype fuzz_type_of(void *ctx, const char *key)
{
    (void)ctx;
    for (size_t i = 0; i < FUZZ_NKEYS; i++)
        if (strcmp(fuzz_keys[i].key, key) == 0)
            return fuzz_keys[i].v.type;
    return EXPR_V_NULL;
}

static int fuzz_count_key(void *ctx, const char *key, int col)
{
    (void)key;
    (void)col;
    (*(int *)ctx)++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* expr_parse takes a C string: stop at the first NUL as any caller would. */
    char *src = malloc(size + 1);
    if (!src)
        return 0;
    memcpy(src, data, size);
    src[size] = '\0';
    expr_node *e = NULL;
    hearth_err err = { { 0 } };
    int col = 0;
    if (expr_parse(src, "fuzz", &e, &col, &err) == 0) {
        int nkeys = 0;
        expr_keys(e, fuzz_count_key, &nkeys);
        expr_vtype t;
        expr_check_types(e, fuzz_type_of, NULL, "fuzz", &t, &col, &err);
        expr_value v;
        expr_eval(e, fuzz_lookup, NULL, "fuzz", &v, &col, &err);
        int b;
        expr_eval_bool(e, fuzz_lookup, NULL, "fuzz", &b, &col, &err);
        expr_free(e);
    }
    expr_value tv;
    expr_value_from_text(src, 0, &tv);
    free(src);
    return 0;
}
