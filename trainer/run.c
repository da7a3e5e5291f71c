#include "run.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "fp8_policy.h"
#include "outputs.h"
#include "runlog.h"
#include "summary.h"
#include "train.h"
#include "version.h"

/* Set by SIGTERM / SIGUSR2 (preemption notice), SIGINT (Ctrl-C) or SIGHUP (the terminal
 * went away): the training loop writes a checkpoint at the next step boundary and the run
 * exits RUN_EXIT_PREEMPTED.  The handler only sets this flag, so a second signal while the
 * checkpoint is written changes nothing.  SIGINT and SIGHUP stay ignored where the parent
 * ignores them (nohup; a shell's background jobs). */
static volatile sig_atomic_t preempt_signal;

static void on_preempt(int sig)
{
    preempt_signal = sig;
}

typedef struct {
    struct sigaction term, usr2, intr, hup;
} saved_handlers;

static void preempt_install(saved_handlers *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_preempt;
    sa.sa_flags = SA_RESTART;     /* file writes and waits go on undisturbed */
    sigemptyset(&sa.sa_mask);
    preempt_signal = 0;
    sigaction(SIGTERM, &sa, &old->term);
    sigaction(SIGUSR2, &sa, &old->usr2);
    /* SIGINT and SIGHUP only where they are not ignored */
    sigaction(SIGINT, NULL, &old->intr);
    sigaction(SIGHUP, NULL, &old->hup);
    if (old->intr.sa_handler != SIG_IGN)
        sigaction(SIGINT, &sa, NULL);
    if (old->hup.sa_handler != SIG_IGN)
        sigaction(SIGHUP, &sa, NULL);
}

static void preempt_restore(const saved_handlers *old)
{
    sigaction(SIGTERM, &old->term, NULL);
    sigaction(SIGUSR2, &old->usr2, NULL);
    sigaction(SIGINT, &old->intr, NULL);
    sigaction(SIGHUP, &old->hup, NULL);
}

static int config_exit(int rc)
{
    return rc == HERR_NOMEM || rc == HERR_RUNTIME ? RUN_EXIT_FAILED : RUN_EXIT_USAGE;
}

/* Things this build cannot run yet, checked before anything is written. */
static int check_supported(const run_config *c, hearth_err *err)
{
    if (c->device == DEVICE_CUDA && c->ranks > 1)
        return herr_set(err, HERR_CONFIG, "device: cuda runs one rank so far (ranks: %d); "
                        "multi-rank layouts run on device cpu", c->ranks);
    if (c->device != DEVICE_CUDA && c->precision.compute != COMPUTE_FP32)
        return herr_set(err, HERR_CONFIG, "precision.compute: bf16 is not supported on device "
                        "cpu (the CPU path is fp32)");
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
    if (!rc && cfg->device == DEVICE_CUDA)
        runlog_printf(log, "device cuda: %s, precision.compute %s (activations stored in fp32)",
                      trainer_device_name(*tr),
                      cfg->precision.compute == COMPUTE_BF16 ? "bf16: GEMMs and attention on "
                      "bf16 tensor cores, fp32 accumulation" : "fp32");
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

/* The peak memory of the run so far: the device's where it has its own, else RSS. */
static long long peak_mem(const trainer *tr)
{
    long long bytes;
    return trainer_device_peak(tr, &bytes) ? bytes : outputs_peak_mem_bytes();
}

static int finish(runlog *log, const char *dir, const run_config *cfg, const trainer *tr,
                  const char *hash, const run_summary *sum, const char *status)
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
    r.peak_mem_bytes = peak_mem(tr);
    r.exit_status = status;
    r.device = cfg->device == DEVICE_CUDA ? "cuda" : "cpu";
    /* The plan of a config that trained is always computable; should it fail anyway,
     * result.json says "memory": null rather than losing the run's other figures. */
    run_memory mem;
    long long dev_peak;
    if (plan_memory_result(&mem, cfg, &err) == 0) {
        r.memory = &mem;
        if (trainer_device_peak(tr, &dev_peak)) {
            mem.measured_bytes = dev_peak;
            mem.measured_source = "the peak of device memory the run allocated (parameters, "
                                  "gradients, AdamW moments, activations; not the CUDA "
                                  "context or library workspaces)";
        }
    }
    else
        runlog_printf(log, "hearth-train: memory plan: %s", err.msg);
    if (result_write(dir, &r, &err)) {
        runlog_printf(log, "hearth-train: %s", err.msg);
        return -1;
    }
    runlog_printf(log, "%s: %d steps, final loss %.9g, median step %.1f ms, %.1f tokens/s",
                  status, r.num.steps, r.num.final_loss, r.num.step_ms_median,
                  r.num.tokens_per_s);
    return 0;
}

