/* flat_json.h - a fast, strict reader for the common shape of a metrics.jsonl line: one
 * JSON object whose values are numbers, null, true or false and whose keys have no escapes.
 *
 * It exists for speed only (ingest reads a million lines in a few seconds): anything it does
 * not handle makes it return -1, and the caller then parses the line with jansson, which
 * also produces the error messages.  Numbers are converted exactly as strtod does (correctly
 * rounded): a mantissa of at most 15 digits with a power of ten up to 22 is converted with
 * one exact operation, anything else goes through strtod / strtoll. */
#ifndef HEARTH_FLAT_JSON_H
#define HEARTH_FLAT_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { FJ_NULL = 0, FJ_INT, FJ_REAL, FJ_TRUE, FJ_FALSE } fj_type;

typedef struct {
    const char *key;   /* into the input, not terminated */
    size_t key_len;
    fj_type type;
    int64_t i;         /* FJ_INT */
    double d;          /* FJ_INT and FJ_REAL */
} fj_member;

/* Parses s[0..n) into at most `max` members; returns their number, or -1 when the text is
 * not such an object (or is not valid JSON, or has more members). */
int fj_parse(const char *s, size_t n, fj_member *out, int max);

/* Parses one JSON number occupying exactly s[0..n); returns 0 or -1.  *is_int tells
 * whether it was written without fraction and exponent. */
int fj_number(const char *s, size_t n, int *is_int, int64_t *i, double *d);

#endif
