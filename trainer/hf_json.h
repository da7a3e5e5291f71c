/* hf_json.h - JSON text as Hugging Face writes it: Python's json.dumps(obj, indent=2)
 * (transformers adds sort_keys=True and a final newline for config.json).
 *
 * Why not jansson's printer: it prints reals with 17 significant digits (1e-06 becomes
 * 9.9999999999999995e-07), so a config.json read and written back would change text it
 * had no reason to touch.  Here every value is written the way Python writes it:
 *   - reals as Python's repr(float): the shortest digits that read back as the same
 *     double, fixed notation for decimal exponents -4..15 ("0.0001", "1000000.0"),
 *     otherwise "1e-06" / "1.5e+16";
 *   - strings ASCII-only (ensure_ascii): '"' '\\' \b \f \n \r \t escaped short, other
 *     bytes outside ' '..'~' as \u00XX / \uXXXX / surrogate pairs;
 *   - HF_JSON_INDENT: 2 spaces per level, "," at line ends, ": " after keys, "[]" and
 *     "{}" for empty containers; without it one line with ", " and ": ".
 * A config.json that transformers wrote therefore reads and writes back byte for byte
 * (keys keep the object's order: jansson keeps insertion order, which is the file's). */
#ifndef HEARTH_HF_JSON_H
#define HEARTH_HF_JSON_H

#include <jansson.h>
#include <stddef.h>

enum {
    HF_JSON_INDENT = 1,     /* json.dumps(indent=2) layout (else one line) */
    HF_JSON_SORT_KEYS = 2,  /* keys in code point order, as sort_keys=True */
    HF_JSON_NEWLINE = 4     /* a final "\n", as transformers' to_json_file */
};

/* The text of v (any JSON value).  Returns a malloc'd string the caller frees, or NULL
 * when out of memory (or v is NULL). */
char *hf_json_dump(const json_t *v, int flags);

/* repr(v) for a finite double into out (32 bytes is enough); returns the length.
 * Non-finite values give "NaN", "Infinity" or "-Infinity" as Python's json does. */
size_t hf_json_format_real(double v, char *out);

/* The double nearest to the shortest decimal that reads back (strtof) as f: the value a
 * user wrote for a float field (1e-05f -> 1e-05, not 9.99999974737875e-06).  Model
 * values kept as float are written through it. */
double hf_json_float_value(float f);

#endif
