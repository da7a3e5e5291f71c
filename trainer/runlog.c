#include "runlog.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void runlog_init(runlog *l)
{
    memset(l, 0, sizeof *l);
    /* Without memory for the held lines the log still reaches stderr. */
    l->held = open_memstream(&l->held_text, &l->held_len);
}

/* Ends the memory stream and frees what it held. */
static void drop_held(runlog *l)
{
    if (l->held)
        fclose(l->held);
    free(l->held_text);
    l->held = NULL;
    l->held_text = NULL;
    l->held_len = 0;
}

int runlog_open(runlog *l, const char *dir, hearth_err *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/train.log", dir) >= (int)sizeof path)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    l->file = fopen(path, "a");
    if (!l->file)
        return herr_set(err, HERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (l->held && fflush(l->held) == 0 && l->held_len) {
        fwrite(l->held_text, 1, l->held_len, l->file);
        fflush(l->file);
    }
    drop_held(l);
    return 0;
}

void runlog_close(runlog *l)
{
    if (!l)
        return;
    drop_held(l);
    if (l->file) {
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
    FILE *to = l ? (l->file ? l->file : l->held) : NULL;
    if (to) {
        fprintf(to, "%s\n", line);
        fflush(to);
    }
}
