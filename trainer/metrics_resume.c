/* metrics_resume.c - metrics.jsonl of a resumed run: each step once (outputs.h). */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "outputs.h"

int metrics_open_resume(metrics_file *mf, const char *dir, int step, hearth_err *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/metrics.jsonl", dir) >= (int)sizeof path)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    FILE *in = fopen(path, "r");
    if (!in && errno != ENOENT)
        return herr_set(err, HERR_IO, "%s: cannot read: %s", path, strerror(errno));
    char *kept = NULL, *line = NULL;
    size_t kept_len = 0, cap = 0;
    FILE *mem = open_memstream(&kept, &kept_len);
    if (!mem) {
        if (in)
            fclose(in);
        return herr_set(err, HERR_NOMEM, "%s: out of memory", path);
    }
    ssize_t n;
    while (in && (n = getline(&line, &cap, in)) > 0) {
        if (line[n - 1] != '\n')
            break;                        /* torn: the process died writing it */
        json_t *o = json_loadb(line, (size_t)n, 0, NULL);
        json_t *js = json_object_get(o, "step");
        int ok = json_is_integer(js) && json_integer_value(js) <= step;
        json_decref(o);
        if (!ok)
            break;
        fputs(line, mem);
    }
    free(line);
    if (in)
        fclose(in);
    if (fclose(mem)) {
        free(kept);
        return herr_set(err, HERR_NOMEM, "%s: out of memory", path);
    }
    int rc = outputs_write_atomic(dir, "metrics.jsonl", kept ? kept : "", err);
    free(kept);
    if (rc)
        return rc;
    mf->f = fopen(path, "a");
    if (!mf->f)
        return herr_set(err, HERR_IO, "%s: cannot open: %s", path, strerror(errno));
    return 0;
}
