/* canon_json.h - canonical JSON text: object keys sorted by byte value (strcmp), no
 * whitespace, integers in decimal, reals in the shortest text that reads back as the same
 * double (a ".0" added to integral values), strings with only '"', '\\' and control
 * characters escaped (UTF-8 kept as is).  Equal values give byte-identical text; that
 * text is what the config hash is computed over.
 *
 * Two ways to produce it:
 *   canon_json_dump()  - from a jansson value (any shape; sorts keys per object);
 *   canon_buf + canon_tree - written directly, members given in canonical order as
 *                        dotted keys ("train.lr"): what the resolved run config uses,
 *                        because building a jansson tree per config is slow in sweeps.
 * Both use the same number and string writers, so they give the same bytes. */
#ifndef HEARTH_CANON_JSON_H
#define HEARTH_CANON_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <string.h>

/* Ownership: returns a malloc'd string the caller frees, or NULL when out of memory. */
char *canon_json_dump(const json_t *v);

/* ---- a growing text buffer ----------------------------------------------------------
 * Zero-initialise (or canon_buf_init with a first capacity).  A failed allocation sets
 * `failed` and makes later writes no-ops, so writers check once at the end. */
typedef struct {
    char *s;
    size_t len, cap;
    int failed;
} canon_buf;

void canon_buf_init(canon_buf *b, size_t cap);
/* Grows the buffer for n more bytes plus the NUL; 0, or -1 (and failed) when out of
 * memory.  canon_buf_reserve is the inline check in front of it. */
int canon_buf_grow(canon_buf *b, size_t n);

static inline int canon_buf_reserve(canon_buf *b, size_t n)
{
    return b->len + n + 1 <= b->cap ? 0 : canon_buf_grow(b, n);
}

static inline void canon_put(canon_buf *b, const char *s, size_t n)
{
    if (canon_buf_reserve(b, n) == 0) {
        memcpy(b->s + b->len, s, n);
        b->len += n;
    }
}

/* `s` (n bytes) as a JSON string: quoted, '"' '\\' and bytes < 0x20 escaped. */
void canon_put_string(canon_buf *b, const char *s, size_t n);
void canon_put_int(canon_buf *b, long long v);
/* The buffer's text (the caller frees it), or NULL when a write failed (then the buffer
 * is freed).  An empty buffer gives "". */
char *canon_buf_finish(canon_buf *b);
void canon_buf_free(canon_buf *b);

/* ---- numbers ------------------------------------------------------------------------
 * The text shape_format_double() / shape_format_float() write (shape_internal.h): for a
 * double, integral values below 1e15 as "%.1f", others as "%.*g" with the smallest
 * precision (1..17) that strtod reads back as the same value, ".0" added when that
 * text would read as an integer; for a float the same with precision 1..9 and strtof,
 * and no integral special case.  Computed without printf in the common cases (exact
 * integer arithmetic, see canon_json.c).  `out` needs 32 bytes; returns the length. */
size_t canon_format_double(double v, char *out);
size_t canon_format_float(float v, char *out);

/* strtod() of printf("%.*g", digits, v), digits in 1..17, without the text in the common
 * cases (run_config_derive rounds lr / 10 this way for every resolved point). */
double canon_round_digits(double v, int digits);

/* ---- members by dotted key, in canonical order ---------------------------------------
 * canon_tree_key(t, prefix, key) starts the member prefix+key ("model." "decoder.heads")
 * opening and closing the objects between the previous member and this one; the caller
 * then writes the value.  Members must come in canonical order: at each level, names
 * strictly increasing by strcmp.  A member out of that order (or a name that is both a
 * value and an object, or deeper than CANON_TREE_DEPTH) is refused with -1 before anything
 * is written for it, so a caller can fall back to sorting its keys.  prefix may be "" and
 * must end with '.' otherwise.  The tree keeps pointers to the names: prefix and key must
 * stay unchanged until canon_tree_end (the key tables' strings do). */
#define CANON_TREE_DEPTH 8

typedef struct {
    canon_buf *b;
    int depth;                              /* objects open below the root */
    const char *name[CANON_TREE_DEPTH];     /* per level: the last member's name ... */
    size_t name_len[CANON_TREE_DEPTH];      /* ... (for an open level: its object's) */
    unsigned char has[CANON_TREE_DEPTH];    /* per level: a member was written */
} canon_tree;

void canon_tree_begin(canon_tree *t, canon_buf *b);
int canon_tree_key(canon_tree *t, const char *prefix, const char *key);
void canon_tree_end(canon_tree *t);

/* ---- for tests ----------------------------------------------------------------------
 * run_json.c writes the resolved config from a key order precomputed in its source (it
 * falls back to sorting per call when that order does not fit the key tables, which is
 * correct but slow).  Returns 0 when the precomputed order is the sorted order of the
 * current tables; else -1 and, when fix != NULL, *fix = the C text of the table to paste
 * into run_json.c (malloc'd; the caller frees it). */
int run_json_order_check(char **fix);

#endif