/* --init-from DIR: reads and classifies DIR/config.json into *src (a config error is
 * exit 2); keys hearth does not know are named in the log. */
static int hf_source(runlog *log, const char *dir, hf_config **src)
{
    hearth_err err = { { 0 } };
    int rc = hf_config_load(src, dir, &err);
    if (rc) {
        runlog_printf(log, "hearth-train: --init-from: %s", err.msg);
        return config_exit(rc);
    }
    if ((*src)->unknown)
        runlog_printf(log, "hearth-train: --init-from: warning: %s: keys hearth does not know "
                      "were ignored (docs/hf.md, \"config.json keys\"): %s", (*src)->file,
                      (*src)->unknown);
    return 0;
}

/* --init-from: the Hugging Face checkpoint's parameters replace the initial ones.  A
 * config that does not match the run's model is a config error (exit 2). */
static int init_from_hf(runlog *log, const char *dir, const hf_config *src,
                        const run_config *cfg, trainer *tr)
{
    hearth_err err = { { 0 } };
    int rc = trainer_init_from_hf(tr, &cfg->model, src, dir, &err);
    if (rc) {
        runlog_printf(log, "hearth-train: --init-from: %s", err.msg);
        return config_exit(rc);
    }
    runlog_printf(log, "initialised from the Hugging Face checkpoint %s", dir);
    return 0;
}

/* --export-hf after a completed run; src (may be NULL): the config.json of --init-from,
 * written back as read. */
static int export_hf(runlog *log, const cli_args *a, const hf_config *src,
                     const run_config *cfg, trainer *tr)
{
    hearth_err err = { { 0 } };
    st_dtype dt = a->export_dtype && !strcmp(a->export_dtype, "bf16") ? ST_BF16 : ST_F32;
    if (trainer_export_hf(tr, &cfg->model, src, a->export_hf, dt, &err)) {
        runlog_printf(log, "hearth-train: --export-hf: %s", err.msg);
        return RUN_EXIT_FAILED;
    }
    runlog_printf(log, "exported the parameters (%s) to %s", dt == ST_BF16 ? "bf16" : "f32",
                  a->export_hf);
    return 0;
}

/* Loads the checkpoint that --resume names into tr and sum; *start = its step.  0 or an
 * exit status. */
static int resume(runlog *log, const char *path, const run_config *cfg, trainer *tr,
                  run_summary *sum, int *start)
{
    hearth_err err = { { 0 } };
    char dir[4400];
    int rc = ckpt_resolve(path, dir, sizeof dir, &err);
    if (!rc)
        rc = ckpt_read(dir, tr, cfg, sum, start, &err);
    if (rc) {
        runlog_printf(log, "hearth-train: --resume: %s", err.msg);
        return rc == HERR_CONFIG ? RUN_EXIT_USAGE : RUN_EXIT_FAILED;
    }
    runlog_printf(log, "resumed from %s: step %d of %d", dir, *start, cfg->train.steps);
    return 0;
}

/* Writes the checkpoint after the steps done; 0 or -1 (logged). */
static int checkpoint(runlog *log, const char *dir, const run_config *cfg, trainer *tr,
                      const char *hash, const run_summary *sum)
{
    hearth_err err = { { 0 } };
    char where[4400];
    if (ckpt_write(dir, tr, cfg, hash, sum, NULL, where, sizeof where, &err)) {
        runlog_printf(log, "hearth-train: %s", err.msg);
        return -1;
    }
    runlog_printf(log, "checkpoint: %s", where);
    return 0;
}

/* The per-op table of HEARTH_PROFILE into the log, line by line. */
static void profile_report(runlog *log, trainer *tr)
{
    hearth_err err = { { 0 } };
    char *buf = malloc(16384);
    if (!buf || trainer_profile_report(tr, buf, 16384, &err)) {
        runlog_printf(log, "hearth-train: profile: %s", buf ? err.msg : "out of memory");
        free(buf);
        return;
    }
    runlog_printf(log, "profile of the measured steps (HEARTH_PROFILE; device ops, each "
                  "charged up to the next op's start):");
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        runlog_printf(log, "  %s", line);
    free(buf);
}

