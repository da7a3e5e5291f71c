#include "run.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "device_info.h"
#include "fp8_policy.h"
#include "outputs.h"
#include "runlog.h"
#include "shape/fp8_linears.h"
#include "summary.h"
#include "train.h"
#include "shape/version.h"

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

/* The run from its arguments to its exit status: prepare() checks and loads everything
 * without writing a file; accept() then creates the directory, its train.log and
 * config.json; train() runs the steps.  Owned here, released by run_release. */
typedef struct {
    const cli_args *a;
    runlog log;
    run_config *cfg;
    trainer *tr;
    hf_config *src;           /* --init-from's config.json, NULL without */
    run_summary sum;
    int has_sum;
    int start;                /* steps done before this process: the checkpoint's step */
    char ckpt[4400];          /* the checkpoint directory --resume names; "" without */
    const char *earlier;      /* the file showing that --out holds an earlier run's
                                 results (outputs_earlier_results), replaced with --force */
    char hash[65];
} run;

static void run_release(run *r)
{
    if (r->has_sum)
        summary_free(&r->sum);
    hf_config_free(r->src);
    trainer_free(r->tr);
    free(r->cfg);
    runlog_close(&r->log);
}

static int config_exit(int rc)
{
    return rc == HERR_NOMEM || rc == HERR_RUNTIME ? RUN_EXIT_FAILED : RUN_EXIT_USAGE;
}

