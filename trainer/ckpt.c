/* ckpt.c - writing training checkpoints and pruning old ones (ckpt.h). */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "ckpt_state.h"
#include "file_digest.h"
#include "outputs.h"

int ckpt_dir_step(const char *name)
{
    int step, used = 0;
    if (strncmp(name, "step-", 5) || strlen(name) != 13 ||
        sscanf(name, "step-%8d%n", &step, &used) != 1 || used != 13 || step < 0)
        return -1;
    for (int i = 5; i < 13; i++)
        if (name[i] < '0' || name[i] > '9')
            return -1;
    return step;
}

int ckpt_resume_hash(const run_config *cfg, char out_hex[65], hearth_err *err)
{
    run_config *c = malloc(sizeof *c);
    if (!c)
        return herr_set(err, HERR_NOMEM, "out of memory");
    *c = *cfg;
    c->train.checkpoint_every = 0;
    c->train.measure_from = 0;
    int rc = run_config_hash(c, out_hex, err);
    free(c);
    return rc;
}

static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Removes a checkpoint directory: its files (it has no subdirectories), then itself. */
static int remove_flat_dir(const char *dir, hearth_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0
                               : herr_set(err, HERR_IO, "%s: cannot open: %s", dir,
                                          strerror(errno));
    char path[4400];
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) && errno != ENOENT) {
            int en = errno;
            closedir(d);
            return herr_set(err, HERR_IO, "%s: cannot remove: %s", path, strerror(en));
        }
    }
    closedir(d);
    if (rmdir(dir) && errno != ENOENT)
        return herr_set(err, HERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    return 0;
}

static json_t *summary_to_json(const run_summary *sum)
{
    json_t *o = json_object(), *st = json_array(), *ms = json_array(), *tk = json_array(),
           *fl = json_array();
    for (int i = 0; st && ms && tk && fl && i < sum->n; i++) {
        json_array_append_new(st, json_integer(sum->step[i]));
        json_array_append_new(ms, json_real(sum->step_ms[i]));
        json_array_append_new(tk, json_integer(sum->tokens[i]));
        json_array_append_new(fl, json_real(sum->flops[i]));
    }
    json_t *last = json_real(sum->last_loss);
    json_object_set_new(o, "last_loss", last ? last : json_null());
    json_object_set_new(o, "step", st);
    json_object_set_new(o, "step_ms", ms);
    json_object_set_new(o, "tokens", tk);
    json_object_set_new(o, "flops", fl);
    return o;
}

static json_t *layout_to_json(const run_config *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "tp", json_integer(c->parallel.tp));
    json_object_set_new(o, "cp", json_integer(c->parallel.cp));
    json_object_set_new(o, "pp", json_integer(c->parallel.pp));
    json_object_set_new(o, "vpp", json_integer(c->parallel.vpp));
    json_object_set_new(o, "dp", json_integer(c->parallel.dp));
    json_object_set_new(o, "ep", json_integer(c->parallel.ep));
    json_object_set_new(o, "sp", json_integer(c->parallel.sp));
    json_object_set_new(o, "encoder_strategy",
                        json_string(encoder_strategy_name(c->parallel.encoder.strategy)));
    json_object_set_new(o, "encoder_tp", json_integer(c->parallel.encoder.tp));
    json_object_set_new(o, "distributed_optimizer",
                        json_boolean(c->parallel.distributed_optimizer));
    return o;
}

