#include "schedule.h"

#include <math.h>

double schedule_lr(const lr_schedule *s, int step)
{
    if (step < 1)
        step = 1;
    if (step <= s->warmup)
        return s->lr * (double)step / (double)s->warmup;
    if (step >= s->steps)
        return s->min_lr;
    double p = (double)(step - s->warmup) / (double)(s->steps - s->warmup);
    return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}
