/* rundir.c - a run directory's files.  See rundir.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "render.h"
#include "rundir.h"
#include "shape/canon_json.h"
#include "shape/file_read.h"
#include "shape/run_config.h"

int rundir_path(char *buf, size_t size, const char *run_dir, const char *name,
                hearth_err *err)
{
    if ((size_t)snprintf(buf, size, "%s/%s", run_dir, name) >= size)
        return herr_set(err, HERR_IO, "%s/%s: path too long", run_dir, name);
    return 0;
}

int rundir_mkdirs(const char *path, hearth_err *err)
{
    char buf[4096];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf)
        return herr_set(err, HERR_IO, "%s: path too long", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0777) && errno != EEXIST)
                return herr_set(err, HERR_IO, "%s: %s", buf, strerror(errno));
            *p = c;
            if (!c)
                break;
        }
    }
    struct stat st;
    if (stat(path, &st) || !S_ISDIR(st.st_mode))
        return herr_set(err, HERR_IO, "%s: not a directory", path);
    return 0;
}

/* Removes every entry of the directory open as `dfd` (closed here), depth first.  Works on
 * descriptors and never follows a symbolic link: a link is removed, not what it names. */
static int remove_entries(int dfd, const char *path, hearth_err *err)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        int e = errno;
        close(dfd);
        return herr_set(err, HERR_IO, "%s: %s", path, strerror(e));
    }
    int rc = 0;
    struct dirent *de;
    while (!rc && (errno = 0, de = readdir(d))) {
        const char *name = de->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        char child[4200];
        if ((size_t)snprintf(child, sizeof child, "%s/%s", path, name) >= sizeof child) {
            rc = herr_set(err, HERR_IO, "%s/%s: path too long", path, name);
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW)) {
            if (errno != ENOENT)
                rc = herr_set(err, HERR_IO, "%s: %s", child, strerror(errno));
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0)
                rc = herr_set(err, HERR_IO, "%s: %s", child, strerror(errno));
            else
                rc = remove_entries(sub, child, err);
            if (!rc && unlinkat(dirfd(d), name, AT_REMOVEDIR) && errno != ENOENT)
                rc = herr_set(err, HERR_IO, "%s: %s", child, strerror(errno));
        } else if (unlinkat(dirfd(d), name, 0) && errno != ENOENT) {
            rc = herr_set(err, HERR_IO, "%s: %s", child, strerror(errno));
        }
    }
    if (!rc && errno)
        rc = herr_set(err, HERR_IO, "%s: %s", path, strerror(errno));
    closedir(d);
    return rc;
}

int rundir_remove_tree(const char *path, hearth_err *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : herr_set(err, HERR_IO, "%s: %s", path, strerror(errno));
    int rc = remove_entries(fd, path, err);
    if (!rc && rmdir(path) && errno != ENOENT)
        rc = herr_set(err, HERR_IO, "%s: %s", path, strerror(errno));
    return rc;
}

int rundir_write_file(const char *path, const char *data, size_t len, int mode,
                      hearth_err *err)
{
    char tmp[4200];
    const char *slash = strrchr(path, '/');
    int dlen = slash ? (int)(slash - path) + 1 : 0;
    if ((size_t)snprintf(tmp, sizeof tmp, "%.*s.%s.tmp", dlen, path,
                         slash ? slash + 1 : path) >= sizeof tmp)
        return herr_set(err, HERR_IO, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return herr_set(err, HERR_IO, "%s: %s", tmp, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, data + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return herr_set(err, HERR_IO, "%s: %s", tmp, strerror(e));
        }
        done += (size_t)n;
    }
    /* The mode given to open() is filtered by the user's umask, which stays respected; a
     * job script must still be executable (and readable) by its owner whatever the umask. */
    struct stat st;
    int fix = (mode & S_IXUSR) && fstat(fd, &st) == 0 &&
              (st.st_mode & (S_IXUSR | S_IRUSR)) != (S_IXUSR | S_IRUSR);
    if ((fix && fchmod(fd, (st.st_mode & 07777) | S_IXUSR | S_IRUSR)) || close(fd) ||
        rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return herr_set(err, HERR_IO, "%s: %s", path, strerror(e));
    }
    return 0;
}