static int train_loop(runlog *log, const char *dir, const run_config *cfg, trainer *tr,
                      const char *hash, const char *resume_from)
{
    const char *prof_env = getenv("HEARTH_PROFILE");
    int profile = prof_env && *prof_env && strcmp(prof_env, "0") != 0;
    hearth_err err = { { 0 } };
    metrics_file mf = { 0 };
    run_summary sum;
    shape_flops fl;
    shape_count_flops(&cfg->model, cfg->train.seq_len, &fl);
    summary_init(&sum, cfg->train.measure_from, &fl);
    const char *status = "done";
    int exit_code = RUN_EXIT_DONE, start = 0;
    if (resume_from && (exit_code = resume(log, resume_from, cfg, tr, &sum, &start))) {
        summary_free(&sum);
        return exit_code;
    }
    int saved = resume_from ? start : -1;   /* the step of the newest checkpoint */
    if (resume_from ? metrics_open_resume(&mf, dir, start, &err) : metrics_open(&mf, dir, &err)) {
        runlog_printf(log, "hearth-train: %s", err.msg);
        status = "failed";
        exit_code = RUN_EXIT_FAILED;
    }
    for (int s = start + 1; exit_code == RUN_EXIT_DONE && s <= cfg->train.steps + 1; s++) {
        /* Step boundary: a preemption notice stops the run here, unless it is done. */
        if (preempt_signal && s <= cfg->train.steps) {
            runlog_printf(log, "hearth-train: signal %d: checkpoint after step %d, then exit "
                          "%d (preempted)", (int)preempt_signal, s - 1, RUN_EXIT_PREEMPTED);
            if (saved != s - 1 && checkpoint(log, dir, cfg, tr, hash, &sum)) {
                status = "failed";
                exit_code = RUN_EXIT_FAILED;
                break;
            }
            metrics_close(&mf);
            summary_free(&sum);
            return RUN_EXIT_PREEMPTED;
        }
        if (s > cfg->train.steps)
            break;
        /* HEARTH_PROFILE: the device's per-op profile of the measured steps. */
        if (profile && s == (start + 1 > cfg->train.measure_from ? start + 1
                                                                  : cfg->train.measure_from) &&
            trainer_profile_start(tr, &err)) {
            runlog_printf(log, "hearth-train: %s", err.msg);
            profile = 0;
        }
        train_step_stats st;
        int rc = trainer_step(tr, &st, &err);
        if (rc < 0) {
            runlog_printf(log, "hearth-train: step %d: %s", s, err.msg);
            status = "failed";
            exit_code = RUN_EXIT_FAILED;
            break;
        }
        long long peak = peak_mem(tr);
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
        } else if (cfg->train.checkpoint_every > 0 && s % cfg->train.checkpoint_every == 0 &&
                   s < cfg->train.steps) {
            if (checkpoint(log, dir, cfg, tr, hash, &sum)) {
                status = "failed";
                exit_code = RUN_EXIT_FAILED;
            }
            saved = s;
        }
    }
    metrics_close(&mf);
    if (profile)
        profile_report(log, tr);
    if (finish(log, dir, cfg, tr, hash, &sum, status) && exit_code == RUN_EXIT_DONE)
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
    hf_config *src = NULL;
    int code = setup(a, &log, cfg, &tr);
    /* the source config is read for the parameters and, with --resume, still for the
     * export, which writes it back */
    if (!code && a->init_from && (!a->resume || a->export_hf))
        code = hf_source(&log, a->init_from, &src);
    /* a requeued job repeats its command line with --resume: the checkpoint wins */
    if (!code && a->init_from && a->resume)
        runlog_printf(&log, "--init-from %s: not used, the checkpoint of --resume holds the "
                      "parameters", a->init_from);
    else if (!code && a->init_from)
        code = init_from_hf(&log, a->init_from, src, cfg, tr);
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
                      "ep %d sp %d cp %d, encoder %s tp %d; %d steps of %d x %d "
                      "tokens (micro batch %d), lr %g (min %g, warmup %d), seed %llu; "
                      "config %s",
                      cfg->model.name, (long long)sp.total, cfg->ranks, cfg->parallel.tp,
                      cfg->parallel.pp, cfg->parallel.vpp, cfg->parallel.dp, cfg->parallel.ep,
                      cfg->parallel.sp, cfg->parallel.cp,
                      encoder_strategy_name(cfg->parallel.encoder.strategy),
                      cfg->parallel.encoder.tp,
                      cfg->train.steps, cfg->train.global_batch, cfg->train.seq_len,
                      cfg->train.micro_batch, cfg->train.lr, cfg->train.min_lr,
                      cfg->train.warmup, (unsigned long long)cfg->train.seed, hash);
        saved_handlers old;
        preempt_install(&old);
        code = train_loop(&log, a->out_dir, cfg, tr, hash, a->resume);
        /* A preempted run keeps the handler until it exits: a repeated notice (Slurm and
         * users send several) arriving after the loop must not turn exit 75 into a kill. */
        if (code != RUN_EXIT_PREEMPTED)
            preempt_restore(&old);
        if (code == RUN_EXIT_DONE && a->export_hf)
            code = export_hf(&log, a, src, cfg, tr);
    }
    free(json);
    hf_config_free(src);
    trainer_free(tr);
    free(cfg);
    runlog_close(&log);
    return code;
}
