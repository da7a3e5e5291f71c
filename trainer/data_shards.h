/* data_shards.h - the reader of a prepared data set (`data.kind: shards`, docs/data.md).
 *
 * Opens DIR/manifest.json and mmaps every shard it lists; checks the manifest against the
 * model (vocab, image_token_id, patch, spatial_merge, in_channels) and each shard's size,
 * header and index, so that a damaged data set fails at start with an error naming the
 * file.  Records are checked again when read (counts, grids, token range), naming the file
 * and record.
 *
 * Sample i of the run is record perm_e(i mod R) with R records and epoch e = i / R, where
 * perm_e is a seeded pseudo-random permutation of [0, R) (a Feistel network with cycle
 * walking, keyed by hrng_mix(train.seed, e)): every record once per epoch, a new order
 * every epoch, and the data of a sample is a pure function of (train.seed, i), which
 * resuming from a checkpoint and splitting over ranks by sample index rely on.
 *
 * A sample of seq_len tokens: the record's tokens, cut at seq_len, and padded with the
 * manifest's pad_token_id.  The cut never splits an image: when an image's tokens would
 * cross seq_len, the sequence ends before that image (that image and later ones are
 * dropped).  targets[i] = tokens[i+1], except -1 where tokens[i+1] is an image token
 * (Qwen2-VL masks image tokens in its labels), at the last real token and on padding.
 * Pixels: the stored RGB bytes scaled to [0, 1], normalised with CLIP's mean and std
 * (Qwen2-VL's processor) and patchified in Qwen2-VL's order (synth_patchify), each
 * frame repeated temporal_patch times. */
#ifndef HEARTH_DATA_SHARDS_H
#define HEARTH_DATA_SHARDS_H

#include <stdint.h>

#include "data_synth.h"
#include "shape/err.h"
#include "shape/run_config.h"

/* CLIP's normalisation, as Qwen2-VL's image processor applies it. */
#define DATA_CLIP_MEAN { 0.48145466f, 0.4578275f, 0.40821073f }
#define DATA_CLIP_STD { 0.26862954f, 0.26130258f, 0.27577711f }

typedef struct data_shards data_shards;

/* Opens cfg->data.path for a model of cfg's shape.  Errors: HERR_CONFIG for a manifest
 * that does not match the model, HERR_IO for a missing or damaged file (naming it).
 * Close with data_shards_close. */
int data_shards_open(data_shards **out, const run_config *cfg, hearth_err *err);
void data_shards_close(data_shards *d);

uint64_t data_shards_records(const data_shards *d);
/* The record (0 .. records-1, in manifest order) that sample `sample` reads. */
uint64_t data_shards_record_of(const data_shards *d, uint64_t sample);

/* Fills b with samples first .. first + n - 1 (b's buffers grow; image_class is -1).
 * Reentrant: d is not changed. */
int data_shards_fill(const data_shards *d, synth_batch *b, uint64_t first, int n,
                     hearth_err *err);

/* The permutation: position pos of epoch `epoch` over n records -> a record in [0, n). */
uint64_t data_shards_permute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t pos);

#endif
