/* ckpt_read.c - finding, validating and loading a checkpoint to resume from (ckpt.h). */
#include "ckpt.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_internal.h"
#include "file_digest.h"
#include "ckpt_state.h"
#include "shape/canon_json.h"
#include "shape/file_read.h"

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

int ckpt_resolve(const char *path, char *out, size_t n, hearth_err *err)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/" CKPT_MANIFEST, path);
    if (is_file(p)) {
        if (snprintf(out, n, "%s", path) >= (int)n)
            return herr_set(err, HERR_IO, "%s: path too long", path);
        return 0;
    }
    snprintf(p, sizeof p, "%s/checkpoints/" CKPT_LATEST, path);
    FILE *f = fopen(p, "r");
    if (!f)
        return herr_set(err, HERR_CONFIG, "--resume %s: neither a checkpoint (no "
                        CKPT_MANIFEST ") nor a run directory with checkpoints/" CKPT_LATEST,
                        path);
    char name[64] = "";
    int ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    if (!ok || ckpt_dir_step(name) < 0)
        return herr_set(err, HERR_CONFIG, "%s: expected a checkpoint name like step-00000010, "
                        "got '%s'", p, name);
    if (snprintf(out, n, "%s/checkpoints/%s", path, name) >= (int)n)
        return herr_set(err, HERR_IO, "%s: path too long", path);
    snprintf(p, sizeof p, "%s/" CKPT_MANIFEST, out);
    if (!is_file(p))
        return herr_set(err, HERR_CONFIG, "%s: missing (named by %s/checkpoints/" CKPT_LATEST
                        ")", p, path);
    return 0;
}

/* A value as the error message shows it: reals as the config writes them. */
static void value_text(const json_t *v, char *out, size_t n)
{
    if (!v) {
        snprintf(out, n, "(absent)");
        return;
    }
    if (json_is_real(v)) {
        char num[32];
        canon_format_double(json_real_value(v), num);
        snprintf(out, n, "%s", num);
        return;
    }
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(out, n, "%s", s ? s : "?");
    free(s);
}

/* The first dotted key where a and b differ, into key ("" when equal); a's and b's
 * values as text into va, vb. */
static void json_diff(const json_t *a, const json_t *b, const char *prefix, char *key,
                      size_t n, char *va, char *vb, size_t vn)
{
    if (json_is_object(a) && json_is_object(b)) {
        const char *k;
        json_t *v;
        char sub[512];
        json_object_foreach((json_t *)a, k, v) {
            snprintf(sub, sizeof sub, "%s%s%s", prefix, *prefix ? "." : "", k);
            json_diff(v, json_object_get(b, k), sub, key, n, va, vb, vn);
            if (*key)
                return;
        }
        json_object_foreach((json_t *)b, k, v)
            if (!json_object_get(a, k)) {
                snprintf(key, n, "%s%s%s", prefix, *prefix ? "." : "", k);
                value_text(NULL, va, vn);
                value_text(v, vb, vn);
                return;
            }
        return;
    }
    if (a && b && json_equal((json_t *)a, (json_t *)b))
        return;
    snprintf(key, n, "%s", *prefix ? prefix : "(config)");
    value_text(a, va, vn);
    value_text(b, vb, vn);
}

/* The config check: the resume hashes must agree; the message names the first key that
 * differs (between the manifest's config and cfg's). */
