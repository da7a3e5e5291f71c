#include "outputs.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shape/version.h"

int outputs_mkdir_p(const char *dir, hearth_err *err)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0)
        return herr_set(err, HERR_IO, "empty directory name");
    if (n >= sizeof path)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return herr_set(err, HERR_IO, "%s: cannot create directory: %s", path,
                            strerror(errno));
        path[i] = c;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return herr_set(err, HERR_IO, "%s: not a directory", dir);
    return 0;
}

const char *outputs_earlier_results(const char *dir)
{
    static const char *const names[] = { "result.json", "metrics.jsonl",
                                         "checkpoints/latest" };
    char path[4096];
    struct stat sb;
    /* Empty files are what a run that died before its first step leaves: nothing to lose. */
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) < (int)sizeof path &&
            stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0)
            return names[i];
    return NULL;
}

int outputs_write_atomic(const char *dir, const char *name, const char *text, hearth_err *err)
{
    char tmp[4096], dst[4096];
    if (snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name) >= (int)sizeof tmp ||
        snprintf(dst, sizeof dst, "%s/%s", dir, name) >= (int)sizeof dst)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return herr_set(err, HERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return herr_set(err, HERR_IO, "%s: write failed: %s", tmp, strerror(e));
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return herr_set(err, HERR_IO, "%s: fsync failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, dst) != 0) {
        int e = errno;
        unlink(tmp);
        return herr_set(err, HERR_IO, "%s: rename failed: %s", dst, strerror(e));
    }
    /* The rename itself is durable only once the directory is synced. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

long long outputs_peak_mem_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) {
            kb = strtoll(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return kb * 1024;
}

/* A real, or null for NaN/inf; jansson refuses non-finite reals. */
static json_t *jreal(double x)
{
    json_t *j = json_real(x);
    return j ? j : json_null();
}

static json_t *jstr_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

#define DUMP_FLAGS(indent) (JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17) | (indent))

char *metrics_line(const train_step_stats *st, long long peak_mem_bytes)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    double tps = st->step_ms > 0 ? (double)st->tokens / (st->step_ms / 1e3) : NAN;
    json_object_set_new(o, "step", json_integer(st->step));
    json_object_set_new(o, "loss", jreal(st->loss));
    json_object_set_new(o, "grad_norm", jreal(st->grad_norm));
    json_object_set_new(o, "lr", jreal(st->lr));
    json_object_set_new(o, "step_ms", jreal(st->step_ms));
    json_object_set_new(o, "tokens", json_integer(st->tokens));
    json_object_set_new(o, "tokens_per_s", jreal(tps));
    json_object_set_new(o, "encoder_ms", jreal(st->encoder_ms));
    json_object_set_new(o, "decoder_ms", jreal(st->decoder_ms));
    json_object_set_new(o, "peak_mem_bytes", json_integer(peak_mem_bytes));
    char *s = json_dumps(o, DUMP_FLAGS(JSON_COMPACT));
    json_decref(o);
    return s;
}

