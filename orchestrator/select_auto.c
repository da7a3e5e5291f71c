/* select_auto.c - `auto` values resolved at plan time, and the plan's cost estimate
 * (select_auto.h). */
#include "select_auto.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/sha.h>

#include "rundir.h"
#include "select_db.h"
#include "select_encoder.h"
#include "select_fp8.h"
#include "shape/fp8_linears.h"

/* The step-time estimate of one point. */
typedef struct {
    uint64_t index;
    double step_s;
    int ranks, steps;
} point_est;

struct select_auto {
    hearth_db *db;
    const spec *s;
    char policy_dir[PATH_MAX];
    int write_policies;
    int estimate;             /* keep a step-time estimate per point */
    /* the runs and layer benchmarks of the last model seen (sweeps rarely change it) */
    char model[256];
    select_run *runs;
    size_t n_runs;
    select_bench_set bench;
    int have_bench;
    char rate_source[96];
    select_auto_note *notes;
    size_t n_notes, cap_notes;
    point_est *est;
    size_t n_est, cap_est;
};

int select_auto_create(select_auto **out, hearth_db *db, const spec *s, const char *policy_dir,
                       int write_policies, int estimate, hearth_err *err)
{
    select_auto *a = calloc(1, sizeof *a);
    if (!a)
        return herr_set(err, HERR_NOMEM, "out of memory");
    a->db = db;
    a->s = s;
    snprintf(a->policy_dir, sizeof a->policy_dir, "%s", policy_dir ? policy_dir : "policies");
    a->write_policies = write_policies;
    a->estimate = estimate;
    *out = a;
    return 0;
}

static void note_free(select_auto_note *n)
{
    free(n->subject);
    free(n->enc_decision);
    free(n->enc_evidence);
    free(n->fp8_decision);
    free(n->fp8_evidence);
    free(n->fp8_table);
}

void select_auto_free(select_auto *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n_notes; i++)
        note_free(&a->notes[i]);
    free(a->notes);
    free(a->est);
    free(a->runs);
    select_bench_set_free(&a->bench);
    free(a);
}

/* Loads the runs and newest layer benchmarks of cfg's model once per model. */
static int load_model(select_auto *a, const run_config *cfg, hearth_err *err)
{
    if (a->model[0] && strcmp(a->model, cfg->model_preset) == 0)
        return 0;
    free(a->runs);
    a->runs = NULL;
    a->n_runs = 0;
    select_bench_set_free(&a->bench);
    a->have_bench = 0;
    snprintf(a->model, sizeof a->model, "%s", cfg->model_preset);
    if (!a->db)
        return 0;
    int rc = select_runs_of_model(a->db, cfg->model_preset, &a->runs, &a->n_runs, err);
    if (rc)
        return rc;
    int found = select_bench_load(a->db, cfg->model_preset, NULL, &a->bench, err);
    if (found < 0)
        return found;
    a->have_bench = found;
    return 0;
}

/* Which SPEC_AUTO_* values point pt leaves to us: its own `auto` values, else the base's. */
static unsigned point_auto(const spec *s, const expand_point *pt)
{
    static const struct { const char *key; unsigned bit; } keys[] = {
        { "parallel.encoder.strategy", SPEC_AUTO_ENCODER }, { "precision.fp8", SPEC_AUTO_FP8 },
    };
    unsigned which = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const spec_value *v = expand_point_get(pt, keys[i].key);
        if (v ? strcmp(v->text, "auto") == 0 && !v->node->quoted : (s->base_auto & keys[i].bit))
            which |= keys[i].bit;
    }
    return which;
}

