/* file_read.c - bounded whole-file reads of regular files only (file_read.h). */
#include "shape/file_read.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *kind_of(mode_t m)
{
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a plain file";
}

/* "16 MiB", "8 KiB" or "100 bytes": limits read as they were written. */
static void size_text(size_t n, char *buf, size_t size)
{
    if (n >= ((size_t)1 << 20) && n % ((size_t)1 << 20) == 0)
        snprintf(buf, size, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(buf, size, "%zu KiB", n >> 10);
    else
        snprintf(buf, size, "%zu bytes", n);
}

static int too_large(const char *path, size_t max_bytes, long long size, hearth_err *err)
{
    char lim[32];
    size_text(max_bytes, lim, sizeof lim);
    if (size >= 0)
        return herr_set(err, HERR_IO, "%s: %lld bytes, over the limit of %s for this file",
                        path, size, lim);
    return herr_set(err, HERR_IO, "%s: more than the limit of %s for this file", path, lim);
}

int file_open_regular(const char *path, int *fd, struct stat *st, hearth_err *err)
{
    *fd = -1;
    /* O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting for
     * one; it is cleared again below, so a regular file reads as usual. */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (f < 0)
        return herr_set(err, HERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        return herr_set(err, HERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return herr_set(err, HERR_IO, "%s: not a regular file (%s)", path, kind_of(sb.st_mode));
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(f);
        return herr_set(err, HERR_IO, "%s: %s", path, strerror(e));
    }
    if (st)
        *st = sb;
    *fd = f;
    return 0;
}

int file_read_fd(int fd, const char *path, size_t max_bytes, char **text, size_t *len,
                 hearth_err *err)
{
    *text = NULL;
    if (len)
        *len = 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return herr_set(err, HERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (sb.st_size > 0 && (unsigned long long)sb.st_size > max_bytes)
        return too_large(path, max_bytes, (long long)sb.st_size, err);
    /* The size is a hint (procfs says 0, a file may grow): room for one byte more than it,
     * so that reaching the end needs no second allocation, growing up to max_bytes + 1 so
     * that a file over the limit is seen as such. */
    size_t cap = (size_t)(sb.st_size > 0 ? sb.st_size : 0) + 2, n = 0;
    if (cap < 4096)
        cap = 4096;
    if (cap > max_bytes + 2)
        cap = max_bytes + 2;
    char *buf = malloc(cap);
    if (!buf)
        return herr_set(err, HERR_NOMEM, "%s: out of memory", path);
    for (;;) {
        if (n > max_bytes) {
            free(buf);
            return too_large(path, max_bytes, -1, err);
        }
        if (n + 1 == cap) {
            size_t grown = cap > (max_bytes + 2) / 2 ? max_bytes + 2 : cap * 2;
            char *b = realloc(buf, grown);
            if (!b) {
                free(buf);
                return herr_set(err, HERR_NOMEM, "%s: out of memory", path);
            }
            buf = b;
            cap = grown;
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            return herr_set(err, HERR_IO, "%s: read error: %s", path, strerror(e));
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    buf[n] = '\0';
    *text = buf;
    if (len)
        *len = n;
    return 0;
}

int file_read_bounded(const char *path, size_t max_bytes, char **text, size_t *len,
                      hearth_err *err)
{
    *text = NULL;
    if (len)
        *len = 0;
    int fd;
    int rc = file_open_regular(path, &fd, NULL, err);
    if (rc)
        return rc;
    rc = file_read_fd(fd, path, max_bytes, text, len, err);
    close(fd);
    return rc;
}

int file_read_json(const char *path, size_t max_bytes, size_t flags, json_t **json,
                   hearth_err *err)
{
    *json = NULL;
    char *text;
    size_t len;
    int rc = file_read_bounded(path, max_bytes, &text, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    *json = json_loadb(text, len, flags, &je);
    free(text);
    if (!*json)
        return herr_set(err, HERR_CONFIG, "%s:%d:%d: not valid JSON: %s", path, je.line,
                        je.column, je.text);
    return 0;
}
