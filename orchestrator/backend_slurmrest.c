/* backend_slurmrest.c - jobs as Slurm batch jobs through slurmrestd (libcurl, JSON with
 * jansson): POST .../job/submit to start one, one GET .../jobs per poll cycle to follow
 * them all, DELETE .../job/ID to end one.
 *
 * The server: --rest-url or $HEARTH_SLURMREST_URL, "http://HOST:PORT" or "unix:/PATH"
 * (slurmrestd on a socket; curl's CURLOPT_UNIX_SOCKET_PATH).  Authentication: a JWT
 * (`scontrol token`) read from --rest-token-file or $HEARTH_SLURMREST_TOKEN_FILE, else
 * taken from $SLURM_JWT (as Slurm's own clients do), sent as X-SLURM-USER-TOKEN with
 * X-SLURM-USER-NAME (this process's user, or $HEARTH_SLURMREST_USER).  The file is
 * refused unless its mode is 0600 or stricter (no access for group or others).  The
 * token lives only in this process's memory and in the request headers: it is never put in
 * a message, a log, a run directory, a job's environment or the database (curl's verbose
 * mode, which would print headers, is never turned on).
 *
 * The API version is discovered from the server (GET /openapi lists its paths; else each
 * known version is tried newest first with .../ping) and looked up in rest_versions[], the
 * one place that says which versions this file speaks.  Slurm 22.05 serves v0.0.38.
 *
 * The job is the same as the sbatch backend's: the rendered job.sh as the script, name =
 * run id, comment "hearth:RUN_ID", one task of cpus_per_task CPUs on one node, the time
 * limit, partition/account/qos/constraint, the outputs appended to RUN_DIR/stdout.log and
 * stderr.log, RUN_DIR as the working directory, and the submitting process's environment
 * (as sbatch passes it; SLURM_JWT and HEARTH_SLURMREST_* left out).  resources.sbatch
 * options have no REST equivalent in general: the few with a job property (--mem...) are
 * mapped, any other is refused with a message.  No job arrays: runs are submitted one by one
 * (submit_many is NULL), which REST makes cheap (no process per job).
 *
 * States map through slurm_state.h, as for the sbatch backend.  Exit codes in the job
 * listing are raw wait statuses (slurm_wait_status_code decodes them); RUN_DIR/exit_code,
 * which the job script writes, comes first. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "rundir.h"
#include "shape/file_read.h"
#include "slurm_state.h"

extern char **environ;

/* The API versions this file speaks, newest first.  Their job submission and job listing
 * have the shape used below (environment as a JSON object, plain integers, job_state as a
 * string); a newer Slurm's version is added here once its dialect is handled. */
static const char *const rest_versions[] = { "v0.0.38", "v0.0.37", "v0.0.36" };
#define N_REST_VERSIONS (sizeof rest_versions / sizeof rest_versions[0])

typedef struct {
    void *tag;
    char job_id[BACKEND_JOB_ID_MAX];
    char *run_dir;
    int cancelled;
} rjob;

typedef struct {
    backend base;
    CURL *curl;
    struct curl_slist *headers;   /* holds the token: freed (and wiped) in rest_free */
    char *base_url;               /* "http://host:port" (no trailing slash) */
    char *socket_path;            /* unix: URLs; NULL otherwise */
    char *shown_url;              /* for messages */
    char *token_from;             /* where the token came from, for messages: "file PATH"
                                     or "$SLURM_JWT" (never the token) */
    char *user;                   /* X-SLURM-USER-NAME, for messages */
    const char *version;          /* rest_versions[k], once discovered */
    int curl_inited;              /* curl_global_init done: rest_free undoes it */
    rjob *jobs;
    size_t n, cap;
    int interval_ms;
    double last_query;
    int failures;
} rest_backend;


/* ---- the token ---------------------------------------------------------------------------- */

/* The token in `text` (what `scontrol token` prints: "SLURM_JWT=TOKEN" or the bare token,
 * whitespace around it trimmed) as a malloc'd string in *out.  `from` names the source
 * in messages, which never show the text itself. */
static int token_parse(const char *from, const char *text, char **out, hearth_err *err)
{
    *out = NULL;
    const char *p = text;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (strncmp(p, "SLURM_JWT=", 10) == 0)
        p += 10;
    size_t n = strcspn(p, " \t\r\n");
    int bad = n == 0 || p[n + strspn(p + n, " \t\r\n")] != 0;
    for (size_t i = 0; i < n && !bad; i++)
        if ((unsigned char)p[i] < 0x21 || (unsigned char)p[i] > 0x7e)
            bad = 1;
    if (bad)
        return herr_set(err, HERR_CONFIG, "slurmrest: %s: expected one token (as `scontrol "
                        "token` prints it)", from);
    *out = strndup(p, n);
    return *out ? 0 : herr_set(err, HERR_NOMEM, "out of memory");
}

