/* test_pp_schedule.c - 1F1B and interleaved 1F1B op lists and the deadlock checker.
 *
 * Every (pp, vpp, M) in a wide range passes the checker; every stage runs each (micro,
 * chunk) forward and backward exactly once, a backward after its forward; 1F1B has its
 * textbook shape and holds min(pp - stage, M) micro batches; the interleaved forward table
 * equals Megatron's (written here from its definition) whenever M % pp == 0.  The checker
 * is compared with an independent reference (a lock-step simulation written here) on
 * random perturbations of valid schedules, and handcrafted broken lists (deadlock,
 * duplicate, missing, out-of-range ops) are rejected with a message that says why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "parallel/pp_schedule.h"
#include "support/testutil.h"

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}

/* Builds all stages into one array (stage p at p * len); returns len. */
static int build_all(int pp, int vpp, int M, pp_op **out)
{
    int len = 2 * M * vpp;
    pp_op *all = calloc((size_t)pp * (size_t)len, sizeof *all);
    assert_non_null(all);
    for (int p = 0; p < pp; p++) {
        hearth_err err = {{0}};
        int n = pp_schedule_build(all + (size_t)p * len, len, pp, vpp, p, M, &err);
        if (n != len)
            fail_msg("pp %d vpp %d M %d stage %d: built %d ops, want %d (%s)", pp, vpp, M, p, n,
                     len, err.msg);
    }
    *out = all;
    return len;
}

/* ---- an independent reference: lock-step rounds ----------------------------------
 * Every round, each stage whose next op has its inputs (as of the start of the round)
 * runs it; the round's results land together.  Returns 1 when all stages finish and each
 * (micro, virtual stage) ran forward and backward exactly once, else 0. */
static int reference_ok(int pp, int vpp, int M, pp_op *all, int len)
{
    int nv = pp * vpp;
    unsigned char *f = calloc((size_t)M * nv, 1), *b = calloc((size_t)M * nv, 1);
    int *pos = calloc((size_t)pp, sizeof *pos), *take = calloc((size_t)pp, sizeof *take);
    assert_true(f && b && pos && take);
    int ok = 1;
    for (;;) {
        int any = 0;
        for (int p = 0; p < pp; p++) {
            take[p] = 0;
            if (pos[p] == len)
                continue;
            pp_op o = all[(size_t)p * len + pos[p]];
            int v = o.chunk * pp + p;
            int ready = o.kind == PP_FORWARD
                            ? (v == 0 || f[o.micro * nv + v - 1])
                            : (f[o.micro * nv + v] && (v == nv - 1 || b[o.micro * nv + v + 1]));
            if (ready)
                take[p] = any = 1;
        }
        if (!any)
            break;
        for (int p = 0; p < pp; p++) {
            if (!take[p])
                continue;
            pp_op o = all[(size_t)p * len + pos[p]++];
            unsigned char *flag = o.kind == PP_FORWARD ? f : b;
            if (flag[o.micro * nv + o.chunk * pp + p]++)
                ok = 0;
        }
    }
    for (int p = 0; p < pp; p++)
        if (pos[p] != len)
            ok = 0;
    for (int c = 0; c < M * nv; c++)
        if (f[c] != 1 || b[c] != 1)
            ok = 0;
    free(f);
    free(b);
    free(pos);
    free(take);
    return ok;
}

/* Largest number of (micro, chunk) activations a stage holds, from its list alone. */
static int list_peak(const pp_op *ops, int n)
{
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        live += ops[i].kind == PP_FORWARD ? 1 : -1;
        if (live > peak)
            peak = live;
    }
    return peak;
}

static int check_all(int pp, int vpp, int M, pp_op *all, int len, int *peak, hearth_err *err)
{
    const pp_op *lists[16];
    int counts[16];
    assert_true(pp <= 16);
    for (int p = 0; p < pp; p++) {
        lists[p] = all + (size_t)p * len;
        counts[p] = len;
    }
    return pp_schedule_check_ops(pp, vpp, M, lists, counts, peak, err);
}

/* ---- tests ----------------------------------------------------------------------- */

