/* file_read.h - the one reader of the whole files that Hearth's programs take as input.
 *
 * Presets, run configs, experiment specs, fp8 policies, the user config, templates and job
 * scripts, JSON manifests and indexes, token files: each is read whole into memory, so each
 * is read here, under a limit the caller chooses for that kind of file.  The reader
 *   - opens without blocking and refuses anything but a regular file: a FIFO named by
 *     mistake would otherwise hang in open() or read() forever, /dev/zero or /dev/urandom
 *     would be read until memory runs out;
 *   - refuses a file over the limit before reading it, and stops reading as soon as more
 *     than the limit has come (a file that grows while read, a procfs file of size 0), so a
 *     file is never silently truncated and never exhausts memory.
 * Messages name the path, and the limit where it was hit:
 *     /dev/zero: not a regular file (a character device)
 *     tok: 9000 bytes, over the limit of 8 KiB for this file
 * Callers add what the file was for with herr_prefix.
 *
 * Large data (token shards, safetensors checkpoints) is mapped or streamed, never read
 * whole: its readers open through file_open_regular only, which refuses what is not a
 * regular file in the same way.
 *
 * Ownership: *text is malloc'd by the reader and freed by the caller (NULL on failure);
 * *json is a new reference the caller json_decref()s; a descriptor from
 * file_open_regular is the caller's to close. */
#ifndef HEARTH_FILE_READ_H
#define HEARTH_FILE_READ_H

#include <jansson.h>
#include <stddef.h>
#include <sys/stat.h>

#include "shape/err.h"

/* YAML and JSON inputs: presets, run configs, specs, policies, templates, manifests.  The
 * largest of ours are specs with many include entries and checkpoint manifests, far below. */
#define FILE_READ_MAX_TEXT ((size_t)16 << 20)
/* A secret token (a JWT from `scontrol token` is a few hundred bytes). */
#define FILE_READ_MAX_TOKEN ((size_t)8 << 10)

/* Opens `path` read-only for a caller that maps or streams it: HERR_IO when it cannot be
 * opened or is not a regular file.  *st gets its fstat (st may be NULL). */
int file_open_regular(const char *path, int *fd, struct stat *st, hearth_err *err);

/* Reads a whole regular file of at most max_bytes (at most SIZE_MAX / 2) into a malloc'd,
 * NUL-terminated *text (the file may itself hold NULs: *len, when len is not NULL, is its
 * size).  HERR_IO when it cannot be opened or read, is not a regular file or is larger
 * than max_bytes; HERR_NOMEM. */
int file_read_bounded(const char *path, size_t max_bytes, char **text, size_t *len,
                      hearth_err *err);

/* The same from a descriptor of file_open_regular (read from its current offset; left
 * open); `path` names it in messages. */
int file_read_fd(int fd, const char *path, size_t max_bytes, char **text, size_t *len,
                 hearth_err *err);

/* A JSON file of at most max_bytes, parsed with jansson's `flags`: HERR_IO as
 * file_read_bounded; HERR_CONFIG "PATH:LINE:COL: not valid JSON: WHAT" when it does not
 * parse. */
int file_read_json(const char *path, size_t max_bytes, size_t flags, json_t **json,
                   hearth_err *err);

#endif
