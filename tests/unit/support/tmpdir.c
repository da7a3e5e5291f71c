/* tmpdir.c - see tmpdir.h. */
#include "tests/unit/support/tmpdir.h"

#include <stdio.h>
#include <stdlib.h>

int tu_tmpdir_make(char *dir, size_t n, const char *tag)
{
    const char *base = getenv("TMPDIR");
    int len = snprintf(dir, n, "%s/hearth-%s-XXXXXX", base ? base : "/tmp", tag);
    if (len < 0 || (size_t)len >= n)
        return -1;
    return mkdtemp(dir) ? 0 : -1;
}

int tu_tmpdir_remove(const char *dir)
{
    /* Only names made by tu_tmpdir_make come here: no quote in them. */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) == 0)
        return 0;
    fprintf(stderr, "could not remove %s\n", dir);
    return -1;
}

int tu_write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    if (!fp)
        return -1;
    int bad = fputs(text, fp) < 0;
    return fclose(fp) != 0 || bad ? -1 : 0;
}