/* Every layout of the small range the trainer uses, and a wider one, runs to the end. */
static void test_all_layouts_finish(void **state)
{
    (void)state;
    for (int pp = 1; pp <= 8; pp++)
        for (int vpp = 1; vpp <= 5; vpp++)
            for (int M = 1; M <= 40; M++) {
                hearth_err err = {{0}};
                int peak = -1;
                int rc = pp_schedule_check(pp, vpp, M, &peak, &err);
                if (rc != 0)
                    fail_msg("pp %d vpp %d M %d: rc %d: %s", pp, vpp, M, rc, err.msg);
                if (peak < 1 || peak > M * vpp)
                    fail_msg("pp %d vpp %d M %d: max in flight %d", pp, vpp, M, peak);
            }
}

/* Each stage: 2*M*vpp ops, each (micro, chunk) forward once and backward once, the
 * backward after the forward; the checker's peak is the largest per-list peak; the
 * reference agrees that the whole set finishes. */
static void test_counts_and_coverage(void **state)
{
    (void)state;
    for (int pp = 1; pp <= 4; pp++)
        for (int vpp = 1; vpp <= 3; vpp++)
            for (int M = 1; M <= 12; M++) {
                pp_op *all;
                int len = build_all(pp, vpp, M, &all);
                assert_int_equal(len, pp_schedule_len(vpp, M));
                int want_peak = 0;
                for (int p = 0; p < pp; p++) {
                    const pp_op *ops = all + (size_t)p * len;
                    int fpos[12 * 3], bpos[12 * 3];
                    for (int c = 0; c < M * vpp; c++)
                        fpos[c] = bpos[c] = -1;
                    for (int i = 0; i < len; i++) {
                        assert_true(ops[i].micro >= 0 && ops[i].micro < M);
                        assert_true(ops[i].chunk >= 0 && ops[i].chunk < vpp);
                        int *slot = ops[i].kind == PP_FORWARD ? fpos : bpos;
                        int c = ops[i].micro * vpp + ops[i].chunk;
                        if (slot[c] >= 0)
                            fail_msg("pp %d vpp %d M %d stage %d: op %d repeats op %d", pp, vpp,
                                     M, p, i, slot[c]);
                        slot[c] = i;
                    }
                    for (int c = 0; c < M * vpp; c++)
                        if (fpos[c] < 0 || bpos[c] < fpos[c])
                            fail_msg("pp %d vpp %d M %d stage %d: micro %d chunk %d: forward at "
                                     "%d, backward at %d",
                                     pp, vpp, M, p, c / vpp, c % vpp, fpos[c], bpos[c]);
                    int pk = list_peak(ops, len);
                    if (pk > want_peak)
                        want_peak = pk;
                }
                hearth_err err = {{0}};
                int peak = -1;
                assert_int_equal(check_all(pp, vpp, M, all, len, &peak, &err), 0);
                assert_int_equal(peak, want_peak);
                assert_true(reference_ok(pp, vpp, M, all, len));
                free(all);
            }
}

/* 1F1B: warmup forwards, then F/B alternating, then backwards; micro batches in order;
 * stage s holds min(pp - s, M) micro batches, so the checker reports min(pp, M). */
static void test_1f1b_shape(void **state)
{
    (void)state;
    for (int pp = 1; pp <= 8; pp++)
        for (int M = 1; M <= 20; M++) {
            pp_op *all;
            int len = build_all(pp, 1, M, &all);
            for (int s = 0; s < pp; s++) {
                const pp_op *ops = all + (size_t)s * len;
                int warm = pp - s - 1 < M ? pp - s - 1 : M;
                int nf = 0, nb = 0;
                for (int i = 0; i < len; i++) {
                    pp_op o = ops[i];
                    assert_int_equal(o.chunk, 0);
                    /* what the textbook shape puts here */
                    pp_op_kind want;
                    if (i < warm)
                        want = PP_FORWARD;
                    else if (i < warm + 2 * (M - warm))
                        want = (i - warm) % 2 == 0 ? PP_FORWARD : PP_BACKWARD;
                    else
                        want = PP_BACKWARD;
                    if (o.kind != want)
                        fail_msg("pp %d M %d stage %d op %d: kind %d, want %d", pp, M, s, i,
                                 o.kind, want);
                    assert_int_equal(o.micro, o.kind == PP_FORWARD ? nf++ : nb++);
                }
                int want_peak = pp - s < M ? pp - s : M;
                assert_int_equal(list_peak(ops, len), want_peak);
            }
            hearth_err err = {{0}};
            int peak = -1;
            assert_int_equal(pp_schedule_check(pp, 1, M, &peak, &err), 0);
            assert_int_equal(peak, pp < M ? pp : M);
            free(all);
        }
}

