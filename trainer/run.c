#include "run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_policy.h"
#include "outputs.h"
#include "runlog.h"
#include "summary.h"
#include "train.h"
#include "version.h"

static int config_exit(int rc)
{
    return rc == HERR_NOMEM || rc == HERR_RUNTIME ? RUN_EXIT_FAILED : RUN_EXIT_USAGE;
}

/* Things this build cannot run yet, checked before anything is written. */
static int check_supported(const run_config *c, hearth_err *err)
{
    if (c->device == DEVICE_CUDA)
        return herr_set(err, HERR_CONFIG, "device: cuda is not supported by this build yet");
    if (c->precision.compute != COMPUTE_FP32)
        return herr_set(err, HERR_CONFIG, "precision.compute: bf16 is not supported on device "
                        "cpu (the CPU path is fp32)");
    if (c->data.kind != DATA_SYNTHETIC)
        return herr_set(err, HERR_CONFIG, "data.kind: shards is not supported by this build "
                        "yet (use synthetic)");
    return 0;
}

/* Loads and checks the config and creates the trainer; on error only the log is
 * written.  Returns 0 or an exit status. */
static int setup(const cli_args *a, runlog *log, run_config *cfg, trainer **tr)
{
    hearth_err err = { { 0 } };
    int rc = run_config_load(cfg, a->config, a->ovr, a->n_ovr, 0, &err);
    if (!rc)
        rc = check_supported(cfg, &err);
    if (!rc)
        rc = trainer_create(tr, cfg, &err);   /* installs the FP8 plan (fp8_policy.h) */
    if (!rc && cfg->precision.fp8 == FP8_ALL)
        runlog_printf(log, "precision.fp8: all is emulated on device cpu (E4M3/E5M2 "
                      "quantise-dequantise around fp32 GEMMs)");
    else if (!rc && cfg->precision.fp8 == FP8_SELECTIVE)
        runlog_printf(log, "precision.fp8: selective is emulated on device cpu (E4M3/E5M2 "
                      "quantise-dequantise around fp32 GEMMs; rules from %s)",
                      cfg->precision.fp8_policy);
    if (rc) {
        runlog_printf(log, "hearth-train: %s", err.msg);
        return config_exit(rc);
    }
    return 0;
}

static void log_step(runlog *log, const train_step_stats *st, int steps)
{
    runlog_printf(log, "step %d/%d loss %.9g lr %.6g grad_norm %.6g ms %.1f "
                  "(encoder %.1f decoder %.1f) tokens %ld",
                  st->step, steps, st->loss, st->lr, st->grad_norm, st->step_ms,
                  st->encoder_ms, st->decoder_ms, st->tokens);
}

static int finish(runlog *log, const char *dir, const run_config *cfg, const char *hash,
                  const run_summary *sum, const char *status)
{
    hearth_err err = { { 0 } };
    run_result r;
    memset(&r, 0, sizeof r);
    memcpy(r.config_hash, hash, sizeof r.config_hash);
    summary_compute(sum, &r.num);
    r.device_count = 1;
    r.nodes = 1;
    r.tokens_per_s_per_gpu = r.num.tokens_per_s / r.device_count;
    r.mfu = NAN;                          /* no known peak on CPU */
    r.peak_mem_bytes = outputs_peak_mem_bytes();
    r.exit_status = status;
    r.device = cfg->device == DEVICE_CUDA ? "cuda" : "cpu";
    if (result_write(dir, &r, &err)) {
        runlog_printf(log, "hearth-train: %s", err.msg);
        return -1;
    }
    runlog_printf(log, "%s: %d steps, final loss %.9g, median step %.1f ms, %.1f tokens/s",
                  status, r.num.steps, r.num.final_loss, r.num.step_ms_median,
                  r.num.tokens_per_s);
    return 0;
}

