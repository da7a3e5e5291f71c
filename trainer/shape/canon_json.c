/* canon_json.c - canonical JSON text: sorted keys, no spaces, numbers in their shortest
 * round-trip form (canon_json.h).  Used for the resolved run config and its config hash,
 * so the trainer and the orchestrator always produce byte-identical text for equal
 * configs.  jansson's own printer is not used: it prints reals with a fixed precision
 * (17 digits by default: 0.1 -> 0.10000000000000001).
 *
 * Numbers.  The text is defined by printf: "%.*g" with the smallest precision that reads
 * back (see canon_json.h).  Calling printf and strtod up to 17 times per number made the
 * config hash slow, so the same digits are computed here with exact arithmetic when the
 * scale allows it: for a > 0 with decimal exponent X, a * 10^k (k = p - 1 - X, 0..22, so
 * 10^k is an exact double) equals prod + err exactly, where prod = fl(a * 10^k) and
 * err = fma(a, 10^k, -prod).  prod < 10^15 < 2^53, so its fraction is exact and the
 * rounding to an integer (ties to even, as glibc's printf rounds exact ties) can be decided
 * exactly.  The integer M then has the p digits printf would print, and fl(M / 10^k) is
 * the double nearest to the decimal M * 10^-k (one correctly rounded division of exact
 * operands), which is what strtod returns for that text.  Other scales (and 16 or 17
 * digits) round the 18 digits of one "%.17e" instead: rounding those to p <= 17 digits
 * gives printf's digits unless they end in 5 followed by zeros (a possible double
 * rounding), where printf is asked directly.  Non-finite values keep the plain loop.
 * tests/unit/test_config_hash.c compares all of this with the printf loop. */
#include "shape/canon_json.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/shape_internal.h"

/* ---- buffer -------------------------------------------------------------------------- */

void canon_buf_init(canon_buf *b, size_t cap)
{
    memset(b, 0, sizeof *b);
    if (cap && !(b->s = malloc(cap)))
        b->failed = 1;
    else
        b->cap = cap;
}

int canon_buf_grow(canon_buf *b, size_t n)
{
    if (b->failed)
        return -1;
    if (b->len + n + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) {
        b->failed = 1;
        return -1;
    }
    b->s = ns;
    b->cap = cap;
    return 0;
}

static int needs_escape(unsigned char c)
{
    return c < 0x20 || c == '"' || c == '\\';
}

void canon_put_string(canon_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t i = 0;
    while (i < n && !needs_escape((unsigned char)s[i]))
        i++;
    /* escapes are at most 6 bytes ("\u001f") per input byte */
    if (canon_buf_reserve(b, i == n ? n + 2 : 6 * n + 2))
        return;
    char *o = b->s + b->len;
    *o++ = '"';
    memcpy(o, s, i);
    o += i;
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!needs_escape(c)) {
            *o++ = (char)c;
        } else if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else {
            memcpy(o, "\\u00", 4);
            o[4] = hex[c >> 4];
            o[5] = hex[c & 15];
            o += 6;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->s);
}

void canon_put_int(canon_buf *b, long long v)
{
    char tmp[24], *end = tmp + sizeof tmp, *p = end;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    canon_put(b, p, (size_t)(end - p));
}

char *canon_buf_finish(canon_buf *b)
{
    if (!b->failed && !b->s)
        canon_buf_reserve(b, 0);
    if (b->failed) {
        canon_buf_free(b);
        return NULL;
    }
    b->s[b->len] = '\0';
    char *s = b->s;
    memset(b, 0, sizeof *b);
    return s;
}

void canon_buf_free(canon_buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

/* ---- numbers ------------------------------------------------------------------------- */

static const double pow10_d[23] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};
static const uint64_t pow10_u[18] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
    100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL,
    10000000000000ULL, 100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
    100000000000000000ULL,
};

static void ensure_real_text(char *buf, size_t size)
{
    /* "1" would read back as an integer: make it "1.0". */
    if (!strpbrk(buf, ".eEni") && strlen(buf) + 2 < size)
        strcat(buf, ".0");
}

/* The printf loops themselves: used for non-finite values (nan, inf). */
static size_t plain_double(double v, char *out)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(out, 32, "%.*g", p, v);
        if (strtod(out, NULL) == v)
            break;
    }
    ensure_real_text(out, 32);
    return strlen(out);
}

static size_t plain_float(float v, char *out)
{
    for (int p = 1; p <= 9; p++) {
        snprintf(out, 32, "%.*g", p, (double)v);
        if (strtof(out, NULL) == v)
            break;
    }
    ensure_real_text(out, 32);
    return strlen(out);
}

