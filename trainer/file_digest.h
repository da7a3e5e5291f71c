/* file_digest.h - the size and sha256 of a file, read in full (checkpoint manifests and
 * dataset manifests record them; readers compare). */
#ifndef HEARTH_FILE_DIGEST_H
#define HEARTH_FILE_DIGEST_H

#include "shape/err.h"

/* *bytes and hex (64 lowercase hex digits + NUL) of the file at path.  A missing file is
 * HERR_CONFIG ("PATH: missing"), a read failure HERR_IO. */
int file_sha256(const char *path, long long *bytes, char hex[65], hearth_err *err);

#endif
