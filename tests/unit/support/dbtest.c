/* dbtest.c - the cmocka-free part of dbtest.h (nothing here calls cmocka, so the bench,
 * which links this file without cmocka, still links). */
#include "tests/unit/support/dbtest.h"

#include <stdio.h>

void dbt_random_hash(tu_rng *r, char out[65])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 64; i++)
        out[i] = hex[tu_next(r) & 15];
    out[64] = '\0';
}

void dbt_flatten(json_t *o, const char *prefix, json_t *out)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        char key[600];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", k);
        if (json_is_object(v) && json_object_size(v))
            dbt_flatten(v, key, out);
        else
            json_object_set(out, key, v);
    }
}