static int resolve_encoder(select_auto *a, run_config *cfg, const select_cost_rates *rates,
                           select_auto_note *n, hearth_err *err)
{
    select_enc_result r;
    int rc = select_encoder_rank(cfg, 1, a->runs, a->n_runs, rates, 1, &r, err);
    if (rc)
        return rc;
    if (r.n == 0) {
        snprintf(n->encoder, sizeof n->encoder, "parallel.encoder.strategy=uniform: no other "
                 "layout is valid here");
        n->enc_method = "none";
    } else {
        const select_enc_cand *best = &r.c[0];
        cfg->parallel.encoder = best->cfg.parallel.encoder;
        char label[48];
        select_encoder_label(cfg, label, sizeof label);
        int k = snprintf(n->encoder, sizeof n->encoder, "parallel.encoder.strategy=%s "
                         "(encoder tp %d, offload %s): ", encoder_strategy_name(
                         cfg->parallel.encoder.strategy), cfg->parallel.encoder.tp,
                         cfg->parallel.encoder.offload ? "true" : "false");
        if (k > 0 && (size_t)k < sizeof n->encoder) {
            if (best->n_measured)
                snprintf(n->encoder + k, sizeof n->encoder - (size_t)k, "measured %.1f tokens/s "
                         "(median of %d run%s, %.1f..%.1f); best of %zu layouts, %zu measured",
                         best->measured, best->n_measured, best->n_measured == 1 ? "" : "s",
                         best->measured_min, best->measured_max, r.n, r.n_measured);
            else
                snprintf(n->encoder + k, sizeof n->encoder - (size_t)k, "predicted %.1f "
                         "tokens/s by the cost model (%s); best of %zu layouts, %zu measured",
                         best->predicted, rates->source, r.n, r.n_measured);
        }
        n->enc_method = best->n_measured ? "measured" : "predicted";
        n->enc_decision = select_encoder_decision_json(cfg);
        n->enc_evidence = select_encoder_evidence_json(&r);
        if (!n->enc_decision || !n->enc_evidence)
            rc = herr_set(err, HERR_NOMEM, "out of memory");
    }
    select_encoder_result_free(&r);
    return rc;
}

/* The evidence table of the plan's output (malloc'd; NULL when out of memory). */
static char *fp8_table(const select_bench_set *b, const select_fp8_opts *o,
                       const select_fp8_policy *p)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    select_fp8_print(b, o, p, "      ", f);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* How many linears of the point's model the derived policy puts in FP8. */
static int policy_linears(const select_fp8_policy *p, const run_config *cfg, int *used,
                          hearth_err *err)
{
    fp8_plan plan;
    int rc = select_fp8_plan(p, &plan, err);
    if (!rc)
        *used = fp8_plan_count(&plan, cfg);
    fp8_plan_clear(&plan);
    return rc;
}

