/* test_config_rules.c - the named layout rules (run_config_check_rules): each rule fires
 * with its name at the place that set the value, and on random layouts the verdict
 * agrees with the rules written out independently here.  Fresh seed, printed on failure. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/run_config.h"
#include "support/testutil.h"

#define MAX_SETS 16

static int parse(run_config *c, const char *yaml, const char *const *sets, hearth_err *err)
{
    config_override o[MAX_SETS] = { { 0 } };
    int n = 0;
    for (; sets && sets[n]; n++) {
        o[n].key = sets[n];
        o[n].value = NULL;
    }
    return run_config_parse(c, "run.yaml", yaml, o, n, 0, err);
}

typedef struct {
    const char *rule;
    const char *yaml;
    const char *sets[8];
    const char *where;   /* the message starts with this, then ": rule RULE: " */
} rule_case;

static const rule_case cases[] = {
    { "ranks_match_layout", "model: tiny-vlm\nranks: 3\n", { "parallel.tp=2" }, "run.yaml:2:8: ranks" },
    { "ranks_match_layout", "model: tiny-vlm\n", { "ranks=4", "parallel.tp=2", "parallel.dp=3" }, "--set ranks" },
    { "nccl_needs_cuda", "model: tiny-vlm\ncomm: nccl\n", { 0 }, "run.yaml:2:7: comm" },
    { "local_ranks_max", "model: tiny-vlm\n", { "ranks=100000" }, "--set ranks" },
    { "sp_needs_tp", "model: tiny-vlm\n", { "parallel.sp=true" }, "--set parallel.sp" },
    { "vpp_needs_pp", "model: tiny-vlm\n", { "parallel.vpp=2" }, "--set parallel.vpp" },
    { "layers_divisible_by_pp_vpp", "model: tiny-vlm\n", { "ranks=3", "parallel.pp=3" }, "--set parallel.pp" },
    { "heads_divisible_by_tp", "model: tiny-vlm\nranks: 3\nparallel: {tp: 3}\n", { 0 }, "run.yaml:3:16: parallel.tp" },
    { "kv_heads_split_or_replicated", "model: {preset: tiny-vlm, decoder: {heads: 12}}\n",
      { "ranks=3", "parallel.tp=3" }, "--set parallel.tp" },
    { "ffn_divisible_by_tp", "model: tiny-vlm\n", { "model.decoder.ffn=511", "ranks=2", "parallel.tp=2" },
      "--set parallel.tp" },
    { "ffn_divisible_by_tp", "model: tiny-vlm-moe\n", { "model.decoder.moe.ffn=255", "ranks=2", "parallel.tp=2" },
      "--set parallel.tp" },
    { "ep_needs_moe", "model: tiny-vlm\n", { "ranks=2", "parallel.ep=2" }, "--set parallel.ep" },
    { "ep_divides_dp", "model: tiny-vlm-moe\n", { "parallel.ep=2" }, "--set parallel.ep" },
    { "experts_divisible_by_ep", "model: tiny-vlm-moe\n", { "model.decoder.moe.experts=6", "ranks=4", "parallel.ep=4" },
      "--set parallel.ep" },
    { "encoder_strategy_needs_encoder", "model: gpt2-124m\n", { "parallel.encoder.strategy=hetero_dp" },
      "--set parallel.encoder.strategy" },
    { "uniform_encoder_tp", "model: tiny-vlm\n", { "parallel.encoder.tp=2" }, "--set parallel.encoder.tp" },
    { "hetero_tp_encoder_tp", "model: tiny-vlm\nparallel:\n  encoder:\n    strategy: hetero_tp\n", { 0 },
      "run.yaml:4:15: parallel.encoder.strategy" },
    { "encoder_tp_one", "model: tiny-vlm\n", { "ranks=2", "parallel.tp=2", "parallel.encoder.strategy=hetero_dp",
      "parallel.encoder.tp=2" }, "--set parallel.encoder.tp" },
    { "encoder_heads_divisible_by_tp", "model: tiny-vlm\n", { "model.encoder={heads: 2, kv_heads: 2, head_dim: 128}",
      "ranks=4", "parallel.tp=4" }, "--set parallel.tp" },
    { "encoder_kv_heads_split_or_replicated", "model: tiny-vlm\n",
      { "model.encoder={hidden: 384, heads: 6, kv_heads: 3}", "ranks=2", "parallel.tp=2" }, "--set parallel.tp" },
    { "encoder_ffn_divisible_by_tp", "model: tiny-vlm\n", { "model.encoder.ffn=510", "ranks=4", "parallel.tp=4" },
      "--set parallel.tp" },
    { "projector_hidden_divisible_by_tp", "model: tiny-vlm\n", { "model.projector.hidden=510", "ranks=4",
      "parallel.tp=4" }, "--set parallel.tp" },
    { "full_separation_no_cp", "model: tiny-vlm\n", { "ranks=2", "parallel.cp=2",
      "parallel.encoder.strategy=full_separation" }, "--set parallel.cp" },
    { "offload_needs_full_separation", "model: tiny-vlm\n", { "parallel.encoder.offload=true" },
      "--set parallel.encoder.offload" },
    { "global_batch_divisible", "model: tiny-vlm\ntrain: {micro_batch: 2, global_batch: 3}\n", { 0 },
      "run.yaml:2:39: train.global_batch" },
    { "seq_len_divisible_by_cp", "model: tiny-vlm\n", { "ranks=2", "parallel.cp=2", "train.seq_len=254" },
      "--set train.seq_len" },
    { "seq_len_divisible_by_tp_for_sp", "model: tiny-vlm\n", { "ranks=2", "parallel.tp=2", "parallel.sp=true",
      "train.seq_len=255" }, "--set train.seq_len" },
    { "seq_len_divisible_by_chunks", "model: tiny-vlm\n", { "train.seq_len=254", "parallel.chunks=4" },
      "--set train.seq_len" },
    { "chunk_divisible_by_tp_for_sp", "model: tiny-vlm\n", { "ranks=2", "parallel.tp=2", "parallel.sp=true",
      "train.seq_len=36", "parallel.chunks=4" }, "--set train.seq_len" },
    { "chunks_no_cp", "model: tiny-vlm\n", { "ranks=2", "parallel.cp=2", "parallel.chunks=2" },
      "--set parallel.chunks" },
    { "chunks_no_moe_aux", "model: tiny-vlm-moe\n", { "parallel.chunks=2" }, "--set parallel.chunks" },
    { "seq_len_within_max_positions", "model: gpt2-124m\n", { "train.seq_len=2048" }, "--set train.seq_len" },
    { "fp8_policy_for_selective", "model: tiny-vlm\ndevice: cuda\nprecision: {fp8: selective}\n", { 0 },
      "run.yaml:3:18: precision.fp8" },
    { "shards_need_path", "model: tiny-vlm\n", { "data.kind=shards" }, "--set data.kind" },
    { "images_min_at_most_max", "model: tiny-vlm\n", { "data.images_min=3" }, "--set data.images_min" },
    { "image_px_min_at_most_max", "model: tiny-vlm\n", { "data.image_px_min=100" }, "--set data.image_px_min" },
    { "min_lr_at_most_lr", "model: tiny-vlm\n", { "train.min_lr=1" }, "--set train.min_lr" },
};

