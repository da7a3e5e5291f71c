/* config_fields.c - the keys of a run config other than `model` (fields.h).
 * Defaults and ranges here are the ones docs/config.md lists. */
#include <stddef.h>

#include "shape/fields.h"
#include "shape/run_config.h"

static const char *const device_names[] = { "cpu", "cuda", NULL };
static const char *const comm_names[] = { "local", "nccl", NULL };
static const char *const strategy_names[] = { "uniform", "hetero_tp", "hetero_dp",
                                              "full_separation", NULL };
static const char *const compute_names[] = { "fp32", "bf16", NULL };
static const char *const fp8_names[] = { "off", "all", "selective", NULL };
static const char *const recompute_names[] = { "none", "selective", "full", NULL };
static const char *const data_names[] = { "synthetic", "shards", NULL };

#define OFF(m) offsetof(run_config, m)
#define SZ(m) sizeof(((run_config *)0)->m)
#define MANY 1e9      /* "no real upper bound" for counts */

#define INT_ROW(K, M, LO, HI, DEF, DOC)                                                     \
    { .key = K, .type = FT_INT, .off = OFF(M), .min = LO, .max = HI, .def = DEF, .doc = DOC }
#define AUTO_INT_ROW(K, M, LO, HI, DOC)                                                     \
    { .key = K, .type = FT_INT, .off = OFF(M), .min = LO, .max = HI, .def = "auto",        \
      .flags = FIELD_AUTO, .doc = DOC }
#define BOOL_ROW(K, M, DOC) { .key = K, .type = FT_BOOL, .off = OFF(M), .def = "false", .doc = DOC }
#define ENUM_ROW(K, M, NAMES, DEF, DOC)                                                     \
    { .key = K, .type = FT_ENUM, .off = OFF(M), .names = NAMES, .def = DEF, .doc = DOC }
#define NUM_ROW(K, M, LO, HI, DEF, DOC)                                                     \
    { .key = K, .type = FT_DOUBLE, .off = OFF(M), .min = LO, .max = HI, .def = DEF, .doc = DOC }

