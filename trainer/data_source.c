#include "data_source.h"

#include <stdlib.h>
#include <string.h>

#include "data_shards.h"

struct data_source {
    synth_params params;
    data_shards *shards;            /* data.kind shards; NULL for synthetic */
};

int data_source_create(data_source **out, const run_config *cfg, hearth_err *err)
{
    *out = NULL;
    data_source *s = calloc(1, sizeof *s);
    if (!s)
        return herr_set(err, HERR_NOMEM, "data: out of memory");
    int rc;
    if (cfg->data.kind == DATA_SHARDS) {
        /* The geometry only: the synthetic generator's own checks do not apply. */
        synth_params_geometry(&s->params, cfg);
        rc = data_shards_open(&s->shards, cfg, err);
    } else {
        rc = synth_params_from_config(&s->params, cfg, err);
    }
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void data_source_free(data_source *s)
{
    if (!s)
        return;
    data_shards_close(s->shards);
    free(s);
}

const synth_params *data_source_params(const data_source *s)
{
    return &s->params;
}

int data_source_fill(const data_source *s, synth_batch *b, uint64_t first, int n,
                     hearth_err *err)
{
    if (s->shards)
        return data_shards_fill(s->shards, b, first, n, err);
    return synth_fill(b, &s->params, first, n, err);
}

uint64_t data_source_first(int step, int global_batch, int micro_batch, int per_rank, int d,
                           int j)
{
    return (uint64_t)step * (uint64_t)global_batch +
           (uint64_t)(d * per_rank + j) * (uint64_t)micro_batch;
}
