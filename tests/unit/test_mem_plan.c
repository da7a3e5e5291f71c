/* test_mem_plan.c - the memory plan (trainer/shape/mem_plan.h) against what the CPU
 * trainer allocates.
 *
 * Random layouts of tiny-vlm / tiny-vlm-moe (tp, pp, vpp, dp, ep, sp, encoder strategy,
 * offload, balance, distributed optimizer, a2a overlap, recompute, sequence chunks,
 * freezing, micro batch and batch size) run one step on their ranks as threads
 * (ptrain_create on the local communicator, as hearth-train does); each rank's
 * allocations are then read back and compared with mem_plan_rank for that rank:
 *   exact   parameters and gradients (model_param_count of every chunk), the optimizer
 *           state (param_sync_state_at: AdamW m and v), the optimizer's flat buckets and
 *           gradient-sum buffers (param_sync_internal.h), the number of decoder
 *           activation slots (clones) the pipeline made, the key/value caches of
 *           sequence chunks (model_chunk_cache_bytes);
 *   arenas  the block activation arenas of every decoder slot and encoder slot
 *           (model_stack_activation_bytes): exact when every sequence has the same images
 *           and the ViT balance is off (then the patches each encode sees are known);
 *           with random image counts and sizes the plan is the upper bound its header
 *           promises (measured <= predicted) and the decoder part stays exact;
 *   encoder slots  <= the plan (== with fixed images and no balance).
 * Not observed here: the decoder stage's own buffers (ids, positions, head chunk), the
 * MoE exchange buffers under ep (grown to data-dependent received rows), the embeddings
 * and input copies of ptrain: the model keeps no size of them that an accessor could
 * return, and they are small next to the arenas for these shapes (docs/memory.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model.h"
#include "parallel/param_sync_internal.h"
#include "parallel/ptrain_internal.h"
#include "shape/mem_plan.h"
#include "support/ranks.h"
#include "support/runcfg.h"
#include "support/testutil.h"

#define CASES 6
#define MAX_WORLD 8

typedef struct {
    int64_t params, opt, flat, sums, arena, dec_arena, cache;
    int slots, enc_slots;
} measured;

typedef struct {
    run_config cfg;
    measured m[RANKS_MAX];
} run_ctx;

static int rank_fn(void *vctx, int rank, comm *world, hearth_err *err)
{
    run_ctx *ctx = vctx;
    ptrain *t;
    int rc = ptrain_create(&t, &ctx->cfg, world, err);
    if (rc) {
        ptrain_free(t);
        return rc;
    }
    train_step_stats st;
    if ((rc = ptrain_step(t, &st, err)) < 0) {
        ptrain_free(t);
        return rc;
    }
    measured *m = &ctx->m[rank];
    memset(m, 0, sizeof *m);
    for (int v = 0; v < t->vpp; v++) {
        m->params += (int64_t)model_param_count(t->chunk[v]);
        m->cache += (int64_t)model_chunk_cache_bytes(t->chunk[v]);
        m->slots += t->n_slots[v];
        for (int i = 0; i < t->n_slots[v]; i++)
            m->dec_arena += (int64_t)model_stack_activation_bytes(t->slots[v][i].m);
    }
    m->arena = m->dec_arena;
    for (int i = 0; i < t->n_enc_pool; i++)
        m->arena += (int64_t)model_stack_activation_bytes(t->enc_pool[i]);
    m->enc_slots = t->n_enc_pool;
    for (int i = 0; i < param_sync_state_count(t->sync); i++) {
        const char *name;
        size_t n;
        param_sync_state_at(t->sync, i, &name, &n);
        m->opt += (int64_t)n;
    }
    /* param_sync.c make_buckets: size x chunk floats each for g and p under ZeRO-1,
     * else the bucket's total */
    for (int k = 0; k < PS_REP_KINDS; k++) {
        const ps_bucket *b = &t->sync->rep[k];
        m->flat += (int64_t)(t->sync->opts.distributed_optimizer ? (size_t)b->size * b->chunk
                                                                 : b->total);
    }
    for (int k = 0; k < PS_SUM_KINDS; k++)
        if (t->sync->sum[k].n)
            m->sums += (int64_t)t->sync->sum[k].total;
    ptrain_free(t);
    return 0;
}

static const char *base_yaml =
    "train:\n"
    "  steps: 1\n"
    "  seq_len: 64\n"
    "  seed: 3\n";

