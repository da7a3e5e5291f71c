/* shapebatch.h - synthetic-task batches (data_synth.h) for a hand-made model shape, for
 * the unit tests that build models without a run config.
 *
 * The task's images (1 or 2 per sample, 16 px up to px_max) follow the shape's encoder
 * (channels, patch, temporal patch, merge); a shape without an encoder gets text only.
 * No cmocka dependency (the bench links the support files too). */
#ifndef HEARTH_SHAPEBATCH_H
#define HEARTH_SHAPEBATCH_H

#include <stdint.h>

#include "data_synth.h"
#include "shape/model_shape.h"

/* Fills *p for shape `sh` (p is cleared first). */
void shapebatch_params(synth_params *p, const model_shape *sh, uint64_t seed, int seq_len,
                       int px_max);

#endif