void rundir_job_free(rundir_job *j)
{
    if (!j)
        return;
    free(j->run_id);
    free(j->experiment);
    free(j->backend);
    free(j->trainer);
    free(j->workdir);
    for (int i = 0; i < j->n_setup; i++)
        free(j->setup[i]);
    free(j->setup);
    free(j->config_hash);
    free(j->after_experiment);
    free(j->partition);
    free(j->account);
    free(j->qos);
    free(j->constraint);
    for (int i = 0; i < j->n_sbatch; i++)
        free(j->sbatch[i]);
    free(j->sbatch);
    memset(j, 0, sizeof *j);
}

static int dup_str(char **dst, const char *src)
{
    *dst = NULL;
    if (!src)
        return 0;
    *dst = strdup(src);
    return *dst ? 0 : HERR_NOMEM;
}

int rundir_job_copy(rundir_job *out, const rundir_job *in, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    out->cpus_per_task = in->cpus_per_task;
    out->time_limit_s = in->time_limit_s;
    out->retries = in->retries;
    out->repeat = in->repeat;
    out->max_concurrent = in->max_concurrent;
    out->retry_timeout = in->retry_timeout;
    out->pack = in->pack;
    out->after_any = in->after_any;
    out->nodes = in->nodes;
    out->gpus_per_node = in->gpus_per_node;
    out->bench_layers = in->bench_layers;
    int rc = dup_str(&out->run_id, in->run_id) || dup_str(&out->experiment, in->experiment) ||
             dup_str(&out->backend, in->backend) || dup_str(&out->trainer, in->trainer) ||
             dup_str(&out->workdir, in->workdir) ||
             dup_str(&out->config_hash, in->config_hash) ||
             dup_str(&out->after_experiment, in->after_experiment) ||
             dup_str(&out->partition, in->partition) || dup_str(&out->account, in->account) ||
             dup_str(&out->qos, in->qos) || dup_str(&out->constraint, in->constraint);
    if (!rc && in->n_sbatch) {
        out->sbatch = calloc((size_t)in->n_sbatch, sizeof *out->sbatch);
        rc = !out->sbatch;
        for (int i = 0; !rc && i < in->n_sbatch; i++, out->n_sbatch++)
            rc = dup_str(&out->sbatch[i], in->sbatch[i]);
    }
    if (!rc && in->n_setup) {
        out->setup = calloc((size_t)in->n_setup, sizeof *out->setup);
        rc = !out->setup;
        for (int i = 0; !rc && i < in->n_setup; i++, out->n_setup++)
            rc = dup_str(&out->setup[i], in->setup[i]);
    }
    if (rc) {
        rundir_job_free(out);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    return 0;
}

static json_t *job_to_json(const rundir_job *j)
{
    json_t *setup = json_array();
    for (int i = 0; setup && i < j->n_setup; i++)
        json_array_append_new(setup, json_string(j->setup[i]));
    json_t *after = json_null();
    if (j->after_experiment)
        after = json_pack("{s:s, s:s}", "experiment", j->after_experiment, "on",
                          j->after_any ? "any" : "ok");
    json_t *sb = json_array();
    for (int i = 0; sb && i < j->n_sbatch; i++)
        json_array_append_new(sb, json_string(j->sbatch[i]));
    json_t *slurm = json_pack("{s:s?, s:s?, s:s?, s:s?, s:o, s:i}", "partition", j->partition,
                              "account", j->account, "qos", j->qos, "constraint",
                              j->constraint, "sbatch", sb, "pack", j->pack > 1 ? j->pack : 1);
    json_t *launch = json_pack("{s:i, s:i}", "nodes", j->nodes > 1 ? j->nodes : 1,
                               "gpus_per_node", j->gpus_per_node > 0 ? j->gpus_per_node : 0);
    json_t *o = json_pack("{s:s?, s:s?, s:s?, s:s?, s:s?, s:o, s:s?, s:i, s:I, s:i, s:i, s:i, "
                          "s:b, s:o, s:o, s:o}",
                     "run_id", j->run_id, "experiment", j->experiment, "backend", j->backend,
                     "trainer", j->trainer, "workdir", j->workdir, "setup", setup,
                     "config_hash", j->config_hash, "cpus_per_task", j->cpus_per_task,
                     "time_limit_s", (json_int_t)j->time_limit_s, "retries", j->retries,
                     "repeat", j->repeat, "max_concurrent", j->max_concurrent,
                     "retry_timeout", j->retry_timeout != 0, "after", after,
                     "slurm", slurm, "launch", launch);
    /* Only a benchmark says so: a run's job.json stays as it always was. */
    if (o && j->bench_layers && json_object_set_new(o, "mode", json_string("bench-layers"))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int get_str(json_t *o, const char *key, char **out, int required, const char *path,
                   hearth_err *err)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) {
        if (required)
            return herr_set(err, HERR_CONFIG, "%s: %s: missing", path, key);
        return 0;
    }
    if (!json_is_string(v))
        return herr_set(err, HERR_CONFIG, "%s: %s: expected a string", path, key);
    if (!(*out = strdup(json_string_value(v))))
        return herr_set(err, HERR_NOMEM, "out of memory");
    return 0;
}

static int get_int(json_t *o, const char *key, int64_t *out, int64_t lo, const char *path,
                   hearth_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || !json_is_integer(v) || json_integer_value(v) < lo)
        return herr_set(err, HERR_CONFIG, "%s: %s: expected an integer >= %lld", path, key,
                        (long long)lo);
    *out = json_integer_value(v);
    return 0;
}