/* A random layout; returns 0 when the rules accept it.  *exact: images are fixed and
 * the balance is off, so the encoder arenas are known exactly. */
static int random_layout(tu_rng *r, run_config *c, int *exact, char desc[512])
{
    static char kv[28][64];
    int n = 0;
#define KV(...) snprintf(kv[n++], sizeof kv[0], __VA_ARGS__)
    int moe = tu_next(r) % 2;
    int tp = 1 << (tu_next(r) % 3), pp = 1 + tu_next(r) % 2, dp = 1 + tu_next(r) % 2;
    int vpp = pp == 2 ? 1 + tu_next(r) % 2 : 1;
    if (tp * pp * dp > MAX_WORLD)
        return -1;
    int ep = moe ? 1 + tu_next(r) % dp : 1, mb = 1 + tu_next(r) % 2;
    int mlocal = 1 + tu_next(r) % 4;
    static const char *const strat[] = { "uniform", "hetero_tp", "hetero_dp",
                                         "full_separation" };
    static const char *const rec[] = { "none", "selective", "full" };
    int s = (int)(tu_next(r) % 4);
    int etp = s == 0 ? tp : s == 1 && tp == 4 ? 1 + (int)(tu_next(r) % 2) : 1;
    int fixed = tu_next(r) % 2, balance = tu_next(r) % 3 == 0;
    KV("model=%s", moe ? "tiny-vlm-moe" : "tiny-vlm");
    KV("ranks=%d", tp * pp * dp);
    KV("parallel.tp=%d", tp);
    KV("parallel.pp=%d", pp);
    KV("parallel.vpp=%d", vpp);
    KV("parallel.dp=%d", dp);
    KV("parallel.ep=%d", ep);
    KV("parallel.sp=%s", tp > 1 && tu_next(r) % 2 ? "true" : "false");
    KV("parallel.encoder.strategy=%s", strat[s]);
    KV("parallel.encoder.tp=%d", etp);
    KV("parallel.encoder.offload=%s", s == 3 && tu_next(r) % 2 ? "true" : "false");
    KV("parallel.encoder.balance=%s", balance ? "true" : "false");
    KV("parallel.distributed_optimizer=%s", tu_next(r) % 2 ? "true" : "false");
    KV("parallel.a2a_overlap=%s", moe && tu_next(r) % 2 ? "true" : "false");
    KV("train.recompute=%s", rec[tu_next(r) % 3]);
    /* sequence chunks (seq_len 64; a chunk's tokens split over tp under sp); MoE only
     * without its aux loss (rule chunks_no_moe_aux) */
    int chunks = tu_next(r) % 2 ? 1 << (tu_next(r) % 3) : 1;
    KV("parallel.chunks=%d", chunks);
    if (moe && chunks > 1)
        KV("model.decoder.moe.aux_coef=0");
    KV("train.micro_batch=%d", mb);
    KV("train.global_batch=%d", mb * dp * mlocal);
    KV("model.encoder.freeze=%s", tu_next(r) % 3 == 0 ? "true" : "false");
    KV("model.decoder.freeze=%s", tu_next(r) % 6 == 0 ? "true" : "false");
    if (fixed) {
        int imgs = 1 + tu_next(r) % 2, px = tu_next(r) % 2 ? 16 : 32;
        KV("data.images_min=%d", imgs);
        KV("data.images_max=%d", imgs);
        KV("data.image_px_min=%d", px);
        KV("data.image_px_max=%d", px);
    } else {
        KV("data.images_min=%d", (int)(tu_next(r) % 2));
        KV("data.images_max=3");
        KV("data.image_px_min=16");
        KV("data.image_px_max=40");
    }
#undef KV
    *exact = fixed && !balance;
    desc[0] = 0;
    for (int i = 0; i < n; i++) {
        strncat(desc, kv[i], 511 - strlen(desc));
        strncat(desc, " ", 511 - strlen(desc));
    }
    const char *ptrs[28];
    for (int i = 0; i < n; i++)
        ptrs[i] = kv[i];
    runcfg_list l;
    runcfg_init(&l);
    runcfg_add_kv(&l, ptrs, n);
    hearth_err err;
    return runcfg_parse(c, base_yaml, &l, 0, &err) ? -1 : 0;
}