/* Interleaved with M % pp == 0: Megatron's get_model_chunk_id / microbatch id
 * (forward k: chunk (k mod pp*vpp) / pp, micro (k / (pp*vpp)) * pp + k mod pp; backward k:
 * the same micro, chunk reversed) and its warmup count. */
static void test_interleaved_megatron_order(void **state)
{
    (void)state;
    for (int pp = 1; pp <= 6; pp++)
        for (int vpp = 2; vpp <= 4; vpp++)
            for (int M = pp; M <= 4 * pp; M += pp) {
                pp_op *all;
                int len = build_all(pp, vpp, M, &all);
                for (int s = 0; s < pp; s++) {
                    const pp_op *ops = all + (size_t)s * len;
                    int nf = 0, nb = 0, first_b = -1;
                    for (int i = 0; i < len; i++) {
                        int k = ops[i].kind == PP_FORWARD ? nf++ : nb++;
                        int chunk = (k % (pp * vpp)) / pp;
                        int micro = (k / (pp * vpp)) * pp + k % pp;
                        if (ops[i].kind == PP_BACKWARD) {
                            chunk = vpp - 1 - chunk;
                            if (first_b < 0)
                                first_b = i;
                        }
                        if (ops[i].micro != micro || ops[i].chunk != chunk)
                            fail_msg("pp %d vpp %d M %d stage %d op %d: (micro %d, chunk %d), "
                                     "Megatron has (%d, %d)",
                                     pp, vpp, M, s, i, ops[i].micro, ops[i].chunk, micro, chunk);
                    }
                    int warm = (pp - s - 1) * 2 + (vpp - 1) * pp;
                    if (warm > M * vpp)
                        warm = M * vpp;
                    /* first backward right after warmup + one steady forward */
                    int want_first = warm == M * vpp ? warm : warm + 1;
                    assert_int_equal(first_b, want_first);
                }
                free(all);
            }
}

/* Random adjacent swaps of valid schedules: the checker agrees with the lock-step
 * reference on every one (many swaps break the schedule, some do not). */
static void test_checker_matches_reference(void **state)
{
    (void)state;
    int seen_ok = 0, seen_bad = 0;
    for (int t = 0; t < 3000; t++) {
        int pp = tu_randint(&g_rng, 1, 5), vpp = tu_randint(&g_rng, 1, 4);
        int M = tu_randint(&g_rng, 1, 9);
        pp_op *all;
        int len = build_all(pp, vpp, M, &all);
        int swaps = tu_randint(&g_rng, 1, 4);
        for (int k = 0; k < swaps && len > 1; k++) {
            int p = tu_randint(&g_rng, 0, pp), i = tu_randint(&g_rng, 0, len - 1);
            pp_op tmp = all[(size_t)p * len + i];
            all[(size_t)p * len + i] = all[(size_t)p * len + i + 1];
            all[(size_t)p * len + i + 1] = tmp;
        }
        hearth_err err = {{0}};
        int peak = -1;
        int rc = check_all(pp, vpp, M, all, len, &peak, &err);
        int ref = reference_ok(pp, vpp, M, all, len);
        if ((rc == 0) != ref)
            fail_msg("pp %d vpp %d M %d: checker rc %d (%s), reference %s (seed %llu)", pp, vpp,
                     M, rc, err.msg, ref ? "finishes" : "stalls",
                     (unsigned long long)g_rng.seed);
        if (rc == 0) {
            int want = 0;
            for (int p = 0; p < pp; p++) {
                int pk = list_peak(all + (size_t)p * len, len);
                want = pk > want ? pk : want;
            }
            assert_int_equal(peak, want);
            seen_ok++;
        } else {
            assert_int_equal(rc, HERR_RUNTIME);
            assert_non_null(strstr(err.msg, "deadlock"));
            seen_bad++;
        }
        free(all);
    }
    assert_true(seen_ok > 0 && seen_bad > 0);
}