int rundir_job_read(const char *run_dir, rundir_job *j, hearth_err *err)
{
    char path[4200];
    memset(j, 0, sizeof *j);
    int rc = rundir_path(path, sizeof path, run_dir, "job.json", err);
    if (rc)
        return rc;
    json_t *o;
    if ((rc = file_read_json(path, FILE_READ_MAX_TEXT, 0, &o, err)))
        return rc;
    int64_t cpus = 1, limit = 0, retries = 0, repeat = 1, maxc = 0;
    if (!json_is_object(o))
        rc = herr_set(err, HERR_CONFIG, "%s: not a JSON object", path);
    if (!rc)
        rc = get_str(o, "run_id", &j->run_id, 1, path, err);
    if (!rc)
        rc = get_str(o, "experiment", &j->experiment, 1, path, err);
    if (!rc)
        rc = get_str(o, "backend", &j->backend, 1, path, err);
    if (!rc)
        rc = get_str(o, "trainer", &j->trainer, 1, path, err);
    if (!rc)
        rc = get_str(o, "workdir", &j->workdir, 1, path, err);
    if (!rc)
        rc = get_str(o, "config_hash", &j->config_hash, 1, path, err);
    if (!rc)
        rc = get_int(o, "cpus_per_task", &cpus, 1, path, err);
    if (!rc)
        rc = get_int(o, "time_limit_s", &limit, 0, path, err);
    if (!rc)
        rc = get_int(o, "retries", &retries, 0, path, err);
    if (!rc)
        rc = get_int(o, "repeat", &repeat, 1, path, err);
    if (!rc)
        rc = get_int(o, "max_concurrent", &maxc, 0, path, err);
    json_t *setup = rc ? NULL : json_object_get(o, "setup");
    if (!rc && setup && !json_is_array(setup))
        rc = herr_set(err, HERR_CONFIG, "%s: setup: expected a list", path);
    if (!rc && setup && json_array_size(setup)) {
        j->setup = calloc(json_array_size(setup), sizeof *j->setup);
        if (!j->setup)
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        for (size_t i = 0; !rc && i < json_array_size(setup); i++) {
            json_t *line = json_array_get(setup, i);
            if (!json_is_string(line))
                rc = herr_set(err, HERR_CONFIG, "%s: setup[%zu]: expected a string", path, i);
            else if (!(j->setup[i] = strdup(json_string_value(line))))
                rc = herr_set(err, HERR_NOMEM, "out of memory");
            else
                j->n_setup++;
        }
    }
    json_t *rt = rc ? NULL : json_object_get(o, "retry_timeout");
    if (!rc && rt && !json_is_boolean(rt))
        rc = herr_set(err, HERR_CONFIG, "%s: retry_timeout: expected true or false", path);
    j->retry_timeout = rt && json_is_true(rt);
    json_t *after = rc ? NULL : json_object_get(o, "after");
    if (!rc && after && json_is_object(after)) {
        char *on = NULL;
        rc = get_str(after, "experiment", &j->after_experiment, 1, path, err);
        if (!rc)
            rc = get_str(after, "on", &on, 0, path, err);
        j->after_any = on && strcmp(on, "any") == 0;
        free(on);
    }
    /* launch: absent in a job.json written before CUDA runs existed, i.e. a CPU run. */
    int64_t nodes = 1, gpus = 0;
    json_t *launch = rc ? NULL : json_object_get(o, "launch");
    if (!rc && launch && !json_is_object(launch))
        rc = herr_set(err, HERR_CONFIG, "%s: launch: expected a mapping", path);
    if (!rc && launch)
        rc = get_int(launch, "nodes", &nodes, 1, path, err);
    if (!rc && launch)
        rc = get_int(launch, "gpus_per_node", &gpus, 0, path, err);
    char *mode = NULL;
    if (!rc)
        rc = get_str(o, "mode", &mode, 0, path, err);
    if (!rc && mode && strcmp(mode, "bench-layers") != 0)
        rc = herr_set(err, HERR_CONFIG, "%s: mode: %s: expected bench-layers (or no mode: a "
                      "run)", path, mode);
    j->bench_layers = mode != NULL;
    free(mode);
    j->nodes = (int)(nodes > 1000000 ? 1000000 : nodes);
    j->gpus_per_node = (int)(gpus > 1000000 ? 1000000 : gpus);
    json_t *slurm = rc ? NULL : json_object_get(o, "slurm");
    j->pack = 1;
    if (!rc && slurm && json_is_object(slurm)) {
        json_t *pk = json_object_get(slurm, "pack");
        if (pk && json_is_integer(pk) && json_integer_value(pk) > 1)
            j->pack = json_integer_value(pk) > 1000000 ? 1000000 : (int)json_integer_value(pk);
        rc = get_str(slurm, "partition", &j->partition, 0, path, err);
        if (!rc)
            rc = get_str(slurm, "account", &j->account, 0, path, err);
        if (!rc)
            rc = get_str(slurm, "qos", &j->qos, 0, path, err);
        if (!rc)
            rc = get_str(slurm, "constraint", &j->constraint, 0, path, err);
        json_t *sb = rc ? NULL : json_object_get(slurm, "sbatch");
        if (!rc && sb && json_is_array(sb) && json_array_size(sb)) {
            j->sbatch = calloc(json_array_size(sb), sizeof *j->sbatch);
            if (!j->sbatch)
                rc = herr_set(err, HERR_NOMEM, "out of memory");
            for (size_t i = 0; !rc && i < json_array_size(sb); i++) {
                json_t *opt = json_array_get(sb, i);
                if (!json_is_string(opt))
                    rc = herr_set(err, HERR_CONFIG, "%s: slurm.sbatch[%zu]: expected a string",
                                  path, i);
                else if (!(j->sbatch[i] = strdup(json_string_value(opt))))
                    rc = herr_set(err, HERR_NOMEM, "out of memory");
                else
                    j->n_sbatch++;
            }
        }
    }
    json_decref(o);
    j->cpus_per_task = (int)(cpus > 4096 ? 4096 : cpus);
    j->time_limit_s = limit;
    j->retries = (int)(retries > 1000 ? 1000 : retries);
    j->repeat = (int)(repeat > 1000000 ? 1000000 : repeat);
    j->max_concurrent = (int)(maxc > 1000000 ? 1000000 : maxc);
    if (rc)
        rundir_job_free(j);
    return rc;
}