static const field_desc rows[] = {
    ENUM_ROW("device", device, device_names, "cpu", "where the ranks compute"),
    { .key = "comm", .type = FT_ENUM, .off = OFF(comm), .names = comm_names, .def = "auto",
      .flags = FIELD_AUTO, .doc = "communicator; auto = local on cpu, nccl on cuda" },
    INT_ROW("ranks", ranks, 1, 1048576, "1", "number of ranks"),

    INT_ROW("parallel.tp", parallel.tp, 1, 4096, "1", "decoder tensor parallel size"),
    INT_ROW("parallel.cp", parallel.cp, 1, 4096, "1", "context parallel size"),
    INT_ROW("parallel.chunks", parallel.chunks, 1, 4096, "1",
            "sequence chunks per micro batch, run through the decoder one after the other"),
    INT_ROW("parallel.pp", parallel.pp, 1, 4096, "1", "pipeline parallel size"),
    INT_ROW("parallel.vpp", parallel.vpp, 1, 4096, "1", "virtual pipeline stages per pp rank"),
    AUTO_INT_ROW("parallel.dp", parallel.dp, 1, 1048576,
                 "data parallel size; auto = ranks / (tp * cp * pp)"),
    INT_ROW("parallel.ep", parallel.ep, 1, 4096, "1", "expert parallel size (carved out of dp)"),
    BOOL_ROW("parallel.sp", parallel.sp, "sequence parallelism inside the tp group"),
    ENUM_ROW("parallel.encoder.strategy", parallel.encoder.strategy, strategy_names, "uniform",
             "how the encoder is laid out"),
    AUTO_INT_ROW("parallel.encoder.tp", parallel.encoder.tp, 1, 4096,
                 "encoder tp; auto = tp (uniform), largest divisor of tp below tp (hetero_tp), "
                 "1 (hetero_dp, full_separation)"),
    BOOL_ROW("parallel.encoder.offload", parallel.encoder.offload,
             "full_separation: keep embeddings in pinned host memory"),
    BOOL_ROW("parallel.encoder.balance", parallel.encoder.balance,
             "rebalance images over the encoding ranks by estimated cost"),
    BOOL_ROW("parallel.distributed_optimizer", parallel.distributed_optimizer,
             "shard optimizer state over dp"),
    BOOL_ROW("parallel.a2a_overlap", parallel.a2a_overlap,
             "overlap MoE all-to-all with computation"),

    { .key = "precision.compute", .type = FT_ENUM, .off = OFF(precision.compute),
      .names = compute_names, .def = "auto", .flags = FIELD_AUTO,
      .doc = "matmul/attention precision; auto = fp32 on cpu, bf16 on cuda" },
    ENUM_ROW("precision.fp8", precision.fp8, fp8_names, "off", "FP8 linears"),
    { .key = "precision.fp8_policy", .type = FT_STR, .off = OFF(precision.fp8_policy),
      .size = SZ(precision.fp8_policy), .def = "", .doc = "selective: the policy file" },

    INT_ROW("train.steps", train.steps, 1, MANY, "10", "optimizer steps"),
    { .key = "train.seed", .type = FT_I64, .off = OFF(train.seed), .min = 0, .max = 9.3e18,
      .def = "1", .doc = "seed of parameters and data (0 .. 2^63-1)" },
    INT_ROW("train.seq_len", train.seq_len, 1, 16777216, "256", "tokens per sequence"),
    INT_ROW("train.micro_batch", train.micro_batch, 1, 1048576, "1",
            "sequences per micro batch per dp rank"),
    AUTO_INT_ROW("train.global_batch", train.global_batch, 1, MANY,
                 "sequences per step; auto = micro_batch * dp"),
    NUM_ROW("train.lr", train.lr, 0, 1e3, "3e-4", "peak learning rate"),
    { .key = "train.min_lr", .type = FT_DOUBLE, .off = OFF(train.min_lr), .min = 0, .max = 1e3,
      .def = "auto", .flags = FIELD_AUTO, .doc = "final learning rate (cosine); auto = lr / 10" },
    INT_ROW("train.warmup", train.warmup, 0, MANY, "0", "linear warm-up steps"),
    NUM_ROW("train.weight_decay", train.weight_decay, 0, 1e3, "0.1", "AdamW weight decay"),
    NUM_ROW("train.grad_clip", train.grad_clip, 0, 1e15, "1.0",
            "global gradient-norm clip; 0 = off"),
    INT_ROW("train.checkpoint_every", train.checkpoint_every, 0, MANY, "0",
            "steps between checkpoints; 0 = only when preempted"),
    ENUM_ROW("train.recompute", train.recompute, recompute_names, "none",
             "activation recomputation (default of model.*.recompute)"),
    INT_ROW("train.measure_from", train.measure_from, 1, MANY, "2",
            "first step (from 1) counted in throughput"),

    ENUM_ROW("data.kind", data.kind, data_names, "synthetic", "data source"),
    INT_ROW("data.images_min", data.images_min, 0, 65536, "1", "images per sequence, at least"),
    INT_ROW("data.images_max", data.images_max, 0, 65536, "2", "images per sequence, at most"),
    INT_ROW("data.image_px_min", data.image_px_min, 1, 65536, "32", "image side in pixels, at least"),
    INT_ROW("data.image_px_max", data.image_px_max, 1, 65536, "64", "image side in pixels, at most"),
    { .key = "data.path", .type = FT_STR, .off = OFF(data.path), .size = SZ(data.path),
      .def = "", .doc = "shards: the data directory" },
    BOOL_ROW("data.balance", data.balance, "balance micro batches over dp ranks by estimated cost"),
};

const field_desc *config_fields(int *n)
{
    *n = (int)(sizeof rows / sizeof rows[0]);
    return rows;
}
