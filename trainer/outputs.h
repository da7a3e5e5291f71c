/* outputs.h - the files hearth-train writes in its run directory (DESIGN.md "Trainer
 * outputs"): metrics.jsonl (one line per step, flushed as written), result.json (the
 * summary, written atomically), config.json (the resolved config, atomically).
 *
 * Numbers that are NaN or infinite are written as null (JSON has no NaN).  Reals are
 * written with 17 significant digits, so a loss read back is bitwise the loss computed. */
#ifndef HEARTH_OUTPUTS_H
#define HEARTH_OUTPUTS_H

#include <stdio.h>

#include "plan_memory.h"
#include "shape/err.h"
#include "summary.h"
#include "train.h"

/* Creates dir and missing parents. */
int outputs_mkdir_p(const char *dir, hearth_err *err);
/* What shows that DIR holds an earlier run's results: the name of the first of a
 * non-empty result.json, metrics.jsonl or checkpoints/latest in it ("result.json", ...),
 * or NULL when it holds none of them (or does not exist).  hearth-train refuses such a
 * directory unless told to continue that run (--resume) or to replace it (--force). */
const char *outputs_earlier_results(const char *dir);
/* Writes DIR/NAME through DIR/.NAME.tmp: write, fsync, rename, fsync DIR, so that
 * readers see the old file or the whole new one. */
int outputs_write_atomic(const char *dir, const char *name, const char *text, hearth_err *err);
/* Peak resident memory of this process (VmHWM from /proc/self/status), bytes; 0 if
 * unknown. */
long long outputs_peak_mem_bytes(void);

typedef struct {
    FILE *f;
} metrics_file;

/* Creates (truncates) DIR/metrics.jsonl. */
int metrics_open(metrics_file *mf, const char *dir, hearth_err *err);
/* For a resumed run: keeps the lines of DIR/metrics.jsonl up to and including step
 * `step` (those after it were written after the checkpoint and are run again; a torn
 * last line ends the kept part), rewriting the file atomically, and opens it for
 * appending.  A missing file starts empty.  (metrics_resume.c) */
int metrics_open_resume(metrics_file *mf, const char *dir, int step, hearth_err *err);
/* Appends the step's line: step, loss, grad_norm, lr, step_ms, tokens, tokens_per_s,
 * encoder_ms, decoder_ms, peak_mem_bytes; flushed. */
int metrics_append(metrics_file *mf, const train_step_stats *st, long long peak_mem_bytes,
                   hearth_err *err);
/* The same line as a malloc'd string (no newline); NULL when out of memory. */
char *metrics_line(const train_step_stats *st, long long peak_mem_bytes);
void metrics_close(metrics_file *mf);

typedef struct {
    char config_hash[65];
    summary_numbers num;
    double tokens_per_s_per_gpu;
    double mfu;                  /* NaN: null (no known peak, e.g. CPU) */
    const char *cuda_version;    /* the CUDA runtime's, as text; NULL: null */
    const char *cublaslt_version;
    long long peak_mem_bytes;
    const char *exit_status;     /* "done" | "diverged" | "failed" */
    const char *device;          /* "cpu" | "cuda" */
    int device_count, nodes;
    const run_memory *memory;    /* predicted and measured peak memory (plan_memory.h);
                                    NULL: "memory": null; borrowed */
} run_result;

/* result.json's text (malloc'd), keys in DESIGN.md's order:
 * config_hash, steps, step_ms_median, step_ms_p10, step_ms_p90, tokens_per_s,
 * tokens_per_s_per_gpu, flops_per_token, mfu, peak_mem_bytes, final_loss, exit_status,
 * device, device_count, nodes, versions {hearth, git_describe, cuda, cublaslt, nccl},
 * then memory {predicted_peak_bytes, predicted_peak_rank, predicted_peak_stage,
 * predicted_by_category {params, grads, ...}, predicted_host_bytes,
 * predicted_process_bytes, measured_peak_bytes, measured_source} (docs/memory.md). */
char *result_json(const run_result *r, hearth_err *err);
int result_write(const char *dir, const run_result *r, hearth_err *err);

#endif
