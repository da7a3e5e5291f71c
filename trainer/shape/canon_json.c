/* canon_json.c - canonical JSON text: sorted keys, no spaces, numbers in their shortest
 * round-trip form.  Used for the resolved run config and its config hash, so the
 * trainer and the orchestrator always produce byte-identical text for equal configs.
 *
 * jansson builds the tree; the text is written here because jansson prints reals with
 * a fixed precision (17 digits by default: 0.1 -> 0.10000000000000001), not the
 * shortest text that reads back to the same double. */
#include "shape/canon_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/shape_internal.h"

static void ensure_real_text(char *buf, size_t size)
{
    /* "1" would read back as an integer: make it "1.0" (inf/nan cannot reach here). */
    if (!strpbrk(buf, ".eEni") && strlen(buf) + 2 < size)
        strcat(buf, ".0");
}

void shape_format_double(double v, char *buf, size_t size)
{
    /* Integral values read better without an exponent: 10000.0, not 1e+04. */
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, size, "%.1f", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, size, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    ensure_real_text(buf, size);
}

void shape_format_float(float v, char *buf, size_t size)
{
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, size, "%.*g", p, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    ensure_real_text(buf, size);
}

typedef struct {
    char *s;
    size_t len, cap;
    int failed;
} sbuf;

static void put(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->failed = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void puts_(sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void put_string(sbuf *b, const char *s, size_t n)
{
    put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            puts_(b, esc);
        } else {
            put(b, (const char *)&s[i], 1);
        }
    }
    put(b, "\"", 1);
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void dump(sbuf *b, const json_t *v)
{
    char num[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        size_t n = json_object_size(v), k = 0;
        const char **keys = malloc((n ? n : 1) * sizeof *keys);
        if (!keys) {
            b->failed = 1;
            return;
        }
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v, key, val)
            keys[k++] = key;
        qsort(keys, n, sizeof *keys, key_cmp);
        put(b, "{", 1);
        for (size_t i = 0; i < n; i++) {
            if (i)
                put(b, ",", 1);
            put_string(b, keys[i], strlen(keys[i]));
            put(b, ":", 1);
            dump(b, json_object_get(v, keys[i]));
        }
        put(b, "}", 1);
        free(keys);
        break;
    }
    case JSON_ARRAY:
        put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                put(b, ",", 1);
            dump(b, json_array_get(v, i));
        }
        put(b, "]", 1);
        break;
    case JSON_STRING:
        put_string(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        puts_(b, num);
        break;
    case JSON_REAL:
        shape_format_double(json_real_value(v), num, sizeof num);
        puts_(b, num);
        break;
    case JSON_TRUE:
        puts_(b, "true");
        break;
    case JSON_FALSE:
        puts_(b, "false");
        break;
    case JSON_NULL:
        puts_(b, "null");
        break;
    }
}

char *canon_json_dump(const json_t *v)
{
    sbuf b = { 0 };
    dump(&b, v);
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    if (!b.s)
        return strdup("");
    return b.s;
}
