/* config_kv.c - flattening resolved configs into run_config_kv.  See config_kv.h. */
#include "config_kv.h"

#include <stdlib.h>
#include <string.h>

int config_value_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_INTEGER:
    case JSON_REAL: return CFG_T_NUM;
    case JSON_STRING: return CFG_T_STR;
    case JSON_TRUE:
    case JSON_FALSE: return CFG_T_BOOL;
    case JSON_NULL: return CFG_T_NULL;
    default: return CFG_T_JSON;
    }
}

static int walk(json_t *obj, char *key, size_t len, config_leaf_fn fn, void *ctx,
                hearth_err *err)
{
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        size_t n = strlen(name);
        size_t sep = len ? 1 : 0;
        if (len + sep + n >= CONFIG_KEY_MAX)
            return herr_set(err, HERR_CONFIG, "config key '%.*s.%s' is longer than %d bytes",
                            (int)len, key, name, CONFIG_KEY_MAX - 1);
        if (sep)
            key[len] = '.';
        memcpy(key + len + sep, name, n + 1);
        int rc;
        if (json_is_object(v) && json_object_size(v) > 0)
            rc = walk(v, key, len + sep + n, fn, ctx, err);
        else
            rc = fn(ctx, key, v, config_value_type(v), err);
        key[len] = '\0';
        if (rc)
            return rc;
    }
    return 0;
}

int config_flatten(json_t *config, config_leaf_fn fn, void *ctx, hearth_err *err)
{
    if (!json_is_object(config))
        return herr_set(err, HERR_CONFIG, "a run config must be a JSON object");
    char key[CONFIG_KEY_MAX];
    key[0] = '\0';
    return walk(config, key, 0, fn, ctx, err);
}

int config_key_find(hearth_db *db, const char *key, int64_t *id, int *types, hearth_err *err)
{
    static const char sql[] = "SELECT id, types FROM config_keys WHERE key = ?1";
    sqlite3_stmt *st;
    int found = db_row_text(db, sql, key, &st, "looking up a config key", err);
    if (found == 1) {
        *id = sqlite3_column_int64(st, 0);
        *types = sqlite3_column_int(st, 1);
        db_stmt_done(st);
    }
    return found;
}

/* The key's id, interning it (and recording `type` in its type set) when needed. */
static int key_intern(hearth_db *db, const char *key, int type, int64_t *id, hearth_err *err)
{
    int types;
    if (db_keycache_get(db, key, id, &types) && (types & type))
        return 0;
    static const char sql[] =
        "INSERT INTO config_keys (key, types) VALUES (?1, ?2) "
        "ON CONFLICT (key) DO UPDATE SET types = types | excluded.types "
        "RETURNING id, types";
    sqlite3_stmt *st;
    int rc = db_prepare_text(db, sql, key, &st, err);
    if (rc)
        return rc;
    sqlite3_bind_int(st, 2, type);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(st, 0);
        types = sqlite3_column_int(st, 1);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_fail(db, err, "interning a config key");
    } else {
        rc = db_fail(db, err, "interning a config key");
    }
    db_stmt_done(st);
    if (rc == 0 && db_keycache_put(db, key, *id, types))
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    return rc;
}

typedef struct {
    hearth_db *db;
    int64_t run;
    sqlite3_stmt *ins;
} kv_ctx;

static int kv_leaf(void *vctx, const char *key, json_t *v, int type, hearth_err *err)
{
    kv_ctx *c = vctx;
    int64_t id;
    int rc = key_intern(c->db, key, type, &id, err);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->ins;
    sqlite3_bind_int64(st, 1, c->run);
    sqlite3_bind_int64(st, 2, id);
    char *dump = NULL;
    switch (type) {
    case CFG_T_NUM:
        if (json_is_integer(v))
            sqlite3_bind_int64(st, 3, json_integer_value(v));
        else
            sqlite3_bind_double(st, 3, json_real_value(v));
        break;
    case CFG_T_STR:
        sqlite3_bind_text(st, 4, json_string_value(v), (int)json_string_length(v),
                          SQLITE_STATIC);
        break;
    case CFG_T_BOOL:
        sqlite3_bind_int(st, 5, json_is_true(v));
        break;
    case CFG_T_JSON:
        dump = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!dump)
            return herr_set(err, HERR_NOMEM, "out of memory");
        sqlite3_bind_text(st, 4, dump, -1, SQLITE_STATIC);
        break;
    default: /* null: no value column set */
        break;
    }
    rc = db_step_done(c->db, st, "recording a config key", err);
    free(dump);
    if (rc)
        herr_prefix(err, rc, "config key '%s'", key);
    return rc;
}

int config_kv_insert(hearth_db *db, int64_t run_pk, json_t *config, hearth_err *err)
{
    static const char sql[] =
        "INSERT INTO run_config_kv (run, key_id, num, txt, flag) VALUES (?1, ?2, ?3, ?4, ?5)";
    kv_ctx c = {db, run_pk, NULL};
    int rc = db_prepare(db, sql, &c.ins, err);
    if (rc)
        return rc;
    return config_flatten(config, kv_leaf, &c, err);
}
