/* select_encoder.c - ranking encoder layouts by measured or predicted tokens/s
 * (select_encoder.h). */
#include "select_encoder.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "stats.h"

static double median(double *v, size_t n)
{
    stats_summary s;
    stats_summarize(v, n, &s);
    return s.median;
}

static const char *device_name(device_kind d)
{
    return d == DEVICE_CUDA ? "cuda" : "cpu";
}

void select_encoder_rates(const run_config *c, const select_run *runs, size_t n_runs,
                          const select_bench_set *b, select_cost_rates *rates)
{
    select_cost_nominal(c->device, rates);
    double *v = malloc((n_runs ? n_runs : 1) * sizeof *v);
    size_t n = 0;
    for (size_t i = 0; v && i < n_runs; i++)
        if (strcmp(runs[i].device, device_name(c->device)) == 0 &&
            runs[i].flops_per_token > 0 && runs[i].tokens_per_s_per_gpu > 0)
            v[n++] = runs[i].flops_per_token * runs[i].tokens_per_s_per_gpu;
    double rate;
    if (n) {
        rates->flops_per_s = median(v, n);
        snprintf(rates->source, sizeof rates->source,
                 "median achieved FLOP/s of %zu run%s of the model", n, n == 1 ? "" : "s");
    } else if (b && c->device == DEVICE_CUDA && select_cost_rate_from_bench(&c->model, b, &rate)) {
        rates->flops_per_s = rate;
        snprintf(rates->source, sizeof rates->source, "decoder layer benchmarks on %.60s",
                 b->gpu);
    }
    free(v);
}

static int run_matches(const select_run *r, const run_config *c, int match_gb)
{
    return strcmp(r->device, device_name(c->device)) == 0 && r->ranks == c->ranks &&
           r->seq_len == c->train.seq_len && r->micro_batch == c->train.micro_batch &&
           (!match_gb || r->global_batch == c->train.global_batch) &&
           r->tp == c->parallel.tp && r->pp == c->parallel.pp && r->vpp == c->parallel.vpp &&
           r->cp == c->parallel.cp &&
           strcmp(r->strategy, encoder_strategy_name(c->parallel.encoder.strategy)) == 0 &&
           r->etp == c->parallel.encoder.tp && !r->offload == !c->parallel.encoder.offload;
}

static int cand_cmp(const void *a, const void *b)
{
    const select_enc_cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return (y->n_measured > 0) - (x->n_measured > 0);
}

/* Appends candidate `c` when it is valid. */
static int add_cand(select_enc_result *out, size_t *cap, const run_config *c,
                    const select_run *runs, size_t n_runs, const select_cost_rates *rates,
                    int match_gb, double *scratch)
{
    hearth_err ignored;
    if (run_config_check_rules(c, &ignored))
        return 0;
    if (out->n == *cap) {
        select_enc_cand *g = realloc(out->c, (*cap = *cap * 2 + 8) * sizeof *g);
        if (!g)
            return HERR_NOMEM;
        out->c = g;
    }
    select_enc_cand *k = &out->c[out->n++];
    memset(k, 0, sizeof *k);
    k->cfg = *c;
    size_t m = 0;
    for (size_t i = 0; i < n_runs; i++)
        if (run_matches(&runs[i], c, match_gb))
            scratch[m++] = runs[i].tokens_per_s;
    select_cost pc;
    select_cost_predict(c, rates, &pc);
    k->predicted = pc.tokens_per_s;
    k->predicted_step_s = pc.step_s;
    k->embedding_bytes = pc.embedding_bytes;
    k->n_measured = (int)m;
    if (m) {
        stats_summary st;
        stats_summarize(scratch, m, &st);
        k->measured = st.median;
        k->measured_min = st.min;
        k->measured_max = st.max;
        out->n_measured++;
    }
    k->score = m ? k->measured : k->predicted;
    return 0;
}

