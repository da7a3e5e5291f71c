/* file_digest.c - size and sha256 of a file (file_digest.h). */
#include "file_digest.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shape/file_read.h"

int file_sha256(const char *path, long long *bytes, char hex[65], hearth_err *err)
{
    static const char digits[] = "0123456789abcdef";
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT)
        return herr_set(err, HERR_CONFIG, "%s: missing", path);
    int fd;
    int rc = file_open_regular(path, &fd, NULL, err);
    if (rc)
        return rc;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(ctx);
        close(fd);
        return herr_set(err, HERR_RUNTIME, "%s: sha256 failed", path);
    }
    static const size_t chunk = 1 << 20;
    unsigned char *buf = malloc(chunk);
    long long total = 0;
    rc = buf ? 0 : herr_set(err, HERR_NOMEM, "%s: out of memory", path);
    while (!rc) {
        ssize_t got = read(fd, buf, chunk);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc = herr_set(err, HERR_IO, "%s: read failed: %s", path, strerror(errno));
        else if (got == 0)
            break;
        else if (!EVP_DigestUpdate(ctx, buf, (size_t)got))
            rc = herr_set(err, HERR_RUNTIME, "%s: sha256 failed", path);
        else
            total += got;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned md_len = 0;
    if (!rc && (!EVP_DigestFinal_ex(ctx, md, &md_len) || md_len != 32))
        rc = herr_set(err, HERR_RUNTIME, "%s: sha256 failed", path);
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    if (rc)
        return rc;
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = '\0';
    *bytes = total;
    return 0;
}
