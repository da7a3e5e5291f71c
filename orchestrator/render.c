/* render.c - template rendering with shell quoting.  See render.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "render.h"
#include "strbuf.h"

/* Single quotes keep every byte literal except the quote itself, which is closed, written
 * escaped and reopened: it's -> 'it'\''s'. */
static int quote_into(strbuf *b, const char *s)
{
    int rc = strbuf_add(b, "'", 1);
    for (const char *p = s; !rc && *p; ) {
        const char *q = strchr(p, '\'');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        rc = strbuf_add(b, p, n);
        if (!rc && q)
            rc = strbuf_add(b, "'\\''", 4);
        p += n + (q ? 1 : 0);
    }
    return rc ? rc : strbuf_add(b, "'", 1);
}

char *render_shell_quote(const char *s)
{
    strbuf b = { 0 };
    if (quote_into(&b, s)) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

static const render_var *find_var(const render_var *vars, size_t n, const char *name,
                                  size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(vars[i].name) == len && memcmp(vars[i].name, name, len) == 0)
            return &vars[i];
    return NULL;
}

int render_template(const char *tmpl_name, const char *tmpl, const render_var *vars,
                    size_t n_vars, char **out, hearth_err *err)
{
    strbuf b = { 0 };
    int rc = 0, line = 1;
    const char *p = tmpl;
    *out = NULL;
    while (!rc && *p) {
        const char *open = strstr(p, "{{");
        size_t n = open ? (size_t)(open - p) : strlen(p);
        for (size_t i = 0; i < n; i++)
            line += p[i] == '\n';
        if ((rc = strbuf_add(&b, p, n)) || !open)
            break;
        const char *name = open + 2, *close = strstr(name, "}}");
        size_t len = 0;
        while (name[len] && ((name[len] >= 'A' && name[len] <= 'Z') ||
                             (name[len] >= '0' && name[len] <= '9') || name[len] == '_'))
            len++;
        if (!close || close != name + len || len == 0) {
            rc = herr_set(err, HERR_CONFIG, "%s:%d: bad placeholder (expected {{NAME}} with "
                          "NAME in A-Z, 0-9, _)", tmpl_name, line);
            break;
        }
        const render_var *v = find_var(vars, n_vars, name, len);
        if (!v) {
            rc = herr_set(err, HERR_CONFIG, "%s:%d: unknown placeholder {{%.*s}}", tmpl_name,
                          line, (int)len, name);
            break;
        }
        const char *val = v->value ? v->value : "";
        rc = v->raw ? strbuf_add(&b, val, strlen(val)) : quote_into(&b, val);
        p = close + 2;
    }
    if (!rc && !b.s)
        rc = strbuf_add(&b, "", 0);
    if (rc) {
        free(b.s);
        return rc == HERR_NOMEM ? herr_set(err, rc, "out of memory rendering %s", tmpl_name)
                                : rc;
    }
    *out = b.s;
    return 0;
}

int render_exe_dir(char *dir, size_t size, hearth_err *err)
{
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0)
        return herr_set(err, HERR_IO, "/proc/self/exe: %s", strerror(errno));
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = 0;
    if ((size_t)snprintf(dir, size, "%s", buf) >= size)
        return herr_set(err, HERR_IO, "%s: path too long", buf);
    return 0;
}

int render_find_template(const char *name, char *path, size_t size, hearth_err *err)
{
    char dirs[8][4096];
    int n = 0;
    const char *env = getenv("HEARTH_TEMPLATES");
    while (env && *env && n < 4) {
        const char *colon = strchr(env, ':');
        size_t len = colon ? (size_t)(colon - env) : strlen(env);
        if (len && len < sizeof dirs[0]) {
            memcpy(dirs[n], env, len);
            dirs[n++][len] = 0;
        }
        env = colon ? colon + 1 : NULL;
    }
    char exe[4096];
    if (render_exe_dir(exe, sizeof exe, NULL) == 0) {
        snprintf(dirs[n++], sizeof dirs[0], "%.4000s/../../templates", exe);
        snprintf(dirs[n++], sizeof dirs[0], "%.4000s/../share/hearth/templates", exe);
    }
    snprintf(dirs[n++], sizeof dirs[0], "./templates");
    char searched[2048] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        char cand[4096 + 256];
        snprintf(cand, sizeof cand, "%.4000s/%.200s", dirs[i], name);
        if (access(cand, R_OK) == 0) {
            char *real = realpath(cand, NULL);
            int too_long = (size_t)snprintf(path, size, "%s", real ? real : cand) >= size;
            free(real);
            if (too_long)
                return herr_set(err, HERR_IO, "%s: path too long", cand);
            return 0;
        }
        if (used < sizeof searched)
            used += (size_t)snprintf(searched + used, sizeof searched - used, "%s%s",
                                     i ? ", " : "", dirs[i]);
    }
    return herr_set(err, HERR_IO, "template %s not found (searched: %s)", name, searched);
}