static void check_case(run_ctx *ctx, int exact, const char *desc)
{
    const run_config *c = &ctx->cfg;
    int n = c->ranks, rc[RANKS_MAX];
    hearth_err errs[RANKS_MAX], err;
    print_message("# layout: %s\n", desc);
    assert_int_equal(ranks_run(n, 60000, rank_fn, ctx, rc, errs, &err), 0);
    for (int r = 0; r < n; r++) {
        if (rc[r])
            fail_msg("rank %d: %s (%s)", r, errs[r].msg, desc);
    }
    for (int r = 0; r < n; r++) {
        mem_rank_plan p;
        if (mem_plan_rank(c, r, &p, &err))
            fail_msg("mem_plan_rank %d: %s", r, err.msg);
        const measured *m = &ctx->m[r];
        if (p.params != m->params || p.bytes[MEM_PARAMS] != 4 * m->params ||
            p.bytes[MEM_GRADS] != 4 * m->params)
            fail_msg("rank %d params: plan %lld, trainer %lld (%s)", r, (long long)p.params,
                     (long long)m->params, desc);
        if (p.bytes[MEM_OPTIMIZER] != 4 * m->opt)
            fail_msg("rank %d optimizer: plan %lld B, trainer %lld floats (%s)", r,
                     (long long)p.bytes[MEM_OPTIMIZER], (long long)m->opt, desc);
        if (p.bytes[MEM_OPT_BUFFERS] != 4 * (2 * m->flat + m->sums))
            fail_msg("rank %d opt_buffers: plan %lld B, trainer flat %lld sums %lld (%s)", r,
                     (long long)p.bytes[MEM_OPT_BUFFERS], (long long)m->flat,
                     (long long)m->sums, desc);
        if (4 * p.chunk_cache_floats != m->cache)
            fail_msg("rank %d chunk key/value cache: plan %lld B, trainer %lld B (%s)", r,
                     (long long)(4 * p.chunk_cache_floats), (long long)m->cache, desc);
        if (p.slots != m->slots)
            fail_msg("rank %d activation slots: plan %d, trainer %d (%s)", r, p.slots,
                     m->slots, desc);
        int64_t arena = 4 * p.stack_arena_floats;
        if (exact ? arena != m->arena || p.enc_slots != m->enc_slots
                  : arena < m->arena || p.enc_slots < m->enc_slots)
            fail_msg("rank %d arenas: plan %lld B in %d encoder slots, trainer %lld B "
                     "(decoder %lld) in %d (%s: %s)", r, (long long)arena, p.enc_slots,
                     (long long)m->arena, (long long)m->dec_arena, m->enc_slots,
                     exact ? "exact" : "bound", desc);
        if (p.total < p.bytes[MEM_PARAMS] + p.bytes[MEM_ACTIVATIONS])
            fail_msg("rank %d: total %lld below its parts", r, (long long)p.total);
    }
}

static void test_random_layouts(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    int done = 0;
    for (int tries = 0; done < CASES && tries < 400; tries++) {
        run_ctx *ctx = calloc(1, sizeof *ctx);
        assert_non_null(ctx);
        int exact;
        char desc[512];
        if (random_layout(&r, &ctx->cfg, &exact, desc) == 0) {
            check_case(ctx, exact, desc);
            done++;
        }
        free(ctx);
    }
    assert_int_equal(done, CASES);
}

/* A decoder with learned positions (GPT-2's kind: attention reads q, k, v in place from
 * the qkv rows, block.c qkv_in_place), shrunk, with and without recomputation, tp and a
 * pipeline: the arenas exact. */