char *rundir_config_yaml(const char *config_json, hearth_err *err)
{
    size_t n = strlen(config_json);
    char *text = malloc(n + 2);
    if (!text) {
        herr_set(err, HERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(text, config_json, n);
    text[n] = '\n';
    text[n + 1] = 0;
    return text;
}

/* The trainer reads run.yaml with the same module that hashed the point: the hash must
 * come back unchanged, or every run would fail at ingest with a hash mismatch. */
static int check_round_trip(const char *path, const char *yaml, const char *want,
                            hearth_err *err)
{
    run_config c;
    char got[65];
    int rc = run_config_parse(&c, path, yaml, NULL, 0, 0, err);
    if (!rc)
        rc = run_config_hash(&c, got, err);
    if (rc)
        return herr_prefix(err, HERR_RUNTIME, "the written run config does not read back");
    if (want && strcmp(got, want) != 0)
        return herr_set(err, HERR_RUNTIME, "%s reads back with config hash %s, not %s: the run "
                        "config reader and the canonical JSON disagree", path, got, want);
    return 0;
}

int rundir_config_read(const char *run_dir, const char *hash, char **json, hearth_err *err)
{
    char path[4200], got[65];
    char *yaml = NULL;
    *json = NULL;
    int rc = rundir_path(path, sizeof path, run_dir, "run.yaml", err);
    if (!rc)
        rc = file_read_bounded(path, FILE_READ_MAX_TEXT, &yaml, NULL, err);
    if (rc)
        return rc;
    run_config c;
    rc = run_config_parse(&c, path, yaml, NULL, 0, 0, err);
    free(yaml);
    if (!rc)
        rc = run_config_hash(&c, got, err);
    if (rc)
        return rc;   /* the parser's message names the file: "PATH:LINE:COL: key: ..." */
    if (hash && strcmp(got, hash) != 0)
        return herr_set(err, HERR_CONFIG, "%s: config hash %s, but job.json says %s", path, got,
                        hash);
    /* The stored text is the canonical form, whatever spacing the file has. */
    if (!(*json = run_config_canonical_json(&c, err)))
        return HERR_CONFIG;
    return 0;
}

static int job_vars_render(const rundir_job *j, const char *run_dir, const char *tmpl_name,
                           const char *tmpl, char **script, hearth_err *err)
{
    char config[4200], cpus[32], nodes[32], gpus[32];
    int rc = rundir_path(config, sizeof config, run_dir, "run.yaml", err);
    if (rc)
        return rc;
    snprintf(cpus, sizeof cpus, "%d", j->cpus_per_task);
    snprintf(nodes, sizeof nodes, "%d", j->nodes > 1 ? j->nodes : 1);
    snprintf(gpus, sizeof gpus, "%d", j->gpus_per_node > 0 ? j->gpus_per_node : 0);
    size_t setup_len = 1;
    for (int i = 0; i < j->n_setup; i++)
        setup_len += strlen(j->setup[i]) + 6;
    char *setup = malloc(setup_len);
    if (!setup)
        return herr_set(err, HERR_NOMEM, "out of memory");
    size_t used = 0;
    setup[0] = 0;
    for (int i = 0; i < j->n_setup; i++)
        used += (size_t)snprintf(setup + used, setup_len - used, "    %s\n", j->setup[i]);
    render_var vars[] = {
        { "RUN_ID", j->run_id, 0 },
        { "EXPERIMENT", j->experiment, 0 },
        { "RUN_DIR", run_dir, 0 },
        { "TRAINER", j->trainer, 0 },
        { "CONFIG", config, 0 },
        { "WORKDIR", j->workdir, 0 },
        { "CONFIG_HASH", j->config_hash, 0 },
        { "CPUS_PER_TASK", cpus, 0 },
        { "NODES", nodes, 0 },
        { "GPUS_PER_NODE", gpus, 0 },   /* 0: a CPU run (one task); else one task per GPU */
        { "SETUP", setup, 1 },   /* resources.setup: shell lines by design */
        /* the trainer's mode in place of a run's --force / --resume: "" for a run */
        { "TRAINER_MODE", j->bench_layers ? "--bench-layers" : "", 0 },
    };
    rc = render_template(tmpl_name, tmpl, vars, sizeof vars / sizeof vars[0], script, err);
    free(setup);
    return rc;
}

int rundir_write(const char *run_dir, const rundir_job *j, const char *config_json,
                 const char *tmpl_name, const char *tmpl, hearth_err *err)
{
    char path[4200];
    char *yaml = NULL, *script = NULL, *job = NULL;
    int rc = rundir_mkdirs(run_dir, err);
    if (!rc && !(yaml = rundir_config_yaml(config_json, err)))
        rc = HERR_RUNTIME;
    if (!rc)
        rc = rundir_path(path, sizeof path, run_dir, "run.yaml", err);
    if (!rc)
        rc = check_round_trip(path, yaml, j->config_hash, err);
    if (!rc)
        rc = rundir_write_file(path, yaml, strlen(yaml), 0644, err);
    if (!rc) {
        json_t *o = job_to_json(j);
        job = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        if (!job)
            rc = herr_set(err, HERR_NOMEM, "out of memory writing job.json");
    }
    if (!rc)
        rc = rundir_path(path, sizeof path, run_dir, "job.json", err);
    if (!rc)
        rc = rundir_write_file(path, job, strlen(job), 0644, err);
    if (!rc)
        rc = job_vars_render(j, run_dir, tmpl_name, tmpl, &script, err);
    if (!rc)
        rc = rundir_path(path, sizeof path, run_dir, "job.sh", err);
    if (!rc)
        rc = rundir_write_file(path, script, strlen(script), 0755, err);
    free(yaml);
    free(job);
    free(script);
    return rc;
}

int rundir_exit_code(const char *run_dir, int *code)
{
    char path[4200], buf[64];
    if (rundir_path(path, sizeof path, run_dir, "exit_code", NULL))
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *end;
    long v = strtol(buf, &end, 10);
    if (end == buf || v < 0 || v > 255)
        return 0;
    *code = (int)v;
    return 1;
}

int rundir_has_checkpoint(const char *run_dir)
{
    char path[4200];
    struct stat sb;
    return !rundir_path(path, sizeof path, run_dir, "checkpoints/latest", NULL) &&
           stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

int rundir_archive_attempt(const char *run_dir, int attempt, int keep_outputs,
                           hearth_err *err)
{
    /* result.json sums up the attempt that wrote it (a resumed trainer writes its own):
     * left in place, it would speak for a later attempt that ended without one. */
    static const char *const always[] = { "stdout.log", "stderr.log", "exit_code",
                                          "result.json" };
    static const char *const outputs[] = { "metrics.jsonl", "train.log", "config.json" };
    char dir[4200], from[4200], to[4300];
    char sub[32];
    snprintf(sub, sizeof sub, "attempt-%d", attempt - 1);
    int rc = rundir_path(dir, sizeof dir, run_dir, sub, err);
    if (!rc && mkdir(dir, 0777) && errno != EEXIST)
        rc = herr_set(err, HERR_IO, "%s: %s", dir, strerror(errno));
    for (int pass = 0; !rc && pass < 2; pass++) {
        if (pass == 1 && keep_outputs)
            break;
        const char *const *names = pass ? outputs : always;
        size_t n = pass ? sizeof outputs / sizeof *outputs : sizeof always / sizeof *always;
        for (size_t i = 0; !rc && i < n; i++) {
            rc = rundir_path(from, sizeof from, run_dir, names[i], err);
            if (!rc && (size_t)snprintf(to, sizeof to, "%s/%s", dir, names[i]) >= sizeof to)
                rc = herr_set(err, HERR_IO, "%s: path too long", dir);
            if (!rc && rename(from, to) && errno != ENOENT)
                rc = herr_set(err, HERR_IO, "%s: %s", from, strerror(errno));
        }
    }
    return rc;
}
