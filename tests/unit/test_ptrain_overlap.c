/* test_ptrain_overlap.c - parallel.a2a_overlap in the parallel trainer: the same layout
 * with and without the overlap gives bitwise the same losses, gradient norms and final
 * parameters (docs/parallel/a2a_overlap.md: only the order of independent nodes moves,
 * and every gradient still takes its micro batches in order).
 *
 * Layouts (ranks as threads on the local communicator, 2 optimizer steps of
 * tiny-vlm-moe with images, fresh data and parameter seeds): tp x ep with sequence
 * parallelism and an odd micro batch count per DP rank (the last unit is a single micro
 * batch), pipeline stages with expert parallelism, interleaved stages with a grouped
 * encoder strategy.  A dense model with the flag set runs as without it (no units of
 * two).  test_ptrain.c checks overlap layouts against the single-rank run.  The same
 * harness shows activation recomputation bitwise equal to none on layouts, with FP8 too
 * (the recomputed linears replay their forward's scales, tp-reduced, per pipeline slot). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model.h"
#include "support/ptrun.h"
#include "support/runcfg.h"
#include "support/testutil.h"
#include "train.h"

#define STEPS 2
#define MAX_KV 24

static const char *base_yaml =
    "train:\n"
    "  steps: 2\n"
    "  seq_len: 32\n"
    "  lr: 1.0e-3\n"
    "  min_lr: 1.0e-4\n"
    "  warmup: 1\n"
    "  weight_decay: 0.1\n"
    "  grad_clip: 1.0\n"
    "data:\n"
    "  images_min: 0\n"
    "  images_max: 2\n"
    "  image_px_min: 16\n"
    "  image_px_max: 32\n";

typedef struct {
    double loss[STEPS], grad_norm[STEPS];
    model *full;
} run_out;

/* One run of kv plus the seed and key=value (the switch compared); fills o. */
static void run(const char *const *kv, int n, uint64_t seed, const char *key,
                const char *value, run_out *o)
{
    runcfg_list l;
    assert_true(n + 2 <= MAX_KV);
    runcfg_init(&l);
    runcfg_add_kv(&l, kv, n);
    runcfg_add_seed(&l, seed % 1000000);
    runcfg_add(&l, key, value);
    run_config *cfg = calloc(1, sizeof *cfg);
    assert_non_null(cfg);
    hearth_err err = { { 0 } };
    if (runcfg_parse(cfg, base_yaml, &l, 0, &err))
        fail_msg("config: %s", err.msg);
    if (ptrun_train(cfg, STEPS, 120000, o->loss, o->grad_norm, &o->full, &err))
        fail_msg("%s=%s: %s", key, value, err.msg);
    free(cfg);
}

/* The layout kv with key=va and with key=vb: bitwise the same run. */
static void check_same_with(const char *const *kv, int n, const char *key, const char *va,
                            const char *vb)
{
    tu_rng rng = tu_rng_fresh();
    uint64_t seed = tu_next(&rng);
    run_out a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    run(kv, n, seed, key, va, &a);
    run(kv, n, seed, key, vb, &b);
    char desc[512] = "";
    snprintf(desc, sizeof desc, "%s %s/%s:", key, va, vb);
    for (int i = 0; i < n; i++)
        snprintf(desc + strlen(desc), sizeof desc - strlen(desc), " %s", kv[i]);
    for (int s = 0; s < STEPS; s++)
        if (a.loss[s] != b.loss[s] || a.grad_norm[s] != b.grad_norm[s])
            fail_msg("%s (seed %llu): step %d loss %.17g / %.17g, grad norm %.17g / %.17g",
                     desc, (unsigned long long)(seed % 1000000), s + 1, a.loss[s], b.loss[s],
                     a.grad_norm[s], b.grad_norm[s]);
    size_t np = model_param_count(a.full);
    assert_int_equal(np, model_param_count(b.full));
    if (!tu_bitwise_equal(model_params(a.full), model_params(b.full), np))
        fail_msg("%s (seed %llu): final parameters differ (max %.3g)", desc,
                 (unsigned long long)(seed % 1000000),
                 tu_max_abs_diff(model_params(a.full), model_params(b.full), np));
    assert_true(a.loss[0] > 0 && a.grad_norm[0] > 0);
    print_message("# %-60s bitwise equal (losses %.6f %.6f)\n", desc, a.loss[0], a.loss[1]);
    model_free(a.full);
    model_free(b.full);
}

