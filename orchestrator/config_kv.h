/* config_kv.h - the flattened, indexed form of a run's resolved config (table
 * run_config_kv), which query filters and columns read.
 *
 * A config JSON object is flattened to dotted leaf keys ("parallel.encoder.tp"); arrays and
 * empty objects are leaves holding their compact JSON text.  Key names are interned in
 * config_keys together with the set of value types seen for each key. */
#ifndef HEARTH_CONFIG_KV_H
#define HEARTH_CONFIG_KV_H

#include <jansson.h>
#include <stdint.h>

#include "db.h"

/* Value type bits, as stored in config_keys.types. */
enum {
    CFG_T_NUM = 1,
    CFG_T_STR = 2,
    CFG_T_BOOL = 4,
    CFG_T_JSON = 8,   /* array or empty object, stored as text */
    CFG_T_NULL = 16,
};

/* Longest dotted key accepted. */
#define CONFIG_KEY_MAX 512

/* Calls fn once per leaf in document order with the dotted key, the value and its type
 * bit.  A non-zero return from fn stops the walk and is returned.  `config` must be an
 * object; a key longer than CONFIG_KEY_MAX fails with HERR_CONFIG. */
typedef int (*config_leaf_fn)(void *ctx, const char *key, json_t *value, int type,
                              hearth_err *err);
int config_flatten(json_t *config, config_leaf_fn fn, void *ctx, hearth_err *err);

/* The type bit of a JSON value. */
int config_value_type(const json_t *v);

/* Inserts the flattened config of run `run_pk` (runs.id).  Call inside a transaction. */
int config_kv_insert(hearth_db *db, int64_t run_pk, json_t *config, hearth_err *err);

/* Looks a key up in config_keys: returns 1 and fills id/types when it exists, 0 when not,
 * or a negative herr_code. */
int config_key_find(hearth_db *db, const char *key, int64_t *id, int *types, hearth_err *err);

#endif
