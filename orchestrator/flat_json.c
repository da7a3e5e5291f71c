/* flat_json.c - the fast path for flat JSON objects of scalars.  See flat_json.h. */
#include "flat_json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Exactly representable powers of ten. */
static const double pow10_exact[] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int fj_number(const char *s, size_t n, int *is_int, int64_t *iv, double *dv)
{
    size_t p = 0;
    int neg = 0;
    if (p < n && s[p] == '-') {
        neg = 1;
        p++;
    }
    if (p >= n || !is_digit(s[p]))
        return -1;
    uint64_t m = 0;
    int sig = 0;        /* significant digits taken into m */
    int dropped = 0;    /* nonzero digits that did not fit */
    int exp10 = 0;
    if (s[p] == '0') {
        p++;
        if (p < n && is_digit(s[p]))
            return -1;   /* leading zeros are not JSON */
    } else {
        while (p < n && is_digit(s[p])) {
            if (sig < 19) {
                m = m * 10 + (uint64_t)(s[p] - '0');
                sig++;
            } else {
                exp10++;
                dropped |= s[p] != '0';
            }
            p++;
        }
    }
    int integral = 1;
    if (p < n && s[p] == '.') {
        integral = 0;
        p++;
        if (p >= n || !is_digit(s[p]))
            return -1;
        while (p < n && is_digit(s[p])) {
            if (m == 0 && s[p] == '0') {
                exp10--;   /* leading zeros of the fraction */
            } else if (sig < 19) {
                m = m * 10 + (uint64_t)(s[p] - '0');
                sig++;
                exp10--;
            } else {
                dropped |= s[p] != '0';
            }
            p++;
        }
    }
    if (p < n && (s[p] == 'e' || s[p] == 'E')) {
        integral = 0;
        p++;
        int eneg = 0;
        if (p < n && (s[p] == '+' || s[p] == '-'))
            eneg = s[p++] == '-';
        if (p >= n || !is_digit(s[p]))
            return -1;
        int e = 0;
        while (p < n && is_digit(s[p])) {
            if (e < 100000)
                e = e * 10 + (s[p] - '0');
            p++;
        }
        exp10 += eneg ? -e : e;
    }
    if (p != n)
        return -1;
    *is_int = integral;
    if (integral) {
        if (sig > 18 || dropped || exp10)
            return -1;   /* big integers: let the full parser decide */
        *iv = neg ? -(int64_t)m : (int64_t)m;
        *dv = (double)*iv;
        return 0;
    }
    double v;
    if (!dropped && m < (1ull << 53) && exp10 >= -22 && exp10 <= 22) {
        v = (double)m;
        v = exp10 < 0 ? v / pow10_exact[-exp10] : v * pow10_exact[exp10];
    } else {
        char buf[512];
        if (n >= sizeof buf)
            return -1;
        memcpy(buf, s, n);
        buf[n] = '\0';
        errno = 0;
        v = strtod(buf, NULL);
        if (errno == ERANGE && (v > 1.0 || v < -1.0))
            return -1;   /* overflow: the full parser reports it */
        *dv = v;
        return 0;
    }
    *dv = neg ? -v : v;
    return 0;
}

static size_t skip_ws(const char *s, size_t n, size_t p)
{
    while (p < n && (s[p] == ' ' || s[p] == '\t' || s[p] == '\n' || s[p] == '\r'))
        p++;
    return p;
}

int fj_parse(const char *s, size_t n, fj_member *out, int max)
{
    size_t p = skip_ws(s, n, 0);
    if (p >= n || s[p] != '{')
        return -1;
    p = skip_ws(s, n, p + 1);
    int count = 0;
    if (p < n && s[p] == '}') {
        p = skip_ws(s, n, p + 1);
        return p == n ? 0 : -1;
    }
    for (;;) {
        if (count == max || p >= n || s[p] != '"')
            return -1;
        size_t k = ++p;
        while (p < n && s[p] != '"') {
            unsigned char c = (unsigned char)s[p];
            if (c == '\\' || c < 0x20 || c >= 0x80)
                return -1;
            p++;
        }
        if (p >= n)
            return -1;
        fj_member *m = &out[count];
        m->key = s + k;
        m->key_len = p - k;
        p = skip_ws(s, n, p + 1);
        if (p >= n || s[p] != ':')
            return -1;
        p = skip_ws(s, n, p + 1);
        if (p >= n)
            return -1;
        size_t v = p;
        while (p < n && s[p] != ',' && s[p] != '}' && s[p] != ' ' && s[p] != '\t' &&
               s[p] != '\n' && s[p] != '\r')
            p++;
        size_t len = p - v;
        m->i = 0;
        m->d = 0;
        if (len == 4 && memcmp(s + v, "null", 4) == 0) {
            m->type = FJ_NULL;
        } else if (len == 4 && memcmp(s + v, "true", 4) == 0) {
            m->type = FJ_TRUE;
        } else if (len == 5 && memcmp(s + v, "false", 5) == 0) {
            m->type = FJ_FALSE;
        } else {
            int is_int;
            if (fj_number(s + v, len, &is_int, &m->i, &m->d))
                return -1;
            m->type = is_int ? FJ_INT : FJ_REAL;
        }
        count++;
        p = skip_ws(s, n, p);
        if (p < n && s[p] == ',') {
            p = skip_ws(s, n, p + 1);
            continue;
        }
        if (p < n && s[p] == '}') {
            p = skip_ws(s, n, p + 1);
            return p == n ? count : -1;
        }
        return -1;
    }
}