#define CHECK_WITH(key, va, vb, ...)                                                    \
    do {                                                                                \
        const char *kv_[] = { __VA_ARGS__ };                                            \
        check_same_with(kv_, (int)(sizeof kv_ / sizeof kv_[0]), key, va, vb);           \
    } while (0)
/* a2a overlap off and on */
#define CHECK(...) CHECK_WITH("parallel.a2a_overlap", "false", "true", __VA_ARGS__)

static void test_tp_ep_sp_odd(void **state)
{
    (void)state;
    CHECK("model=tiny-vlm-moe", "ranks=4", "parallel.tp=2", "parallel.dp=2", "parallel.ep=2",
          "parallel.sp=true", "train.micro_batch=1", "train.global_batch=6");
}

static void test_pp_ep(void **state)
{
    (void)state;
    CHECK("model=tiny-vlm-moe", "ranks=4", "parallel.pp=2", "parallel.dp=2", "parallel.ep=2",
          "train.micro_batch=1", "train.global_batch=8");
}

static void test_vpp_hetero_dp(void **state)
{
    (void)state;
    CHECK("model=tiny-vlm-moe", "ranks=4", "parallel.tp=2", "parallel.pp=2", "parallel.vpp=2",
          "parallel.encoder.strategy=hetero_dp", "parallel.encoder.tp=1",
          "train.micro_batch=1", "train.global_batch=5");
}

static void test_dense_unaffected(void **state)
{
    (void)state;
    CHECK("model=tiny-vlm", "ranks=2", "parallel.pp=2", "train.micro_batch=1",
          "train.global_batch=3");
}

/* Activation recomputation on layouts: the recomputed forward reruns the sequence-
 * parallel gathers in the backward, with a2a overlap pairs and pipeline slots. */
static void test_recompute_layouts(void **state)
{
    (void)state;
    CHECK_WITH("train.recompute", "none", "full", "model=tiny-vlm-moe", "ranks=4",
               "parallel.tp=2", "parallel.dp=2", "parallel.ep=2", "parallel.sp=true",
               "parallel.a2a_overlap=true", "train.micro_batch=1", "train.global_batch=4");
    CHECK_WITH("train.recompute", "none", "selective", "model=tiny-vlm", "ranks=4",
               "parallel.tp=2", "parallel.pp=2", "parallel.sp=true", "train.micro_batch=1",
               "train.global_batch=3");
}

/* The same with every linear in FP8 (delayed scaling, the default history): full
 * recomputation replays qkv, proj and fc1 with the scales of their forward, reduced over
 * tp, while two micro batches are in flight on the pipeline's activation slots. */
static void test_recompute_layouts_fp8(void **state)
{
    (void)state;
    CHECK_WITH("train.recompute", "none", "full", "model=tiny-vlm-moe", "ranks=4",
               "parallel.tp=2", "parallel.dp=2", "parallel.ep=2", "parallel.sp=true",
               "parallel.a2a_overlap=true", "train.micro_batch=1", "train.global_batch=4",
               "precision.fp8=all");
    CHECK_WITH("train.recompute", "none", "full", "model=tiny-vlm", "ranks=4",
               "parallel.tp=2", "parallel.pp=2", "parallel.sp=true", "train.micro_batch=1",
               "train.global_batch=3", "precision.fp8=all");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_ep_sp_odd),
        cmocka_unit_test(test_pp_ep),
        cmocka_unit_test(test_vpp_hetero_dp),
        cmocka_unit_test(test_dense_unaffected),
        cmocka_unit_test(test_recompute_layouts),
        cmocka_unit_test(test_recompute_layouts_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