/* Handcrafted broken lists. */
static void test_broken_lists(void **state)
{
    (void)state;
    hearth_err err = {{0}};
    /* pp 2: stage 0 waits for the backward of micro 0 before it sends micro 1 forward;
     * stage 1 wants micro 1's forward before it runs any backward. */
    const pp_op s0[] = {{PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0},
                        {PP_FORWARD, 1, 0}, {PP_BACKWARD, 1, 0}};
    const pp_op s1[] = {{PP_FORWARD, 0, 0}, {PP_FORWARD, 1, 0},
                        {PP_BACKWARD, 0, 0}, {PP_BACKWARD, 1, 0}};
    const pp_op *lists[2] = {s0, s1};
    int counts[2] = {4, 4};
    assert_int_equal(pp_schedule_check_ops(2, 1, 2, lists, counts, NULL, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "deadlock"));
    assert_non_null(strstr(err.msg, "stage 0 op 1"));
    assert_non_null(strstr(err.msg, "stage 1 op 1"));

    /* The same with stage 1 in 1F1B order finishes. */
    const pp_op s1_ok[] = {{PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0},
                           {PP_FORWARD, 1, 0}, {PP_BACKWARD, 1, 0}};
    lists[1] = s1_ok;
    int peak = -1;
    assert_int_equal(pp_schedule_check_ops(2, 1, 2, lists, counts, &peak, &err), 0);
    assert_int_equal(peak, 1);

    /* A backward before its own forward on one stage (pp 1). */
    const pp_op back_first[] = {{PP_BACKWARD, 0, 0}, {PP_FORWARD, 0, 0}};
    const pp_op *one[1] = {back_first};
    int two[1] = {2};
    assert_int_equal(pp_schedule_check_ops(1, 1, 1, one, two, NULL, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "deadlock"));

    /* A duplicate forward. */
    const pp_op dup[] = {{PP_FORWARD, 0, 0}, {PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0}};
    one[0] = dup;
    two[0] = 3;
    assert_int_equal(pp_schedule_check_ops(1, 1, 1, one, two, NULL, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "second time"));

    /* A micro batch never run. */
    const pp_op missing[] = {{PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0}};
    one[0] = missing;
    two[0] = 2;
    assert_int_equal(pp_schedule_check_ops(1, 1, 2, one, two, NULL, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "micro 1"));
    assert_non_null(strstr(err.msg, "never runs"));

    /* Out of range. */
    const pp_op range[] = {{PP_FORWARD, 0, 1}, {PP_BACKWARD, 0, 0}};
    one[0] = range;
    assert_int_equal(pp_schedule_check_ops(1, 1, 1, one, two, NULL, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "out of range"));

    /* A valid interleaved schedule with one stage's first backward moved to the front. */
    int pp = tu_randint(&g_rng, 2, 5), vpp = tu_randint(&g_rng, 2, 4);
    int M = pp * tu_randint(&g_rng, 1, 4);
    pp_op *all;
    int len = build_all(pp, vpp, M, &all);
    int p = tu_randint(&g_rng, 0, pp);
    pp_op *ops = all + (size_t)p * len;
    int fb = 0;
    while (ops[fb].kind != PP_BACKWARD)
        fb++;
    pp_op b = ops[fb];
    memmove(ops + 1, ops, (size_t)fb * sizeof *ops);
    ops[0] = b;
    assert_int_equal(check_all(pp, vpp, M, all, len, NULL, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "deadlock"));
    free(all);
}

/* Why the remainder joins the last group: the other choice, a short last group of M % pp
 * after the full ones with Megatron's warmup of (vpp - 1) * pp, deadlocks (stage 0 waits
 * for a forward that stage pp - 1 only runs after a backward that needs stage 0). */