/* Reads the token from `path` into a malloc'd string (whitespace trimmed).  Refused when
 * the file is not a regular file (a FIFO would block forever), is larger than
 * FILE_READ_MAX_TOKEN (a truncated token would be sent as if whole), or its mode is not 0600
 * or stricter (any bit for group or others, or the owner's execute bit). */
static int read_token(const char *path, char **out, hearth_err *err)
{
    *out = NULL;
    int fd;
    struct stat st;
    int rc = file_open_regular(path, &fd, &st, err);
    if (rc)
        return herr_prefix(err, HERR_CONFIG, "slurmrest: token file");
    if (st.st_mode & 07177) {
        close(fd);
        return herr_set(err, HERR_CONFIG, "slurmrest: token file %s has mode %04o: a token "
                        "file must have mode 0600 or stricter, no access for group or "
                        "others (chmod 600 %s)", path, (unsigned)(st.st_mode & 07777), path);
    }
    char *text;
    size_t len;
    rc = file_read_fd(fd, path, FILE_READ_MAX_TOKEN, &text, &len, err);
    close(fd);
    if (rc)
        return herr_prefix(err, rc == HERR_IO ? HERR_CONFIG : rc, "slurmrest: token file");
    char from[PATH_MAX + 16];
    snprintf(from, sizeof from, "token file %s", path);
    rc = token_parse(from, text, out, err);
    memset(text, 0, len);
    free(text);
    return rc;
}

/* ---- HTTP --------------------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
    int oom;
} rbuf;

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud)
{
    rbuf *b = ud;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 16384;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *g = realloc(b->data, cap);
        if (!g) {
            b->oom = 1;
            return 0;
        }
        b->data = g;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return n;
}

/* The first entry of a reply's "errors" (description, else error) into buf; 0 when none. */
static int reply_error(json_t *reply, char *buf, size_t size)
{
    json_t *errs = json_object_get(reply, "errors");
    if (!json_is_array(errs) || json_array_size(errs) == 0)
        return 0;
    json_t *e = json_array_get(errs, 0);
    const char *d = json_string_value(json_object_get(e, "description"));
    const char *w = json_string_value(json_object_get(e, "error"));
    if (d && *d && w && *w && !strstr(d, w))
        snprintf(buf, size, "%s: %s", w, d);
    else
        snprintf(buf, size, "%s", d && *d ? d : w ? w : "error");
    return 1;
}

/* One request: METHOD base_url + path with an optional JSON body.  *reply receives the
 * parsed JSON (NULL when the body is not JSON), *status the HTTP status.  Returns 0 when
 * the server answered at all, else a herr_code (transport failure). */
static int rest_call(rest_backend *rb, const char *method, const char *path, const char *body,
                     json_t **reply, long *status, hearth_err *err)
{
    *reply = NULL;
    *status = 0;
    char url[1024];
    if ((size_t)snprintf(url, sizeof url, "%s%s", rb->base_url, path) >= sizeof url)
        return herr_set(err, HERR_CONFIG, "slurmrest: URL too long");
    rbuf b = { 0 };
    CURL *c = rb->curl;
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    if (rb->socket_path)
        curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, rb->socket_path);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, rb->headers);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 60000L);
    /* Never follow a redirect: the token would go along to wherever it points. */
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    CURLcode cc = curl_easy_perform(c);
    if (cc != CURLE_OK) {
        free(b.data);
        return herr_set(err, HERR_RUNTIME, "slurmrest: %s %s: %s", method, rb->shown_url,
                        curl_easy_strerror(cc));
    }
    if (b.oom) {
        free(b.data);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    if (b.data)
        *reply = json_loadb(b.data, b.len, 0, NULL);
    free(b.data);
    return 0;
}

/* The error for a request the server refused as unauthorised: 401 (the token was not
 * accepted) or 403 (it was, but this user may not do this).  Says which, the URL, the user
 * and where the token came from, so that the user knows what to fix; never the token.
 * Returns 0 for any other status. */
static int auth_error(rest_backend *rb, long status, json_t *reply, const char *what,
                      hearth_err *err)
{
    if (status != 401 && status != 403)
        return 0;
    char why[512] = "";
    char said[600] = "";
    if (reply_error(reply, why, sizeof why))
        snprintf(said, sizeof said, " (the server says: %s)", why);
    if (status == 401)
        return herr_set(err, HERR_RUNTIME, "slurmrest: %s: authentication failed (HTTP 401 "
                        "from %s)%s: the token from %s is not accepted for user %s; is it "
                        "valid and unexpired? (`scontrol token` prints a new one)", what,
                        rb->shown_url, said, rb->token_from, rb->user);
    return herr_set(err, HERR_RUNTIME, "slurmrest: %s: permission denied (HTTP 403 from %s)%s: "
                    "user %s, with the token from %s, may not do this", what, rb->shown_url,
                    said, rb->user, rb->token_from);
}