static void test_learned_positions(void **state)
{
    (void)state;
    static const char *const layouts[][4] = {
        { "ranks=1", "train.recompute=none", "parallel.tp=1", "parallel.pp=1" },
        { "ranks=1", "train.recompute=full", "parallel.tp=1", "parallel.pp=1" },
        { "ranks=2", "train.recompute=selective", "parallel.tp=2", "parallel.pp=1" },
        { "ranks=2", "train.recompute=none", "parallel.tp=1", "parallel.pp=2" },
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        const char *kv[] = { "model=gpt2-124m", "model.decoder.layers=2",
                             "model.decoder.hidden=64", "model.decoder.heads=4",
                             "model.decoder.kv_heads=4", "model.decoder.head_dim=16",
                             "model.decoder.ffn=128", "model.decoder.vocab=128",
                             "train.global_batch=2", "train.micro_batch=1", layouts[i][0],
                             layouts[i][1], layouts[i][2], layouts[i][3] };
        run_ctx *ctx = calloc(1, sizeof *ctx);
        assert_non_null(ctx);
        runcfg_list l;
        runcfg_init(&l);
        runcfg_add_kv(&l, kv, (int)(sizeof kv / sizeof kv[0]));
        hearth_err err;
        if (runcfg_parse(&ctx->cfg, base_yaml, &l, 0, &err))
            fail_msg("layout %zu: %s", i, err.msg);
        char desc[256];
        snprintf(desc, sizeof desc, "gpt2 shrunk: %s %s %s %s", layouts[i][0], layouts[i][1],
                 layouts[i][2], layouts[i][3]);
        check_case(ctx, 1, desc);
        free(ctx);
    }
}

/* The shapes of the plan itself: 1F1B holds min(pp - p, M) micro batches on stage p, the
 * peak is the largest stage, ZeRO-1 divides the optimizer state, recompute shrinks the
 * arenas, cuda halves weights and activations. */
static void test_plan_properties(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    int pp = 2 + tu_next(&r) % 3, M = 1 + tu_next(&r) % 8;
    char kv[8][64];
    snprintf(kv[0], sizeof kv[0], "ranks=%d", 2 * pp);
    snprintf(kv[1], sizeof kv[1], "parallel.pp=%d", pp);
    snprintf(kv[2], sizeof kv[2], "parallel.dp=2");
    snprintf(kv[3], sizeof kv[3], "train.global_batch=%d", 2 * M);
    snprintf(kv[4], sizeof kv[4], "model=tiny-vlm");
    snprintf(kv[5], sizeof kv[5], "model.decoder.layers=%d", 4 * pp);
    const char *ptrs[8] = { kv[0], kv[1], kv[2], kv[3], kv[4], kv[5] };
    run_config c, z, f, g;
    hearth_err err;
    runcfg_list l;
    runcfg_init(&l);
    runcfg_add_kv(&l, ptrs, 6);
    assert_int_equal(runcfg_parse(&c, base_yaml, &l, 0, &err), 0);
    for (int p = 0; p < pp; p++) {
        mem_rank_plan s;
        assert_int_equal(mem_plan_stage(&c, p, &s, &err), 0);
        int want = pp - p < M ? pp - p : M;
        assert_int_equal(s.slots, want);
        assert_int_equal(s.p, p);
    }
    mem_rank_plan peak, a, b;
    assert_int_equal(mem_plan_peak(&c, &peak, &err), 0);
    for (int p = 0; p < pp; p++) {
        assert_int_equal(mem_plan_stage(&c, p, &a, &err), 0);
        assert_true(a.total <= peak.total);
    }
    z = c;
    z.parallel.distributed_optimizer = 1;
    assert_int_equal(mem_plan_rank(&c, 0, &a, &err), 0);
    assert_int_equal(mem_plan_rank(&z, 0, &b, &err), 0);
    assert_true(b.bytes[MEM_OPTIMIZER] * 2 >= a.bytes[MEM_OPTIMIZER]);
    assert_true(b.bytes[MEM_OPTIMIZER] < a.bytes[MEM_OPTIMIZER]);
    f = c;
    f.model.decoder.s.recompute = RECOMPUTE_FULL;
    assert_int_equal(mem_plan_rank(&f, 0, &b, &err), 0);
    assert_true(b.bytes[MEM_ACTIVATIONS] < a.bytes[MEM_ACTIVATIONS]);
    g = c;
    g.device = DEVICE_CUDA;
    assert_int_equal(mem_plan_rank(&g, 0, &b, &err), 0);
    assert_int_equal(b.bytes[MEM_PARAMS] * 2, a.bytes[MEM_PARAMS]);
    assert_int_equal(b.bytes[MEM_ACTIVATIONS] * 2, a.bytes[MEM_ACTIVATIONS]);
    assert_int_equal(b.bytes[MEM_OPTIMIZER] * 2, a.bytes[MEM_OPTIMIZER] * 3);
    assert_int_not_equal(mem_plan_rank(&c, c.ranks, &b, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_layouts),
        cmocka_unit_test(test_learned_positions),
        cmocka_unit_test(test_plan_properties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