static void short_group_entry(int pp, int vpp, int M, int k, int *micro, int *chunk)
{
    int full = M / pp, gsz = pp * vpp;
    if (k < full * gsz) {
        *chunk = (k % gsz) / pp;
        *micro = (k / gsz) * pp + k % pp;
    } else {
        int rest = M % pp, i = k - full * gsz;
        *chunk = i / rest;
        *micro = full * pp + i % rest;
    }
}

static void short_group_op(pp_op *o, pp_op_kind kind, int pp, int vpp, int M, int k)
{
    o->kind = kind;
    short_group_entry(pp, vpp, M, k, &o->micro, &o->chunk);
    if (kind == PP_BACKWARD)
        o->chunk = vpp - 1 - o->chunk;
}

static void test_short_last_group_deadlocks(void **state)
{
    (void)state;
    int deadlocks = 0;
    for (int pp = 2; pp <= 4; pp++)
        for (int vpp = 2; vpp <= 3; vpp++)
            for (int M = pp + 1; M < 3 * pp; M++) {
                if (M % pp == 0)
                    continue;
                int total = M * vpp, len = 2 * total;
                pp_op *all = calloc((size_t)pp * len, sizeof *all);
                assert_non_null(all);
                for (int s = 0; s < pp; s++) {
                    pp_op *ops = all + (size_t)s * len;
                    int warm = (pp - s - 1) * 2 + (vpp - 1) * pp, n = 0, f = 0, b = 0;
                    warm = warm < total ? warm : total;
                    /* warmup forwards, then F/B pairs, then the remaining backwards */
                    while (f < warm)
                        short_group_op(&ops[n++], PP_FORWARD, pp, vpp, M, f++);
                    while (f < total) {
                        short_group_op(&ops[n++], PP_FORWARD, pp, vpp, M, f++);
                        short_group_op(&ops[n++], PP_BACKWARD, pp, vpp, M, b++);
                    }
                    while (b < total)
                        short_group_op(&ops[n++], PP_BACKWARD, pp, vpp, M, b++);
                    assert_int_equal(n, len);
                }
                hearth_err err = {{0}};
                int rc = check_all(pp, vpp, M, all, len, NULL, &err);
                assert_int_equal(rc == 0, reference_ok(pp, vpp, M, all, len));
                if (rc != 0) {
                    assert_non_null(strstr(err.msg, "deadlock"));
                    deadlocks++;
                }
                if (pp == 4 && vpp == 3 && M == 5)
                    assert_int_equal(rc, HERR_RUNTIME);
                /* the module's own schedule for the same sizes finishes */
                assert_int_equal(pp_schedule_check(pp, vpp, M, NULL, &err), 0);
                free(all);
            }
    assert_true(deadlocks > 0);
}

static void test_bad_sizes(void **state)
{
    (void)state;
    hearth_err err = {{0}};
    pp_op ops[64];
    assert_int_equal(pp_schedule_build(ops, 64, 0, 1, 0, 4, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "pp"));
    assert_int_equal(pp_schedule_build(ops, 64, 2, 0, 0, 4, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "vpp"));
    assert_int_equal(pp_schedule_build(ops, 64, 2, 1, 0, 0, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "micro batches"));
    assert_int_equal(pp_schedule_build(ops, 64, 2, 1, 2, 4, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "stage 2"));
    assert_int_equal(pp_schedule_build(ops, 15, 2, 2, 0, 4, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "16 needed"));
    assert_int_equal(pp_schedule_check(3, 0, 4, NULL, &err), HERR_CONFIG);
    assert_int_equal(pp_schedule_build(ops, 16, 2, 2, 1, 4, &err), 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_layouts_finish),
        cmocka_unit_test(test_counts_and_coverage),
        cmocka_unit_test(test_1f1b_shape),
        cmocka_unit_test(test_interleaved_megatron_order),
        cmocka_unit_test_setup(test_checker_matches_reference, setup_seed),
        cmocka_unit_test_setup(test_broken_lists, setup_seed),
        cmocka_unit_test(test_short_last_group_deadlocks),
        cmocka_unit_test(test_bad_sizes),
    };
    return cmocka_run_group_tests_name("pp_schedule", tests, NULL, NULL);
}
