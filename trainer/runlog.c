#include "runlog.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

int runlog_open(runlog *l, const char *dir, hearth_err *err)
{
    char path[4096];
    l->quiet = 0;
    l->file = NULL;
    if (snprintf(path, sizeof path, "%s/train.log", dir) >= (int)sizeof path)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    l->file = fopen(path, "a");
    if (!l->file)
        return herr_set(err, HERR_IO, "%s: cannot open: %s", path, strerror(errno));
    return 0;
}

void runlog_close(runlog *l)
{
    if (l && l->file) {
        fclose(l->file);
        l->file = NULL;
    }
}

void runlog_printf(runlog *l, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!l || !l->quiet) {
        fprintf(stderr, "%s\n", line);
        fflush(stderr);
    }
    if (l && l->file) {
        fprintf(l->file, "%s\n", line);
        fflush(l->file);
    }
}