/* a > 0 rounded to p significant digits (1..15) exactly (see the top of the file).
 * *X: a's decimal exponent, an estimate on entry, exact after a success.  Returns 1 with
 * *raw = a * 10^k rounded to an integer (in [10^(p-1), 10^p]; 10^p when the rounding
 * carried) and *k; 0 when 10^k would not be an exact double. */
static int round_exact(double a, int p, int *X, double *raw, int *k_out)
{
    for (int tries = 0; tries < 4; tries++) {
        int k = p - 1 - *X;
        if (k < 0 || k > 22)
            return 0;
        double scale = pow10_d[k], prod = a * scale, err = fma(a, scale, -prod);
        double lo = pow10_d[p - 1], hi = pow10_d[p];
        if (prod < lo || (prod == lo && err < 0)) {
            (*X)--;
            continue;
        }
        if (prod > hi || (prod == hi && err >= 0)) {
            (*X)++;
            continue;
        }
        /* a * 10^k - floor(prod) - 1/2 = ((prod - f) - 1/2) + err: both terms exact, and a
         * rounded sum keeps the sign (and is zero only when the exact sum is). */
        double f = floor(prod), s = ((prod - f) - 0.5) + err;
        if (s > 0 || (s == 0 && ((uint64_t)f & 1)))
            f += 1;
        *raw = f;
        *k_out = k;
        return 1;
    }
    return 0;
}

/* Rounds the 18 digits of e18 ("%.17e" of a > 0) to p (1..17).  Returns 1 with the
 * digits as an integer *m (p digits) and the exponent *x of the rounded value; 0 when
 * the dropped digits are 5 then zeros (they may themselves be rounded: ask printf). */
static int round_e18(const char *e18, int p, uint64_t *m, int *x)
{
    char d[18];
    d[0] = e18[0];
    memcpy(d + 1, e18 + 2, 17);
    int ex = (int)strtol(e18 + 20, NULL, 10);
    uint64_t v = 0;
    for (int i = 0; i < p; i++)
        v = v * 10 + (uint64_t)(d[i] - '0');
    int up = d[p] > '5';
    if (d[p] == '5') {
        for (int i = p + 1; i < 18 && !up; i++)
            up = d[i] != '0';
        if (!up)
            return 0;
    }
    if (up && ++v == pow10_u[p]) {
        v = pow10_u[p - 1];
        ex++;
    }
    *m = v;
    *x = ex;
    return 1;
}

/* "%.{p}g" text of the value (-1)^neg * m * 10^(x - p + 1), m having p digits, with the
 * ".0" of ensure_real_text.  Returns the length. */
static size_t g_text(char *out, int neg, uint64_t m, int p, int x)
{
    char dig[20];
    for (int i = p - 1; i >= 0; i--) {
        dig[i] = (char)('0' + m % 10);
        m /= 10;
    }
    int nd = p;                       /* digits left after dropping trailing zeros */
    char *o = out;
    if (neg)
        *o++ = '-';
    if (x < -4 || x >= p) {
        while (nd > 1 && dig[nd - 1] == '0')
            nd--;
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, dig + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        *o++ = 'e';
        *o++ = x < 0 ? '-' : '+';
        int ax = x < 0 ? -x : x;
        if (ax >= 100) {
            *o++ = (char)('0' + ax / 100);
            ax %= 100;
        }
        *o++ = (char)('0' + ax / 10);
        *o++ = (char)('0' + ax % 10);
    } else if (x >= 0) {
        while (nd > x + 1 && dig[nd - 1] == '0')
            nd--;
        memcpy(o, dig, (size_t)x + 1);
        o += x + 1;
        if (nd > x + 1) {
            *o++ = '.';
            memcpy(o, dig + x + 1, (size_t)(nd - x - 1));
            o += nd - x - 1;
        } else {
            memcpy(o, ".0", 2);       /* would read back as an integer */
            o += 2;
        }
    } else {
        while (nd > 1 && dig[nd - 1] == '0')
            nd--;
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -x - 1; i++)
            *o++ = '0';
        memcpy(o, dig, (size_t)nd);
        o += nd;
    }
    *o = '\0';
    return (size_t)(o - out);
}

/* printf's own text for one precision (a tie in the 18 digits); ".0" added as above. */
static size_t printf_g(double v, int p, char *out)
{
    snprintf(out, 32, "%.*g", p, v);
    ensure_real_text(out, 32);
    return strlen(out);
}

static int is_float_midpoint(double y)
{
    float g = (float)y;
    if ((double)g == y)
        return 0;
    float g2 = nextafterf(g, y > (double)g ? INFINITY : -INFINITY);
    return (double)g + (double)g2 == 2 * y;   /* exact: adjacent floats, a doubled double */
}

