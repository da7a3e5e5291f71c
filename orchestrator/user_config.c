/* user_config.c - the user's defaults (config file, environment, command line).  See
 * user_config.h. */
#include "user_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shape/fields.h"
#include "shape/file_read.h"
#include "shape/yaml_tree.h"

static const struct {
    const char *name, *env, *builtin;
    int is_path;             /* "~/" expands to $HOME in the file */
    const char *choices;     /* "a|b|c" or NULL */
    const char *help;
} keys[UCFG_N] = {
    [UCFG_DB] = { "db", "HEARTH_DB", "hearth.db", 1, NULL, "the results database" },
    [UCFG_RUNS_DIR] = { "runs_dir", "HEARTH_RUNS_DIR", NULL, 1, NULL,
                        "run directories (unset: runs/ beside the database)" },
    [UCFG_BACKEND] = { "backend", "HEARTH_BACKEND", "local", 0, "local|slurm|slurmrest",
                       "where submit and bench run jobs" },
    [UCFG_SLURM_PARTITION] = { "slurm.partition", "HEARTH_SLURM_PARTITION", NULL, 0, NULL,
                               "sbatch --partition unless the spec's resources say" },
    [UCFG_SLURM_ACCOUNT] = { "slurm.account", "HEARTH_SLURM_ACCOUNT", NULL, 0, NULL,
                             "sbatch --account unless the spec's resources say" },
    [UCFG_SLURM_QOS] = { "slurm.qos", "HEARTH_SLURM_QOS", NULL, 0, NULL,
                         "sbatch --qos unless the spec's resources say" },
    [UCFG_SLURM_CONSTRAINT] = { "slurm.constraint", "HEARTH_SLURM_CONSTRAINT", NULL, 0, NULL,
                                "sbatch --constraint unless the spec's resources say" },
    [UCFG_REST_URL] = { "slurmrest.url", "HEARTH_SLURMREST_URL", NULL, 0, NULL,
                        "slurmrestd's address: http://HOST:PORT or unix:/PATH" },
    [UCFG_REST_TOKEN_FILE] = { "slurmrest.token_file", "HEARTH_SLURMREST_TOKEN_FILE", NULL, 1,
                               NULL, "file holding a JWT (mode 600), not the token itself" },
};

const char *ucfg_name(ucfg_key k)
{
    return k < UCFG_N ? keys[k].name : NULL;
}

const char *ucfg_env(ucfg_key k)
{
    return k < UCFG_N ? keys[k].env : NULL;
}

const char *ucfg_builtin(ucfg_key k)
{
    return k < UCFG_N ? keys[k].builtin : NULL;
}

const char *ucfg_help(ucfg_key k)
{
    return k < UCFG_N ? keys[k].help : NULL;
}

int ucfg_path(char *buf, size_t size, hearth_err *err)
{
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    int n;
    /* XDG base directories: a relative $XDG_CONFIG_HOME is invalid and ignored. */
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, size, "%s/hearth/config.yaml", xdg);
    else if (home && *home)
        n = snprintf(buf, size, "%s/.config/hearth/config.yaml", home);
    else
        return herr_set(err, HERR_CONFIG, "neither $XDG_CONFIG_HOME nor $HOME is set: no "
                        "place for the config file");
    if (n < 0 || (size_t)n >= size)
        return herr_set(err, HERR_CONFIG, "the config file's path is too long");
    return 0;
}

