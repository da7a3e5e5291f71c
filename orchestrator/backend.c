/* backend.c - choosing a backend by name.  See backend.h. */
#include <string.h>

#include "backend.h"

int backend_open(const char *name, backend **out, hearth_err *err)
{
    *out = NULL;
    if (!name || strcmp(name, "local") == 0)
        return backend_local_create(out, 0, err);
    if (strcmp(name, "slurm") == 0)
        return backend_slurm_create(out, err);
    if (strcmp(name, "slurmrest") == 0)
        return backend_slurmrest_create(out, NULL, NULL, err);
    return herr_set(err, HERR_CONFIG, "--backend %s: unknown backend (expected local, slurm "
                    "or slurmrest)", name);
}

void backend_free(backend *b)
{
    if (b)
        b->ops->free(b);
}