static int train_loop(runlog *log, const char *dir, const run_config *cfg, trainer *tr,
                      const char *hash)
{
    hearth_err err = { { 0 } };
    metrics_file mf = { 0 };
    run_summary sum;
    shape_flops fl;
    shape_count_flops(&cfg->model, cfg->train.seq_len, &fl);
    summary_init(&sum, cfg->train.measure_from, &fl);
    const char *status = "done";
    int exit_code = RUN_EXIT_DONE;
    if (metrics_open(&mf, dir, &err)) {
        runlog_printf(log, "hearth-train: %s", err.msg);
        status = "failed";
        exit_code = RUN_EXIT_FAILED;
    }
    for (int s = 1; exit_code == RUN_EXIT_DONE && s <= cfg->train.steps; s++) {
        train_step_stats st;
        int rc = trainer_step(tr, &st, &err);
        if (rc < 0) {
            runlog_printf(log, "hearth-train: step %d: %s", s, err.msg);
            status = "failed";
            exit_code = RUN_EXIT_FAILED;
            break;
        }
        long long peak = outputs_peak_mem_bytes();
        if (summary_add(&sum, &st, &err) || metrics_append(&mf, &st, peak, &err)) {
            runlog_printf(log, "hearth-train: step %d: %s", s, err.msg);
            status = "failed";
            exit_code = RUN_EXIT_FAILED;
            break;
        }
        log_step(log, &st, cfg->train.steps);
        if (rc == TRAIN_DIVERGED) {
            runlog_printf(log, "hearth-train: step %d: diverged (loss %g, grad_norm %g); "
                          "stopping", s, st.loss, st.grad_norm);
            status = "diverged";
            exit_code = RUN_EXIT_DIVERGED;
        }
    }
    metrics_close(&mf);
    if (finish(log, dir, cfg, hash, &sum, status) && exit_code == RUN_EXIT_DONE)
        exit_code = RUN_EXIT_FAILED;
    summary_free(&sum);
    return exit_code;
}

int run_main(const cli_args *a)
{
    hearth_err err = { { 0 } };
    if (outputs_mkdir_p(a->out_dir, &err)) {
        fprintf(stderr, "hearth-train: %s\n", err.msg);
        return RUN_EXIT_FAILED;
    }
    runlog log;
    if (runlog_open(&log, a->out_dir, &err)) {
        fprintf(stderr, "hearth-train: %s\n", err.msg);
        return RUN_EXIT_FAILED;
    }
    runlog_printf(&log, "%s: config %s, %d override(s), out %s", version_line(),
                  a->config ? a->config : "(none)", a->n_ovr, a->out_dir);

    run_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) {
        runlog_printf(&log, "hearth-train: out of memory");
        runlog_close(&log);
        return RUN_EXIT_FAILED;
    }
    trainer *tr = NULL;
    int code = setup(a, &log, cfg, &tr);
    char hash[65] = { 0 };
    char *json = NULL;
    if (!code) {
        json = run_config_canonical_json(cfg, &err);
        if (!json || run_config_hash(cfg, hash, &err) ||
            outputs_write_atomic(a->out_dir, "config.json", json, &err)) {
            runlog_printf(&log, "hearth-train: %s", err.msg);
            code = RUN_EXIT_FAILED;
        }
    }
    if (!code) {
        shape_params sp;
        shape_count_params(&cfg->model, &sp);
        runlog_printf(&log, "model %s: %lld parameters; %d rank(s): tp %d pp %d vpp %d dp %d "
                      "ep %d sp %d, encoder %s tp %d; %d steps of %d x %d "
                      "tokens (micro batch %d), lr %g (min %g, warmup %d), seed %llu; "
                      "config %s",
                      cfg->model.name, (long long)sp.total, cfg->ranks, cfg->parallel.tp,
                      cfg->parallel.pp, cfg->parallel.vpp, cfg->parallel.dp, cfg->parallel.ep,
                      cfg->parallel.sp, encoder_strategy_name(cfg->parallel.encoder.strategy),
                      cfg->parallel.encoder.tp,
                      cfg->train.steps, cfg->train.global_batch, cfg->train.seq_len,
                      cfg->train.micro_batch, cfg->train.lr, cfg->train.min_lr,
                      cfg->train.warmup, (unsigned long long)cfg->train.seed, hash);
        if (cfg->train.checkpoint_every > 0)
            runlog_printf(&log, "note: train.checkpoint_every: checkpoints are not written by "
                          "this build yet; ignored");
        code = train_loop(&log, a->out_dir, cfg, tr, hash);
    }
    free(json);
    trainer_free(tr);
    free(cfg);
    runlog_close(&log);
    return code;
}