/* Replaces k's value; `where` describes the source (copied). */
static int set_value(ucfg *c, ucfg_key k, const char *value, ucfg_source src,
                     const char *where, hearth_err *err)
{
    char *v = value ? strdup(value) : NULL, *w = where ? strdup(where) : NULL;
    if ((value && !v) || (where && !w)) {
        free(v);
        free(w);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    free(c->v[k].value);
    free(c->v[k].where);
    c->v[k].value = v;
    c->v[k].where = w;
    c->v[k].source = src;
    return 0;
}

static int find_key(const char *name)
{
    for (int k = 0; k < UCFG_N; k++)
        if (strcmp(keys[k].name, name) == 0)
            return k;
    return -1;
}

static int check_choice(ucfg_key k, const char *v, const char *where, hearth_err *err)
{
    const char *ch = keys[k].choices;
    if (!ch)
        return 0;
    size_t len = strlen(v);
    for (const char *p = ch; *p;) {
        size_t n = strcspn(p, "|");
        if (n == len && strncmp(p, v, n) == 0)
            return 0;
        p += n + (p[n] == '|');
    }
    return herr_set(err, HERR_CONFIG, "%s: %s: expected one of %s, got '%s'", where,
                    keys[k].name, ch, v);
}

/* One `key: value` of the file (key dotted: "slurm.partition"). */
static int read_pair(ucfg *c, const char *name, const char *key, const yaml_tree_pair *p,
                     hearth_err *err)
{
    char where[4200];
    snprintf(where, sizeof where, "%s:%d:%d", name, p->line, p->col);
    int k = find_key(key);
    if (k < 0) {
        field_suggestion sg;
        field_suggest_init(&sg);
        for (int i = 0; i < UCFG_N; i++)
            field_suggest_add(&sg, key, keys[i].name);
        const char *best = field_suggest_result(&sg, key);
        return herr_set(err, HERR_CONFIG, "%s: %s: unknown key%s%s%s", where, key,
                        best ? " (did you mean '" : "", best ? best : "", best ? "'?)" : "");
    }
    const yaml_tree_node *v = p->value;
    if (!v || yaml_tree_is_null(v))   /* written empty: the built-in default */
        return set_value(c, (ucfg_key)k, keys[k].builtin, UCFG_FILE, where, err);
    if (v->kind != YAML_TREE_SCALAR) {
        char got[96];
        yaml_tree_describe(v, got, sizeof got);
        snprintf(where, sizeof where, "%s:%d:%d", name, v->line, v->col);
        return herr_set(err, HERR_CONFIG, "%s: %s: expected a string, got %s", where, key, got);
    }
    snprintf(where, sizeof where, "%s:%d:%d", name, v->line, v->col);   /* the value's place */
    if (memchr(v->text, 0, v->len) || !*v->text)
        return herr_set(err, HERR_CONFIG, "%s: %s: expected a non-empty string", where, key);
    int rc = check_choice((ucfg_key)k, v->text, where, err);
    if (rc)
        return rc;
    const char *home = getenv("HOME");
    if (keys[k].is_path && strncmp(v->text, "~/", 2) == 0) {
        if (!home || !*home)
            return herr_set(err, HERR_CONFIG, "%s: %s: '~/' needs $HOME", where, key);
        char *full = NULL;
        if (asprintf(&full, "%s/%s", home, v->text + 2) < 0)
            return herr_set(err, HERR_NOMEM, "out of memory");
        rc = set_value(c, (ucfg_key)k, full, UCFG_FILE, where, err);
        free(full);
        return rc;
    }
    return set_value(c, (ucfg_key)k, v->text, UCFG_FILE, where, err);
}

int ucfg_parse(ucfg *c, const char *name, const char *text, size_t len, hearth_err *err)
{
    yaml_tree *t = NULL;
    int rc = yaml_tree_parse(&t, name, text, len, err);
    if (rc)
        return rc;
    const yaml_tree_node *root = t->root;
    if (root && root->kind != YAML_TREE_MAP) {
        rc = herr_set(err, HERR_CONFIG, "%s:%d:%d: expected a mapping of settings (db, "
                      "backend, slurm, slurmrest, ...)", name, root->line, root->col);
    }
    for (int i = 0; !rc && root && i < root->n_pairs; i++) {
        const yaml_tree_pair *p = &root->pairs[i];
        int section = strcmp(p->key, "slurm") == 0 || strcmp(p->key, "slurmrest") == 0;
        if (!section) {
            rc = read_pair(c, name, p->key, p, err);
            continue;
        }
        const yaml_tree_node *m = p->value;
        if (!m || yaml_tree_is_null(m))
            continue;
        if (m->kind != YAML_TREE_MAP) {
            char got[96];
            yaml_tree_describe(m, got, sizeof got);
            rc = herr_set(err, HERR_CONFIG, "%s:%d:%d: %s: expected a mapping, got %s", name,
                          m->line, m->col, p->key, got);
            break;
        }
        for (int j = 0; !rc && j < m->n_pairs; j++) {
            char key[256];
            snprintf(key, sizeof key, "%s.%s", p->key, m->pairs[j].key);
            rc = read_pair(c, name, key, &m->pairs[j], err);
        }
    }
    yaml_tree_free(t);
    return rc;
}

int ucfg_load(ucfg *c, const char *path, hearth_err *err)
{
    memset(c, 0, sizeof *c);
    char buf[4096];
    int rc = 0;
    if (!path) {
        if ((rc = ucfg_path(buf, sizeof buf, err)))
            return rc;
        path = buf;
    }
    if (!(c->path = strdup(path)))
        return herr_set(err, HERR_NOMEM, "out of memory");
    for (int k = 0; k < UCFG_N && !rc; k++)
        rc = set_value(c, (ucfg_key)k, keys[k].builtin, UCFG_BUILTIN, NULL, err);
    if (!rc && access(path, F_OK) == 0) {
        c->found = 1;
        char *text = NULL;
        size_t len = 0;
        rc = file_read_bounded(path, FILE_READ_MAX_TEXT, &text, &len, err);
        if (!rc)
            rc = ucfg_parse(c, path, text, len, err);
        free(text);
    } else if (!rc && errno != ENOENT && errno != ENOTDIR) {
        rc = herr_set(err, HERR_IO, "%s: %s", path, strerror(errno));
    }
    for (int k = 0; k < UCFG_N && !rc; k++) {
        const char *v = getenv(keys[k].env);
        if (!v || !*v)
            continue;
        char where[128];
        snprintf(where, sizeof where, "$%s", keys[k].env);
        if (!(rc = check_choice((ucfg_key)k, v, where, err)))
            rc = set_value(c, (ucfg_key)k, v, UCFG_ENV, where, err);
    }
    return rc;
}

int ucfg_set_cmdline(ucfg *c, ucfg_key k, const char *value, const char *flag,
                     hearth_err *err)
{
    if (!value || !*value)
        return 0;
    int rc = check_choice(k, value, flag, err);
    return rc ? rc : set_value(c, k, value, UCFG_CMDLINE, flag, err);
}

const char *ucfg_get(const ucfg *c, ucfg_key k)
{
    if (k >= UCFG_N)
        return NULL;
    return c ? c->v[k].value : keys[k].builtin;
}

void ucfg_describe_source(const ucfg *c, ucfg_key k, char *buf, size_t size)
{
    const ucfg_value *v = &c->v[k];
    switch (v->source) {
    case UCFG_CMDLINE:
        snprintf(buf, size, "command line (%s)", v->where);
        break;
    case UCFG_ENV:
        snprintf(buf, size, "environment (%s)", v->where);
        break;
    case UCFG_FILE:
        snprintf(buf, size, "%s", v->where);
        break;
    default:
        snprintf(buf, size, "%s", v->value ? "built-in" : "unset");
        break;
    }
}

int ucfg_export_env(const ucfg *c, hearth_err *err)
{
    static const ucfg_key exported[] = { UCFG_REST_URL, UCFG_REST_TOKEN_FILE };
    for (size_t i = 0; i < sizeof exported / sizeof *exported; i++) {
        const ucfg_value *v = &c->v[exported[i]];
        if (v->source == UCFG_FILE && v->value && setenv(keys[exported[i]].env, v->value, 1))
            return herr_set(err, HERR_RUNTIME, "setenv %s: %s", keys[exported[i]].env,
                            strerror(errno));
    }
    return 0;
}

void ucfg_free(ucfg *c)
{
    if (!c)
        return;
    for (int k = 0; k < UCFG_N; k++) {
        free(c->v[k].value);
        free(c->v[k].where);
    }
    free(c->path);
    memset(c, 0, sizeof *c);
}
