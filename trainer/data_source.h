/* data_source.h - where a run's samples come from (`data.kind`): the synthetic data set
 * (data_synth.h) or prepared shards (data_shards.h), behind one fill call.  Either way a
 * sample is a pure function of (config, sample index), so every rank fills exactly the
 * samples it trains on, and a resumed run sees the same data. */
#ifndef HEARTH_DATA_SOURCE_H
#define HEARTH_DATA_SOURCE_H

#include <stdint.h>

#include "data_synth.h"
#include "shape/err.h"
#include "shape/run_config.h"

typedef struct data_source data_source;

/* Opens the source of cfg->data.kind; errors name the key or the file.  Free with
 * data_source_free. */
int data_source_create(data_source **out, const run_config *cfg, hearth_err *err);
void data_source_free(data_source *s);

/* The sample geometry (seq_len, vocab, image_token_id, encoder patch sizes); for
 * synthetic data also its generator parameters.  Owned by s. */
const synth_params *data_source_params(const data_source *s);

/* Fills b with samples first .. first + n - 1.  Does not change s: ranks that share a
 * source may call it concurrently. */
int data_source_fill(const data_source *s, synth_batch *b, uint64_t first, int n,
                     hearth_err *err);

/* The first sample of micro batch j (of micro_batch samples) of DP rank d, which holds
 * micro batches [d * per_rank, (d + 1) * per_rank) of step `step` (0-based) of
 * global_batch samples: the DP ranks' shares of a step are disjoint and cover it. */
uint64_t data_source_first(int step, int global_batch, int micro_batch, int per_rank, int d,
                           int j);

#endif