static void test_each_rule(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const rule_case *k = &cases[i];
        run_config c;
        hearth_err err = { { 0 } };
        int rc = parse(&c, k->yaml, k->sets[0] ? k->sets : NULL, &err);
        if (rc != HERR_CONFIG)
            fail_msg("%s: expected the rule to fail, got rc %d", k->rule, rc);
        char want[300];
        snprintf(want, sizeof want, "%s: rule %s: ", k->where, k->rule);
        if (strncmp(err.msg, want, strlen(want)) != 0)
            fail_msg("%s:\n  '%s'\ndoes not start with\n  '%s'", k->rule, err.msg, want);
    }
}

/* run_config_check_rules on a struct changed after loading. */
static void test_check_struct(void **state)
{
    (void)state;
    run_config c;
    hearth_err err = { { 0 } };
    assert_int_equal(parse(&c, "model: tiny-vlm-moe\n", NULL, &err), 0);
    assert_int_equal(run_config_check_rules(&c, &err), 0);
    run_config b = c;
    b.parallel.tp = 0;
    assert_int_equal(run_config_check_rules(&b, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "rule sizes_positive: every parallel size must be >= 1");
    b = c;
    b.parallel.tp = 2;
    assert_int_equal(run_config_check_rules(&b, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "rule ranks_match_layout: ranks 1 must equal tp 2 x cp 1 x "
                        "pp 1 x dp 1 = 2");
    b.ranks = 2;
    b.parallel.encoder.tp = 2;
    assert_int_equal(run_config_check_rules(&b, &err), 0);
    b.model.decoder.moe_experts = 7;
    b.model.decoder.moe_top_k = 1;
    b.parallel.dp = 2;
    b.parallel.tp = 1;
    b.parallel.encoder.tp = 1;
    b.parallel.ep = 2;
    assert_int_equal(run_config_check_rules(&b, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "rule experts_divisible_by_ep: moe.experts 7 must be "
                        "divisible by ep 2");
    assert_string_equal(encoder_strategy_name(ENC_HETERO_DP), "hetero_dp");
}

/* Sequence chunks with MoE are accepted once the aux loss is off (chunks_no_moe_aux). */
static void test_chunks_moe_without_aux(void **state)
{
    (void)state;
    run_config c;
    hearth_err err = { { 0 } };
    const char *sets[] = { "parallel.chunks=2", "model.decoder.moe.aux_coef=0", NULL };
    assert_int_equal(parse(&c, "model: tiny-vlm-moe\n", sets, &err), 0);
    assert_int_equal(c.parallel.chunks, 2);
}

/* FP8 with activation recomputation is accepted, per component and over train.recompute
 * (the recomputed linears replay their forward's scales, docs/fp8.md). */
static void test_fp8_with_recompute(void **state)
{
    (void)state;
    static const char *const sets[][4] = {
        { "precision.fp8=all", "train.recompute=full", NULL },
        { "precision.fp8=all", "train.recompute=selective", NULL },
        { "precision.fp8=all", "model.encoder.recompute=full", "model.decoder.recompute=none",
          NULL },
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        run_config c;
        hearth_err err = { { 0 } };
        if (parse(&c, "model: tiny-vlm\n", sets[i], &err) || run_config_check_rules(&c, &err))
            fail_msg("%s %s: %s", sets[i][0], sets[i][1], err.msg);
        assert_int_equal(c.precision.fp8, FP8_ALL);
    }
}

/* Random layouts of tiny-vlm-moe against the rules written out here. */
static int expected_valid(int ranks, int tp, int cp, int pp, int vpp, int dp, int ep, int sp,
                          int strat, int etp, int seq)
{
    /* tiny-vlm-moe: decoder 4 layers, 4 heads, 2 kv heads, 8 experts of width 256;
     * encoder 4 heads, 4 kv heads, ffn 512; projector 512. */
    if (tp * cp * pp * dp != ranks)
        return 0;
    if (sp && (tp < 2 || seq % (tp * cp)))
        return 0;
    if (vpp > 1 && pp < 2)
        return 0;
    if (4 % (pp * vpp) || 4 % tp || !(2 % tp == 0 || tp % 2 == 0) || 256 % tp)
        return 0;
    if (dp % ep || 8 % ep)
        return 0;
    if (strat == ENC_UNIFORM && etp != tp)
        return 0;
    if (strat == ENC_HETERO_TP && !(etp < tp && tp % etp == 0))
        return 0;
    if ((strat == ENC_HETERO_DP || strat == ENC_FULL_SEPARATION) && etp != 1)
        return 0;
    if (4 % etp || 512 % etp)
        return 0;
    if (strat == ENC_FULL_SEPARATION && cp > 1)
        return 0;
    if (cp > 1 && seq % (2 * cp))
        return 0;
    return 1;
}

static void test_random_layouts(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    static const char *const strat_names[] = { "uniform", "hetero_tp", "hetero_dp", "full_separation" };
    int valid_seen = 0, invalid_seen = 0;
    for (int iter = 0; iter < 400; iter++) {
        int tp = tu_randint(&r, 1, 5), cp = tu_randint(&r, 1, 4), pp = tu_randint(&r, 1, 5);
        int vpp = tu_randint(&r, 1, 3), dp = tu_randint(&r, 1, 5);
        int ep = 1 << tu_randint(&r, 0, 4), sp = tu_randint(&r, 0, 4) == 0;
        int strat = tu_randint(&r, 0, 4);
        int seq = tu_randint(&r, 0, 2) ? 240 : tu_randint(&r, 16, 300);
        int ranks = tp * cp * pp * dp + (tu_randint(&r, 0, 8) == 0);
        int dp_auto = tu_randint(&r, 0, 2), etp_auto = tu_randint(&r, 0, 2);
        int etp = etp_auto ? 0 : tu_randint(&r, 1, 5);
        /* what `auto` resolves to, per docs/config.md */
        int dp_eff = dp_auto ? (ranks % (tp * cp * pp) ? 0 : ranks / (tp * cp * pp)) : dp;
        int etp_eff = etp;
        if (etp_auto) {
            etp_eff = 1;
            if (strat == ENC_UNIFORM)
                etp_eff = tp;
            else if (strat == ENC_HETERO_TP)
                for (int d = tp - 1; d >= 1 && etp_eff == 1; d--)
                    if (tp % d == 0)
                        etp_eff = d;
        }
        char yaml[1024], dps[32], etps[32];
        snprintf(dps, sizeof dps, dp_auto ? "auto" : "%d", dp);
        snprintf(etps, sizeof etps, etp_auto ? "auto" : "%d", etp);
        snprintf(yaml, sizeof yaml,
                 "model: tiny-vlm-moe\nranks: %d\n"
                 "parallel: {tp: %d, cp: %d, pp: %d, vpp: %d, dp: %s, ep: %d, sp: %s,\n"
                 "  encoder: {strategy: %s, tp: %s}}\ntrain: {seq_len: %d}\n",
                 ranks, tp, cp, pp, vpp, dps, ep, sp ? "true" : "false", strat_names[strat],
                 etps, seq);
        int want = dp_eff > 0 &&
                   expected_valid(ranks, tp, cp, pp, vpp, dp_eff, ep, sp, strat, etp_eff, seq);
        run_config c;
        hearth_err err = { { 0 } };
        int rc = parse(&c, yaml, NULL, &err);
        if (rc && rc != HERR_CONFIG)
            fail_msg("rc %d: %s", rc, err.msg);
        if ((rc == 0) != want)
            fail_msg("expected %s, got %s (seed %llu)\n%s", want ? "valid" : "invalid",
                     rc ? err.msg : "valid", (unsigned long long)r.seed, yaml);
        if (rc)
            assert_non_null(strstr(err.msg, ": rule "));
        else
            assert_int_equal(c.parallel.dp, dp_eff);
        valid_seen += want;
        invalid_seen += !want;
    }
    assert_true(valid_seen > 0 && invalid_seen > 0);
}

/* Layouts DESIGN.md promises for the tiny presets are valid. */
static void test_promised_layouts(void **state)
{
    (void)state;
    const char *const layouts[][8] = {
        { "ranks=16", "parallel.tp=4", "parallel.pp=2", "parallel.vpp=2", "parallel.dp=2", NULL },
        { "ranks=8", "parallel.tp=2", "parallel.cp=2", "parallel.pp=2", NULL },
        { "ranks=4", "parallel.tp=4", "parallel.encoder.strategy=hetero_tp", "parallel.encoder.tp=2", NULL },
        { "ranks=4", "parallel.tp=4", "parallel.encoder.strategy=hetero_dp", NULL },
        { "ranks=4", "parallel.tp=2", "parallel.pp=2", "parallel.encoder.strategy=full_separation",
          "parallel.encoder.offload=true", NULL },
        { "ranks=8", "parallel.tp=2", "parallel.sp=true", "train.global_batch=8", "train.micro_batch=2", NULL },
    };
    for (int p = 0; p < 2; p++) {
        for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
            run_config c;
            hearth_err err = { { 0 } };
            if (parse(&c, p ? "model: tiny-vlm-moe\n" : "model: tiny-vlm\n", layouts[i], &err))
                fail_msg("layout %zu: %s", i, err.msg);
        }
    }
    const char *const ep4[] = { "ranks=4", "parallel.ep=4", NULL };
    run_config c;
    hearth_err err = { { 0 } };
    if (parse(&c, "model: tiny-vlm-moe\n", ep4, &err))
        fail_msg("ep 4: %s", err.msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_rule),
        cmocka_unit_test(test_check_struct),
        cmocka_unit_test(test_chunks_moe_without_aux),
        cmocka_unit_test(test_fp8_with_recompute),
        cmocka_unit_test(test_random_layouts),
        cmocka_unit_test(test_promised_layouts),
    };
    return cmocka_run_group_tests_name("config_rules", tests, NULL, NULL);
}
