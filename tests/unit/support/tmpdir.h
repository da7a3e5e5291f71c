/* tmpdir.h - temporary directories and small files for the unit tests.
 *
 * tu_tmpdir_make creates a fresh private directory under $TMPDIR (else /tmp) named
 * hearth-TAG-XXXXXX; tu_tmpdir_remove deletes it with everything in it.  The caller owns
 * the name buffer.  No cmocka dependency (the bench links the support files too): the
 * functions return 0 or -1 and the test asserts on that. */
#ifndef HEARTH_TMPDIR_H
#define HEARTH_TMPDIR_H

#include <stddef.h>

/* Writes the name into dir[0..n) and creates the directory; 0, or -1 when it could not. */
int tu_tmpdir_make(char *dir, size_t n, const char *tag);
/* Removes `dir` recursively; 0, or -1 (also reported on stderr) when that failed. */
int tu_tmpdir_remove(const char *dir);
/* Creates or truncates `path` with `text`; 0, or -1 when it could not be written. */
int tu_write_text(const char *path, const char *text);

#endif
