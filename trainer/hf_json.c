/* hf_json.c - JSON text the way Python's json module writes it (hf_json.h). */
#include "hf_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/canon_json.h"

size_t hf_json_format_real(double v, char *out)
{
    if (isnan(v))
        return (size_t)sprintf(out, "NaN");
    if (isinf(v))
        return (size_t)sprintf(out, v < 0 ? "-Infinity" : "Infinity");
    if (v == 0)
        return (size_t)sprintf(out, signbit(v) ? "-0.0" : "0.0");
    /* the shortest digits that read back: "%.{p-1}e" for p = 1..17 */
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v)
            break;
    }
    /* e is [-]D[.DDD]e(+|-)XX: split into sign, digits and exponent */
    char digits[24];
    int nd = 0, neg = 0;
    const char *s = e;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            digits[nd++] = *s;
    int exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    /* Python's repr: fixed notation when -4 < decpt <= 16 (decpt = exp10 + 1) */
    int decpt = exp10 + 1;
    char *o = out;
    if (neg)
        *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            o += sprintf(o, "0.");
            for (int i = 0; i < -decpt; i++)
                *o++ = '0';
            o += sprintf(o, "%s", digits);
        } else if (decpt >= nd) {
            o += sprintf(o, "%s", digits);
            for (int i = nd; i < decpt; i++)
                *o++ = '0';
            o += sprintf(o, ".0");
        } else {
            o += sprintf(o, "%.*s.%s", decpt, digits, digits + decpt);
        }
    } else {
        *o++ = digits[0];
        if (nd > 1)
            o += sprintf(o, ".%s", digits + 1);
        o += sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
    *o = '\0';
    return (size_t)(o - out);
}

double hf_json_float_value(float f)
{
    char t[32];
    canon_format_float(f, t);
    return strtod(t, NULL);
}

/* Next code point of UTF-8 text (jansson's strings are valid UTF-8). */
static unsigned utf8_next(const unsigned char **p)
{
    const unsigned char *s = *p;
    unsigned c = s[0];
    int n = c < 0x80 ? 0 : c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
    if (n)
        c &= 0x3fu >> n;
    for (int i = 1; i <= n; i++)
        c = (c << 6) | (s[i] & 0x3fu);
    *p = s + n + 1;
    return c;
}

static void put_str(canon_buf *b, const char *s)
{
    canon_put(b, s, strlen(s));
}

/* Python's json ensure_ascii escaping */
static void put_string(canon_buf *b, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    char u[16];
    canon_put(b, "\"", 1);
    while (p < end) {
        unsigned c = utf8_next(&p);
        switch (c) {
        case '"': put_str(b, "\\\""); break;
        case '\\': put_str(b, "\\\\"); break;
        case '\b': put_str(b, "\\b"); break;
        case '\f': put_str(b, "\\f"); break;
        case '\n': put_str(b, "\\n"); break;
        case '\r': put_str(b, "\\r"); break;
        case '\t': put_str(b, "\\t"); break;
        default:
            if (c >= 0x20 && c <= 0x7e) {
                u[0] = (char)c;
                canon_put(b, u, 1);
            } else if (c < 0x10000) {
                canon_put(b, u, (size_t)snprintf(u, sizeof u, "\\u%04x", c));
            } else {
                c -= 0x10000;
                canon_put(b, u, (size_t)snprintf(u, sizeof u, "\\u%04x\\u%04x",
                                                 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff)));
            }
        }
    }
    canon_put(b, "\"", 1);
}

static void put_newline(canon_buf *b, int flags, int depth)
{
    if (!(flags & HF_JSON_INDENT))
        return;
    canon_put(b, "\n", 1);
    for (int i = 0; i < depth; i++)
        canon_put(b, "  ", 2);
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void put_value(canon_buf *b, const json_t *v, int flags, int depth);

static void put_object(canon_buf *b, const json_t *v, int flags, int depth)
{
    size_t n = json_object_size(v);
    if (!n) {
        put_str(b, "{}");
        return;
    }
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) {
        b->failed = 1;
        return;
    }
    size_t i = 0;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x)
        keys[i++] = k;
    if (flags & HF_JSON_SORT_KEYS)
        qsort(keys, n, sizeof *keys, key_cmp);
    canon_put(b, "{", 1);
    for (i = 0; i < n; i++) {
        if (i)
            canon_put(b, (flags & HF_JSON_INDENT) ? "," : ", ", (flags & HF_JSON_INDENT) ? 1 : 2);
        put_newline(b, flags, depth + 1);
        put_string(b, keys[i], strlen(keys[i]));
        put_str(b, ": ");
        put_value(b, json_object_get(v, keys[i]), flags, depth + 1);
    }
    put_newline(b, flags, depth);
    canon_put(b, "}", 1);
    free(keys);
}

static void put_array(canon_buf *b, const json_t *v, int flags, int depth)
{
    size_t n = json_array_size(v);
    if (!n) {
        put_str(b, "[]");
        return;
    }
    canon_put(b, "[", 1);
    for (size_t i = 0; i < n; i++) {
        if (i)
            canon_put(b, (flags & HF_JSON_INDENT) ? "," : ", ", (flags & HF_JSON_INDENT) ? 1 : 2);
        put_newline(b, flags, depth + 1);
        put_value(b, json_array_get(v, i), flags, depth + 1);
    }
    put_newline(b, flags, depth);
    canon_put(b, "]", 1);
}

static void put_value(canon_buf *b, const json_t *v, int flags, int depth)
{
    char t[40];
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        put_object(b, v, flags, depth);
        break;
    case JSON_ARRAY:
        put_array(b, v, flags, depth);
        break;
    case JSON_STRING:
        put_string(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        canon_put_int(b, (long long)json_integer_value(v));
        break;
    case JSON_REAL:
        canon_put(b, t, hf_json_format_real(json_real_value(v), t));
        break;
    case JSON_TRUE:
        put_str(b, "true");
        break;
    case JSON_FALSE:
        put_str(b, "false");
        break;
    default:
        put_str(b, "null");
    }
}

char *hf_json_dump(const json_t *v, int flags)
{
    if (!v)
        return NULL;
    canon_buf b;
    canon_buf_init(&b, 1024);
    put_value(&b, v, flags, 0);
    if (flags & HF_JSON_NEWLINE)
        canon_put(&b, "\n", 1);
    return canon_buf_finish(&b);
}
