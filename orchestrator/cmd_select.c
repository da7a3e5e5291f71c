/* cmd_select.c - `hearth select fp8` and `hearth select encoder` (docs/select.md): the
 * command-line side of select_fp8.h and select_encoder.h, with the decision recorded. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cmd.h"
#include "report_fmt.h"
#include "rundir.h"
#include "select_db.h"
#include "select_encoder.h"
#include "select_fp8.h"
#include "shape/fp8_linears.h"

/* Options that belong to one subcommand only. */
static int check_only(hcli_ctx *c, const char *what, const char *const *names, hearth_err *err)
{
    for (int i = 0; names[i]; i++)
        if (hcli_get(c, names[i]))
            return herr_set(err, HERR_CONFIG, "--%s does not apply to `select %s`", names[i],
                            what);
    return 0;
}

static int need(hcli_ctx *c, const char *name, hearth_err *err)
{
    return hcli_get(c, name) ? 0 : herr_set(err, HERR_CONFIG, "--%s is required", name);
}

static int parse_double(const char *name, const char *v, double *out, hearth_err *err)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !(x > 0) || !isfinite(x))
        return herr_set(err, HERR_CONFIG, "--%s %s: expected a number > 0", name, v);
    *out = x;
    return 0;
}

/* ---- select fp8 ------------------------------------------------------------------------ */

/* The token counts of a run of `model` at sequence `seq` with the --set overrides: the
 * decoder's, the encoder's (patches) and the projector's (merged units) of one rank's
 * micro batch, the counts `precision.fp8: auto` derives its policy at. */
static int fp8_run_tokens(hcli_ctx *c, const char *model, long seq, int n_set,
                          select_fp8_opts *o, hearth_err *err)
{
    config_override *ovr = calloc((size_t)n_set, sizeof *ovr);
    if (!ovr)
        return herr_set(err, HERR_NOMEM, "out of memory");
    for (int i = 0; i < n_set; i++)
        ovr[i] = (config_override){ hcli_get_nth(c, "set", i), NULL };   /* KEY=VALUE */
    char yaml[1200];
    snprintf(yaml, sizeof yaml, "model: \"%.900s\"\ntrain: {seq_len: %ld}\n", model, seq);
    run_config cfg;
    int rc = run_config_parse(&cfg, "select fp8", yaml, ovr, n_set, 0, err);
    free(ovr);
    if (rc)
        return rc;
    fp8_micro_tokens mt;
    fp8_micro_tokens_of(&cfg, &mt);
    o->tokens = (long)mt.decoder;
    o->encoder_tokens = (long)mt.encoder;
    o->projector_tokens = (long)mt.projector;
    return 0;
}