static int check_config(const char *mpath, json_t *m, const run_config *cfg, hearth_err *err)
{
    char want[65];
    int rc = ckpt_resume_hash(cfg, want, err);
    if (rc)
        return rc;
    const char *have = json_string_value(json_object_get(m, "resume_hash"));
    if (!have)
        return herr_set(err, HERR_CONFIG, "%s: resume_hash: missing", mpath);
    if (!strcmp(have, want))
        return 0;
    char key[512] = "", va[256] = "", vb[256] = "";
    char *canon = run_config_canonical_json(cfg, err);
    json_t *now = canon ? json_loads(canon, 0, NULL) : NULL;
    free(canon);
    json_t *saved = json_object_get(m, "config");
    if (now && json_is_object(saved)) {
        json_t *a = json_deep_copy(saved), *b = json_deep_copy(now);
        /* The free keys are not what made the hashes differ. */
        for (json_t **x = &a; x; x = x == &a ? &b : NULL) {
            json_t *train = json_object_get(*x, "train");
            json_object_del(train, "checkpoint_every");
            json_object_del(train, "measure_from");
        }
        json_diff(a, b, "", key, sizeof key, va, vb, sizeof va);
        json_decref(a);
        json_decref(b);
    }
    json_decref(now);
    if (!*key)
        return herr_set(err, HERR_CONFIG, "%s: the checkpoint was written with another config "
                        "(resume hash %.12s, this config %.12s)", mpath, have, want);
    if (!strcmp(key, "train.steps"))
        return herr_set(err, HERR_CONFIG, "%s: other config: train.steps is %s in the "
                        "checkpoint, %s now (the learning-rate schedule depends on it; only "
                        CKPT_FREE_KEYS " may differ)", mpath, va, vb);
    return herr_set(err, HERR_CONFIG, "%s: other config: %s is %s in the checkpoint, %s now "
                    "(only " CKPT_FREE_KEYS " may differ)", mpath, key, va, vb);
}

/* Every rank file: present, of the recorded size and sha256. */
static int check_files(const char *dir, const char *mpath, json_t *m, int ranks,
                       hearth_err *err)
{
    json_t *files = json_object_get(m, "files");
    if (!json_is_array(files) || (int)json_array_size(files) != ranks)
        return herr_set(err, HERR_CONFIG, "%s: files: expected %d entries (one per rank)",
                        mpath, ranks);
    char path[4400];
    for (int r = 0; r < ranks; r++) {
        json_t *f = json_array_get(files, (size_t)r);
        const char *sha = json_string_value(json_object_get(f, "sha256"));
        json_t *jb = json_object_get(f, "bytes");
        int rc = ckpt_rank_path(path, sizeof path, dir, r, err);
        if (rc)
            return rc;
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!sha || !json_is_integer(jb) || !name || strcmp(name, strrchr(path, '/') + 1))
            return herr_set(err, HERR_CONFIG, "%s: files[%d]: expected name %s, bytes and "
                            "sha256", mpath, r, strrchr(path, '/') + 1);
        long long bytes;
        char hex[65];
        if ((rc = file_sha256(path, &bytes, hex, err)))
            return rc;
        long long want = (long long)json_integer_value(jb);
        if (bytes != want)
            return herr_set(err, HERR_CONFIG, "%s: %s: %lld bytes, the manifest says %lld",
                            path, bytes < want ? "truncated" : "wrong size", bytes, want);
        if (strcmp(hex, sha))
            return herr_set(err, HERR_CONFIG, "%s: sha256 mismatch (file %.16s..., manifest "
                            "%.16s...): the file is corrupt", path, hex, sha);
    }
    return 0;
}

