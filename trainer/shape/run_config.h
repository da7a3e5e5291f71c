/* run_config.h - the run config (DESIGN.md "Run config"): parsing, defaults, overrides,
 * validity rules, the resolved canonical JSON and its sha256 config hash.
 *
 * Part of the pure model-shape/layout rules module: hearth-train reads a config with it
 * and the orchestrator uses the same functions to validate, resolve and hash points. */
#ifndef HEARTH_RUN_CONFIG_H
#define HEARTH_RUN_CONFIG_H

#include "shape/err.h"
#include "shape/model_shape.h"

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } device_kind;
typedef enum { COMM_LOCAL = 0, COMM_NCCL = 1 } comm_kind;
/* The most ranks comm local runs as threads of one process (rule local_ranks_max). */
#define RUN_LOCAL_RANKS_MAX 1024
typedef enum {
    ENC_UNIFORM = 0, ENC_HETERO_TP = 1, ENC_HETERO_DP = 2, ENC_FULL_SEPARATION = 3
} encoder_strategy;
typedef enum { COMPUTE_FP32 = 0, COMPUTE_BF16 = 1 } compute_kind;
typedef enum { FP8_OFF = 0, FP8_ALL = 1, FP8_SELECTIVE = 2 } fp8_kind;
typedef enum { DATA_SYNTHETIC = 0, DATA_SHARDS = 1 } data_kind;

typedef struct {
    char model_preset[256];   /* the preset name or path as given */
    model_shape model;        /* preset with overrides applied */

    device_kind device;
    comm_kind comm;
    int ranks;

    struct {
        int tp, cp, pp, vpp, dp, ep, sp;
        int chunks;             /* sequence chunks per micro batch (docs/parallel/chunks.md) */
        struct {
            encoder_strategy strategy;
            int tp;
            int offload;
            int balance;
        } encoder;
        int distributed_optimizer;
        int a2a_overlap;
    } parallel;

    struct {
        compute_kind compute;
        fp8_kind fp8;
        char fp8_policy[256];
    } precision;

    struct {
        int steps;
        uint64_t seed;
        int seq_len;
        int micro_batch;
        int global_batch;
        double lr, min_lr;
        int warmup;
        double weight_decay;
        double grad_clip;
        int checkpoint_every;
        recompute_kind recompute;
        int measure_from;
    } train;

    struct {
        data_kind kind;
        int images_min, images_max;
        int image_px_min, image_px_max;
        char path[256];
        int balance;
    } data;
} run_config;

/* An override from the command line (--set KEY=VALUE) or an experiment-matrix point.
 * The value is YAML text: a scalar, or a flow sequence "[16,24,24]" (a flow mapping
 * works for a section key: model.decoder="{layers: 2}").  value == NULL means `key` is
 * the raw "KEY=VALUE" argument, split at the first '=' by the loader (so hearth-train
 * can pass argv as is; a missing '=' is reported as "--set ARG: expected KEY=VALUE"). */
typedef struct {
    const char *key;
    const char *value;
} config_override;

/* Reads FILE, applies overrides in order, fills defaults, loads the preset, applies the
 * `model.*` overrides and checks every validity rule.  Any unknown key, wrong type,
 * impossible shape, missing preset or bad override fails with HERR_CONFIG and a message
 * "FILE:LINE:COL: key: ..." (or "--set KEY: ...").  `file` may be NULL: then only the
 * overrides are used (they must then name the model).
 * `single_rank_only`: reject every parallel value other than one rank, with a message
 * saying that parallel layouts are not supported by this trainer yet. */
int run_config_load(run_config *out, const char *file, const config_override *ovr, int n_ovr,
                    int single_rank_only, hearth_err *err);

/* Same, from YAML text in memory; `name` is used as FILE in messages. */
int run_config_parse(run_config *out, const char *name, const char *yaml_text,
                     const config_override *ovr, int n_ovr, int single_rank_only,
                     hearth_err *err);

/* The layout validity rules (DESIGN.md and the orchestrator's `plan`), each with a name
 * (listed in docs/config.md).  Returns 0 when the config is valid, else HERR_CONFIG with
 * "rule NAME: message".  run_config_load/parse check them too and then prefix the place
 * that set the most relevant key: "run.yaml:3:7: parallel.tp: rule NAME: message". */
int run_config_check_rules(const run_config *c, hearth_err *err);

/* The resolved config as canonical JSON: every key present, defaults applied, `auto`
 * resolved, the preset inlined; keys sorted, compact, numbers in shortest round-trip form.
 * Returns a malloc'd string the caller frees, or NULL with err set. */
char *run_config_canonical_json(const run_config *c, hearth_err *err);

/* sha256 of the canonical JSON, as 64 lowercase hex characters plus NUL. */
int run_config_hash(const run_config *c, char out_hex[65], hearth_err *err);

const char *encoder_strategy_name(encoder_strategy s);

#endif
