/* progress.c - the progress line of long waits.  See progress.h. */
#include "progress.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void progress_init(progress *p, FILE *f, int tty, double interval_s)
{
    memset(p, 0, sizeof *p);
    p->f = f;
    p->tty = tty;
    p->interval_s = interval_s;
}

void progress_line(progress *p, const char *line, double now_s)
{
    if (!p->f)
        return;
    int changed = strcmp(line, p->line) != 0;
    if (p->tty) {
        if (!changed && p->open)
            return;
        snprintf(p->line, sizeof p->line, "%s", line);
        fprintf(p->f, "\r%s\033[K", p->line);
        p->open = 1;
    } else {
        if (!changed && !(p->interval_s > 0 && now_s - p->last_s >= p->interval_s))
            return;
        snprintf(p->line, sizeof p->line, "%s", line);
        fprintf(p->f, "%s\n", p->line);
        p->last_s = now_s;
    }
    fflush(p->f);
}

void progress_set(progress *p, const char *fmt, ...)
{
    if (!p->f)
        return;
    char line[sizeof p->line];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    progress_line(p, line, monotonic_s());
}

void progress_counts(progress *p, long started, long total, long running, long done,
                     long failed, long cancelled)
{
    if (cancelled > 0)
        progress_set(p, "[%ld/%ld] running %ld \xc2\xb7 done %ld \xc2\xb7 failed %ld \xc2\xb7 "
                     "cancelled %ld", started, total, running, done, failed, cancelled);
    else
        progress_set(p, "[%ld/%ld] running %ld \xc2\xb7 done %ld \xc2\xb7 failed %ld", started,
                     total, running, done, failed);
}

void progress_say(progress *p, const char *fmt, ...)
{
    if (!p->f)
        return;
    if (p->open)
        fprintf(p->f, "\r\033[K");
    va_list ap;
    va_start(ap, fmt);
    fprintf(p->f, "hearth: ");
    vfprintf(p->f, fmt, ap);
    va_end(ap);
    fprintf(p->f, "\n");
    p->open = 0;
    if (p->tty && p->line[0]) {
        fprintf(p->f, "%s\033[K", p->line);
        p->open = 1;
    }
    fflush(p->f);
}

void progress_end(progress *p)
{
    if (p->f && p->open) {
        fprintf(p->f, "\n");
        fflush(p->f);
    }
    p->open = 0;
}