size_t canon_format_double(double v, char *out)
{
    if (!isfinite(v))
        return plain_double(v, out);
    int neg = signbit(v) != 0;
    double a = fabs(v);
    if (v == floor(v) && a < 1e15) {
        /* "%.1f": the integer and ".0" (-0.0 keeps its sign, as printf does) */
        char tmp[24], *end = tmp + sizeof tmp, *q = end;
        uint64_t u = (uint64_t)a;
        *--q = '0';
        *--q = '.';
        do {
            *--q = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (neg)
            *--q = '-';
        memcpy(out, q, (size_t)(end - q));
        out[end - q] = '\0';
        return (size_t)(end - q);
    }
    int X = (int)floor(log10(a));
    char e18[40] = "";
    for (int p = 1; p <= 17; p++) {
        double raw;
        int k, x;
        uint64_t m;
        if (p <= 15 && round_exact(a, p, &X, &raw, &k)) {
            if (raw / pow10_d[k] != a)
                continue;
            m = (uint64_t)raw;
            x = X;
            if (m == pow10_u[p]) {
                m = pow10_u[p - 1];
                x++;
            }
            return g_text(out, neg, m, p, x);
        }
        if (!e18[0])
            snprintf(e18, sizeof e18, "%.17e", a);
        size_t len = round_e18(e18, p, &m, &x) ? g_text(out, neg, m, p, x) : printf_g(v, p, out);
        if (strtod(out, NULL) == v)
            return len;
    }
    return plain_double(v, out);      /* not reached: 17 digits always read back */
}

size_t canon_format_float(float f, char *out)
{
    double v = f;
    if (!isfinite(v))
        return plain_float(f, out);
    int neg = signbit(v) != 0;
    if (v == 0) {
        memcpy(out, neg ? "-0.0" : "0.0", neg ? 5 : 4);
        return neg ? 4 : 3;
    }
    double a = fabs(v);
    float fa = fabsf(f);
    int X = (int)floor(log10(a));
    char e18[40] = "";
    for (int p = 1; p <= 9; p++) {
        double raw;
        int k, x;
        uint64_t m;
        if (round_exact(a, p, &X, &raw, &k)) {
            m = (uint64_t)raw;
            x = X;
            if (m == pow10_u[p]) {
                m = pow10_u[p - 1];
                x++;
            }
            /* y is the double nearest the decimal; the float nearest it is the float
             * nearest the decimal unless y lies exactly between two floats. */
            double y = raw / pow10_d[k];
            float g = (float)y;
            if (isfinite(g) && !is_float_midpoint(y)) {
                if (g == fa)
                    return g_text(out, neg, m, p, x);
                continue;
            }
            size_t len = g_text(out, neg, m, p, x);
            if (strtof(out, NULL) == f)
                return len;
            continue;
        }
        if (!e18[0])
            snprintf(e18, sizeof e18, "%.17e", a);
        size_t len = round_e18(e18, p, &m, &x) ? g_text(out, neg, m, p, x) : printf_g(v, p, out);
        if (strtof(out, NULL) == f)
            return len;
    }
    return plain_float(f, out);       /* not reached: 9 digits always read back */
}

double canon_round_digits(double v, int digits)
{
    if (digits >= 1 && digits <= 15 && isfinite(v) && v != 0) {
        double a = fabs(v), raw;
        int X = (int)floor(log10(a)), k;
        if (round_exact(a, digits, &X, &raw, &k)) {
            double y = raw / pow10_d[k];
            return v < 0 ? -y : y;
        }
    }
    char buf[48];
    snprintf(buf, sizeof buf, "%.*g", digits, v);
    return strtod(buf, NULL);
}

void shape_format_double(double v, char *buf, size_t size)
{
    char tmp[32];
    canon_format_double(v, tmp);
    snprintf(buf, size, "%s", tmp);
}

void shape_format_float(float v, char *buf, size_t size)
{
    char tmp[32];
    canon_format_float(v, tmp);
    snprintf(buf, size, "%s", tmp);
}

/* ---- members by dotted key ----------------------------------------------------------- */

void canon_tree_begin(canon_tree *t, canon_buf *b)
{
    memset(t, 0, sizeof *t);
    t->b = b;
    canon_put(b, "{", 1);
}

/* strcmp of two names given with their lengths */
static int name_cmp(const char *a, size_t na, const char *b, size_t nb)
{
    size_t n = na < nb ? na : nb;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return (unsigned char)a[i] < (unsigned char)b[i] ? -1 : 1;
    return na < nb ? -1 : na > nb;
}

/* Splits prefix+key at the dots into name/len; returns the count, or -1 when too deep. */
static int split_key(const char *prefix, const char *key, const char **name, size_t *len)
{
    int n = 0, in_prefix = *prefix != '\0';
    const char *s = in_prefix ? prefix : key, *p = s;
    for (;;) {
        while (*p != '.' && *p != '\0')
            p++;
        if (in_prefix && *p == '\0' && p == s) {   /* past the prefix's final '.' */
            in_prefix = 0;
            s = p = key;
            continue;
        }
        if (n == CANON_TREE_DEPTH)
            return -1;
        name[n] = s;
        len[n++] = (size_t)(p - s);
        if (*p == '\0') {
            if (!in_prefix)
                return n;
            in_prefix = 0;                          /* a prefix without its '.' */
            s = p = key;
            continue;
        }
        s = ++p;
    }
}

static int same_name(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

int canon_tree_key(canon_tree *t, const char *prefix, const char *key)
{
    const char *name[CANON_TREE_DEPTH];
    size_t len[CANON_TREE_DEPTH];
    int n = split_key(prefix, key, name, len);
    if (n < 0)
        return -1;
    /* m: how many of the open objects this member shares; at level m its name must come
     * after the previous one there (an open object's own name, or the last member). */
    int m = 0;
    while (m < t->depth && m < n - 1 && len[m] == t->name_len[m] &&
           same_name(name[m], t->name[m], len[m]))
        m++;
    if (t->has[m] && name_cmp(name[m], len[m], t->name[m], t->name_len[m]) <= 0)
        return -1;
    canon_buf *b = t->b;
    /* "}" per closed object, ",", then "NAME":{ per opened object and "NAME": */
    size_t need = (size_t)(t->depth - m) + 1;
    int plain = 1;
    for (int j = m; j < n; j++) {
        need += len[j] + 4;
        for (size_t i = 0; i < len[j]; i++)
            plain &= !needs_escape((unsigned char)name[j][i]);
    }
    if (!plain || canon_buf_reserve(b, need)) {
        /* names to escape (never in the key tables), or out of memory: the plain way */
        for (; t->depth > m; t->depth--)
            canon_put(b, "}", 1);
        if (t->has[m])
            canon_put(b, ",", 1);
        for (int j = m; j < n; j++) {
            canon_put_string(b, name[j], len[j]);
            canon_put(b, j < n - 1 ? ":{" : ":", j < n - 1 ? 2 : 1);
            t->name[j] = name[j];
            t->name_len[j] = len[j];
            t->has[j] = 1;
        }
    } else {
        char *o = b->s + b->len;
        for (int d = t->depth; d > m; d--)
            *o++ = '}';
        if (t->has[m])
            *o++ = ',';
        for (int j = m; j < n; j++) {
            *o++ = '"';
            memcpy(o, name[j], len[j]);
            o += len[j];
            *o++ = '"';
            *o++ = ':';
            if (j < n - 1)
                *o++ = '{';
            t->name[j] = name[j];
            t->name_len[j] = len[j];
            t->has[j] = 1;
        }
        b->len = (size_t)(o - b->s);
    }
    t->depth = n - 1;   /* every level up to here now has a member */
    return 0;
}

void canon_tree_end(canon_tree *t)
{
    for (; t->depth > 0; t->depth--)
        canon_put(t->b, "}", 1);
    canon_put(t->b, "}", 1);
}

/* ---- from a jansson value -------------------------------------------------------------- */

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void dump(canon_buf *b, const json_t *v)
{
    char num[32];
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
        canon_put(b, "{", 1);
        for (size_t i = 0; i < n; i++) {
            if (i)
                canon_put(b, ",", 1);
            canon_put_string(b, keys[i], strlen(keys[i]));
            canon_put(b, ":", 1);
            dump(b, json_object_get(v, keys[i]));
        }
        canon_put(b, "}", 1);
        free(keys);
        break;
    }
    case JSON_ARRAY:
        canon_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                canon_put(b, ",", 1);
            dump(b, json_array_get(v, i));
        }
        canon_put(b, "]", 1);
        break;
    case JSON_STRING:
        canon_put_string(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        canon_put_int(b, (long long)json_integer_value(v));
        break;
    case JSON_REAL:
        canon_put(b, num, canon_format_double(json_real_value(v), num));
        break;
    case JSON_TRUE:
        canon_put(b, "true", 4);
        break;
    case JSON_FALSE:
        canon_put(b, "false", 5);
        break;
    case JSON_NULL:
        canon_put(b, "null", 4);
        break;
    }
}

char *canon_json_dump(const json_t *v)
{
    canon_buf b = { 0 };
    dump(&b, v);
    return canon_buf_finish(&b);
}