/* rest_call that must succeed (HTTP 2xx, JSON, no "errors"): else an error naming `what`. */
static int rest_ok(rest_backend *rb, const char *method, const char *path, const char *body,
                   const char *what, json_t **reply, hearth_err *err)
{
    long status = 0;
    int rc = rest_call(rb, method, path, body, reply, &status, err);
    if (rc)
        return rc;
    char why[512];
    if (reply_error(*reply, why, sizeof why) || status < 200 || status >= 300 || !*reply) {
        if ((rc = auth_error(rb, status, *reply, what, err))) {
            json_decref(*reply);
            *reply = NULL;
            return rc;
        }
        if (!reply_error(*reply, why, sizeof why))
            snprintf(why, sizeof why, "%s", *reply ? "request failed" : "no JSON in the reply");
        json_decref(*reply);
        *reply = NULL;
        /* slurmrestd 22.05 answers a rejected token with a bare 500 and this text. */
        int auth = strstr(why, "Zero Bytes") || strstr(why, "uthentication");
        return herr_set(err, HERR_RUNTIME, "slurmrest: %s (HTTP %ld from %s): %s%s", what,
                        status, rb->shown_url, why,
                        auth ? " (is the token valid, unexpired and for this user?)" : "");
    }
    return 0;
}

/* Finds the API version: the newest of rest_versions[] that the server offers. */
static int discover_version(rest_backend *rb, hearth_err *err)
{
    if (rb->version)
        return 0;
    char spoken[128] = "";
    for (size_t k = 0; k < N_REST_VERSIONS; k++) {
        size_t o = strlen(spoken);
        snprintf(spoken + o, sizeof spoken - o, "%s%s", k ? ", " : "", rest_versions[k]);
    }
    json_t *spec = NULL;
    long status = 0;
    int rc = rest_call(rb, "GET", "/openapi", NULL, &spec, &status, err);
    if (rc)
        return rc;
    /* A refused token is said as such, not as a server that speaks no known version. */
    if ((rc = auth_error(rb, status, spec, "finding the API version", err))) {
        json_decref(spec);
        return rc;
    }
    json_t *paths = json_object_get(spec, "paths");
    char offered[256] = "";
    if (status == 200 && json_is_object(paths)) {
        const char *key;
        json_t *v;
        json_object_foreach(paths, key, v) {
            char ver[32], again[64];
            if (sscanf(key, "/slurm/%31[^/]", ver) != 1)
                continue;
            snprintf(again, sizeof again, "/slurm/%s/job/submit", ver);
            if (strcmp(again, key) != 0)
                continue;
            size_t o = strlen(offered);
            snprintf(offered + o, sizeof offered - o, "%s%s", o ? ", " : "", ver);
        }
        /* newest first: the first of our list the server offers */
        for (size_t k = 0; k < N_REST_VERSIONS && !rb->version; k++) {
            char want[64];
            snprintf(want, sizeof want, "/slurm/%s/job/submit", rest_versions[k]);
            if (json_object_get(paths, want))
                rb->version = rest_versions[k];
        }
    }
    json_decref(spec);
    if (rb->version)
        return 0;
    if (offered[0])
        return herr_set(err, HERR_RUNTIME, "slurmrest: %s serves API %s; this hearth speaks "
                        "%s", rb->shown_url, offered, spoken);
    /* No usable /openapi: try each version's ping, newest first. */
    for (size_t k = 0; k < N_REST_VERSIONS; k++) {
        char path[64];
        json_t *r = NULL;
        snprintf(path, sizeof path, "/slurm/%s/ping", rest_versions[k]);
        if ((rc = rest_call(rb, "GET", path, NULL, &r, &status, err)))
            return rc;
        if ((rc = auth_error(rb, status, r, "finding the API version", err))) {
            json_decref(r);
            return rc;
        }
        char why[256];
        int ok = status == 200 && r && !reply_error(r, why, sizeof why);
        json_decref(r);
        if (ok) {
            rb->version = rest_versions[k];
            return 0;
        }
    }
    return herr_set(err, HERR_RUNTIME, "slurmrest: %s answers none of the API versions %s "
                    "(is it slurmrestd, and is the token valid?)", rb->shown_url, spoken);
}

/* ---- jobs --------------------------------------------------------------------------------- */

