/* shapebatch.c - synthetic-task batches for a hand-made model shape (see shapebatch.h). */
#include "shapebatch.h"

#include <string.h>

void shapebatch_params(synth_params *p, const model_shape *sh, uint64_t seed, int seq_len,
                       int px_max)
{
    memset(p, 0, sizeof *p);
    p->seed = seed;
    p->seq_len = seq_len;
    p->vocab = sh->decoder.vocab;
    p->image_token_id = sh->encoder.present ? sh->decoder.image_token_id : -1;
    if (sh->encoder.present) {
        p->images_min = 1;
        p->images_max = 2;
        p->px_min = 16;
        p->px_max = px_max;
        p->in_channels = sh->encoder.in_channels;
        p->patch = sh->encoder.patch;
        p->temporal_patch = sh->encoder.temporal_patch;
        p->merge = sh->encoder.spatial_merge;
    }
}