static int resolve_fp8(select_auto *a, run_config *cfg, select_auto_note *n, hearth_err *err)
{
    cfg->precision.fp8 = FP8_OFF;
    cfg->precision.fp8_policy[0] = '\0';
    n->fp8_method = "none";
    if (!a->have_bench) {
        snprintf(n->fp8, sizeof n->fp8, "precision.fp8=off: no layer benchmarks of model %.100s "
                 "in the database (`hearth bench ingest`)", cfg->model_preset);
        return 0;
    }
    /* speedups of one device say nothing about another (and the trainer refuses a
     * policy measured elsewhere) */
    int cpu_set = select_fp8_cpu_warning(&a->bench) != NULL;
    if (cpu_set != (cfg->device == DEVICE_CPU)) {
        snprintf(n->fp8, sizeof n->fp8, "precision.fp8=off: the newest layer benchmarks of "
                 "model %.100s ran on %.60s, this point runs on %s", cfg->model_preset,
                 a->bench.gpu, cfg->device == DEVICE_CPU ? "the cpu" : "a GPU");
        return 0;
    }
    /* the spec's auto.fp8 where it sets them */
    select_fp8_opts o = { .threshold = a->s->fp8_threshold > 0 ? a->s->fp8_threshold
                                                                : SELECT_FP8_THRESHOLD,
                          .max_err = a->s->fp8_max_err >= 0 ? a->s->fp8_max_err
                                                             : SELECT_FP8_MAX_ERR };
    /* each component at the token count its linears see (what the trainer matches) */
    fp8_micro_tokens mt;
    fp8_micro_tokens_of(cfg, &mt);
    o.tokens = (long)mt.decoder;
    o.encoder_tokens = (long)mt.encoder;
    o.projector_tokens = (long)mt.projector;
    select_fp8_policy p;
    int rc = select_fp8_derive(&a->bench, &o, &p, err);
    if (rc)
        return rc;
    n->fp8_method = "measured";
    n->fp8_decision = select_fp8_decision_json(&p);
    n->fp8_evidence = select_fp8_evidence_json(&a->bench, &o, &p);
    if (cpu_set)
        n->fp8_warning = select_fp8_cpu_warning(&a->bench);
    n->fp8_table = fp8_table(&a->bench, &o, &p);
    char *yaml = p.n_rules ? select_fp8_yaml(&a->bench, &o, &p) : NULL;
    int used = -1;   /* linears of this point the policy puts in FP8 */
    if (p.n_rules && !(rc = policy_linears(&p, cfg, &used, err)) && used == 0) {
        /* a policy that changes nothing: say so, and run as what it is */
        free(n->fp8_decision);
        n->fp8_decision = strdup("{\"fp8\":\"off\",\"reason\":\"the policy matches no "
                                 "linear of the point\"}");
        n->fp8_warning = "the selective FP8 policy from the layer benchmarks matches no "
                         "linear of this point (component, kind, tp and token range, after "
                         "keep_bf16): resolved to off";
    }
    if (rc) {
        /* reported below */
    } else if (!n->fp8_decision || !n->fp8_evidence || !n->fp8_table || (p.n_rules && !yaml)) {
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    } else if (used == 0) {
        snprintf(n->fp8, sizeof n->fp8, "precision.fp8=off: the %zu rule%s from layer "
                 "benchmarks on %.60s at %ld tokens match no linear of this point",
                 p.n_rules, p.n_rules == 1 ? "" : "s", a->bench.gpu, o.tokens);
    } else if (!p.n_rules) {
        snprintf(n->fp8, sizeof n->fp8, "precision.fp8=off: no layer kind reaches speedup %.2f "
                 "within error %.3g at %ld tokens in the layer benchmarks on %.60s",
                 o.threshold, o.max_err, o.tokens, a->bench.gpu);
    } else {
        unsigned char md[SHA256_DIGEST_LENGTH];
        SHA256((const unsigned char *)yaml, strlen(yaml), md);
        char path[PATH_MAX + 64];
        int len = snprintf(path, sizeof path, "%s/fp8-", a->policy_dir);
        for (int i = 0; i < 8 && len > 0; i++)
            len += snprintf(path + len, sizeof path - (size_t)len, "%02x", md[i]);
        snprintf(path + len, sizeof path - (size_t)len, ".yaml");
        if (strlen(path) >= sizeof cfg->precision.fp8_policy)
            rc = herr_set(err, HERR_CONFIG, "%s: path too long for precision.fp8_policy", path);
        if (!rc) {
            cfg->precision.fp8 = FP8_SELECTIVE;
            snprintf(cfg->precision.fp8_policy, sizeof cfg->precision.fp8_policy, "%s", path);
            snprintf(n->fp8, sizeof n->fp8, "precision.fp8=selective: %zu rule%s from layer "
                     "benchmarks on %.60s at %ld tokens (policy %.100s)", p.n_rules,
                     p.n_rules == 1 ? "" : "s", a->bench.gpu, o.tokens, path);
        }
        /* a layout rule against fp8 here (a cpu device, ...): off, and why */
        hearth_err with, without;
        if (!rc && run_config_check_rules(cfg, &with)) {
            cfg->precision.fp8 = FP8_OFF;
            if (run_config_check_rules(cfg, &without) == 0) {
                cfg->precision.fp8_policy[0] = '\0';
                snprintf(n->fp8, sizeof n->fp8, "precision.fp8=off: selective would break "
                         "%.200s", with.msg);
                free(n->fp8_decision);
                n->fp8_decision = NULL;   /* recorded as off, the reason as evidence */
                free(n->fp8_evidence);
                n->fp8_evidence = NULL;
            } else {
                cfg->precision.fp8 = FP8_SELECTIVE;   /* pruned anyway, for another rule */
            }
        }
        if (!rc && cfg->precision.fp8 == FP8_SELECTIVE && a->write_policies &&
            access(path, F_OK) != 0 && !(rc = rundir_mkdirs(a->policy_dir, err)))
            rc = rundir_write_file(path, yaml, strlen(yaml), 0644, err);
    }
    free(yaml);
    select_fp8_policy_free(&p);
    return rc;
}

