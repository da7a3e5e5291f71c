/* test_orch_progress.c - the progress line: random sequences of updates, messages and
 * clock steps against a model of what a terminal and a log should receive (a terminal:
 * the line rewritten only when it changes, messages above it, the line drawn again; a log:
 * a line when it changes or when the interval passed, never a carriage return). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "progress.h"
#include "strbuf.h"
#include "support/testutil.h"

static void add(strbuf *b, const char *s)
{
    assert_int_equal(strbuf_add(b, s, strlen(s)), 0);
}

static void run_random(tu_rng *r, int tty)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    assert_non_null(f);
    double interval = tu_randint(r, 0, 3) * 5.0;   /* 0: only on change */
    progress p;
    progress_init(&p, f, tty, interval);
    strbuf want = { 0 };
    char cur[64] = "";
    int open = 0;
    double now = 0, last = 0;
    int n = tu_randint(r, 1, 60);
    for (int i = 0; i < n; i++) {
        int what = tu_randint(r, 0, 5);
        now += tu_randint(r, 0, 4) * 2.5;
        if (what <= 2) {
            char line[64];
            snprintf(line, sizeof line, "[%d/3] running", tu_randint(r, 0, 3));
            int changed = strcmp(line, cur) != 0;
            if (tty) {
                if (changed || !open) {
                    add(&want, "\r");
                    add(&want, line);
                    add(&want, "\033[K");
                    open = 1;
                }
            } else if (changed || (interval > 0 && now - last >= interval)) {
                add(&want, line);
                add(&want, "\n");
                last = now;
            }
            snprintf(cur, sizeof cur, "%s", line);
            progress_line(&p, line, now);
        } else if (what == 3) {
            char msg[32];
            snprintf(msg, sizeof msg, "run-%d failed", i);
            if (open)
                add(&want, "\r\033[K");
            add(&want, "hearth: ");
            add(&want, msg);
            add(&want, "\n");
            open = 0;
            if (tty && cur[0]) {
                add(&want, cur);
                add(&want, "\033[K");
                open = 1;
            }
            progress_say(&p, "%s", msg);
        } else {
            if (open)
                add(&want, "\n");
            open = 0;
            progress_end(&p);
        }
    }
    fclose(f);
    if (strcmp(out, want.s ? want.s : ""))
        fail_msg("seed %llu (tty %d, interval %g):\ngot  '%s'\nwant '%s'",
                 (unsigned long long)r->seed, tty, interval, out, want.s ? want.s : "");
    if (!tty)
        assert_null(strchr(out, '\r'));
    free(out);
    free(want.s);
}

static void test_random_sequences(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    for (int i = 0; i < 2000; i++)
        run_random(&r, i % 2);
}

static void test_counts_and_quiet(void **state)
{
    (void)state;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    assert_non_null(f);
    progress p;
    progress_init(&p, f, 0, 0);
    progress_counts(&p, 4, 5, 1, 3, 0, 0);
    progress_counts(&p, 4, 5, 1, 3, 0, 0);   /* unchanged, no interval: nothing */
    progress_counts(&p, 5, 5, 0, 5, 0, 0);
    /* A cancelled run is counted as cancelled, not as failed. */
    progress_counts(&p, 5, 5, 0, 3, 1, 1);
    fclose(f);
    assert_string_equal(out, "[4/5] running 1 \xc2\xb7 done 3 \xc2\xb7 failed 0\n"
                             "[5/5] running 0 \xc2\xb7 done 5 \xc2\xb7 failed 0\n"
                             "[5/5] running 0 \xc2\xb7 done 3 \xc2\xb7 failed 1 \xc2\xb7 "
                             "cancelled 1\n");
    free(out);
    progress_init(&p, NULL, 1, 1);   /* quiet: every call a no-op */
    progress_set(&p, "x %d", 1);
    progress_say(&p, "y");
    progress_end(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_sequences),
        cmocka_unit_test(test_counts_and_quiet),
    };
    return cmocka_run_group_tests_name("orch_progress", tests, NULL, NULL);
}
