/* test_shape_file_read.c - the bounded reader of whole files (trainer/shape/file_read.h):
 * regular files up to the limit are read exactly; files over it, devices, FIFOs and
 * directories are refused at once, with the path (and the limit) in the message.
 * An alarm turns a reader that blocks (on a FIFO) into a failure instead of a hung test. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shape/file_read.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

static char dir[4096];

static int setup(void **state)
{
    (void)state;
    alarm(60);
    return tu_tmpdir_make(dir, sizeof dir, "file-read");
}

static int teardown(void **state)
{
    (void)state;
    alarm(0);
    return tu_tmpdir_remove(dir);
}

static void write_bytes(const char *path, const char *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void refused(const char *path, size_t max, const char *want1, const char *want2)
{
    char *text = (char *)1;
    size_t len = 99;
    hearth_err err = { { 0 } };
    assert_int_equal(file_read_bounded(path, max, &text, &len, &err), HERR_IO);
    assert_null(text);
    assert_int_equal(len, 0);
    if (!strstr(err.msg, path) || !strstr(err.msg, want1) || (want2 && !strstr(err.msg, want2)))
        fail_msg("message '%s' lacks '%s', '%s' or '%s'", err.msg, path, want1,
                 want2 ? want2 : "");
}

/* Random sizes around a random limit: at most the limit reads back byte for byte (NULs
 * included, NUL-terminated), one byte more is refused naming the size and the limit. */
static void test_sizes(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    char path[4200];
    snprintf(path, sizeof path, "%s/f", dir);
    for (int iter = 0; iter < 40; iter++) {
        size_t max = (size_t)tu_randint(&r, 0, 20000);
        size_t n = iter == 0 ? max : iter == 1 ? max + 1 : (size_t)tu_randint(&r, 0, 40001);
        char *data = malloc(n + 1);
        assert_non_null(data);
        for (size_t i = 0; i < n; i++)
            data[i] = (char)tu_randint(&r, 0, 256);
        write_bytes(path, data, n);
        char *text = NULL;
        size_t len = 0;
        hearth_err err = { { 0 } };
        int rc = file_read_bounded(path, max, &text, &len, &err);
        if (n <= max) {
            if (rc)
                fail_msg("%zu bytes under a limit of %zu: %s", n, max, err.msg);
            assert_int_equal(len, n);
            assert_memory_equal(text, data, n);
            assert_int_equal(text[n], '\0');
            free(text);
        } else {
            char size[64];
            snprintf(size, sizeof size, "%zu bytes, over the limit of", n);
            refused(path, max, size, NULL);
        }
        free(data);
    }
}

/* The limit reads as written, in KiB or MiB where it is a whole number of them. */
static void test_limit_text(void **state)
{
    (void)state;
    char path[4200];
    snprintf(path, sizeof path, "%s/token", dir);
    char big[FILE_READ_MAX_TOKEN + 1];
    memset(big, 'a', sizeof big);
    write_bytes(path, big, sizeof big);
    refused(path, FILE_READ_MAX_TOKEN, "8193 bytes, over the limit of 8 KiB", NULL);
    write_bytes(path, big, FILE_READ_MAX_TOKEN);
    char *text;
    hearth_err err;
    assert_int_equal(file_read_bounded(path, FILE_READ_MAX_TOKEN, &text, NULL, &err), 0);
    assert_int_equal(strlen(text), FILE_READ_MAX_TOKEN);
    free(text);
}

/* A file whose size says nothing (procfs: 0) is still bounded while it is read. */
static void test_unknown_size(void **state)
{
    (void)state;
    struct stat sb;
    assert_int_equal(stat("/proc/self/maps", &sb), 0);
    assert_int_equal(sb.st_size, 0);
    refused("/proc/self/maps", 16, "more than the limit of 16 bytes", NULL);
    char *text;
    hearth_err err;
    assert_int_equal(file_read_bounded("/proc/self/maps", FILE_READ_MAX_TEXT, &text, NULL,
                                       &err), 0);
    assert_non_null(strstr(text, "["));   /* [stack], [heap], ... */
    free(text);
}

/* Devices, FIFOs (no writer: opening one blocks without O_NONBLOCK), directories and
 * missing files are refused at once, by kind. */
static void test_not_regular(void **state)
{
    (void)state;
    refused("/dev/zero", FILE_READ_MAX_TEXT, "not a regular file (a character device)", NULL);
    char fifo[4200];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    refused(fifo, FILE_READ_MAX_TOKEN, "not a regular file (a FIFO)", NULL);
    refused(dir, FILE_READ_MAX_TEXT, "not a regular file (a directory)", NULL);
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/missing.yaml", dir);
    refused(missing, FILE_READ_MAX_TEXT, "cannot open", NULL);

    int fd = 7;
    hearth_err err = { { 0 } };
    assert_int_equal(file_open_regular(fifo, &fd, NULL, &err), HERR_IO);
    assert_int_equal(fd, -1);
    assert_non_null(strstr(err.msg, "a FIFO"));
}

/* JSON: parse errors at PATH:LINE:COL; file errors as for any file. */
static void test_json(void **state)
{
    (void)state;
    char path[4200];
    snprintf(path, sizeof path, "%s/x.json", dir);
    assert_int_equal(tu_write_text(path, "{\"a\": [1, 2]}\n"), 0);
    json_t *j = NULL;
    hearth_err err = { { 0 } };
    assert_int_equal(file_read_json(path, FILE_READ_MAX_TEXT, 0, &j, &err), 0);
    assert_int_equal(json_array_size(json_object_get(j, "a")), 2);
    json_decref(j);
    assert_int_equal(tu_write_text(path, "{\"a\":\n  [1,,]}"), 0);
    assert_int_equal(file_read_json(path, FILE_READ_MAX_TEXT, 0, &j, &err), HERR_CONFIG);
    assert_null(j);
    char want[4300];
    snprintf(want, sizeof want, "%s:2:", path);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "not valid JSON"));
    assert_int_equal(file_read_json("/dev/zero", FILE_READ_MAX_TEXT, 0, &j, &err), HERR_IO);
    assert_non_null(strstr(err.msg, "/dev/zero: not a regular file"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_limit_text),
        cmocka_unit_test(test_unknown_size),
        cmocka_unit_test(test_not_regular),
        cmocka_unit_test(test_json),
    };
    return cmocka_run_group_tests_name("shape_file_read", tests, setup, teardown);
}