static int add_job(rest_backend *rb, const char *run_dir, void *tag, const char *id,
                   hearth_err *err)
{
    if (rb->n == rb->cap) {
        size_t cap = rb->cap ? 2 * rb->cap : 16;
        rjob *g = realloc(rb->jobs, cap * sizeof *g);
        if (!g)
            return herr_set(err, HERR_NOMEM, "out of memory");
        rb->jobs = g;
        rb->cap = cap;
    }
    rjob *j = &rb->jobs[rb->n];
    memset(j, 0, sizeof *j);
    if (!(j->run_dir = strdup(run_dir)))
        return herr_set(err, HERR_NOMEM, "out of memory");
    j->tag = tag;
    snprintf(j->job_id, sizeof j->job_id, "%s", id);
    rb->n++;
    return 0;
}

/* A job listing entry's integer field (plain, or {"set":..,"number":..} as newer APIs
 * write them); `def` when absent. */
static long long job_int(json_t *job, const char *key, long long def)
{
    json_t *v = json_object_get(job, key);
    if (json_is_object(v))
        v = json_object_get(v, "number");
    return json_is_integer(v) ? (long long)json_integer_value(v) : def;
}

/* A job listing entry's state name (a string, or the first of an array). */
static const char *job_state_name(json_t *job)
{
    json_t *v = json_object_get(job, "job_state");
    if (json_is_array(v))
        v = json_array_get(v, 0);
    return json_string_value(v);
}

/* "123" for a job, "123_4" for an array task (not ours, but listed). */
static void job_id_of(json_t *job, char id[BACKEND_JOB_ID_MAX])
{
    long long jid = job_int(job, "job_id", -1), aj = job_int(job, "array_job_id", 0);
    long long at = job_int(job, "array_task_id", -1);
    if (aj > 0 && at >= 0)
        snprintf(id, BACKEND_JOB_ID_MAX, "%lld_%lld", aj, at);
    else
        snprintf(id, BACKEND_JOB_ID_MAX, "%lld", jid);
}

/* GET .../jobs: every job slurmctld remembers, in one request. */
static int list_jobs(rest_backend *rb, json_t **reply, json_t **jobs, hearth_err *err)
{
    char path[64];
    int rc = discover_version(rb, err);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "/slurm/%s/jobs", rb->version);
    if ((rc = rest_ok(rb, "GET", path, NULL, "listing jobs", reply, err)))
        return rc;
    *jobs = json_object_get(*reply, "jobs");
    if (!json_is_array(*jobs)) {
        json_decref(*reply);
        *reply = NULL;
        return herr_set(err, HERR_RUNTIME, "slurmrest: the job listing of %s has no jobs array",
                        rb->shown_url);
    }
    return 0;
}

/* The newest live job named RUN_ID with the comment "hearth:RUN_ID" (a job submitted by a
 * hearth killed before it recorded the id).  1 and id_out, 0 when none. */
static int find_by_name(rest_backend *rb, const backend_job *job,
                        char id_out[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    json_t *reply = NULL, *jobs = NULL;
    int rc = list_jobs(rb, &reply, &jobs, err);
    if (rc)
        return rc;
    char want[600];
    snprintf(want, sizeof want, "hearth:%s", job->run_id);
    long long best = -1;
    size_t i;
    json_t *j;
    json_array_foreach(jobs, i, j) {
        const char *name = json_string_value(json_object_get(j, "name"));
        const char *comment = json_string_value(json_object_get(j, "comment"));
        if (!name || !comment || strcmp(name, job->run_id) || strcmp(comment, want) ||
            slurm_state_classify(job_state_name(j)) != SLURM_ST_ALIVE)
            continue;
        long long id = job_int(j, "job_id", -1);
        if (id > best)
            best = id;
    }
    json_decref(reply);
    if (best < 0)
        return 0;
    snprintf(id_out, BACKEND_JOB_ID_MAX, "%lld", best);
    return 1;
}

/* resources.sbatch options with a job property: "--mem=100" -> memory_per_node 100 (MB).
 * Any other option is refused: silently dropping it would run a different job. */
static int sbatch_option(json_t *props, const char *opt, const char *next, int *used_next,
                         hearth_err *err)
{
    static const struct { const char *opt, *prop; int mb; } map[] = {
        { "--mem", "memory_per_node", 1 }, { "--mem-per-cpu", "memory_per_cpu", 1 },
        { "--mem-per-gpu", "memory_per_gpu", 1 }, { "--gres", "gres", 0 },
        { "--gpus", "gpus", 0 }, { "--gpus-per-node", "gpus_per_node", 0 },
        { "--gpus-per-task", "gpus_per_task", 0 }, { "--reservation", "reservation", 0 },
        { "--wckey", "wckey", 0 }, { "--licenses", "licenses", 0 },
        { "--exclusive", "exclusive", 0 },
    };
    *used_next = 0;
    size_t n = strcspn(opt, "=");
    const char *val = opt[n] == '=' ? opt + n + 1 : NULL;
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
        if (strlen(map[k].opt) != n || strncmp(opt, map[k].opt, n))
            continue;
        if (!val && strcmp(map[k].opt, "--exclusive") == 0)
            val = "true";
        if (!val && next) {
            val = next;
            *used_next = 1;
        }
        if (!val)
            break;
        if (map[k].mb) {
            char *end;
            errno = 0;
            double v = strtod(val, &end);
            double f = 1;
            switch (*end) {
            case 'K': case 'k': f = 1.0 / 1024; end++; break;
            case 'M': case 'm': end++; break;
            case 'G': case 'g': f = 1024; end++; break;
            case 'T': case 't': f = 1024.0 * 1024; end++; break;
            }
            if (end == val || *end || errno || v < 0)
                break;
            json_object_set_new(props, map[k].prop, json_integer((json_int_t)(v * f + 0.999)));
        } else {
            json_object_set_new(props, map[k].prop, json_string(val));
        }
        return 0;
    }
    return herr_set(err, HERR_CONFIG, "resources.sbatch: %s: not supported by the slurmrest "
                    "backend (it maps --mem, --mem-per-cpu, --mem-per-gpu, --gres, --gpus, "
                    "--gpus-per-node, --gpus-per-task, --reservation, --wckey, --licenses, "
                    "--exclusive; use --backend slurm for others)", opt);
}

