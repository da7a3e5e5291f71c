#include "shape/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int herr_set(hearth_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int herr_prefix(hearth_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return code;
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    /* Append ": old" after the prefix, truncating the whole message to the buffer. */
    size_t used = n < 0 ? 0 : (size_t)n;
    if (used < sizeof err->msg - 1) {
        size_t room = sizeof err->msg - used;
        size_t k = 0;
        const char *sep = ": ";
        for (; *sep && k + 1 < room; sep++)
            err->msg[used + k++] = *sep;
        for (size_t i = 0; old[i] && k + 1 < room; i++)
            err->msg[used + k++] = old[i];
        err->msg[used + k] = '\0';
    }
    return code;
}