int metrics_open(metrics_file *mf, const char *dir, hearth_err *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/metrics.jsonl", dir) >= (int)sizeof path)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    mf->f = fopen(path, "w");
    if (!mf->f)
        return herr_set(err, HERR_IO, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

int metrics_append(metrics_file *mf, const train_step_stats *st, long long peak_mem_bytes,
                   hearth_err *err)
{
    char *s = metrics_line(st, peak_mem_bytes);
    if (!s)
        return herr_set(err, HERR_NOMEM, "metrics.jsonl: out of memory");
    int bad = fprintf(mf->f, "%s\n", s) < 0 || fflush(mf->f) != 0;
    free(s);
    if (bad)
        return herr_set(err, HERR_IO, "metrics.jsonl: write failed: %s", strerror(errno));
    return 0;
}

void metrics_close(metrics_file *mf)
{
    if (mf && mf->f) {
        fclose(mf->f);
        mf->f = NULL;
    }
}

/* result.json's "memory" object (docs/memory.md); null without figures. */
static json_t *memory_json(const run_memory *m)
{
    json_t *o = m ? json_object() : NULL, *cat = m ? json_object() : NULL;
    if (!o || !cat) {
        json_decref(o);
        json_decref(cat);
        return json_null();
    }
    json_object_set_new(o, "predicted_peak_bytes", json_integer(m->peak.total));
    json_object_set_new(o, "predicted_peak_rank", json_integer(m->peak.rank));
    json_object_set_new(o, "predicted_peak_stage", json_integer(m->peak.p));
    for (int k = 0; k < MEM_CATEGORIES; k++)
        json_object_set_new(cat, mem_category_name((mem_category)k),
                            json_integer(m->peak.bytes[k]));
    json_object_set_new(o, "predicted_by_category", cat);
    json_object_set_new(o, "predicted_host_bytes", json_integer(m->peak.host_bytes));
    json_object_set_new(o, "predicted_process_bytes", json_integer(m->process_predicted));
    json_object_set_new(o, "measured_peak_bytes", json_integer(m->measured_bytes));
    json_object_set_new(o, "measured_source", jstr_or_null(m->measured_source));
    return o;
}

char *result_json(const run_result *r, hearth_err *err)
{
    json_t *o = json_object(), *v = json_object();
    if (!o || !v) {
        json_decref(o);
        json_decref(v);
        herr_set(err, HERR_NOMEM, "result.json: out of memory");
        return NULL;
    }
    json_object_set_new(o, "config_hash", json_string(r->config_hash));
    json_object_set_new(o, "steps", json_integer(r->num.steps));
    json_object_set_new(o, "step_ms_median", jreal(r->num.step_ms_median));
    json_object_set_new(o, "step_ms_p10", jreal(r->num.step_ms_p10));
    json_object_set_new(o, "step_ms_p90", jreal(r->num.step_ms_p90));
    json_object_set_new(o, "tokens_per_s", jreal(r->num.tokens_per_s));
    json_object_set_new(o, "tokens_per_s_per_gpu", jreal(r->tokens_per_s_per_gpu));
    json_object_set_new(o, "flops_per_token", jreal(r->num.flops_per_token));
    json_object_set_new(o, "mfu", jreal(r->mfu));
    json_object_set_new(o, "peak_mem_bytes", json_integer(r->peak_mem_bytes));
    json_object_set_new(o, "final_loss", jreal(r->num.final_loss));
    json_object_set_new(o, "exit_status", json_string(r->exit_status));
    json_object_set_new(o, "device", json_string(r->device));
    json_object_set_new(o, "device_count", json_integer(r->device_count));
    json_object_set_new(o, "nodes", json_integer(r->nodes));
    json_object_set_new(v, "hearth", json_string(version_release()));
    json_object_set_new(v, "git_describe", jstr_or_null(version_git_describe()));
    json_object_set_new(v, "cuda", jstr_or_null(r->cuda_version));
    json_object_set_new(v, "cublaslt", jstr_or_null(r->cublaslt_version));
    json_object_set_new(v, "nccl", json_null());
    json_object_set_new(o, "versions", v);
    json_object_set_new(o, "memory", memory_json(r->memory));
    char *s = json_dumps(o, DUMP_FLAGS(JSON_INDENT(2)));
    json_decref(o);
    if (!s)
        herr_set(err, HERR_NOMEM, "result.json: out of memory");
    return s;
}

int result_write(const char *dir, const run_result *r, hearth_err *err)
{
    char *s = result_json(r, err);
    if (!s)
        return HERR_NOMEM;
    size_t n = strlen(s);
    char *t = malloc(n + 2);
    if (!t) {
        free(s);
        return herr_set(err, HERR_NOMEM, "result.json: out of memory");
    }
    memcpy(t, s, n);
    t[n] = '\n';
    t[n + 1] = '\0';
    free(s);
    int rc = outputs_write_atomic(dir, "result.json", t, err);
    free(t);
    return rc;
}
