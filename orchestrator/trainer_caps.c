/* trainer_caps.c - the trainer a spec runs, and what that build can run (trainer_caps.h). */
#include "trainer_caps.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "render.h"
#include "shape/file_read.h"

int trainer_find(const spec *s, char *out, size_t size, hearth_err *err)
{
    char path[PATH_MAX];
    if (s->trainer) {
        snprintf(path, sizeof path, "%s", s->trainer);
    } else {
        char dir[PATH_MAX];
        int rc = render_exe_dir(dir, sizeof dir, err);
        if (rc)
            return rc;
        snprintf(path, sizeof path, "%.4000s/hearth-train", dir);
    }
    char *real = realpath(path, NULL);
    struct stat st;
    if (!real || stat(real, &st) || !S_ISREG(st.st_mode) || access(real, X_OK)) {
        free(real);
        return herr_set(err, HERR_CONFIG, "%s: trainer: %s: not an executable file", s->file,
                        path);
    }
    int too_long = (size_t)snprintf(out, size, "%s", real) >= size;
    free(real);
    return too_long ? herr_set(err, HERR_CONFIG, "%s: path too long", path) : 0;
}

int trainer_run_wait(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (log && (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0))
            _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void trainer_caps_query(const char *trainer, trainer_caps *caps)
{
    memset(caps, 0, sizeof *caps);
    char tmp[] = "/tmp/hearth-caps.XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0)
        return;
    close(fd);
    char *argv[] = { (char *)trainer, "--capabilities", NULL };
    int rc = trainer_run_wait(argv, tmp);
    json_t *root = NULL;
    if (rc == 0)
        file_read_json(tmp, FILE_READ_MAX_TEXT, 0, &root, NULL);
    unlink(tmp);
    json_t *devs = root ? json_object_get(root, "devices") : NULL;
    if (json_is_array(devs)) {
        caps->known = 1;
        size_t i;
        json_t *d;
        json_array_foreach(devs, i, d)
            caps->cuda |= json_is_string(d) && strcmp(json_string_value(d), "cuda") == 0;
    }
    json_decref(root);
}
