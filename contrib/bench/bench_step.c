/* bench_step.c - times whole tiny-vlm training steps (data, forward, backward, clipping,
 * AdamW) on the fp32 CPU path, with one thread and with all threads.
 *
 * Usage: bench_step [steps]     (default 8 timed steps after 2 warm-up steps per row)
 * The model is tiny-vlm as the preset defines it; the batch is the shape the CLI tests
 * use scaled up a little: seq_len 128, global batch 4 in micro batches of 2, 1-2 images
 * of 28-56 px.  Each row builds a fresh trainer from the same seed, so both rows run
 * bitwise the same computation (the loss column shows it). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "summary.h"
#include "train.h"

static const char *bench_yaml =
    "model: tiny-vlm\n"
    "train:\n"
    "  steps: 1000\n"
    "  seed: 1234\n"
    "  seq_len: 128\n"
    "  micro_batch: 2\n"
    "  global_batch: 4\n"
    "  lr: 1.0e-3\n"
    "  warmup: 10\n"
    "data:\n"
    "  images_min: 1\n"
    "  images_max: 2\n"
    "  image_px_min: 28\n"
    "  image_px_max: 56\n";

enum { WARMUP = 2, MAX_STEPS = 1000 };

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times `steps` steps after WARMUP; fills the median, p10, p90 step time, the mean
 * encoder/decoder share and tokens/s of the timed steps, and the last loss. */
static int bench_row(const run_config *c, int steps, double out[7])
{
    trainer *t = NULL;
    hearth_err err = { { 0 } };
    if (trainer_create(&t, c, &err)) {
        fprintf(stderr, "bench_step: %s\n", err.msg);
        return 1;
    }
    double ms[MAX_STEPS], enc = 0, dec = 0, total = 0, tokens = 0, loss = 0;
    for (int i = 0; i < WARMUP + steps; i++) {
        train_step_stats st;
        int rc = trainer_step(t, &st, &err);
        if (rc) {
            fprintf(stderr, "bench_step: step %d: %s\n", i + 1,
                    rc == TRAIN_DIVERGED ? "diverged" : err.msg);
            trainer_free(t);
            return 1;
        }
        loss = st.loss;
        if (i < WARMUP)
            continue;
        ms[i - WARMUP] = st.step_ms;
        enc += st.encoder_ms;
        dec += st.decoder_ms;
        total += st.step_ms;
        tokens += (double)st.tokens;
    }
    trainer_free(t);
    qsort(ms, (size_t)steps, sizeof ms[0], cmp_double);
    out[0] = summary_percentile(ms, steps, 0.5);
    out[1] = summary_percentile(ms, steps, 0.1);
    out[2] = summary_percentile(ms, steps, 0.9);
    out[3] = enc / steps;
    out[4] = dec / steps;
    out[5] = tokens / (total / 1e3);
    out[6] = loss;
    return 0;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 8;
    if (steps < 1 || steps > MAX_STEPS - WARMUP) {
        fprintf(stderr, "usage: bench_step [steps]   (1..%d)\n", MAX_STEPS - WARMUP);
        return 2;
    }
    run_config *c = calloc(1, sizeof *c);
    hearth_err err = { { 0 } };
    if (!c || run_config_parse(c, "bench_step", bench_yaml, NULL, 0, 1, &err)) {
        fprintf(stderr, "bench_step: %s\n", c ? err.msg : "out of memory");
        free(c);
        return 1;
    }
    int all = omp_get_max_threads();
    printf("bench_step: %s training step, fp32 CPU, seq_len %d, global batch %d "
           "(micro %d), %d timed steps after %d warm-up\n",
           c->model.name, c->train.seq_len, c->train.global_batch, c->train.micro_batch, steps,
           WARMUP);
    printf("%7s %10s %10s %10s %11s %11s %10s %12s\n", "threads", "median_ms", "p10_ms",
           "p90_ms", "encoder_ms", "decoder_ms", "tokens/s", "last_loss");
    int threads[2] = { 1, all }, rows = all > 1 ? 2 : 1, bad = 0;
    for (int r = 0; r < rows; r++) {
        double v[7];
        omp_set_num_threads(threads[r]);
        if (bench_row(c, steps, v)) {
            bad = 1;
            continue;
        }
        printf("%7d %10.2f %10.2f %10.2f %11.2f %11.2f %10.0f %12.9g\n", threads[r], v[0], v[1],
               v[2], v[3], v[4], v[5], v[6]);
    }
    free(c);
    return bad;
}