int select_encoder_rank(const run_config *bases, size_t n_bases, const select_run *runs,
                        size_t n_runs, const select_cost_rates *rates, int match_global_batch,
                        select_enc_result *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    out->rates = *rates;
    size_t cap = 0;
    double *scratch = malloc((n_runs ? n_runs : 1) * sizeof *scratch);
    int rc = scratch ? 0 : HERR_NOMEM;
    for (size_t b = 0; !rc && b < n_bases; b++) {
        run_config c = bases[b];
        int tp = c.parallel.tp;
        c.parallel.encoder.offload = 0;
        c.parallel.encoder.strategy = ENC_UNIFORM;
        c.parallel.encoder.tp = tp;
        rc = add_cand(out, &cap, &c, runs, n_runs, rates, match_global_batch, scratch);
        c.parallel.encoder.strategy = ENC_HETERO_TP;
        for (int etp = tp - 1; !rc && etp >= 1; etp--) {
            if (tp % etp)
                continue;
            c.parallel.encoder.tp = etp;
            rc = add_cand(out, &cap, &c, runs, n_runs, rates, match_global_batch, scratch);
        }
        c.parallel.encoder.tp = 1;
        c.parallel.encoder.strategy = ENC_HETERO_DP;
        if (!rc)
            rc = add_cand(out, &cap, &c, runs, n_runs, rates, match_global_batch, scratch);
        c.parallel.encoder.strategy = ENC_FULL_SEPARATION;
        for (int off = 0; !rc && off < 2; off++) {
            c.parallel.encoder.offload = off;
            rc = add_cand(out, &cap, &c, runs, n_runs, rates, match_global_batch, scratch);
        }
    }
    free(scratch);
    if (rc) {
        select_encoder_result_free(out);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    qsort(out->c, out->n, sizeof *out->c, cand_cmp);
    return 0;
}

void select_encoder_result_free(select_enc_result *r)
{
    free(r->c);
    r->c = NULL;
    r->n = r->n_measured = 0;
}

void select_encoder_label(const run_config *c, char *buf, size_t size)
{
    switch (c->parallel.encoder.strategy) {
    case ENC_HETERO_TP:
        snprintf(buf, size, "hetero_tp(etp %d)", c->parallel.encoder.tp);
        break;
    case ENC_FULL_SEPARATION:
        snprintf(buf, size, "full_separation%s", c->parallel.encoder.offload ? "+offload" : "");
        break;
    default:
        snprintf(buf, size, "%s", encoder_strategy_name(c->parallel.encoder.strategy));
        break;
    }
}

int select_encoder_write_sweep(const select_enc_result *r, const char *model, int repeat,
                               int with_global_batch, FILE *f)
{
    if (r->n_measured == r->n || r->n == 0)
        return 0;
    const run_config *b = &r->c[0].cfg;
    fprintf(f, "name: encoder-%s-%dr\nbase:\n  model: %s\n  device: %s\n", model, b->ranks,
            model, device_name(b->device));
    if (b->device != DEVICE_CUDA)
        fprintf(f, "  ranks: %d\n", b->ranks);
    fprintf(f, "  train: {seq_len: %d, micro_batch: %d", b->train.seq_len, b->train.micro_batch);
    if (with_global_batch)   /* else auto: micro_batch x dp of each layout */
        fprintf(f, ", global_batch: %d", b->train.global_batch);
    fprintf(f, "}\n");
    if (b->device == DEVICE_CUDA)
        fprintf(f, "resources: {nodes: 1, gpus_per_node: %d}\n", b->ranks);
    fprintf(f, "include:\n");
    for (size_t i = 0; i < r->n; i++) {
        const run_config *c = &r->c[i].cfg;
        if (r->c[i].n_measured)
            continue;
        fprintf(f, "  - {parallel.tp: %d, parallel.pp: %d, parallel.vpp: %d, "
                   "parallel.encoder.strategy: %s, parallel.encoder.tp: %d, "
                   "parallel.encoder.offload: %s}\n", c->parallel.tp, c->parallel.pp,
                c->parallel.vpp, encoder_strategy_name(c->parallel.encoder.strategy),
                c->parallel.encoder.tp, c->parallel.encoder.offload ? "true" : "false");
    }
    fprintf(f, "repeat: %d\n", repeat);
    return ferror(f) ? -1 : 0;
}

char *select_encoder_evidence_json(const select_enc_result *r)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < r->n; i++) {
        const select_enc_cand *k = &r->c[i];
        char label[48];
        select_encoder_label(&k->cfg, label, sizeof label);
        json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:s, s:f, s:f}", "encoder", label, "tp",
                              k->cfg.parallel.tp, "pp", k->cfg.parallel.pp, "runs",
                              k->n_measured, "source", k->n_measured ? "measured" : "predicted",
                              "tokens_per_s", k->score, "predicted", k->predicted);
        if (o && k->n_measured) {
            json_object_set_new(o, "min", json_real(k->measured_min));
            json_object_set_new(o, "max", json_real(k->measured_max));
        }
        json_array_append_new(a, o);
    }
    json_t *ev = json_pack("{s:o, s:s}", "candidates", a, "rate_source", r->rates.source);
    char *s = ev ? json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(ev);
    return s;
}

char *select_encoder_decision_json(const run_config *c)
{
    json_t *dj = json_pack("{s:s, s:i, s:i, s:i, s:b}", "strategy",
                           encoder_strategy_name(c->parallel.encoder.strategy), "tp",
                           c->parallel.encoder.tp, "decoder_tp", c->parallel.tp, "decoder_pp",
                           c->parallel.pp, "offload", c->parallel.encoder.offload);
    char *s = dj ? json_dumps(dj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(dj);
    return s;
}
