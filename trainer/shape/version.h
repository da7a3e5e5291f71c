/* version.h - the version of hearth-train, for --version and result.json.
 *
 * The release number lives here; the git description of the tree it was built from is
 * passed at build time as -DHEARTH_GIT_DESCRIBE="\"$(git describe --always --dirty)\""
 * (absent when building from a tarball). */
#ifndef HEARTH_VERSION_H
#define HEARTH_VERSION_H

#define HEARTH_VERSION "0.1.0"

/* "0.1.0". */
const char *version_release(void);
/* The git description given at build time, or NULL when none was given. */
const char *version_git_describe(void);
/* The --version line: "hearth-train 0.1.0" or "hearth-train 0.1.0 (v0.1.0-3-gabc1234)". */
const char *version_line(void);

#endif