/* manifest.json's text for the rank files already in dir. */
static char *manifest_text(const char *dir, int ranks, int step, const run_config *cfg,
                           const char *config_hash, const run_summary *sum, hearth_err *err)
{
    char resume[65], path[4200];
    json_t *config = NULL;
    char *canon = run_config_canonical_json(cfg, err);
    if (!canon)
        return NULL;
    json_error_t je;
    config = json_loads(canon, 0, &je);
    free(canon);
    if (!config || ckpt_resume_hash(cfg, resume, err)) {
        json_decref(config);
        if (!config)
            herr_set(err, HERR_RUNTIME, "the canonical config does not parse: %s", je.text);
        return NULL;
    }
    json_t *files = json_array();
    for (int r = 0; r < ranks; r++) {
        long long bytes;
        char hex[65];
        if (ckpt_rank_path(path, sizeof path, dir, r, err) ||
            file_sha256(path, &bytes, hex, err)) {
            json_decref(files);
            json_decref(config);
            return NULL;
        }
        json_t *f = json_object();
        json_object_set_new(f, "name", json_string(strrchr(path, '/') + 1));
        json_object_set_new(f, "rank", json_integer(r));
        json_object_set_new(f, "bytes", json_integer(bytes));
        json_object_set_new(f, "sha256", json_string(hex));
        json_array_append_new(files, f);
    }
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string(CKPT_FORMAT));
    json_object_set_new(o, "version", json_integer(CKPT_VERSION));
    json_object_set_new(o, "step", json_integer(step));
    json_object_set_new(o, "next_sample",
                        json_integer((json_int_t)step * cfg->train.global_batch));
    json_object_set_new(o, "config_hash", json_string(config_hash));
    json_object_set_new(o, "resume_hash", json_string(resume));
    json_object_set_new(o, "ranks", json_integer(ranks));
    json_object_set_new(o, "layout", layout_to_json(cfg));
    json_object_set_new(o, "files", files);
    json_object_set_new(o, "summary", summary_to_json(sum));
    json_object_set_new(o, "config", config);
    char *s = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!s)
        herr_set(err, HERR_NOMEM, "%s/" CKPT_MANIFEST ": out of memory", dir);
    return s;
}

/* Deletes leftover *.tmp directories and complete checkpoints older than the newest
 * `keep` (never `current`). */
static int prune(const char *root, int keep, int current, hearth_err *err)
{
    DIR *d = opendir(root);
    if (!d)
        return herr_set(err, HERR_IO, "%s: cannot open: %s", root, strerror(errno));
    int *steps = NULL, n = 0, cap = 0, rc = 0;
    char **stale = NULL;
    int n_stale = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s = ckpt_dir_step(e->d_name);
        size_t len = strlen(e->d_name);
        if (s >= 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                int *ns = realloc(steps, (size_t)cap * sizeof *ns);
                if (!ns) {
                    rc = herr_set(err, HERR_NOMEM, "out of memory");
                    break;
                }
                steps = ns;
            }
            steps[n++] = s;
        } else if (!strncmp(e->d_name, "step-", 5) && len > 4 &&
                   !strcmp(e->d_name + len - 4, ".tmp")) {
            char **ns = realloc(stale, (size_t)(n_stale + 1) * sizeof *ns);
            if (!ns || !(ns[n_stale] = strdup(e->d_name))) {
                stale = ns ? ns : stale;
                rc = herr_set(err, HERR_NOMEM, "out of memory");
                break;
            }
            stale = ns;
            n_stale++;
        }
    }
    closedir(d);
    char path[4400];
    for (int i = 0; i < n_stale; i++) {
        snprintf(path, sizeof path, "%s/%s", root, stale[i]);
        if (!rc)
            rc = remove_flat_dir(path, err);
        free(stale[i]);
    }
    free(stale);
    /* Keep the `keep` largest steps. */
    for (int i = 0; !rc && i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++)
            newer += steps[j] > steps[i];
        if (newer < keep || steps[i] == current)
            continue;
        snprintf(path, sizeof path, "%s/" CKPT_DIR_FMT, root, steps[i]);
        rc = remove_flat_dir(path, err);
    }
    free(steps);
    return rc;
}

