/* test_orch_plan.c - plan: every layout rule prunes with its name and reason; the fast
 * resolution (base read once + prepared overrides) equals run_config_parse on random points;
 * `where` sees resolved values; dedup against completed runs, --force and duplicates in one
 * spec; repeat in the counts; cuda ranks from resources; resources.gpu_mem prunes the
 * layouts whose predicted peak does not fit (rule fits_gpu_mem); the table and JSON
 * outputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "plan.h"
#include "shape/mem_plan.h"
#include "shape/run_config.h"
#include "support/spectest.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

static unsigned g_seed;
static char g_dir[64];
static char g_vlm[128], g_moe[128], g_text[128];

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

/* Three small presets of our own, so the test does not depend on contrib/models. */
static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/hearth-plan-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(g_vlm, sizeof g_vlm, "%s/vlm.yaml", g_dir);
    snprintf(g_moe, sizeof g_moe, "%s/moe.yaml", g_dir);
    snprintf(g_text, sizeof g_text, "%s/text.yaml", g_dir);
    const char *enc =
        "encoder:\n  layers: 2\n  hidden: 128\n  ffn: 256\n  heads: 4\n  kv_heads: 4\n"
        "  head_dim: 32\n  pos: rope2d\n  patch: 8\n  spatial_merge: 2\n"
        "projector:\n  hidden: 256\n";
    char buf[2048];
    snprintf(buf, sizeof buf, "%sdecoder:\n  layers: 4\n  hidden: 128\n  ffn: 256\n  heads: 4\n"
             "  kv_heads: 2\n  head_dim: 32\n  pos: rope\n  vocab: 256\n  image_token_id: 255\n",
             enc);
    assert_int_equal(tu_write_text(g_vlm, buf), 0);
    snprintf(buf, sizeof buf, "%sdecoder:\n  layers: 4\n  hidden: 128\n  heads: 4\n"
             "  kv_heads: 2\n  pos: rope\n  vocab: 256\n  image_token_id: 255\n"
             "  moe: {experts: 4, top_k: 2, ffn: 64}\n", enc);
    assert_int_equal(tu_write_text(g_moe, buf), 0);
    assert_int_equal(tu_write_text(g_text, "decoder:\n  layers: 2\n  hidden: 64\n  ffn: 128\n"
                                           "  heads: 2\n  pos: learned\n  max_positions: 64\n"
                                           "  vocab: 128\n  mlp: gelu\n  norm: layernorm\n"),
                     0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_vlm);
    unlink(g_moe);
    unlink(g_text);
    rmdir(g_dir);
    return 0;
}

/* ---- every rule prunes ------------------------------------------------------------- */

typedef struct {
    const char *overrides;     /* a flow mapping */
    const char *rule;
    const char *reason_part;
} rule_case;

typedef struct {
    int n;
    plan_status status[64];
    char rule[64][64];
    char reason[64][1024];
    char hash[64][65];
    int runs[64];
} seen_points;

static int record(void *ctx, const plan_point *p)
{
    seen_points *sp = ctx;
    if (sp->n < 64) {
        sp->status[sp->n] = p->status;
        snprintf(sp->rule[sp->n], sizeof sp->rule[0], "%s", p->rule ? p->rule : "");
        snprintf(sp->reason[sp->n], sizeof sp->reason[0], "%s", p->reason);
        snprintf(sp->hash[sp->n], sizeof sp->hash[0], "%s", p->hash);
        sp->runs[sp->n] = p->runs;
    }
    sp->n++;
    return 0;
}