/* The environment the job gets: this process's, as sbatch passes it, without the token
 * (SLURM_JWT) and this backend's settings. */
static json_t *job_environment(void)
{
    json_t *env = json_object();
    for (char **e = environ; env && e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || eq == *e)
            continue;
        size_t n = (size_t)(eq - *e);
        if ((n == 9 && strncmp(*e, "SLURM_JWT", 9) == 0) ||
            strncmp(*e, "HEARTH_SLURMREST_", 17) == 0)
            continue;
        char *k = strndup(*e, n);
        if (k)
            json_object_set_new(env, k, json_string(eq + 1));
        free(k);
    }
    /* A minimal PATH when there is none: Slurm requires an environment. */
    if (env && !json_object_get(env, "PATH"))
        json_object_set_new(env, "PATH", json_string("/usr/local/bin:/usr/bin:/bin"));
    return env;
}

/* The submission body for one job (job.sh as the script, the sbatch backend's options). */
static int submission(const backend_job *job, const rundir_job *rj, char **body,
                      hearth_err *err)
{
    *body = NULL;
    char *script = NULL;
    int rc = file_read_bounded(job->script, FILE_READ_MAX_TEXT, &script, NULL, err);
    if (rc)
        return rc;
    json_t *props = json_object();
    char path[4200], comment[600];
    snprintf(comment, sizeof comment, "hearth:%s", job->run_id);
    json_object_set_new(props, "name", json_string(job->run_id));
    json_object_set_new(props, "comment", json_string(comment));
    json_object_set_new(props, "nodes", json_pack("[ii]", 1, 1));
    json_object_set_new(props, "tasks", json_integer(1));
    /* hearth resubmits after a node failure itself, bounded by `retries`. */
    json_object_set_new(props, "requeue", json_false());
    json_object_set_new(props, "cpus_per_task",
                        json_integer(job->cpus_per_task > 0 ? job->cpus_per_task : 1));
    if (job->time_limit_s > 0)   /* minutes: never shorter than asked */
        json_object_set_new(props, "time_limit",
                            json_integer((json_int_t)((job->time_limit_s + 59) / 60)));
    if (rj && rj->partition)
        json_object_set_new(props, "partition", json_string(rj->partition));
    if (rj && rj->account)
        json_object_set_new(props, "account", json_string(rj->account));
    if (rj && rj->qos)
        json_object_set_new(props, "qos", json_string(rj->qos));
    if (rj && rj->constraint)
        json_object_set_new(props, "constraints", json_string(rj->constraint));
    json_object_set_new(props, "current_working_directory", json_string(job->run_dir));
    snprintf(path, sizeof path, "%s/stdout.log", job->run_dir);
    json_object_set_new(props, "standard_output", json_string(path));
    snprintf(path, sizeof path, "%s/stderr.log", job->run_dir);
    json_object_set_new(props, "standard_error", json_string(path));
    json_object_set_new(props, "open_mode", json_string("append"));
    json_object_set_new(props, "environment", job_environment());
    for (int i = 0; !rc && rj && i < rj->n_sbatch; i++) {
        int used = 0;
        rc = sbatch_option(props, rj->sbatch[i], i + 1 < rj->n_sbatch ? rj->sbatch[i + 1] : NULL,
                           &used, err);
        i += used;
    }
    json_t *sub = json_pack("{s:s, s:o}", "script", script, "job", props);
    free(script);
    if (!rc) {
        *body = sub ? json_dumps(sub, JSON_COMPACT) : NULL;
        if (!*body)
            rc = herr_set(err, HERR_NOMEM, "out of memory");
    }
    json_decref(sub);
    return rc;
}

