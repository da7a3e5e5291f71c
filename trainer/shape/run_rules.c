/* run_rules.c - the named layout validity rules of a resolved run config
 * (run_config_check_rules).  The orchestrator's `plan` and hearth-train both call these,
 * so a layout is judged the same way everywhere.  docs/config.md lists the rules. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "shape/run_config.h"
#include "shape/shape_internal.h"

/* Fills *iss: `keys` is a space-separated list of dotted keys. */
static int fail(rule_issue *iss, const char *name, const char *keys, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(rule_issue *iss, const char *name, const char *keys, const char *fmt, ...)
{
    memset(iss, 0, sizeof *iss);
    iss->name = name;
    int k = 0;
    const char *p = keys;
    while (*p && k < 5) {
        size_t len = strcspn(p, " ");
        if (len < sizeof iss->keys[k])
            memcpy(iss->keys[k++], p, len);
        p += len;
        while (*p == ' ')
            p++;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(iss->msg, sizeof iss->msg, fmt, ap);
    va_end(ap);
    return 1;
}

/* A head count splits over tp when tp divides it, or is replicated when it divides tp. */
static int split_or_replicated(int kv, int tp)
{
    return kv > 0 && (kv % tp == 0 || tp % kv == 0);
}

int run_rules_check(const run_config *c, rule_issue *iss)
{
    const model_shape *m = &c->model;
    const stack_shape *ds = &m->decoder.s, *es = &m->encoder.s;
    const decoder_shape *d = &m->decoder;
    int tp = c->parallel.tp, cp = c->parallel.cp, pp = c->parallel.pp, vpp = c->parallel.vpp;
    int dp = c->parallel.dp, ep = c->parallel.ep, etp = c->parallel.encoder.tp;
    encoder_strategy strat = c->parallel.encoder.strategy;
    long mp = (long)tp * cp * pp;

    if (tp < 1 || cp < 1 || pp < 1 || vpp < 1 || ep < 1 || etp < 1 || c->ranks < 1)
        return fail(iss, "sizes_positive", "parallel.tp parallel.cp parallel.pp parallel.vpp",
                    "every parallel size must be >= 1");
    if (dp < 1)
        return fail(iss, "ranks_match_layout", "ranks parallel.tp parallel.cp parallel.pp",
                    "ranks %d is not a multiple of tp x cp x pp = %ld, so dp cannot be derived",
                    c->ranks, mp);
    if (mp * dp != c->ranks)
        return fail(iss, "ranks_match_layout",
                    "ranks parallel.dp parallel.tp parallel.cp parallel.pp",
                    "ranks %d must equal tp %d x cp %d x pp %d x dp %d = %ld", c->ranks, tp, cp,
                    pp, dp, mp * dp);
    if (c->comm == COMM_NCCL && c->device != DEVICE_CUDA)
        return fail(iss, "nccl_needs_cuda", "comm device",
                    "comm nccl needs device cuda (use comm local on cpu)");
    /* comm local runs every rank as a thread of one process: refused here, before any
     * thread starts, rather than after thousands of them */
    if (c->comm == COMM_LOCAL && c->ranks > RUN_LOCAL_RANKS_MAX)
        return fail(iss, "local_ranks_max", "ranks comm",
                    "ranks %d with comm local: at most %d thread ranks in one process (use "
                    "comm nccl, one process per GPU, for more)", c->ranks,
                    RUN_LOCAL_RANKS_MAX);
    if (c->parallel.sp && tp < 2)
        return fail(iss, "sp_needs_tp", "parallel.sp parallel.tp",
                    "sequence parallelism needs tp > 1");
    if (vpp > 1 && pp < 2)
        return fail(iss, "vpp_needs_pp", "parallel.vpp parallel.pp",
                    "virtual pipeline stages (vpp %d) need pp > 1", vpp);
    if (ds->layers % (pp * vpp))
        return fail(iss, "layers_divisible_by_pp_vpp",
                    "parallel.pp parallel.vpp model.decoder.layers",
                    "decoder layers %d must be divisible by pp %d x vpp %d", ds->layers, pp, vpp);
    if (ds->heads % tp)
        return fail(iss, "heads_divisible_by_tp", "parallel.tp model.decoder.heads",
                    "decoder heads %d must be divisible by tp %d", ds->heads, tp);
    if (!split_or_replicated(ds->kv_heads, tp))
        return fail(iss, "kv_heads_split_or_replicated", "parallel.tp model.decoder.kv_heads",
                    "decoder kv_heads %d must be divisible by tp %d, or divide it", ds->kv_heads,
                    tp);
    int moe = d->moe_experts > 0;
    int dense = !moe || d->moe_every > 1;
    if (dense && ds->ffn % tp)
        return fail(iss, "ffn_divisible_by_tp", "parallel.tp model.decoder.ffn",
                    "decoder ffn %d must be divisible by tp %d", ds->ffn, tp);
    if (moe && d->moe_ffn % tp)
        return fail(iss, "ffn_divisible_by_tp", "parallel.tp model.decoder.moe.ffn",
                    "decoder moe.ffn %d must be divisible by tp %d", d->moe_ffn, tp);
    if (moe && d->moe_shared_ffn % tp)
        return fail(iss, "ffn_divisible_by_tp", "parallel.tp model.decoder.moe.shared_ffn",
                    "decoder moe.shared_ffn %d must be divisible by tp %d", d->moe_shared_ffn, tp);
    if (ep > 1 && !moe)
        return fail(iss, "ep_needs_moe", "parallel.ep model.decoder.moe.experts",
                    "expert parallelism (ep %d) needs a MoE decoder", ep);
    if (dp % ep)
        return fail(iss, "ep_divides_dp", "parallel.ep parallel.dp ranks",
                    "ep %d must divide dp %d (experts are sharded over ranks of dp)", ep, dp);
    if (moe && d->moe_experts % ep)
        return fail(iss, "experts_divisible_by_ep", "parallel.ep model.decoder.moe.experts",
                    "moe.experts %d must be divisible by ep %d", d->moe_experts, ep);

    if (strat != ENC_UNIFORM && !m->encoder.present)
        return fail(iss, "encoder_strategy_needs_encoder", "parallel.encoder.strategy model.preset",
                    "strategy %s needs a model with an encoder", encoder_strategy_name(strat));
    if (strat == ENC_UNIFORM && etp != tp)
        return fail(iss, "uniform_encoder_tp",
                    "parallel.encoder.tp parallel.tp parallel.encoder.strategy",
                    "uniform: the encoder shares the decoder's tp group, so encoder tp %d must "
                    "equal tp %d", etp, tp);
    if (strat == ENC_HETERO_TP && !(etp < tp && tp % etp == 0))
        return fail(iss, "hetero_tp_encoder_tp",
                    "parallel.encoder.tp parallel.tp parallel.encoder.strategy",
                    "hetero_tp: encoder tp %d must be smaller than tp %d and divide it", etp, tp);
    if ((strat == ENC_HETERO_DP || strat == ENC_FULL_SEPARATION) && etp != 1)
        return fail(iss, "encoder_tp_one", "parallel.encoder.tp parallel.encoder.strategy",
                    "%s: encoder tp must be 1, got %d", encoder_strategy_name(strat), etp);
    if (m->encoder.present) {
        if (es->heads % etp)
            return fail(iss, "encoder_heads_divisible_by_tp",
                        "parallel.encoder.tp parallel.tp model.encoder.heads",
                        "encoder heads %d must be divisible by encoder tp %d", es->heads, etp);
        if (!split_or_replicated(es->kv_heads, etp))
            return fail(iss, "encoder_kv_heads_split_or_replicated",
                        "parallel.encoder.tp parallel.tp model.encoder.kv_heads",
                        "encoder kv_heads %d must be divisible by encoder tp %d, or divide it",
                        es->kv_heads, etp);
        if (es->ffn % etp)
            return fail(iss, "encoder_ffn_divisible_by_tp",
                        "parallel.encoder.tp parallel.tp model.encoder.ffn",
                        "encoder ffn %d must be divisible by encoder tp %d", es->ffn, etp);
        if (m->projector.hidden % etp)
            return fail(iss, "projector_hidden_divisible_by_tp",
                        "parallel.encoder.tp parallel.tp model.projector.hidden",
                        "projector hidden %d must be divisible by encoder tp %d",
                        m->projector.hidden, etp);
    }
    if (strat == ENC_FULL_SEPARATION && cp > 1)
        return fail(iss, "full_separation_no_cp", "parallel.cp parallel.encoder.strategy",
                    "full_separation needs cp = 1, got cp %d", cp);
    if (c->parallel.encoder.offload && strat != ENC_FULL_SEPARATION)
        return fail(iss, "offload_needs_full_separation",
                    "parallel.encoder.offload parallel.encoder.strategy",
                    "encoder offload needs strategy full_separation, got %s",
                    encoder_strategy_name(strat));

    long mb = (long)c->train.micro_batch * dp;
    if (c->train.global_batch % mb)
        return fail(iss, "global_batch_divisible",
                    "train.global_batch train.micro_batch parallel.dp ranks",
                    "global_batch %d must be a multiple of micro_batch %d x dp %d = %ld",
                    c->train.global_batch, c->train.micro_batch, dp, mb);
    /* Causal load balancing cuts a sequence into 2*cp chunks (rank r holds r and
     * 2*cp-1-r), so every rank gets equal attention work. */
    if (cp > 1 && c->train.seq_len % (2 * cp))
        return fail(iss, "seq_len_divisible_by_cp", "train.seq_len parallel.cp",
                    "seq_len %d must be divisible by 2 x cp = %d", c->train.seq_len, 2 * cp);
    if (c->parallel.sp && c->train.seq_len % (tp * cp))
        return fail(iss, "seq_len_divisible_by_tp_for_sp",
                    "train.seq_len parallel.tp parallel.sp",
                    "sequence parallelism needs seq_len %d divisible by tp x cp = %d",
                    c->train.seq_len, tp * cp);
    /* Sequence chunks (docs/parallel/chunks.md): seq_len / chunks tokens per chunk and
     * sequence; under sp a chunk's tokens are split over tp. */
    int K = c->parallel.chunks;   /* 0 (a config built by hand) counts as 1 */
    if (K > 1 && c->train.seq_len % K)
        return fail(iss, "seq_len_divisible_by_chunks", "train.seq_len parallel.chunks",
                    "seq_len %d must be divisible by chunks %d", c->train.seq_len, K);
    if (K > 1 && c->parallel.sp && (c->train.seq_len / K) % tp)
        return fail(iss, "chunk_divisible_by_tp_for_sp",
                    "train.seq_len parallel.chunks parallel.tp parallel.sp",
                    "sequence parallelism needs seq_len / chunks = %d divisible by tp %d",
                    c->train.seq_len / K, tp);
    if (K > 1 && cp > 1)
        return fail(iss, "chunks_no_cp", "parallel.chunks parallel.cp",
                    "sequence chunks (%d) do not combine with context parallelism (cp %d)", K,
                    cp);
    /* The aux loss is a nonlinear function of whole-micro-batch routing statistics: per
     * chunk it would be another loss. */
    if (K > 1 && moe && d->moe_aux_coef > 0)
        return fail(iss, "chunks_no_moe_aux", "parallel.chunks model.decoder.moe.aux_coef",
                    "sequence chunks (%d) need the MoE aux loss off (aux_coef %g): its "
                    "statistics are over the whole micro batch", K, d->moe_aux_coef);
    if (ds->pos == POS_LEARNED && c->train.seq_len > d->max_positions)
        return fail(iss, "seq_len_within_max_positions",
                    "train.seq_len model.decoder.max_positions",
                    "seq_len %d exceeds the learned position table (max_positions %d)",
                    c->train.seq_len, d->max_positions);
    if (c->precision.fp8 == FP8_SELECTIVE && !c->precision.fp8_policy[0])
        return fail(iss, "fp8_policy_for_selective", "precision.fp8_policy precision.fp8",
                    "fp8 selective needs precision.fp8_policy (the policy file)");
    if (c->data.kind == DATA_SHARDS && !c->data.path[0])
        return fail(iss, "shards_need_path", "data.path data.kind",
                    "data kind shards needs data.path");
    if (c->data.images_min > c->data.images_max)
        return fail(iss, "images_min_at_most_max", "data.images_min data.images_max",
                    "images_min %d must be <= images_max %d", c->data.images_min,
                    c->data.images_max);
    if (c->data.image_px_min > c->data.image_px_max)
        return fail(iss, "image_px_min_at_most_max", "data.image_px_min data.image_px_max",
                    "image_px_min %d must be <= image_px_max %d", c->data.image_px_min,
                    c->data.image_px_max);
    if (c->train.min_lr > c->train.lr)
        return fail(iss, "min_lr_at_most_lr", "train.min_lr train.lr",
                    "min_lr %g must be <= lr %g", c->train.min_lr, c->train.lr);
    return 0;
}

int run_config_check_rules(const run_config *c, hearth_err *err)
{
    rule_issue iss;
    if (!run_rules_check(c, &iss))
        return 0;
    return herr_set(err, HERR_CONFIG, "rule %s: %s", iss.name, iss.msg);
}

const char *encoder_strategy_name(encoder_strategy s)
{
    switch (s) {
    case ENC_UNIFORM: return "uniform";
    case ENC_HETERO_TP: return "hetero_tp";
    case ENC_HETERO_DP: return "hetero_dp";
    case ENC_FULL_SEPARATION: return "full_separation";
    }
    return "?";
}
