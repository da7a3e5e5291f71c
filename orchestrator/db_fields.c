/* db_fields.c - the whitelist of named columns.  See db_fields.h. */
#include "db_fields.h"

#include <string.h>

#define N(a) (sizeof(a) / sizeof((a)[0]))

static const db_field run_fields[] = {
    {"run_id", "r.run_id", FIELD_TEXT, 0, 0},
    {"experiment", "e.name", FIELD_TEXT, 0, 0},
    {"seq", "r.seq", FIELD_INT, 0, 0},
    {"state", "r.state", FIELD_TEXT, 0, 0},
    {"config_hash", "r.config_hash", FIELD_TEXT, 0, 0},
    {"attempts", "r.attempts", FIELD_INT, 0, 0},
    {"exit_code", "r.exit_code", FIELD_INT, 0, 0},
    {"backend", "r.backend", FIELD_TEXT, 0, 0},
    {"job_id", "r.backend_job_id", FIELD_TEXT, 0, 0},
    {"run_dir", "r.run_dir", FIELD_TEXT, 0, 0},
    {"created_at", "r.created_at", FIELD_TEXT, 0, 0},
    {"submitted_at", "r.submitted_at", FIELD_TEXT, 0, 0},
    {"started_at", "r.started_at", FIELD_TEXT, 0, 0},
    {"ended_at", "r.ended_at", FIELD_TEXT, 0, 0},
};

/* Keep in the order of the columns of `results` (db/migrations) after `run`; `indexed`
 * must match the indexes created there. */
static const db_field result_fields[] = {
    {"steps", "res.steps", FIELD_INT, 0, 0},
    {"step_ms_median", "res.step_ms_median", FIELD_REAL, -1, 1},
    {"step_ms_p10", "res.step_ms_p10", FIELD_REAL, -1, 0},
    {"step_ms_p90", "res.step_ms_p90", FIELD_REAL, -1, 0},
    {"tokens_per_s", "res.tokens_per_s", FIELD_REAL, +1, 1},
    {"tokens_per_s_per_gpu", "res.tokens_per_s_per_gpu", FIELD_REAL, +1, 1},
    {"flops_per_token", "res.flops_per_token", FIELD_REAL, 0, 0},
    {"mfu", "res.mfu", FIELD_REAL, +1, 1},
    {"peak_mem_bytes", "res.peak_mem_bytes", FIELD_INT, -1, 1},
    {"final_loss", "res.final_loss", FIELD_REAL, -1, 1},
    {"exit_status", "res.exit_status", FIELD_ANY, 0, 0},
    {"device", "res.device", FIELD_TEXT, 0, 0},
    {"device_count", "res.device_count", FIELD_INT, 0, 0},
    {"nodes", "res.nodes", FIELD_INT, 0, 0},
    {"versions", "res.versions", FIELD_JSON, 0, 0},
};

/* Keep in the order of the columns of `metrics` after `run, step`. */
static const db_field metric_fields[] = {
    {"loss", NULL, FIELD_REAL, -1, 0},
    {"grad_norm", NULL, FIELD_REAL, 0, 0},
    {"lr", NULL, FIELD_REAL, 0, 0},
    {"step_ms", NULL, FIELD_REAL, -1, 0},
    {"tokens", NULL, FIELD_INT, 0, 0},
    {"tokens_per_s", NULL, FIELD_REAL, +1, 0},
    {"encoder_ms", NULL, FIELD_REAL, -1, 0},
    {"decoder_ms", NULL, FIELD_REAL, -1, 0},
    {"peak_mem_bytes", NULL, FIELD_INT, -1, 0},
};

const db_field_table db_run_fields = {run_fields, N(run_fields)};
const db_field_table db_result_fields = {result_fields, N(result_fields)};
const db_field_table db_metric_fields = {metric_fields, N(metric_fields)};

const db_field *db_field_find(const db_field_table *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->v[i].name, name) == 0)
            return &t->v[i];
    return NULL;
}