static select_auto_note *new_note(select_auto *a, uint64_t index)
{
    if (a->n_notes && a->notes[a->n_notes - 1].index == index) {
        /* the same point again: start over */
        note_free(&a->notes[--a->n_notes]);
    }
    if (a->n_notes == a->cap_notes) {
        size_t cap = a->cap_notes ? 2 * a->cap_notes : 16;
        select_auto_note *g = realloc(a->notes, cap * sizeof *g);
        if (!g)
            return NULL;
        a->notes = g;
        a->cap_notes = cap;
    }
    select_auto_note *n = &a->notes[a->n_notes++];
    memset(n, 0, sizeof *n);
    n->index = index;
    return n;
}

static int add_estimate(select_auto *a, uint64_t index, const run_config *cfg,
                        const select_cost_rates *rates)
{
    if (a->n_est == a->cap_est) {
        size_t cap = a->cap_est ? 2 * a->cap_est : 64;
        point_est *g = realloc(a->est, cap * sizeof *g);
        if (!g)
            return HERR_NOMEM;
        a->est = g;
        a->cap_est = cap;
    }
    select_cost c;
    select_cost_predict(cfg, rates, &c);
    a->est[a->n_est++] = (point_est){ index, c.step_s, cfg->ranks, cfg->train.steps };
    snprintf(a->rate_source, sizeof a->rate_source, "%s", rates->source);
    return 0;
}

int select_auto_resolve(void *ctx, const expand_point *pt, run_config *cfg, hearth_err *err)
{
    select_auto *a = ctx;
    unsigned which = point_auto(a->s, pt);
    int rc = load_model(a, cfg, err);
    if (rc)
        return rc;
    select_cost_rates rates;
    select_encoder_rates(cfg, a->runs, a->n_runs, a->have_bench ? &a->bench : NULL, &rates);
    select_auto_note *n = NULL;
    if (which) {
        if (!(n = new_note(a, pt->seq)))
            return herr_set(err, HERR_NOMEM, "out of memory");
        n->which = which;
        if ((which & SPEC_AUTO_ENCODER) && (rc = resolve_encoder(a, cfg, &rates, n, err)))
            return rc;
        if ((which & SPEC_AUTO_FP8) && (rc = resolve_fp8(a, cfg, n, err)))
            return rc;
        hearth_err ignored;
        if (run_config_check_rules(cfg, &ignored) == 0 && (rc = run_config_hash(cfg, n->hash,
                                                                                 err)))
            return rc;
        json_t *sj = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i}", "model",
                               cfg->model_preset, "device",
                               cfg->device == DEVICE_CUDA ? "cuda" : "cpu", "ranks", cfg->ranks,
                               "seq_len", cfg->train.seq_len, "micro_batch",
                               cfg->train.micro_batch, "tp", cfg->parallel.tp, "pp",
                               cfg->parallel.pp);
        n->subject = sj ? json_dumps(sj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(sj);
        if (!n->subject)
            return herr_set(err, HERR_NOMEM, "out of memory");
    }
    if (a->estimate && add_estimate(a, pt->seq, cfg, &rates))
        return herr_set(err, HERR_NOMEM, "out of memory");
    return 0;
}

const select_auto_note *select_auto_note_of(const select_auto *a, uint64_t index)
{
    size_t lo = 0, hi = a->n_notes;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->notes[mid].index < index)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < a->n_notes && a->notes[lo].index == index ? &a->notes[lo] : NULL;
}

static const point_est *est_of(const select_auto *a, uint64_t index)
{
    size_t lo = 0, hi = a->n_est;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->est[mid].index < index)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < a->n_est && a->est[lo].index == index ? &a->est[lo] : NULL;
}