static int select_fp8_cmd(hcli_ctx *c, hearth_db *db, hearth_err *err)
{
    static const char *const other[] = { "gpus", "layout", "device", "global-batch", "repeat",
                                         "format", NULL };
    int rc = check_only(c, "fp8", other, err);
    if (!rc)
        rc = need(c, "model", err);
    if (!rc)
        rc = need(c, "seq", err);
    if (!rc)
        rc = need(c, "out", err);
    select_fp8_opts o = { .threshold = SELECT_FP8_THRESHOLD, .max_err = SELECT_FP8_MAX_ERR };
    long seq = 0;
    if (!rc && hcli_get(c, "threshold"))
        rc = parse_double("threshold", hcli_get(c, "threshold"), &o.threshold, err);
    if (!rc && hcli_get(c, "max-err"))
        rc = parse_double("max-err", hcli_get(c, "max-err"), &o.max_err, err);
    if (!rc)
        rc = hcli_get_long(c, "seq", 0, 1, &seq, err);
    if (!rc)
        rc = select_fp8_parse_allow(hcli_get(c, "allow"), &o, err);
    if (rc)
        return rc;
    o.tokens = seq;
    const char *model = hcli_get(c, "model"), *gpu = hcli_get(c, "gpu");
    /* --set: the run's shape, each component at the token count its linears see on one
     * rank (fp8_micro_tokens_of), as `precision.fp8: auto` resolves it */
    int n_set = hcli_count(c, "set");
    if (n_set && (rc = fp8_run_tokens(c, model, seq, n_set, &o, err)))
        return rc;
    select_bench_set b;
    int found = select_bench_load(db, model, gpu, &b, err);
    if (found < 0)
        return found;
    if (!found)
        return herr_set(err, HERR_CONFIG, "no layer benchmarks of model %s%s%s in %s "
                        "(`hearth bench ingest FILE` records a layer_bench.json)", model,
                        gpu ? " on GPU " : "", gpu ? gpu : "", db_path(db));
    select_fp8_policy p;
    char *yaml = NULL, *decision = NULL, *evidence = NULL, *subject = NULL;
    if ((rc = select_fp8_derive(&b, &o, &p, err))) {
        select_bench_set_free(&b);
        return rc;
    }
    yaml = select_fp8_yaml(&b, &o, &p);
    decision = select_fp8_decision_json(&p);
    evidence = select_fp8_evidence_json(&b, &o, &p);
    json_t *sj = json_pack("{s:s, s:s, s:I, s:f, s:f, s:s}", "model", model, "gpu", b.gpu,
                           "tokens", (json_int_t)o.tokens, "threshold", o.threshold,
                           "max_err", o.max_err, "allow",
                           hcli_get(c, "allow") ? hcli_get(c, "allow") : "");
    if (sj && n_set) {
        json_object_set_new(sj, "encoder_tokens", json_integer(o.encoder_tokens));
        json_object_set_new(sj, "projector_tokens", json_integer(o.projector_tokens));
    }
    subject = sj ? json_dumps(sj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(sj);
    if (!yaml || !decision || !evidence || !subject)
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    const char *out = hcli_get(c, "out");
    if (!rc)
        rc = rundir_write_file(out, yaml, strlen(yaml), 0644, err);
    int64_t id = 0;
    if (!rc) {
        select_decision d = { "fp8", NULL, NULL, subject, decision, "measured", evidence };
        rc = select_decision_record(db, &d, &id, err);
    }
    if (!rc) {
        if (select_fp8_cpu_warning(&b))
            fprintf(stderr, "hearth: warning: %s\n", select_fp8_cpu_warning(&b));
        if (n_set)
            printf("token counts of one rank's micro batch: decoder %ld, encoder %ld, "
                   "projector %ld\n", o.tokens, o.encoder_tokens, o.projector_tokens);
        select_fp8_print(&b, &o, &p, "", stdout);
        if (p.n_rules)
            printf("\n%zu rule%s: FP8 where the speedup holds, bf16 elsewhere; kept bf16: ",
                   p.n_rules, p.n_rules == 1 ? "" : "s");
        else
            printf("\nno layer kind reaches the threshold within the error tolerance: every "
                   "linear stays bf16; kept bf16: ");
        for (int i = 0; i < p.n_keep; i++)
            printf("%s%s", i ? ", " : "", p.keep_bf16[i]);
        printf("%s\npolicy written to %s (decision %lld)\n", p.n_keep ? "" : "nothing", out,
               (long long)id);
    }
    free(yaml);
    free(decision);
    free(evidence);
    free(subject);
    select_fp8_policy_free(&p);
    select_bench_set_free(&b);
    return rc;
}

/* ---- select encoder -------------------------------------------------------------------- */

/* --layout "tp=2,pp=1,micro_batch=2": decoder layout and batch keys as overrides. */
static int layout_overrides(const char *layout, char (*keys)[48], char (*vals)[32],
                            config_override *ovr, int *n, int *has_tp, int *has_pp,
                            int *has_gb, hearth_err *err)
{
    static const char *const par[] = { "tp", "pp", "vpp", "cp", "ep", "sp", NULL };
    static const char *const train[] = { "micro_batch", "global_batch", NULL };
    for (const char *p = layout ? layout : ""; *p; ) {
        size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        if (len == 0) {
            p++;
            continue;
        }
        if (!eq || *n >= 8)
            return herr_set(err, HERR_CONFIG, "--layout: expected KEY=VALUE,... got '%.*s'",
                            (int)len, p);
        int kl = (int)(eq - p), found = 0;
        for (int i = 0; par[i] && !found; i++)
            if ((int)strlen(par[i]) == kl && strncmp(p, par[i], (size_t)kl) == 0) {
                snprintf(keys[*n], 48, "parallel.%s", par[i]);
                found = 1;
            }
        for (int i = 0; train[i] && !found; i++)
            if ((int)strlen(train[i]) == kl && strncmp(p, train[i], (size_t)kl) == 0) {
                snprintf(keys[*n], 48, "train.%s", train[i]);
                found = 1;
            }
        if (!found)
            return herr_set(err, HERR_CONFIG, "--layout: unknown key '%.*s' (expected tp, pp, "
                            "vpp, cp, ep, sp, micro_batch, global_batch)", kl, p);
        snprintf(vals[*n], 32, "%.*s", (int)(len - (size_t)kl - 1), eq + 1);
        *has_tp |= strcmp(keys[*n], "parallel.tp") == 0;
        *has_pp |= strcmp(keys[*n], "parallel.pp") == 0;
        *has_gb |= strcmp(keys[*n], "train.global_batch") == 0;
        ovr[*n].key = keys[*n];
        ovr[*n].value = vals[*n];
        (*n)++;
        p += len + (p[len] == ',');
    }
    return 0;
}

/* The base configs: the --layout's decoder layout, or every tp x pp (powers of two) that
 * divides the ranks and passes the rules. */
static int encoder_bases(hcli_ctx *c, const char *model, long gpus, long seq,
                         run_config **bases, size_t *n, int *match_gb, hearth_err *err)
{
    char keys[8][48], vals[8][32];
    config_override ovr[10];
    int n_ovr = 0, has_tp = 0, has_pp = 0;
    int rc = layout_overrides(hcli_get(c, "layout"), keys, vals, ovr, &n_ovr, &has_tp, &has_pp,
                              match_gb, err);
    if (rc)
        return rc;
    const char *device = hcli_get(c, "device") ? hcli_get(c, "device") : "cuda";
    char yaml[1024];
    int len = snprintf(yaml, sizeof yaml, "model: \"%.900s\"\ndevice: %s\nranks: %ld\n", model,
                       device, gpus);
    if (seq && len > 0 && (size_t)len < sizeof yaml)
        snprintf(yaml + len, sizeof yaml - (size_t)len, "train: {seq_len: %ld}\n", seq);
    *bases = calloc(64, sizeof **bases);
    *n = 0;
    if (!*bases)
        return herr_set(err, HERR_NOMEM, "out of memory");
    hearth_err first = { { 0 } };
    for (long tp = 1; tp <= gpus && *n < 64; tp *= 2) {
        for (long pp = 1; pp * tp <= gpus && *n < 64; pp *= 2) {
            char tps[24], pps[24];
            snprintf(tps, sizeof tps, "%ld", tp);
            snprintf(pps, sizeof pps, "%ld", pp);
            config_override all[10];
            int m = 0;
            if (!has_tp)
                all[m++] = (config_override){ "parallel.tp", tps };
            if (!has_pp)
                all[m++] = (config_override){ "parallel.pp", pps };
            for (int i = 0; i < n_ovr; i++)
                all[m++] = ovr[i];
            hearth_err e = { { 0 } };
            if (gpus % (tp * pp) == 0 &&
                run_config_parse(&(*bases)[*n], "select encoder", yaml, all, m, 0, &e) == 0)
                (*n)++;
            else if (!first.msg[0])
                first = e;
            if (has_pp)
                break;
        }
        if (has_tp)
            break;
    }
    if (*n == 0) {
        free(*bases);
        *bases = NULL;
        return herr_set(err, HERR_CONFIG, "no valid layout of %s on %ld ranks%s%s", model, gpus,
                        first.msg[0] ? ": " : "", first.msg);
    }
    return 0;
}

static int print_encoder(const select_enc_result *r, report_format fmt, FILE *f,
                         hearth_err *err)
{
    static const char *const cols[] = { "rank", "encoder", "tp", "pp", "tokens_per_s", "source",
                                         "runs", "min", "max", "predicted", "emb_mib" };
    report *rep = report_begin(f, fmt, 11, cols);
    int rc = rep ? 0 : herr_set(err, HERR_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < r->n; i++) {
        const select_enc_cand *k = &r->c[i];
        char label[48];
        select_encoder_label(&k->cfg, label, sizeof label);
        report_cell cells[11] = {
            { CELL_INT, (int64_t)i + 1, 0, NULL },
            { CELL_TEXT, 0, 0, label },
            { CELL_INT, k->cfg.parallel.tp, 0, NULL },
            { CELL_INT, k->cfg.parallel.pp, 0, NULL },
            { CELL_REAL, 0, round(k->score * 10) / 10, NULL },
            { CELL_TEXT, 0, 0, k->n_measured ? "measured" : "predicted" },
            { CELL_INT, k->n_measured, 0, NULL },
            { k->n_measured ? CELL_REAL : CELL_NULL, 0, round(k->measured_min * 10) / 10, NULL },
            { k->n_measured ? CELL_REAL : CELL_NULL, 0, round(k->measured_max * 10) / 10, NULL },
            { CELL_REAL, 0, round(k->predicted * 10) / 10, NULL },
            { CELL_REAL, 0, round(k->embedding_bytes / 1048576.0 * 100) / 100, NULL },
        };
        rc = report_row(rep, cells, err);
    }
    if (rc) {
        report_abort(rep);
        return rc;
    }
    return report_end(rep, err);
}

static int select_encoder_cmd(hcli_ctx *c, hearth_db *db, hearth_err *err)
{
    static const char *const other[] = { "threshold", "max-err", "allow", "out", "gpu", "set",
                                         NULL };
    int rc = check_only(c, "encoder", other, err);
    if (!rc)
        rc = need(c, "model", err);
    if (!rc)
        rc = need(c, "gpus", err);
    long gpus = 0, seq = 0, repeat = 0;
    report_format fmt = REPORT_TABLE;
    if (!rc)
        rc = hcli_get_long(c, "gpus", 0, 1, &gpus, err);
    if (!rc)
        rc = hcli_get_long(c, "seq", 0, 1, &seq, err);
    if (!rc)
        rc = hcli_get_long(c, "repeat", 3, 1, &repeat, err);
    if (!rc && hcli_get(c, "format"))
        rc = report_format_parse(hcli_get(c, "format"), &fmt, err);
    if (rc)
        return rc;
    const char *model = hcli_get(c, "model");
    run_config *bases = NULL;
    size_t n_bases = 0;
    int match_gb = 0;
    if ((rc = encoder_bases(c, model, gpus, seq, &bases, &n_bases, &match_gb, err)))
        return rc;
    select_run *runs = NULL;
    size_t n_runs = 0;
    select_bench_set b = { 0 };
    int have_bench = 0;
    if (db) {
        rc = select_runs_of_model(db, bases[0].model_preset, &runs, &n_runs, err);
        if (!rc && (have_bench = select_bench_load(db, bases[0].model_preset, NULL, &b, err)) < 0)
            rc = have_bench;
    }
    select_cost_rates rates;
    select_enc_result r = { 0 };
    char *evidence = NULL;
    if (!rc) {
        select_encoder_rates(&bases[0], runs, n_runs, have_bench > 0 ? &b : NULL, &rates);
        rc = select_encoder_rank(bases, n_bases, runs, n_runs, &rates, match_gb, &r, err);
    }
    if (!rc)
        rc = print_encoder(&r, fmt, stdout, err);
    if (!rc && fmt == REPORT_TABLE) {
        printf("\n%zu of %zu candidates measured (median tokens/s over completed runs, min..max); "
               "the rest predicted by the cost model (%s)\n", r.n_measured, r.n,
               rates.source);
        if (r.n_measured < r.n) {
            printf("\nto measure the rest, submit this spec:\n\n");
            if (select_encoder_write_sweep(&r, model, (int)repeat, match_gb, stdout))
                rc = herr_set(err, HERR_IO, "writing the output failed");
        }
    }
    if (!rc && db && r.n) {
        json_t *sj = json_pack("{s:s, s:i, s:i, s:s, s:s}", "model", model, "ranks", (int)gpus,
                               "seq_len", bases[0].train.seq_len, "device",
                               bases[0].device == DEVICE_CUDA ? "cuda" : "cpu", "layout",
                               hcli_get(c, "layout") ? hcli_get(c, "layout") : "");
        char *subject = sj ? json_dumps(sj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        char *decision = select_encoder_decision_json(&r.c[0].cfg);
        evidence = select_encoder_evidence_json(&r);
        if (!subject || !decision || !evidence) {
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        } else {
            select_decision d = { "encoder", NULL, NULL, subject, decision,
                                  r.c[0].n_measured ? "measured" : "predicted", evidence };
            rc = select_decision_record(db, &d, NULL, err);
        }
        json_decref(sj);
        free(subject);
        free(decision);
    }
    free(evidence);
    select_encoder_result_free(&r);
    select_bench_set_free(&b);
    free(runs);
    free(bases);
    return rc;
}

int cmd_select(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    const char *what = c->argv[0];
    int fp8 = strcmp(what, "fp8") == 0;
    if (!fp8 && strcmp(what, "encoder") != 0) {
        herr_set(&err, HERR_CONFIG, "expected `select fp8` or `select encoder`, got '%s'", what);
        return hcli_fail(c, HERR_CONFIG, &err);
    }
    hearth_db *db = NULL;
    /* select fp8 reads benchmarks and must have a database; select encoder predicts
     * without one */
    if (fp8 || access(c->db_path, F_OK) == 0) {
        int code = cmd_open_db(c, 0, &db);
        if (code)
            return code;
    }
    int rc = fp8 ? select_fp8_cmd(c, db, &err) : select_encoder_cmd(c, db, &err);
    if (!rc && fflush(stdout))
        rc = herr_set(&err, HERR_IO, "writing the output failed");
    db_close(db);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}