static int restore_summary(const char *mpath, json_t *m, run_summary *sum, int step,
                           hearth_err *err)
{
    json_t *s = json_object_get(m, "summary");
    json_t *st = json_object_get(s, "step"), *ms = json_object_get(s, "step_ms"),
           *tk = json_object_get(s, "tokens"), *fl = json_object_get(s, "flops");
    size_t n = json_array_size(st);
    if (!json_is_array(st) || json_array_size(ms) != n || json_array_size(tk) != n ||
        json_array_size(fl) != n)
        return herr_set(err, HERR_CONFIG, "%s: summary: expected arrays step, step_ms, "
                        "tokens and flops of one length", mpath);
    for (size_t i = 0; i < n; i++) {
        int s_i = (int)json_integer_value(json_array_get(st, i));
        if (s_i < 1 || s_i > step)
            return herr_set(err, HERR_CONFIG, "%s: summary: step %d outside 1..%d", mpath,
                            s_i, step);
        double loss = i + 1 == n ? json_number_value(json_object_get(s, "last_loss")) : 0.0;
        int rc = summary_push(sum, s_i, json_number_value(json_array_get(ms, i)),
                              (long)json_integer_value(json_array_get(tk, i)),
                              json_number_value(json_array_get(fl, i)), loss, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* Parses dir's manifest.json into *m (the caller decrefs); mpath gets its path. */
static int manifest_load(const char *dir, char *mpath, size_t n, json_t **m, hearth_err *err)
{
    if (snprintf(mpath, n, "%s/" CKPT_MANIFEST, dir) >= (int)n)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    struct stat sb;
    if (stat(mpath, &sb) != 0)
        return herr_set(err, HERR_CONFIG, "%s: missing", mpath);
    int rc = file_read_json(mpath, FILE_READ_MAX_TEXT, 0, m, err);
    return rc == HERR_IO ? HERR_CONFIG : rc;
}

int ckpt_read_config(const char *dir, const config_override *ovr, int n_ovr, run_config *out,
                     hearth_err *err)
{
    char mpath[4400];
    json_t *m = NULL;
    int rc = manifest_load(dir, mpath, sizeof mpath, &m, err);
    if (rc)
        return rc;
    json_t *saved = json_object_get(m, "config");
    /* Reals with 17 digits read back to the same doubles, so the config hashes as saved. */
    char *text = json_is_object(saved)
                     ? json_dumps(saved, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17))
                     : NULL;
    json_decref(m);
    if (!text)
        return herr_set(err, HERR_CONFIG, "%s: config: missing (the run config the checkpoint "
                        "was written with)", mpath);
    rc = run_config_parse(out, mpath, text, ovr, n_ovr, 0, err);
    free(text);
    return rc;
}

int ckpt_read(const char *dir, trainer *tr, const run_config *cfg, run_summary *sum,
              int *step, hearth_err *err)
{
    char mpath[4400];
    json_t *m = NULL;
    int rc = manifest_load(dir, mpath, sizeof mpath, &m, err);
    if (rc)
        return rc;
    const char *fmt = json_string_value(json_object_get(m, "format"));
    json_t *ver = json_object_get(m, "version"), *js = json_object_get(m, "step"),
           *jr = json_object_get(m, "ranks");
    int ranks = trainer_ranks(tr);
    if (!fmt || strcmp(fmt, CKPT_FORMAT))
        rc = herr_set(err, HERR_CONFIG, "%s: format: expected \"%s\"", mpath, CKPT_FORMAT);
    else if (!json_is_integer(ver) || json_integer_value(ver) != CKPT_VERSION)
        rc = herr_set(err, HERR_CONFIG, "%s: version: %lld is not supported (this build "
                      "reads version %d)", mpath, (long long)json_integer_value(ver),
                      CKPT_VERSION);
    if (!rc)
        rc = check_config(mpath, m, cfg, err);
    if (rc)
        ;
    else if (!json_is_integer(js) || json_integer_value(js) < 0 ||
             json_integer_value(js) > cfg->train.steps)
        rc = herr_set(err, HERR_CONFIG, "%s: step: expected an integer in 0..%d (train.steps)",
                      mpath, cfg->train.steps);
    else if (!json_is_integer(jr) || json_integer_value(jr) != ranks)
        rc = herr_set(err, HERR_CONFIG, "%s: ranks: the checkpoint has %lld, this run %d",
                      mpath, (long long)json_integer_value(jr), ranks);
    if (!rc)
        rc = check_files(dir, mpath, m, ranks, err);
    int s = (int)json_integer_value(js);
    if (!rc)
        rc = trainer_load(tr, dir, s, err);
    if (!rc)
        rc = restore_summary(mpath, m, sum, s, err);
    json_decref(m);
    if (!rc)
        *step = s;
    return rc;
}
