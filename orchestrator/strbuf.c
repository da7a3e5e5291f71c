/* strbuf.c - a growing string.  See strbuf.h. */
#include <stdlib.h>
#include <string.h>

#include "shape/err.h"
#include "strbuf.h"

int strbuf_add(strbuf *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *g = realloc(b->s, cap);
        if (!g)
            return HERR_NOMEM;
        b->s = g;
        b->cap = cap;
    }
    memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = 0;
    return 0;
}