/* ---- the backend -------------------------------------------------------------------------- */

static int rest_submit(backend *b, const backend_job *job, void *tag,
                       char job_id[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    rest_backend *rb = (rest_backend *)b;
    /* The submission asks for one task: multi-process cuda runs go through sbatch. */
    int rc0 = backend_check_one_process(job->run_dir, "slurmrest", err);
    if (rc0)
        return rc0;
    rundir_job rj;
    int have = rundir_job_read(job->run_dir, &rj, err) == 0;
    char *body = NULL;
    int rc = discover_version(rb, err);
    if (!rc)
        rc = submission(job, have ? &rj : NULL, &body, err);
    if (have)
        rundir_job_free(&rj);
    if (rc)
        return rc;
    char path[64], what[700];
    snprintf(path, sizeof path, "/slurm/%s/job/submit", rb->version);
    snprintf(what, sizeof what, "submitting %s", job->run_id);
    json_t *reply = NULL;
    rc = rest_ok(rb, "POST", path, body, what, &reply, err);
    free(body);
    if (rc)
        return rc;
    long long id = job_int(reply, "job_id", -1);
    json_decref(reply);
    if (id <= 0)
        return herr_set(err, HERR_RUNTIME, "slurmrest: %s: no job id in the reply", what);
    char sid[BACKEND_JOB_ID_MAX];
    snprintf(sid, sizeof sid, "%lld", id);
    if ((rc = add_job(rb, job->run_dir, tag, sid, err)))
        return rc;
    snprintf(job_id, BACKEND_JOB_ID_MAX, "%s", sid);
    return 0;
}

static int rest_track(backend *b, const backend_job *job, const char *job_id, void *tag,
                      char job_id_out[BACKEND_JOB_ID_MAX], hearth_err *err)
{
    rest_backend *rb = (rest_backend *)b;
    char id[BACKEND_JOB_ID_MAX] = "";
    int rc;
    if (job_id && *job_id) {
        /* Tracked without asking: the next poll reports how it ended. */
        snprintf(id, sizeof id, "%s", job_id);
    } else if ((rc = find_by_name(rb, job, id, err)) <= 0) {
        return rc;
    }
    if ((rc = add_job(rb, job->run_dir, tag, id, err)))
        return rc;
    if (job_id_out)
        snprintf(job_id_out, BACKEND_JOB_ID_MAX, "%s", id);
    return 1;
}

static int rest_poll(backend *b, int timeout_ms, backend_event *ev, size_t cap, size_t *n,
                     hearth_err *err)
{
    rest_backend *rb = (rest_backend *)b;
    *n = 0;
    if (!backend_poll_due(&rb->last_query, rb->interval_ms, rb->n, timeout_ms))
        return 0;
    json_t *reply = NULL, *jobs = NULL;
    int rc = list_jobs(rb, &reply, &jobs, err);
    if (rc == HERR_RUNTIME) {
        /* slurmctld or slurmrestd may be restarting: try again, give up after a while. */
        return ++rb->failures >= 60 ? rc : 0;
    }
    if (rc)
        return rc;
    rb->failures = 0;
    size_t w = 0;
    for (size_t i = 0; i < rb->n; i++) {
        rjob *j = &rb->jobs[i];
        slurm_state st = SLURM_ST_UNKNOWN;
        int code = -1;
        size_t k;
        json_t *x;
        json_array_foreach(jobs, k, x) {
            char id[BACKEND_JOB_ID_MAX];
            job_id_of(x, id);
            if (strcmp(id, j->job_id) == 0) {
                st = slurm_state_classify(job_state_name(x));
                long long raw = job_int(x, "exit_code", -1);
                if (raw >= 0 && st != SLURM_ST_ALIVE)
                    code = slurm_wait_status_code(raw);
                break;
            }
        }
        if (st != SLURM_ST_ALIVE && *n < cap) {
            slurm_state_event(j->run_dir, j->job_id, j->tag, st,
                              st == SLURM_ST_UNKNOWN ? -1 : code, j->cancelled, &ev[(*n)++]);
            free(j->run_dir);
            continue;
        }
        rb->jobs[w++] = *j;
    }
    rb->n = w;
    json_decref(reply);
    return 0;
}

/* The state of one job (GET .../job/ID): SLURM_ST_UNKNOWN when slurmctld forgot it. */
static int job_state(rest_backend *rb, const char *id, slurm_state *st, hearth_err *err)
{
    *st = SLURM_ST_UNKNOWN;
    int rc = discover_version(rb, err);
    if (rc)
        return rc;
    if (strspn(id, "0123456789_") != strlen(id))
        return herr_set(err, HERR_CONFIG, "slurmrest: %s: not a Slurm job id", id);
    char path[128];
    snprintf(path, sizeof path, "/slurm/%s/job/%s", rb->version, id);
    json_t *reply = NULL;
    long status = 0;
    if ((rc = rest_call(rb, "GET", path, NULL, &reply, &status, err)))
        return rc;
    json_t *jobs = json_object_get(reply, "jobs");
    char why[512];
    if (json_is_array(jobs) && json_array_size(jobs) > 0) {
        *st = slurm_state_classify(job_state_name(json_array_get(jobs, 0)));
    } else if (reply_error(reply, why, sizeof why) && !strstr(why, "Invalid job id")) {
        json_decref(reply);
        return herr_set(err, HERR_RUNTIME, "slurmrest: job %s (HTTP %ld): %s", id, status, why);
    }
    json_decref(reply);
    return 0;
}

static int rest_alive(backend *b, const backend_job *job, const char *job_id, hearth_err *err)
{
    rest_backend *rb = (rest_backend *)b;
    char id[BACKEND_JOB_ID_MAX];
    if (!job_id || !*job_id)
        return find_by_name(rb, job, id, err);
    slurm_state st;
    int rc = job_state(rb, job_id, &st, err);
    return rc < 0 ? rc : st == SLURM_ST_ALIVE;
}

static int rest_cancel(backend *b, const backend_job *job, const char *job_id,
                       hearth_err *err)
{
    rest_backend *rb = (rest_backend *)b;
    char id[BACKEND_JOB_ID_MAX] = "";
    if (job_id && *job_id)
        snprintf(id, sizeof id, "%s", job_id);
    else {
        int f = find_by_name(rb, job, id, err);
        if (f <= 0)
            return f;
    }
    int alive = rest_alive(b, job, id, err);
    if (alive < 0)
        return alive;
    rjob *tracked = NULL;
    for (size_t i = 0; i < rb->n; i++)
        if (strcmp(rb->jobs[i].job_id, id) == 0)
            tracked = &rb->jobs[i];
    if (tracked)
        tracked->cancelled = 1;
    if (!alive)
        return 0;
    char path[128], what[200];
    snprintf(path, sizeof path, "/slurm/%s/job/%s", rb->version, id);
    snprintf(what, sizeof what, "cancelling job %s", id);
    json_t *reply = NULL;
    int rc = rest_ok(rb, "DELETE", path, NULL, what, &reply, err);
    json_decref(reply);
    if (rc)
        return rc;
    if (!tracked) {
        for (int i = 0; i < 100; i++) {
            hearth_err e;
            if (rest_alive(b, job, id, &e) != 1)
                break;
            backend_sleep_ms(200);
        }
    }
    return 1;
}

static size_t rest_tracked(const backend *b)
{
    return ((const rest_backend *)b)->n;
}

static void rest_free(backend *b)
{
    rest_backend *rb = (rest_backend *)b;
    if (!rb)
        return;
    for (size_t i = 0; i < rb->n; i++)
        free(rb->jobs[i].run_dir);
    free(rb->jobs);
    if (rb->curl)
        curl_easy_cleanup(rb->curl);
    if (rb->curl_inited)
        curl_global_cleanup();
    for (struct curl_slist *h = rb->headers; h; h = h->next)
        if (h->data)
            memset(h->data, 0, strlen(h->data));
    curl_slist_free_all(rb->headers);
    free(rb->base_url);
    free(rb->socket_path);
    free(rb->shown_url);
    free(rb->token_from);
    free(rb->user);
    free(rb);
}

static const backend_ops rest_ops = {
    .name = "slurmrest",
    .submit = rest_submit,
    .submit_many = NULL,
    .track = rest_track,
    .poll = rest_poll,
    .cancel = rest_cancel,
    .alive = rest_alive,
    .tracked = rest_tracked,
    .free = rest_free,
};

/* Splits the URL: "unix:/PATH" (socket) or "http(s)://HOST:PORT[/]". */
static int parse_url(rest_backend *rb, const char *url, hearth_err *err)
{
    if (strncmp(url, "unix:", 5) == 0) {
        const char *p = url + 5;
        if (strncmp(p, "//", 2) == 0)
            p += 2;
        if (*p != '/')
            return herr_set(err, HERR_CONFIG, "slurmrest URL %s: expected unix:/PATH", url);
        rb->socket_path = strdup(p);
        rb->base_url = strdup("http://localhost");
    } else if (strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0) {
        rb->base_url = strdup(url);
        if (rb->base_url) {
            size_t n = strlen(rb->base_url);
            while (n > 0 && rb->base_url[n - 1] == '/')
                rb->base_url[--n] = 0;
        }
    } else {
        return herr_set(err, HERR_CONFIG, "slurmrest URL %s: expected http://HOST:PORT or "
                        "unix:/PATH", url);
    }
    rb->shown_url = strdup(url);
    if (!rb->base_url || !rb->shown_url || (strncmp(url, "unix:", 5) == 0 && !rb->socket_path))
        return herr_set(err, HERR_NOMEM, "out of memory");
    return 0;
}

int backend_slurmrest_create(backend **out, const char *url, const char *token_file,
                             hearth_err *err)
{
    *out = NULL;
    if (!url || !*url)
        url = getenv("HEARTH_SLURMREST_URL");
    if (!token_file || !*token_file)
        token_file = getenv("HEARTH_SLURMREST_TOKEN_FILE");
    if (!url || !*url)
        return herr_set(err, HERR_CONFIG, "--backend slurmrest needs the slurmrestd URL: "
                        "--rest-url URL or HEARTH_SLURMREST_URL (http://HOST:PORT or unix:/PATH)");
    /* Without a file, the token Slurm's own clients read: $SLURM_JWT. */
    const char *jwt = getenv("SLURM_JWT");
    if ((!token_file || !*token_file) && (!jwt || !*jwt))
        return herr_set(err, HERR_CONFIG, "--backend slurmrest needs a token: "
                        "--rest-token-file FILE or HEARTH_SLURMREST_TOKEN_FILE "
                        "(e.g. from `scontrol token`, mode 600), or SLURM_JWT");
    rest_backend *rb = calloc(1, sizeof *rb);
    if (!rb)
        return herr_set(err, HERR_NOMEM, "out of memory");
    rb->base.ops = &rest_ops;
    const char *env = getenv("HEARTH_SLURMREST_POLL_MS");
    if (!env || atoi(env) <= 0)
        env = getenv("HEARTH_SLURM_POLL_MS");
    rb->interval_ms = env && atoi(env) > 0 ? atoi(env) : 2000;
    char *token = NULL;
    int rc = parse_url(rb, url, err);
    if (!rc)
        rc = token_file && *token_file ? read_token(token_file, &token, err)
                                       : token_parse("SLURM_JWT", jwt, &token, err);
    if (!rc) {
        if (token_file && *token_file)
            rc = asprintf(&rb->token_from, "file %s", token_file) < 0;
        else
            rb->token_from = strdup("$SLURM_JWT");
        if (rc || !rb->token_from) {
            rb->token_from = NULL;
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        }
    }
    if (!rc) {
        const char *user = getenv("HEARTH_SLURMREST_USER");
        struct passwd *pw = (!user || !*user) ? getpwuid(geteuid()) : NULL;
        if (pw)
            user = pw->pw_name;
        if (!user || !*user || strpbrk(user, "\r\n"))
            rc = herr_set(err, HERR_CONFIG, "slurmrest: cannot tell this user's name "
                          "(set HEARTH_SLURMREST_USER)");
        else if (!(rb->user = strdup(user)))
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        char *h1 = NULL, *h2 = NULL;
        if (!rc && (asprintf(&h1, "X-SLURM-USER-NAME: %s", user) < 0 ||
                    asprintf(&h2, "X-SLURM-USER-TOKEN: %s", token) < 0)) {
            h1 = h2 = NULL;
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        }
        struct curl_slist *l = NULL;
        if (!rc) {
            const char *hs[] = { h1, h2, "Content-Type: application/json",
                                 "Accept: application/json" };
            for (size_t i = 0; !rc && i < 4; i++) {
                struct curl_slist *g = curl_slist_append(l, hs[i]);
                if (!g)
                    rc = herr_set(err, HERR_NOMEM, "out of memory");
                else
                    l = g;
            }
        }
        rb->headers = l;
        if (h2)
            memset(h2, 0, strlen(h2));
        free(h1);
        free(h2);
    }
    if (token) {
        memset(token, 0, strlen(token));
        free(token);
    }
    if (!rc) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            rc = herr_set(err, HERR_RUNTIME, "slurmrest: curl_global_init failed");
        else
            rb->curl_inited = 1;
    }
    if (!rc && !(rb->curl = curl_easy_init()))
        rc = herr_set(err, HERR_RUNTIME, "slurmrest: curl_easy_init failed");
    if (rc) {
        rest_free(&rb->base);
        return rc;
    }
    *out = &rb->base;
    return 0;
}
