/* fields.h - the tables of settable keys (run config and model preset) and the small
 * engine that reads YAML nodes into C structs through them.
 *
 * Every key a user can write is one row of a table: its dotted name, its C type and
 * place in the struct, its range, its default (as YAML text) and a line of
 * documentation.  Parsing, defaults, the canonical JSON and docs/config.md all follow
 * from the tables, so a key cannot be parsed and then forgotten in the hash.
 *
 * Tables:
 *   model_fields(): keys of a preset, relative to model_shape ("decoder.heads"); in a
 *     run config they are written under `model.` ("model.decoder.heads").
 *   config_fields(): every other run-config key, relative to run_config ("train.lr").
 *
 * Defaults: `def` is YAML text applied when the key is not written; "auto" means the
 * value is derived from other keys (see docs/config.md), NULL means the key is
 * required.  A key with FIELD_AUTO also accepts the word `auto` from the user.
 *
 * The engine (field_state) keeps, per key, whether and where it was set, so that a
 * rule that fails later can point at the line that caused it. */
#ifndef HEARTH_FIELDS_H
#define HEARTH_FIELDS_H

#include <stddef.h>

#include "shape/err.h"
#include "shape/yaml_tree.h"

typedef enum {
    FT_INT,       /* int, range [min, max] */
    FT_I64,       /* int64_t (train.seed), range [min, max] */
    FT_DOUBLE,    /* double, range [min, max] (FIELD_GT_MIN: strictly above min) */
    FT_FLOAT,     /* float, same */
    FT_BOOL,      /* int 0/1 */
    FT_ENUM,      /* int, index into names */
    FT_STR,       /* char[size] */
    FT_INT3,      /* int[3], each in [min, max] */
    FT_INTLIST,   /* int[size] with its count at count_off, each in [min, max] */
    FT_BIAS_ALL,  /* shorthand: a boolean that sets the next three (bias.qkv/proj/mlp) rows */
} field_type;

enum {
    FIELD_AUTO = 1,      /* accepts `auto`: derived from other keys */
    FIELD_GT_MIN = 2,    /* numbers: strictly greater than min */
    FIELD_RUN_ONLY = 4,  /* model keys that only a run config may set (freeze, recompute) */
    FIELD_NO_JSON = 8,   /* not a value of its own (FT_BIAS_ALL): left out of the JSON */
};

/* Which part of a model a model key belongs to (absent parts are not filled). */
enum { COMP_NONE = 0, COMP_ENCODER = 1, COMP_PROJECTOR = 2, COMP_DECODER = 3 };

typedef struct {
    const char *key;
    field_type type;
    size_t off;
    size_t size;               /* FT_STR: buffer bytes; FT_INTLIST: capacity */
    size_t count_off;          /* FT_INTLIST */
    const char *const *names;  /* FT_ENUM: NULL-terminated, indexed by value */
    double min, max;
    const char *def;
    unsigned flags;
    int comp;                  /* model keys: COMP_* */
    const char *doc;
} field_desc;

const field_desc *model_fields(int *n);
const field_desc *config_fields(int *n);
/* Index of `key` in a table, or -1. */
int field_find(const field_desc *t, int n, const char *key);
/* Whether `key` is a proper prefix of some key in the table ("train" for "train.lr"). */
int field_is_section(const field_desc *t, int n, const char *key);

/* Where a value came from.  file == NULL: the command line (--set) when key[0] is set,
 * else a default. */
typedef struct {
    const char *file;
    int line, col;
    char key[160];             /* the key as the user wrote it, dotted */
} field_src;

/* "FILE:LINE:COL: KEY" or "--set KEY" (or just KEY for a default). */
void field_src_format(const field_src *s, char *buf, size_t size);

#define FIELDS_MAX 96

typedef struct {
    const field_desc *t;
    int n;
    void *base;                       /* the struct the table describes */
    unsigned char set[FIELDS_MAX];    /* written by the user (preset, file or --set) */
    unsigned char is_auto[FIELDS_MAX];/* to be derived (default "auto" or written `auto`) */
    field_src src[FIELDS_MAX];
} field_state;

void field_state_init(field_state *st, const field_desc *t, int n, void *base);
/* Reads `node` into row i.  Errors read "SRC: expected ..., got ...". */
int field_apply(field_state *st, int i, const yaml_tree_node *node, const field_src *src,
                hearth_err *err);
/* Applies the default of every row not set (rows with comp in `skip_comp_mask` bits are
 * left alone; bit c = 1 << c).  Rows without a default report "FILE: KEY: required". */
int field_fill_defaults(field_state *st, unsigned skip_comp_mask, const char *file,
                        const char *key_prefix, hearth_err *err);

/* "Did you mean" hints: feed every known key, then ask for the closest one to what
 * the user wrote (small edit distance, or the same last component), or NULL. */
typedef struct {
    char best[160];
    int dist;
    char tail[160];            /* a key whose last component equals the user's */
    int tail_hits;
} field_suggestion;
void field_suggest_init(field_suggestion *s);
void field_suggest_add(field_suggestion *s, const char *written, const char *candidate);
const char *field_suggest_result(const field_suggestion *s, const char *written);

/* ---- walking a YAML mapping into settings ------------------------------------------
 * A config or preset mapping is flattened into (dotted key, value node, where) settings,
 * descending into mappings that are sections ("train:" -> "train.steps").  Keys may
 * themselves be dotted ("train.steps: 5").  `classify` says what a key is; it may
 * rewrite the key into `canon` (e.g. `model: NAME` -> model.preset).  A key set twice
 * in one walk is an error naming both places. */
enum { WALK_UNKNOWN = 0, WALK_LEAF = 1, WALK_SECTION = 2 };

typedef struct {
    char key[160];             /* canonical dotted key */
    const yaml_tree_node *value;
    field_src src;             /* src.key: the key as written; line/col of the value */
} field_setting;

typedef struct {
    field_setting *v;
    int n, cap;
} field_settings;

typedef struct {
    /* returns WALK_*; for WALK_LEAF may write the canonical key into canon (else it is
     * the key itself) */
    int (*classify)(void *ctx, const char *key, const yaml_tree_node *value, char *canon,
                    size_t size);
    /* fills a "did you mean" hint for an unknown key, or leaves buf empty */
    void (*suggest)(void *ctx, const char *key, char *buf, size_t size);
    void *ctx;
} field_walker;

/* Walks `node` found under `key` (NULL/"" for a document root, which must be a mapping
 * or empty).  file == NULL: the command line ("--set KEY").  Appends to `out`. */
int field_walk(const field_walker *w, const char *file, const char *key,
               const yaml_tree_node *node, field_settings *out, hearth_err *err);
void field_settings_free(field_settings *s);

#endif