static void test_every_rule_prunes(void **state)
{
    (void)state;
    const rule_case cases[] = {
        {"{ranks: 3, parallel.tp: 2}", "ranks_match_layout", "not a multiple"},
        {"{ranks: 4, parallel.tp: 2, parallel.dp: 1}", "ranks_match_layout", "must equal"},
        {"{comm: nccl}", "nccl_needs_cuda", "nccl"},
        {"{parallel.sp: true}", "sp_needs_tp", "tp > 1"},
        {"{parallel.vpp: 2}", "vpp_needs_pp", "pp > 1"},
        {"{ranks: 3, parallel.pp: 3}", "layers_divisible_by_pp_vpp", "layers 4"},
        {"{ranks: 3, parallel.tp: 3}", "heads_divisible_by_tp", "heads 4"},
        {"{ranks: 2, parallel.tp: 2, model.decoder.heads: 6, model.decoder.kv_heads: 3}",
         "kv_heads_split_or_replicated", "kv_heads 3"},
        {"{ranks: 2, parallel.tp: 2, model.decoder.ffn: 255}", "ffn_divisible_by_tp", "255"},
        {"{model: MOE, ranks: 2, parallel.tp: 2, model.decoder.moe.ffn: 63}",
         "ffn_divisible_by_tp", "63"},
        {"{ranks: 2, parallel.ep: 2}", "ep_needs_moe", "MoE"},
        {"{model: MOE, ranks: 2, parallel.tp: 2, parallel.ep: 2}", "ep_divides_dp", "ep 2"},
        {"{model: MOE, ranks: 3, parallel.ep: 3}", "experts_divisible_by_ep", "experts 4"},
        {"{model: TEXT, parallel.encoder.strategy: hetero_dp}",
         "encoder_strategy_needs_encoder", "encoder"},
        {"{ranks: 2, parallel.tp: 2, parallel.encoder.tp: 1}", "uniform_encoder_tp", "equal"},
        {"{ranks: 2, parallel.tp: 2, parallel.encoder.strategy: hetero_tp, "
         "parallel.encoder.tp: 2}", "hetero_tp_encoder_tp", "smaller"},
        {"{ranks: 2, parallel.tp: 2, parallel.encoder.strategy: hetero_dp, "
         "parallel.encoder.tp: 2}", "encoder_tp_one", "must be 1"},
        {"{ranks: 4, parallel.tp: 4, model.encoder.heads: 2, model.encoder.kv_heads: 2, "
         "model.encoder.head_dim: 64}", "encoder_heads_divisible_by_tp", "heads 2"},
        {"{ranks: 4, parallel.tp: 4, model.encoder.hidden: 192, model.encoder.heads: 12, "
         "model.encoder.head_dim: 16, model.encoder.kv_heads: 6}",
         "encoder_kv_heads_split_or_replicated", "kv_heads 6"},
        {"{ranks: 2, parallel.tp: 2, model.encoder.ffn: 255}", "encoder_ffn_divisible_by_tp",
         "255"},
        {"{ranks: 2, parallel.tp: 2, model.projector.hidden: 255}",
         "projector_hidden_divisible_by_tp", "255"},
        {"{ranks: 2, parallel.cp: 2, parallel.encoder.strategy: full_separation}",
         "full_separation_no_cp", "cp"},
        {"{parallel.encoder.offload: true}", "offload_needs_full_separation", "offload"},
        {"{train.micro_batch: 2, train.global_batch: 3}", "global_batch_divisible",
         "global_batch 3"},
        {"{ranks: 2, parallel.cp: 2, train.seq_len: 66}", "seq_len_divisible_by_cp", "66"},
        {"{ranks: 2, parallel.tp: 2, parallel.sp: true, train.seq_len: 65}",
         "seq_len_divisible_by_tp_for_sp", "65"},
        {"{model: TEXT, train.seq_len: 128}", "seq_len_within_max_positions", "128"},
        {"{device: cuda, precision.fp8: selective}", "fp8_policy_for_selective", "policy"},
        {"{data.kind: shards}", "shards_need_path", "path"},
        {"{data.images_min: 3, data.images_max: 2}", "images_min_at_most_max", "3"},
        {"{data.image_px_min: 64, data.image_px_max: 32}", "image_px_min_at_most_max", "64"},
        {"{train.lr: 1e-4, train.min_lr: 1e-3}", "min_lr_at_most_lr", "min_lr"},
        /* an inconsistent model shape is pruned too, with rule "shape" */
        {"{model.decoder.kv_heads: 3}", "shape", "kv_heads"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    /* one spec: a valid base point, then one include per case */
    char *text = malloc(16384);
    int len = snprintf(text, 16384, "name: rules\nbase: {model: %s, train: {seq_len: 64}}\n"
                       "include:\n  - {train.seed: 1}\n", g_vlm);
    for (int i = 0; i < n; i++) {
        char ov[512];
        const char *src = cases[i].overrides;
        /* MOE / TEXT stand for the preset paths */
        char *o = ov;
        while (*src) {
            if (strncmp(src, "MOE", 3) == 0) {
                o += sprintf(o, "%s", g_moe);
                src += 3;
            } else if (strncmp(src, "TEXT", 4) == 0) {
                o += sprintf(o, "%s", g_text);
                src += 4;
            } else {
                *o++ = *src++;
            }
        }
        *o = '\0';
        len += snprintf(text + len, 16384 - (size_t)len, "  - %s\n", ov);
    }
    spec *s = spt_parse_ok(text);
    seen_points *sp = calloc(1, sizeof *sp);
    plan_counts counts;
    hearth_err err = {{0}};
    if (plan_run(s, NULL, record, sp, &counts, &err))
        fail_msg("plan: %s", err.msg);
    assert_int_equal(sp->n, n + 1);
    assert_int_equal(sp->status[0], PLAN_KEPT);
    for (int i = 0; i < n; i++) {
        int k = i + 1;
        if (sp->status[k] != PLAN_PRUNED || strcmp(sp->rule[k], cases[i].rule) != 0 ||
            !strstr(sp->reason[k], cases[i].reason_part))
            fail_msg("%s: got %s rule '%s' reason '%s', want pruned by %s ('%s')",
                     cases[i].overrides, plan_status_name(sp->status[k]), sp->rule[k],
                     sp->reason[k], cases[i].rule, cases[i].reason_part);
        assert_string_equal(sp->hash[k], "");
    }
    assert_int_equal(counts.kept, 1);
    assert_int_equal(counts.pruned, n);
    assert_int_equal(counts.skipped, 0);
    free(sp);
    spec_free(s);
    free(text);
}

/* ---- fast resolution == run_config_parse ------------------------------------------- */

typedef struct {
    const char *key;
    const char *values[6];
} pool_key;

static const pool_key pool[] = {
    {"ranks", {"1", "2", "4", "8", NULL}},
    {"parallel.tp", {"1", "2", "4", NULL}},
    {"parallel.pp", {"1", "2", NULL}},
    {"parallel.vpp", {"1", "2", NULL}},
    {"parallel.cp", {"1", "2", NULL}},
    {"parallel.dp", {"auto", "1", "2", NULL}},
    {"parallel.sp", {"false", "true", NULL}},
    {"parallel.encoder.strategy", {"uniform", "hetero_tp", "hetero_dp", "full_separation", NULL}},
    {"parallel.encoder.tp", {"auto", "1", "2", NULL}},
    {"train.micro_batch", {"1", "2", NULL}},
    {"train.global_batch", {"auto", "4", "6", NULL}},
    {"train.lr", {"1e-3", "3e-4", "0.1", "7e-05", NULL}},
    {"train.min_lr", {"auto", "1e-5", NULL}},
    {"train.recompute", {"none", "full", "selective", NULL}},
    {"train.seed", {"1", "2", "123456789012", NULL}},
    {"device", {"cpu", "cuda", NULL}},
    {"comm", {"auto", "local", "nccl", NULL}},
    {"model", {"VLM", "MOE", "TEXT", NULL}},
    {"model.decoder.layers", {"2", "4", "6", NULL}},
    {"model.decoder.kv_heads", {"auto", "1", "2", "4", NULL}},
    {"model.decoder.recompute", {"auto", "none", "full", NULL}},
    {"model.encoder.freeze", {"false", "true", NULL}},
    {"model.decoder.bias", {"false", "true", NULL}},
    {"data.images_max", {"2", "3", NULL}},
};
#define NPOOL ((int)(sizeof pool / sizeof pool[0]))

static const char *preset_of(const char *v)
{
    if (strcmp(v, "VLM") == 0)
        return g_vlm;
    if (strcmp(v, "MOE") == 0)
        return g_moe;
    if (strcmp(v, "TEXT") == 0)
        return g_text;
    return v;
}

typedef struct {
    int n;
    int key[8];
    int val[8];
} rpoint;

typedef struct {
    const rpoint *pts;
    const char *base_text;
    int checked_ok, checked_rule, checked_shape;
} equiv_ctx;

static const char *rule_of(const char *msg, char *buf, size_t n)
{
    const char *r = strstr(msg, "rule ");
    if (!r)
        return NULL;
    r += 5;
    size_t len = strcspn(r, ":");
    snprintf(buf, n, "%.*s", (int)len, r);
    return buf;
}

static int check_equiv(void *ctx, const plan_point *p)
{
    equiv_ctx *x = ctx;
    const rpoint *rp = &x->pts[p->pt->include - 1];
    config_override ovr[10];
    int n = 0, cuda = 0;
    for (int i = 0; i < rp->n; i++) {
        const char *k = pool[rp->key[i]].key, *v = pool[rp->key[i]].values[rp->val[i]];
        ovr[n].key = k;
        ovr[n].value = strcmp(k, "model") == 0 ? preset_of(v) : v;
        n++;
    }
    /* on cuda the plan takes ranks from resources (nodes 1 x gpus_per_node 4) */
    for (int i = 0; i < rp->n; i++)
        if (strcmp(pool[rp->key[i]].key, "device") == 0 &&
            strcmp(pool[rp->key[i]].values[rp->val[i]], "cuda") == 0)
            cuda = 1;
    if (cuda) {
        /* ... and prunes a point that writes other ranks (rule ranks_match_gpus), unless
         * its model does not resolve at all (rule shape, checked below) */
        for (int i = 0; i < rp->n; i++)
            if (!(p->rule && strcmp(p->rule, "shape") == 0) &&
                strcmp(pool[rp->key[i]].key, "ranks") == 0 &&
                strcmp(pool[rp->key[i]].values[rp->val[i]], "4") != 0) {
                if (p->status != PLAN_PRUNED || strcmp(p->rule, "ranks_match_gpus") != 0)
                    fail_msg("point %d: cuda with ranks %s on 4 GPUs: plan says %s %s (seed %u)",
                             p->pt->include, pool[rp->key[i]].values[rp->val[i]],
                             plan_status_name(p->status), p->rule ? p->rule : "", g_seed);
                x->checked_rule++;
                return 0;
            }
        ovr[n].key = "ranks";
        ovr[n].value = "4";
        n++;
    }
    run_config want;
    hearth_err err = {{0}};
    int rc = run_config_parse(&want, "base.yaml", x->base_text, ovr, n, 0, &err);
    char rb[64];
    if (rc == 0) {
        if (p->status == PLAN_PRUNED)
            fail_msg("point %d: plan pruned (%s: %s), run_config_parse accepts (seed %u)",
                     p->pt->include, p->rule, p->reason, g_seed);
        char *a = run_config_canonical_json(&want, &err);
        char *b = run_config_canonical_json(p->config, &err);
        if (strcmp(a, b) != 0)
            fail_msg("point %d differs (seed %u):\nparse: %s\nplan:  %s", p->pt->include, g_seed,
                     a, b);
        char h[65];
        assert_int_equal(run_config_hash(&want, h, &err), 0);
        assert_string_equal(h, p->hash);
        free(a);
        free(b);
        x->checked_ok++;
    } else if (rule_of(err.msg, rb, sizeof rb)) {
        if (p->status != PLAN_PRUNED || strcmp(p->rule, rb) != 0)
            fail_msg("point %d: run_config_parse says '%s', plan says %s %s (seed %u)",
                     p->pt->include, err.msg, plan_status_name(p->status),
                     p->rule ? p->rule : "", g_seed);
        x->checked_rule++;
    } else {
        /* a shape error (or an override the preset cannot take) */
        if (p->status != PLAN_PRUNED || strcmp(p->rule, "shape") != 0)
            fail_msg("point %d: run_config_parse says '%s', plan says %s (seed %u)",
                     p->pt->include, err.msg, plan_status_name(p->status), g_seed);
        x->checked_shape++;
    }
    return 0;
}

static void test_resolution_matches_run_config_parse(void **state)
{
    (void)state;
    unsigned s = g_seed ^ 0xabcdef;
    enum { NPTS = 300 };
    rpoint *pts = calloc(NPTS, sizeof *pts);
    char *text = malloc(200000);
    char base_text[512];
    snprintf(base_text, sizeof base_text,
             "model: %s\ntrain: {seq_len: 64, steps: 3}\nparallel.encoder.balance: true\n",
             g_vlm);
    int len = snprintf(text, 200000, "name: eq\nresources: {nodes: 1, gpus_per_node: 4}\n"
                       "base:\n  model: %s\n  train: {seq_len: 64, steps: 3}\n"
                       "  parallel.encoder.balance: true\ninclude:\n", g_vlm);
    for (int i = 0; i < NPTS; i++) {
        rpoint *rp = &pts[i];
        int used[64] = {0};
        rp->n = (int)(rnd(&s) % 6) + 1;
        len += snprintf(text + len, 200000 - (size_t)len, "  - {");
        for (int k = 0; k < rp->n; k++) {
            int key;
            do
                key = (int)(rnd(&s) % NPOOL);
            while (used[key]);
            used[key] = 1;
            int nv = 0;
            while (pool[key].values[nv])
                nv++;
            rp->key[k] = key;
            rp->val[k] = (int)(rnd(&s) % (unsigned)nv);
            const char *v = pool[key].values[rp->val[k]];
            if (strcmp(pool[key].key, "model") == 0)
                v = preset_of(v);
            len += snprintf(text + len, 200000 - (size_t)len, "%s%s: %s", k ? ", " : "",
                            pool[key].key, v);
        }
        len += snprintf(text + len, 200000 - (size_t)len, "}\n");
    }
    spec *sp = spt_parse_ok(text);
    equiv_ctx x = { pts, base_text, 0, 0, 0 };
    plan_counts counts;
    hearth_err err = {{0}};
    if (plan_run(sp, NULL, check_equiv, &x, &counts, &err))
        fail_msg("plan: %s", err.msg);
    print_message("# %d equal configs, %d same rule, %d shape errors\n", x.checked_ok,
                  x.checked_rule, x.checked_shape);
    /* a fair test sees all three outcomes */
    assert_true(x.checked_ok > 10);
    assert_true(x.checked_rule > 10);
    assert_int_equal(x.checked_ok + x.checked_rule + x.checked_shape, NPTS);
    spec_free(sp);
    free(text);
    free(pts);
}

/* ---- where over resolved values --------------------------------------------------- */

static void test_where_sees_resolved_values(void **state)
{
    (void)state;
    char text[1024];
    /* heads (4, from the preset) and dp (auto = 8 / tp) are never swept */
    snprintf(text, sizeof text,
             "name: w\nbase: {model: %s, ranks: 8}\n"
             "matrix: {parallel.tp: [1, 2, 3, 4, 8]}\n"
             "where: model.decoder.heads %% parallel.tp == 0 and parallel.dp >= 2 and "
             "model == '%s' and parallel.encoder.strategy == 'uniform'\n", g_vlm, g_vlm);
    spec *s = spt_parse_ok(text);
    seen_points sp = {0};
    plan_counts c;
    hearth_err err = {{0}};
    if (plan_run(s, NULL, record, &sp, &c, &err))
        fail_msg("plan: %s", err.msg);
    /* tp 1 (dp 8), 2 (dp 4), 4 (dp 2); tp 3 breaks heads, tp 8 has dp 1 */
    assert_int_equal(c.points, 3);
    assert_int_equal(c.filtered, 2);
    assert_int_equal(c.kept, 3);
    spec_free(s);
}

/* ---- dedup ------------------------------------------------------------------------- */

typedef struct {
    char hash[8][65];
    int count[8];
    int n;
    int calls;
} fake_db;

static int fake_completed(void *ctx, const char *hash, int *count, hearth_err *err)
{
    (void)err;
    fake_db *db = ctx;
    db->calls++;
    *count = 0;
    for (int i = 0; i < db->n; i++)
        if (strcmp(db->hash[i], hash) == 0)
            *count = db->count[i];
    return 0;
}

static int fail_db(void *ctx, const char *hash, int *count, hearth_err *err)
{
    (void)ctx;
    (void)hash;
    (void)count;
    return herr_set(err, HERR_IO, "db: disk I/O error");
}

static void test_dedup_and_force(void **state)
{
    (void)state;
    unsigned s = g_seed ^ 0x1234;
    int repeat = (int)(rnd(&s) % 3) + 2;   /* 2..4 */
    char text[1024];
    snprintf(text, sizeof text,
             "name: d\nbase: {model: %s}\nrepeat: %d\n"
             "matrix: {train.seed: [1, 2, 3, 4], parallel.dp: [auto, 1]}\n"
             "include: [{train.seed: 2}]\n", g_vlm, repeat);
    spec *sp = spt_parse_ok(text);
    /* first plan: nothing completed; dp auto == dp 1 at ranks 1, so every second point is
     * a duplicate of the one before, and the include duplicates seed 2 */
    seen_points *a = calloc(1, sizeof *a);
    plan_counts c;
    hearth_err err = {{0}};
    fake_db db = {.n = 0};
    plan_opts opts = { .already_completed = fake_completed, .completed_ctx = &db };
    assert_int_equal(plan_run(sp, &opts, record, a, &c, &err), 0);
    assert_int_equal(c.points, 9);
    assert_int_equal(c.kept, 4);
    assert_int_equal(c.skipped, 5);
    assert_int_equal(c.runs, 4 * (uint64_t)repeat);
    for (int i = 0; i < 8; i += 2) {
        assert_int_equal(a->status[i], PLAN_KEPT);
        assert_int_equal(a->runs[i], repeat);
        assert_int_equal(a->status[i + 1], PLAN_SKIPPED);
        assert_string_equal(a->hash[i], a->hash[i + 1]);
        char want[64];
        snprintf(want, sizeof want, "same resolved config as point %d", i + 1);
        assert_string_equal(a->reason[i + 1], want);
    }
    assert_string_equal(a->reason[8], "same resolved config as point 3");
    assert_int_equal(db.calls, 4);   /* only first occurrences reach the DB */
    /* the DB now has seed 1 fully done, seed 2 partly, seed 3 over-done */
    int part = (int)(rnd(&s) % (unsigned)(repeat - 1)) + 1;   /* 1..repeat-1 */
    snprintf(db.hash[0], 65, "%s", a->hash[0]);
    db.count[0] = repeat;
    snprintf(db.hash[1], 65, "%s", a->hash[2]);
    db.count[1] = part;
    snprintf(db.hash[2], 65, "%s", a->hash[4]);
    db.count[2] = repeat + 3;
    db.n = 3;
    seen_points *b = calloc(1, sizeof *b);
    assert_int_equal(plan_run(sp, &opts, record, b, &c, &err), 0);
    assert_int_equal(b->status[0], PLAN_SKIPPED);
    char want[96];
    snprintf(want, sizeof want, "%d of %d runs already completed", repeat, repeat);
    assert_string_equal(b->reason[0], want);
    assert_int_equal(b->status[2], PLAN_KEPT);
    assert_int_equal(b->runs[2], repeat - part);
    assert_int_equal(b->status[4], PLAN_SKIPPED);
    assert_int_equal(b->status[6], PLAN_KEPT);
    assert_int_equal(b->runs[6], repeat);
    assert_int_equal(c.kept, 2);
    assert_int_equal(c.runs, (uint64_t)(repeat - part + repeat));
    /* --force: completed runs are ignored, duplicates inside the spec still are not rerun */
    opts.force = 1;
    db.calls = 0;
    memset(b, 0, sizeof *b);
    assert_int_equal(plan_run(sp, &opts, record, b, &c, &err), 0);
    assert_int_equal(db.calls, 0);
    assert_int_equal(c.kept, 4);
    assert_int_equal(c.runs, 4 * (uint64_t)repeat);
    /* a DB error stops the plan with its message */
    opts.force = 0;
    opts.already_completed = fail_db;
    assert_int_equal(plan_run(sp, &opts, NULL, NULL, &c, &err), HERR_IO);
    assert_string_equal(err.msg, "db: disk I/O error");
    free(a);
    free(b);
    spec_free(sp);
}

/* ---- cuda ranks, resources -------------------------------------------------------- */

typedef struct {
    int n;
    int ranks[8], dp[8];
    int64_t nodes[8];
} ranks_rec;

static int record_ranks(void *ctx, const plan_point *p)
{
    ranks_rec *r = ctx;
    if (r->n < 8) {
        r->ranks[r->n] = p->config->ranks;
        r->dp[r->n] = p->config->parallel.dp;
        r->nodes[r->n] = p->res.nodes;
    }
    r->n++;
    return 0;
}

static void test_cuda_ranks_from_resources(void **state)
{
    (void)state;
    unsigned s = g_seed ^ 0x77;
    int gpus = 1 << (rnd(&s) % 3);   /* 1, 2, 4 */
    char text[1024];
    snprintf(text, sizeof text,
             "name: c\nbase: {model: %s, device: cuda}\n"
             "resources: {gpus_per_node: %d, time: '10'}\n"
             "matrix: {resources.nodes: [1, 2, 4]}\n", g_vlm, gpus);
    spec *sp = spt_parse_ok(text);
    ranks_rec r = {0};
    plan_counts c;
    hearth_err err = {{0}};
    assert_int_equal(plan_run(sp, NULL, record_ranks, &r, &c, &err), 0);
    assert_int_equal(r.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r.nodes[i], 1 << i);
        assert_int_equal(r.ranks[i], (1 << i) * gpus);
        assert_int_equal(r.dp[i], (1 << i) * gpus);
    }
    spec_free(sp);
}

/* ---- resources.gpu_mem ------------------------------------------------------------- */

typedef struct {
    int n;
    plan_status status[16];
    char rule[16][64];
    char reason[16][1024];
    int tp[16], pp[16];
    int64_t peak[16];
} mem_rec;

static int record_mem(void *ctx, const plan_point *p)
{
    mem_rec *r = ctx;
    if (r->n < 16) {
        r->status[r->n] = p->status;
        snprintf(r->rule[r->n], sizeof r->rule[0], "%s", p->rule ? p->rule : "");
        snprintf(r->reason[r->n], sizeof r->reason[0], "%s", p->reason);
        r->tp[r->n] = p->config->parallel.tp;
        r->pp[r->n] = p->config->parallel.pp;
        mem_rank_plan pk;
        hearth_err err;
        r->peak[r->n] = p->status == PLAN_PRUNED && strcmp(r->rule[r->n], "fits_gpu_mem")
                            ? -1
                        : mem_plan_peak(p->config, &pk, &err) ? -2
                                                              : pk.total;
    }
    r->n++;
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A cuda sweep over tp x pp on 4 GPUs: with resources.gpu_mem between two of the
 * layouts' predicted peaks, exactly those above it are pruned by fits_gpu_mem (naming
 * the rank, its GiB and the limit) and the others kept, the largest per rank among the
 * pruned.  Device cpu runs are not judged by it. */
static void test_gpu_mem_prunes(void **state)
{
    (void)state;
    unsigned s = g_seed ^ 0x9e3;
    int seq = 256 << (rnd(&s) % 3), mb = 1 + (int)(rnd(&s) % 4);
    const char *model = rnd(&s) % 2 ? g_vlm : g_moe;
    char text[1024];
    const char *sweep = "matrix: {parallel.tp: [1, 2, 4], parallel.pp: [1, 2, 4]}\n";
    snprintf(text, sizeof text,
             "name: m\nbase: {model: %s, device: cuda, train: {seq_len: %d, micro_batch: %d, "
             "global_batch: %d}}\nresources: {gpus_per_node: 4, time: '10'}\n%s", model, seq,
             mb, 4 * mb, sweep);
    spec *sp = spt_parse_ok(text);
    mem_rec all = {0};
    plan_counts c;
    hearth_err err = {{0}};
    assert_int_equal(plan_run(sp, NULL, record_mem, &all, &c, &err), 0);
    spec_free(sp);
    assert_int_equal(all.n, 9);
    int64_t sorted[9];
    int nk = 0, big = -1;
    for (int i = 0; i < 9; i++) {
        if (all.status[i] != PLAN_KEPT)
            continue;
        assert_true(all.peak[i] > 0);
        sorted[nk++] = all.peak[i];
        if (big < 0 || all.peak[i] > all.peak[big])
            big = i;
    }
    assert_true(nk >= 3);
    qsort(sorted, (size_t)nk, sizeof sorted[0], cmp_i64);
    /* a limit between two distinct peaks, chosen at random */
    int cut = 1 + (int)(rnd(&s) % (unsigned)(nk - 1));
    while (cut < nk && sorted[cut] == sorted[cut - 1])
        cut++;
    if (cut == nk)
        cut = 1;
    assert_true(sorted[cut] > sorted[cut - 1]);
    double gib = ((double)sorted[cut - 1] + (double)sorted[cut]) / 2 / (double)(1 << 30);

    snprintf(text, sizeof text,
             "name: m\nbase: {model: %s, device: cuda, train: {seq_len: %d, micro_batch: %d, "
             "global_batch: %d}}\nresources: {gpus_per_node: 4, time: '10', gpu_mem: %.17g}\n"
             "%s", model, seq, mb, 4 * mb, gib, sweep);
    sp = spt_parse_ok(text);
    assert_true(sp->resources.gpu_mem == gib);
    mem_rec lim = {0};
    assert_int_equal(plan_run(sp, NULL, record_mem, &lim, &c, &err), 0);
    spec_free(sp);
    assert_int_equal(lim.n, 9);
    int pruned = 0, kept = 0;
    for (int i = 0; i < 9; i++) {
        if (all.status[i] != PLAN_KEPT) {
            assert_int_equal(lim.status[i], all.status[i]);   /* other rules as before */
            continue;
        }
        double need = (double)all.peak[i] / (double)(1 << 30);
        if (all.peak[i] > gib * (double)(1 << 30)) {
            if (lim.status[i] != PLAN_PRUNED || strcmp(lim.rule[i], "fits_gpu_mem"))
                fail_msg("tp %d pp %d needs %.6f GiB > %.6f but was not pruned (%s)",
                         all.tp[i], all.pp[i], need, gib, lim.rule[i]);
            char want[64];
            snprintf(want, sizeof want, "needs %.2f GiB", need);
            assert_non_null(strstr(lim.reason[i], "rank "));
            assert_non_null(strstr(lim.reason[i], want));
            assert_non_null(strstr(lim.reason[i], "resources.gpu_mem"));
            pruned++;
        } else {
            if (lim.status[i] != PLAN_KEPT)
                fail_msg("tp %d pp %d needs %.6f GiB <= %.6f but was %s: %s", all.tp[i],
                         all.pp[i], need, gib, lim.rule[i], lim.reason[i]);
            kept++;
        }
    }
    assert_int_equal(pruned, nk - cut);
    assert_int_equal(kept, cut);
    assert_int_equal(lim.status[big], PLAN_PRUNED);

    /* device cpu: the limit does not apply */
    snprintf(text, sizeof text,
             "name: m\nbase: {model: %s, ranks: 4, train: {seq_len: %d, micro_batch: %d, "
             "global_batch: %d}}\nresources: {time: '10', gpu_mem: %.17g}\n%s", model, seq,
             mb, 4 * mb, gib, sweep);
    sp = spt_parse_ok(text);
    mem_rec cpu = {0};
    assert_int_equal(plan_run(sp, NULL, record_mem, &cpu, &c, &err), 0);
    spec_free(sp);
    for (int i = 0; i < cpu.n && i < 16; i++)
        assert_string_not_equal(cpu.rule[i], "fits_gpu_mem");
}

/* ---- output formats ---------------------------------------------------------------- */

static void test_formats(void **state)
{
    (void)state;
    char text[2048];
    snprintf(text, sizeof text,
             "name: fmt\nbase: {model: %s, ranks: 3}\nrepeat: 2\nresources: {partition: gpu}\n"
             "matrix: {parallel.tp: [1, 3], train.lr: [1e-3, 0.5]}\n"
             "include: [{data.path: \"$(touch /tmp/pwned); `id` ' \\\" ; DROP TABLE runs\", "
             "train.seed: 7}, {train.lr: 0.001, parallel.tp: 1}]\n", g_vlm);
    spec *sp = spt_parse_ok(text);
    plan_result r;
    hearth_err err = {{0}};
    assert_int_equal(plan_collect(sp, NULL, &r, &err), 0);
    assert_int_equal(r.counts.points, 6);
    assert_int_equal(r.counts.kept, 3);
    assert_int_equal(r.counts.pruned, 2);
    assert_int_equal(r.counts.skipped, 1);
    assert_int_equal(r.counts.runs, 6);

    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    assert_int_equal(plan_format_json(&r, f), 0);
    fclose(f);
    json_error_t jerr;
    json_t *root = json_loads(buf, 0, &jerr);
    if (!root)
        fail_msg("bad JSON (%s):\n%s", jerr.text, buf);
    assert_string_equal(json_string_value(json_object_get(root, "experiment")), "fmt");
    json_t *counts = json_object_get(root, "counts");
    assert_int_equal(json_integer_value(json_object_get(counts, "kept")), 3);
    assert_int_equal(json_integer_value(json_object_get(counts, "runs")), 6);
    json_t *kept = json_object_get(root, "kept"), *pruned = json_object_get(root, "pruned"),
           *skipped = json_object_get(root, "skipped");
    assert_int_equal(json_array_size(kept), 3);
    assert_int_equal(json_array_size(pruned), 2);
    assert_int_equal(json_array_size(skipped), 1);
    for (size_t i = 0; i < 2; i++) {
        json_t *p = json_array_get(pruned, i);
        assert_string_equal(json_string_value(json_object_get(p, "rule")),
                            "heads_divisible_by_tp");
        assert_non_null(strstr(json_string_value(json_object_get(p, "reason")), "tp 3"));
        assert_int_equal(json_integer_value(json_object_get(json_object_get(p, "overrides"),
                                                            "parallel.tp")), 3);
    }
    json_t *k0 = json_array_get(kept, 0);
    assert_int_equal(json_integer_value(json_object_get(k0, "index")), 1);
    assert_int_equal(strlen(json_string_value(json_object_get(k0, "hash"))), 64);
    assert_true(json_real_value(json_object_get(json_object_get(k0, "overrides"), "train.lr")) ==
                1e-3);
    assert_string_equal(json_string_value(json_object_get(json_object_get(k0, "resources"),
                                                          "partition")), "gpu");
    /* the injection-looking value is one string, byte for byte */
    json_t *k2 = json_array_get(kept, 2);
    assert_string_equal(json_string_value(json_object_get(json_object_get(k2, "overrides"),
                                                          "data.path")),
                        "$(touch /tmp/pwned); `id` ' \" ; DROP TABLE runs");
    json_t *s0 = json_array_get(skipped, 0);
    assert_string_equal(json_string_value(json_object_get(s0, "reason")),
                        "same resolved config as point 1");
    json_decref(root);
    free(buf);

    buf = NULL;
    f = open_memstream(&buf, &size);
    assert_int_equal(plan_format_table(&r, f), 0);
    fclose(f);
    assert_non_null(strstr(buf, "experiment fmt: 6 points: 3 kept (6 runs), 2 pruned, 1 skipped"));
    assert_non_null(strstr(buf, "heads_divisible_by_tp"));
    assert_non_null(strstr(buf, "same resolved config as point 1"));
    assert_non_null(strstr(buf, "train.lr"));
    free(buf);
    plan_result_free(&r);
    spec_free(sp);
}

/* A spec whose base or preset cannot be read fails the plan with the place. */
static void test_plan_errors(void **state)
{
    (void)state;
    hearth_err err = {{0}};
    spec *sp = spt_parse_ok("name: e\nbase: {model: /nonexistent/x.yaml}\n");
    assert_int_equal(plan_run(sp, NULL, NULL, NULL, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "t.yaml:2:15: model"));
    spec_free(sp);
    char text[512];
    snprintf(text, sizeof text, "name: e\nbase: {model: %s}\nmatrix:\n  model: [%s, nope/x.yaml]\n",
             g_vlm, g_vlm);
    sp = spt_parse_ok(text);
    assert_int_equal(plan_run(sp, NULL, NULL, NULL, NULL, &err), HERR_CONFIG);
    char want[64];
    snprintf(want, sizeof want, "t.yaml:4:%d: model", (int)(13 + strlen(g_vlm)));
    if (!strstr(err.msg, want))
        fail_msg("got '%s', want '%s'", err.msg, want);
    spec_free(sp);
    sp = spt_parse_ok("name: e\nbase: {train: {stepz: 1}}\n");
    assert_int_equal(plan_run(sp, NULL, NULL, NULL, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "t.yaml:2:16: train.stepz: unknown key"));
    spec_free(sp);
    /* no model in the base: every point must name one */
    snprintf(text, sizeof text, "name: e\nbase: {train: {steps: 1}}\n"
             "include: [{model: %s}, {train.steps: 2}]\n", g_vlm);
    sp = spt_parse_ok(text);
    plan_counts c;
    assert_int_equal(plan_run(sp, NULL, NULL, NULL, &c, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "t.yaml: model: required: name a preset in base (model: NAME) "
                                 "or in every point (point 2 names none)");
    assert_int_equal(c.kept, 1);
    spec_free(sp);
}

int main(void)
{
    g_seed = tu_seed_noted();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_rule_prunes),
        cmocka_unit_test(test_resolution_matches_run_config_parse),
        cmocka_unit_test(test_where_sees_resolved_values),
        cmocka_unit_test(test_dedup_and_force),
        cmocka_unit_test(test_cuda_ranks_from_resources),
        cmocka_unit_test(test_gpu_mem_prunes),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_plan_errors),
    };
    return cmocka_run_group_tests_name("orch_plan", tests, setup, teardown);
}