int ckpt_remove_all(const char *run_dir, hearth_err *err)
{
    char root[4200], path[4500];
    if (snprintf(root, sizeof root, "%s/checkpoints", run_dir) >= (int)sizeof root)
        return herr_set(err, HERR_IO, "%s: path too long", run_dir);
    snprintf(path, sizeof path, "%s/" CKPT_LATEST, root);
    if (unlink(path) && errno != ENOENT && errno != ENOTDIR)
        return herr_set(err, HERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    DIR *d = opendir(root);
    if (!d)
        return errno == ENOENT || errno == ENOTDIR
                   ? 0 : herr_set(err, HERR_IO, "%s: cannot open: %s", root, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d)))
        if (!strncmp(e->d_name, "step-", 5)) {
            snprintf(path, sizeof path, "%s/%s", root, e->d_name);
            rc = remove_flat_dir(path, err);
        }
    closedir(d);
    if (!rc && rmdir(root) && errno != ENOTEMPTY && errno != EEXIST)
        rc = herr_set(err, HERR_IO, "%s: cannot remove: %s", root, strerror(errno));
    return rc;
}

int ckpt_write(const char *run_dir, trainer *tr, const run_config *cfg,
               const char *config_hash, const run_summary *sum, const ckpt_write_opts *opts,
               char *out, size_t out_n, hearth_err *err)
{
    ckpt_write_opts o = opts ? *opts : (ckpt_write_opts){ 0 };
    int keep = o.keep > 0 ? o.keep : CKPT_KEEP;
    int step = trainer_steps_done(tr), ranks = trainer_ranks(tr);
    char root[4200], tmp[4300], fin[4300], old[4400], name[32];
    if (snprintf(root, sizeof root, "%s/checkpoints", run_dir) >= (int)sizeof root)
        return herr_set(err, HERR_IO, "%s: path too long", run_dir);
    snprintf(name, sizeof name, CKPT_DIR_FMT, step);
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", root, name);
    snprintf(fin, sizeof fin, "%s/%s", root, name);
    snprintf(old, sizeof old, "%s/%s.old.tmp", root, name);
    int rc = outputs_mkdir_p(root, err);
    /* A .tmp directory is what a crash left: never part of a usable checkpoint. */
    if (!rc)
        rc = remove_flat_dir(tmp, err);
    if (!rc && mkdir(tmp, 0777))
        rc = herr_set(err, HERR_IO, "%s: cannot create directory: %s", tmp, strerror(errno));
    if (!rc)
        rc = trainer_save(tr, tmp, err);
    if (rc || o.stop_after == 1)
        return rc ? herr_prefix(err, rc, "checkpoint of step %d", step) : 0;
    char *text = manifest_text(tmp, ranks, step, cfg, config_hash, sum, err);
    if (!text)
        return herr_prefix(err, HERR_RUNTIME, "checkpoint of step %d", step);
    size_t len = strlen(text);
    char *line = realloc(text, len + 2);
    if (!line) {
        free(text);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    line[len] = '\n';
    line[len + 1] = '\0';
    rc = outputs_write_atomic(tmp, CKPT_MANIFEST, line, err);
    free(line);
    if (rc || o.stop_after == 2)
        return rc;
    /* The same step written again (a run resumed from an older checkpoint): the old
     * directory moves aside first, as rename cannot replace a non-empty directory. */
    struct stat sb;
    if (stat(fin, &sb) == 0) {
        if ((rc = remove_flat_dir(old, err)))
            return rc;
        if (rename(fin, old))
            return herr_set(err, HERR_IO, "%s: rename failed: %s", fin, strerror(errno));
    }
    if (rename(tmp, fin))
        return herr_set(err, HERR_IO, "%s: rename failed: %s", tmp, strerror(errno));
    sync_dir(root);
    if (o.stop_after == 3)
        return 0;
    char latest[48];
    snprintf(latest, sizeof latest, "%s\n", name);
    if ((rc = outputs_write_atomic(root, CKPT_LATEST, latest, err)))
        return rc;
    if (out && snprintf(out, out_n, "%s", fin) >= (int)out_n)
        return herr_set(err, HERR_IO, "%s: path too long", fin);
    return prune(root, keep, step, err);
}
