#include "shape/version.h"

#include <stddef.h>

const char *version_release(void)
{
    return HEARTH_VERSION;
}

const char *version_git_describe(void)
{
#ifdef HEARTH_GIT_DESCRIBE
    return HEARTH_GIT_DESCRIBE[0] ? HEARTH_GIT_DESCRIBE : NULL;
#else
    return NULL;
#endif
}

const char *version_line(void)
{
#ifdef HEARTH_GIT_DESCRIBE
    /* An empty description (no git at build time) prints as if none were given. */
    if (HEARTH_GIT_DESCRIBE[0])
        return "hearth-train " HEARTH_VERSION " (" HEARTH_GIT_DESCRIBE ")";
#endif
    return "hearth-train " HEARTH_VERSION;
}
