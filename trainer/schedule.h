/* schedule.h - the learning-rate schedule: linear warmup, then cosine decay.
 *
 * Steps count from 1 (as in metrics.jsonl and train.measure_from).  For step s:
 *   s <= warmup          : lr * s / warmup          (reaches lr at s == warmup)
 *   warmup < s <= steps  : min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,
 *                          p = (s - warmup) / (steps - warmup)
 *   s > steps            : min_lr
 * so the decay ends at min_lr exactly on the last step, s == steps. */
#ifndef HEARTH_SCHEDULE_H
#define HEARTH_SCHEDULE_H

typedef struct {
    double lr;      /* peak learning rate */
    double min_lr;  /* floor, reached at `steps` */
    int warmup;     /* warmup steps (0 = none) */
    int steps;      /* total steps of the run */
} lr_schedule;

double schedule_lr(const lr_schedule *s, int step);

#endif
