/* strbuf.h - a growing NUL-terminated string.
 *
 * Start from `strbuf b = { 0 };`; b.s is NULL until the first add and is always
 * NUL-terminated after one.  The owner frees b.s with free(). */
#ifndef HEARTH_STRBUF_H
#define HEARTH_STRBUF_H

#include <stddef.h>

typedef struct {
    char *s;
    size_t len, cap;
} strbuf;

/* Appends n bytes of p; returns 0, or HERR_NOMEM with b unchanged. */
int strbuf_add(strbuf *b, const char *p, size_t n);

#endif