/* Logs err's message after `what` and returns the exit status of rc. */
static int refuse(run *r, const char *what, int rc, const hearth_err *err)
{
    runlog_printf(&r->log, "hearth-train: %s%s", what, err->msg);
    return config_exit(rc);
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

/* An earlier run's results are never replaced by accident: a directory holding them
 * takes --resume (continue that run) or --force (replace it). */
static int check_out_dir(run *r)
{
    const cli_args *a = r->a;
    r->earlier = outputs_earlier_results(a->out_dir);
    if (!r->earlier || a->resume || a->force)
        return 0;
    runlog_printf(&r->log, "hearth-train: --out %s: holds the results of an earlier run "
                  "(%s): --resume %s continues that run, --force replaces its results",
                  a->out_dir, r->earlier, a->out_dir);
    return RUN_EXIT_USAGE;
}

/* The checkpoint directory that --resume names, into r->ckpt. */
static int resolve_resume(run *r)
{
    hearth_err err = { { 0 } };
    int rc = ckpt_resolve(r->a->resume, r->ckpt, sizeof r->ckpt, &err);
    return rc ? refuse(r, "--resume: ", rc, &err) : 0;
}

/* The run config: --config and --set, or with --resume and no --config the checkpoint's
 * own config and --set. */
static int config_load(run *r, hearth_err *err)
{
    const cli_args *a = r->a;
    if (*r->ckpt && !a->config)
        return ckpt_read_config(r->ckpt, a->ovr, a->n_ovr, r->cfg, err);
    return run_config_load(r->cfg, a->config, a->ovr, a->n_ovr, 0, err);
}

static void log_precision(runlog *log, const run_config *cfg, const trainer *tr)
{
    if (cfg->device == DEVICE_CUDA)
        runlog_printf(log, "device cuda: %s, precision.compute %s (activations stored in fp32)",
                      trainer_device_name(tr),
                      cfg->precision.compute == COMPUTE_BF16 ? "bf16: GEMMs and attention on "
                      "bf16 tensor cores, fp32 accumulation" : "fp32");
    if (cfg->precision.fp8 == FP8_ALL)
        runlog_printf(log, "precision.fp8: all is emulated on device cpu (E4M3/E5M2 "
                      "quantise-dequantise around fp32 GEMMs)");
    else if (cfg->precision.fp8 == FP8_SELECTIVE)
        runlog_printf(log, "precision.fp8: selective is emulated on device cpu (E4M3/E5M2 "
                      "quantise-dequantise around fp32 GEMMs; rules from %s)",
                      cfg->precision.fp8_policy);
    if (cfg->precision.fp8 != FP8_SELECTIVE)
        return;
    /* A policy for another layout or batch silently trains without FP8: say so.  The
     * trainer already loaded this policy (trainer_create), so it reads. */
    fp8_plan plan;
    hearth_err ignored;
    if (fp8_plan_from_config(&plan, cfg, TRAIN_CPU_DEVICE_NAME, &ignored) == 0 &&
        fp8_plan_count(&plan, cfg) == 0)
        runlog_printf(log, "hearth-train: warning: precision.fp8_policy %s matches no linear "
                      "of this run (its rules' component, kind, tp and token range against "
                      "the model's linears at the micro batch's token counts, after "
                      "keep_bf16): every linear computes without FP8",
                      cfg->precision.fp8_policy);
    fp8_plan_clear(&plan);
}

/* Loads and checks the config and creates the trainer and the summary. */
static int setup(run *r)
{
    hearth_err err = { { 0 } };
    if (!(r->cfg = calloc(1, sizeof *r->cfg)))
        return refuse(r, "", herr_set(&err, HERR_NOMEM, "out of memory"), &err);
    int rc = config_load(r, &err);
    if (!rc)
        rc = check_supported(r->cfg, &err);
    if (!rc)
        rc = trainer_create(&r->tr, r->cfg, &err);   /* installs the FP8 plan (fp8_policy.h) */
    if (rc)
        return refuse(r, "", rc, &err);
    log_precision(&r->log, r->cfg, r->tr);
    shape_flops fl;
    shape_count_flops(&r->cfg->model, r->cfg->train.seq_len, &fl);
    summary_init(&r->sum, r->cfg->train.measure_from, &fl);
    r->has_sum = 1;
    return 0;
}

/* --init-from DIR: reads and classifies DIR/config.json into r->src (a config error is
 * exit 2); keys hearth does not know are named in the log. */
static int hf_source(run *r)
{
    hearth_err err = { { 0 } };
    int rc = hf_config_load(&r->src, r->a->init_from, &err);
    if (rc)
        return refuse(r, "--init-from: ", rc, &err);
    if (r->src->unknown)
        runlog_printf(&r->log, "hearth-train: --init-from: warning: %s: keys hearth does not "
                      "know were ignored (docs/hf.md, \"config.json keys\"): %s",
                      r->src->file, r->src->unknown);
    return 0;
}

/* --init-from: the Hugging Face checkpoint's parameters replace the initial ones.  A
 * config that does not match the run's model is a config error (exit 2).  The source
 * config is read for the parameters and, with --resume, still for --export-hf, which
 * writes it back. */
static int init_from_hf(run *r)
{
    hearth_err err = { { 0 } };
    const char *dir = r->a->init_from;
    if (!r->a->resume || r->a->export_hf) {
        int code = hf_source(r);
        if (code)
            return code;
    }
    if (r->a->resume) {
        /* a requeued job repeats its command line with --resume: the checkpoint wins */
        runlog_printf(&r->log, "--init-from %s: not used, the checkpoint of --resume holds "
                      "the parameters", dir);
        return 0;
    }
    int rc = trainer_init_from_hf(r->tr, &r->cfg->model, r->src, dir, &err);
    if (rc)
        return refuse(r, "--init-from: ", rc, &err);
    runlog_printf(&r->log, "initialised from the Hugging Face checkpoint %s", dir);
    return 0;
}

/* Loads the checkpoint that --resume names into the trainer and the summary; r->start =
 * its step. */
static int resume(run *r)
{
    hearth_err err = { { 0 } };
    int rc = ckpt_read(r->ckpt, r->tr, r->cfg, &r->sum, &r->start, &err);
    if (rc) {
        runlog_printf(&r->log, "hearth-train: --resume: %s", err.msg);
        return rc == HERR_CONFIG ? RUN_EXIT_USAGE : RUN_EXIT_FAILED;
    }
    runlog_printf(&r->log, "resumed from %s: step %d of %d", r->ckpt, r->start,
                  r->cfg->train.steps);
    return 0;
}

/* Everything that can refuse the run, before anything is written: the run directory, the
 * config, the trainer, --init-from and --resume.  0 or an exit status. */
static int prepare(run *r)
{
    int code = check_out_dir(r);
    if (!code && r->a->resume)
        code = resolve_resume(r);
    if (!code)
        code = setup(r);
    if (!code && r->a->init_from)
        code = init_from_hf(r);
    if (!code && r->a->resume)
        code = resume(r);
    return code;
}

/* --force: what the earlier run left that the new run would not rewrite at once. */
static int replace_earlier(run *r, hearth_err *err)
{
    const char *dir = r->a->out_dir;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/result.json", dir) >= (int)sizeof path)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    if (unlink(path) && errno != ENOENT)
        return herr_set(err, HERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    int rc = ckpt_remove_all(dir, err);
    if (!rc && r->earlier)
        runlog_printf(&r->log, "--force: the results of the earlier run in %s are replaced",
                      dir);
    return rc;
}

/* The run is accepted: its directory, train.log (with the lines so far) and config.json. */
static int accept(run *r)
{
    hearth_err err = { { 0 } };
    const char *dir = r->a->out_dir;
    char *json = NULL;
    int rc = outputs_mkdir_p(dir, &err);
    if (!rc)
        rc = runlog_open(&r->log, dir, &err);
    if (!rc && r->a->force)
        rc = replace_earlier(r, &err);
    if (!rc && !(json = run_config_canonical_json(r->cfg, &err)))
        rc = HERR_NOMEM;
    if (!rc)
        rc = run_config_hash(r->cfg, r->hash, &err);
    if (!rc)
        rc = outputs_write_atomic(dir, "config.json", json, &err);
    free(json);
    if (rc) {
        runlog_printf(&r->log, "hearth-train: %s", err.msg);
        return RUN_EXIT_FAILED;
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

static int finish(run *r, const char *status)
{
    hearth_err err = { { 0 } };
    const run_config *cfg = r->cfg;
    run_result res;
    memset(&res, 0, sizeof res);
    memcpy(res.config_hash, r->hash, sizeof res.config_hash);
    summary_compute(&r->sum, &res.num);
    res.device_count = 1;
    res.nodes = 1;
    res.tokens_per_s_per_gpu = res.num.tokens_per_s / res.device_count;
    /* MFU over the GPU's dense bf16 peak (device_info.c's table); null for the cpu, for
     * multi-rank runs and for GPUs without a known peak */
    double peak = device_peak_bf16_tflops(trainer_device_name(r->tr));
    res.mfu = cfg->device == DEVICE_CUDA && peak > 0
                  ? res.num.flops_per_token * res.tokens_per_s_per_gpu / (peak * 1e12)
                  : NAN;
    char cuda_v[32], lt_v[32];
    res.cuda_version = device_version_text(cuda_v, sizeof cuda_v, KDEV_LIB_CUDA_RUNTIME,
                                           trainer_lib_version(r->tr, KDEV_LIB_CUDA_RUNTIME));
    res.cublaslt_version = device_version_text(lt_v, sizeof lt_v, KDEV_LIB_CUBLASLT,
                                               trainer_lib_version(r->tr, KDEV_LIB_CUBLASLT));
    res.peak_mem_bytes = peak_mem(r->tr);
    res.exit_status = status;
    res.device = cfg->device == DEVICE_CUDA ? "cuda" : "cpu";
    /* The plan of a config that trained is always computable; should it fail anyway,
     * result.json says "memory": null rather than losing the run's other figures. */
    run_memory mem;
    long long dev_peak;
    if (plan_memory_result(&mem, cfg, &err) == 0) {
        res.memory = &mem;
        if (trainer_device_peak(r->tr, &dev_peak)) {
            mem.measured_bytes = dev_peak;
            mem.measured_source = "the peak of device memory the run allocated (parameters, "
                                  "gradients, AdamW moments, activations; not the CUDA "
                                  "context or library workspaces)";
        }
    }
    else
        runlog_printf(&r->log, "hearth-train: memory plan: %s", err.msg);
    if (result_write(r->a->out_dir, &res, &err)) {
        runlog_printf(&r->log, "hearth-train: %s", err.msg);
        return -1;
    }
    runlog_printf(&r->log, "%s: %d steps, final loss %.9g, median step %.1f ms, %.1f tokens/s",
                  status, res.num.steps, res.num.final_loss, res.num.step_ms_median,
                  res.num.tokens_per_s);
    return 0;
}

/* --export-hf after a completed run; the config.json of --init-from (if any) is written
 * back as read. */
static int export_hf(run *r)
{
    hearth_err err = { { 0 } };
    const cli_args *a = r->a;
    st_dtype dt = a->export_dtype && !strcmp(a->export_dtype, "bf16") ? ST_BF16 : ST_F32;
    if (trainer_export_hf(r->tr, &r->cfg->model, r->src, a->export_hf, dt, &err)) {
        runlog_printf(&r->log, "hearth-train: --export-hf: %s", err.msg);
        return RUN_EXIT_FAILED;
    }
    runlog_printf(&r->log, "exported the parameters (%s) to %s", dt == ST_BF16 ? "bf16" : "f32",
                  a->export_hf);
    return 0;
}

/* Writes the checkpoint after the steps done; 0 or -1 (logged). */
static int checkpoint(run *r)
{
    hearth_err err = { { 0 } };
    char where[4400];
    if (ckpt_write(r->a->out_dir, r->tr, r->cfg, r->hash, &r->sum, NULL, where, sizeof where,
                   &err)) {
        runlog_printf(&r->log, "hearth-train: %s", err.msg);
        return -1;
    }
    runlog_printf(&r->log, "checkpoint: %s", where);
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

static int train_loop(run *r)
{
    const char *prof_env = getenv("HEARTH_PROFILE");
    int profile = prof_env && *prof_env && strcmp(prof_env, "0") != 0;
    hearth_err err = { { 0 } };
    metrics_file mf = { 0 };
    const run_config *cfg = r->cfg;
    runlog *log = &r->log;
    const char *status = "done";
    int exit_code = RUN_EXIT_DONE, start = r->start;
    int saved = r->a->resume ? start : -1;   /* the step of the newest checkpoint */
    if (r->a->resume ? metrics_open_resume(&mf, r->a->out_dir, start, &err)
                     : metrics_open(&mf, r->a->out_dir, &err)) {
        runlog_printf(log, "hearth-train: %s", err.msg);
        status = "failed";
        exit_code = RUN_EXIT_FAILED;
    }
    for (int s = start + 1; exit_code == RUN_EXIT_DONE && s <= cfg->train.steps + 1; s++) {
        /* Step boundary: a preemption notice stops the run here, unless it is done. */
        if (preempt_signal && s <= cfg->train.steps) {
            runlog_printf(log, "hearth-train: signal %d: checkpoint after step %d, then exit "
                          "%d (preempted)", (int)preempt_signal, s - 1, RUN_EXIT_PREEMPTED);
            if (saved != s - 1 && checkpoint(r)) {
                status = "failed";
                exit_code = RUN_EXIT_FAILED;
                break;
            }
            metrics_close(&mf);
            return RUN_EXIT_PREEMPTED;
        }
        if (s > cfg->train.steps)
            break;
        /* HEARTH_PROFILE: the device's per-op profile of the measured steps. */
        if (profile && s == (start + 1 > cfg->train.measure_from ? start + 1
                                                                  : cfg->train.measure_from) &&
            trainer_profile_start(r->tr, &err)) {
            runlog_printf(log, "hearth-train: %s", err.msg);
            profile = 0;
        }
        train_step_stats st;
        int rc = trainer_step(r->tr, &st, &err);
        if (rc < 0) {
            runlog_printf(log, "hearth-train: step %d: %s", s, err.msg);
            status = "failed";
            exit_code = RUN_EXIT_FAILED;
            break;
        }
        long long peak = peak_mem(r->tr);
        if (summary_add(&r->sum, &st, &err) || metrics_append(&mf, &st, peak, &err)) {
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
            if (checkpoint(r)) {
                status = "failed";
                exit_code = RUN_EXIT_FAILED;
            }
            saved = s;
        }
    }
    metrics_close(&mf);
    if (profile)
        profile_report(log, r->tr);
    if (finish(r, status) && exit_code == RUN_EXIT_DONE)
        exit_code = RUN_EXIT_FAILED;
    return exit_code;
}

static void log_model(run *r)
{
    const run_config *cfg = r->cfg;
    shape_params sp;
    shape_count_params(&cfg->model, &sp);
    runlog_printf(&r->log, "model %s: %lld parameters; %d rank(s): tp %d pp %d vpp %d dp %d "
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
                  cfg->train.warmup, (unsigned long long)cfg->train.seed, r->hash);
}

/* The accepted run: the steps, then --export-hf. */
static int train(run *r)
{
    log_model(r);
    saved_handlers old;
    preempt_install(&old);
    int code = train_loop(r);
    /* A preempted run keeps the handler until it exits: a repeated notice (Slurm and
     * users send several) arriving after the loop must not turn exit 75 into a kill. */
    if (code != RUN_EXIT_PREEMPTED)
        preempt_restore(&old);
    if (code == RUN_EXIT_DONE && r->a->export_hf)
        code = export_hf(r);
    return code;
}

int run_main(const cli_args *a)
{
    run r;
    memset(&r, 0, sizeof r);
    r.a = a;
    runlog_init(&r.log);
    runlog_printf(&r.log, "%s: config %s, %d override(s), out %s", version_line(),
                  a->config ? a->config : a->resume ? "(the checkpoint's)" : "(none)",
                  a->n_ovr, a->out_dir);
    int code = prepare(&r);
    if (!code)
        code = accept(&r);
    if (!code)
        code = train(&r);
    run_release(&r);
    return code;
}