/* Whether a decision of this kind is already recorded for the point. */
static int recorded(select_auto *a, const char *experiment, const char *hash, const char *kind,
                    hearth_err *err)
{
    sqlite3_stmt *st;
    int rc = db_prepare(a->db, "SELECT 1 FROM decisions WHERE experiment = ?1 AND "
                        "config_hash = ?2 AND kind = ?3", &st, err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, experiment, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    db_stmt_done(st);
    if (s == SQLITE_ROW)
        return 1;
    return s == SQLITE_DONE ? 0 : db_fail(a->db, err, "reading decisions");
}

int select_auto_record(select_auto *a, const char *experiment, hearth_err *err)
{
    if (!a->db || !a->n_notes)
        return 0;
    int rc = db_tx_begin(a->db, err);
    for (size_t i = 0; !rc && i < a->n_notes; i++) {
        const select_auto_note *n = &a->notes[i];
        if (!n->hash[0])
            continue;   /* the point broke a rule: nothing runs */
        for (int k = 0; !rc && k < 2; k++) {
            const char *kind = k ? "fp8" : "encoder";
            const char *dec = k ? n->fp8_decision : n->enc_decision;
            const char *ev = k ? n->fp8_evidence : n->enc_evidence;
            const char *method = k ? n->fp8_method : n->enc_method;
            if (!(n->which & (k ? SPEC_AUTO_FP8 : SPEC_AUTO_ENCODER)))
                continue;
            int have = recorded(a, experiment, n->hash, kind, err);
            if (have < 0) {
                rc = have;
                break;
            }
            if (have)
                continue;
            /* "off" without benchmarks: the reason is the evidence */
            char *dec_off = NULL, *ev_off = NULL;
            if (!dec)
                dec = dec_off = strdup("{\"fp8\":\"off\"}");
            if (!ev) {
                json_t *o = json_pack("{s:s}", "reason", k ? n->fp8 : n->encoder);
                ev = ev_off = o ? json_dumps(o, JSON_COMPACT) : NULL;
                json_decref(o);
            }
            if (!dec || !ev) {
                rc = herr_set(err, HERR_NOMEM, "out of memory");
            } else {
                select_decision d = { kind, experiment, n->hash, n->subject, dec, method, ev };
                rc = select_decision_record(a->db, &d, NULL, err);
            }
            free(dec_off);
            free(ev_off);
        }
    }
    return db_tx_end(a->db, rc, err);
}

int select_auto_print(select_auto *a, const plan_result *r, FILE *f, hearth_err *err)
{
    int any = 0;
    for (int i = 0; i < r->n; i++) {
        const plan_entry *e = &r->e[i];
        const select_auto_note *n = e->status == PLAN_KEPT ? select_auto_note_of(a, e->index)
                                                           : NULL;
        if (!n)
            continue;
        if (!any)
            fprintf(f, "\nauto values (from %s):\n", a->db ? db_path(a->db) : "no database: "
                    "the cost model and no layer benchmarks");
        any = 1;
        fprintf(f, "  point %" PRIu64 ":\n", e->index + 1);
        if (n->encoder[0])
            fprintf(f, "    %s\n", n->encoder);
        if (n->fp8[0])
            fprintf(f, "    %s\n", n->fp8);
        if (n->fp8_warning)
            fprintf(f, "    warning: %s\n", n->fp8_warning);
        if (n->fp8_table)
            fputs(n->fp8_table, f);
    }
    double hours = 0;
    long from_runs = 0, from_model = 0;
    for (int i = 0; i < r->n; i++) {
        const plan_entry *e = &r->e[i];
        const point_est *pe = e->status == PLAN_KEPT ? est_of(a, e->index) : NULL;
        if (!pe)
            continue;
        double step_s = pe->step_s, ms = 0;
        long n = 0;
        int rc = a->db && e->hash[0] ? select_runs_of_hash(a->db, e->hash, &ms, &n, err) : 0;
        if (rc)
            return rc;
        if (n > 0) {
            step_s = ms / 1e3;
            from_runs++;
        } else {
            from_model++;
        }
        hours += e->runs * (double)pe->steps * step_s * pe->ranks / 3600.0;
    }
    if (from_runs + from_model) {
        fprintf(f, "\nestimated GPU-hours of the kept runs: %.3g (", hours);
        if (from_runs)
            fprintf(f, "%ld point%s from prior runs of the same config%s", from_runs,
                    from_runs == 1 ? "" : "s", from_model ? ", " : "");
        if (from_model)
            fprintf(f, "%ld point%s from the cost model: %s", from_model,
                    from_model == 1 ? "" : "s", a->rate_source);
        fprintf(f, "; a cpu rank counts as a GPU)\n");
    }
    return ferror(f) ? herr_set(err, HERR_IO, "writing the plan failed") : 0;
}
