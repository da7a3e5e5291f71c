/* plan_memory.c - hearth-train --plan-memory and result.json's memory figures (see
 * plan_memory.h). */
#include "plan_memory.h"

#include <string.h>
#include <sys/resource.h>

#include "run.h"

/* "12.3 MiB" style, 1024-based, at most 9 characters. */
static void fmt_bytes(char *buf, size_t size, long long b)
{
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%lld B", b);
    else
        snprintf(buf, size, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v,
                 unit[u]);
}

static void role(char *buf, size_t size, const run_config *c, const mem_rank_plan *r)
{
    /* The first virtual stage is chunk 0 of pipeline rank 0, the last chunk vpp - 1 of
     * pipeline rank pp - 1. */
    int embed = r->p == 0, head = r->p == c->parallel.pp - 1;
    snprintf(buf, size, "%s%s%s%s", embed ? "embed" : "", embed && head ? "+" : "",
             head ? "head" : "", !embed && !head ? "layers" : "");
    if (r->has_encoder)
        strncat(buf, r->encodes ? "+encoder" : "+enc.params", size - strlen(buf) - 1);
}

int plan_memory_print(FILE *out, const run_config *c, hearth_err *err)
{
    mem_rank_plan peak;
    int rc = mem_plan_peak(c, &peak, err);
    if (rc)
        return rc;
    int cuda = c->device == DEVICE_CUDA;
    fprintf(out, "memory plan: %s, device %s (%s), %d ranks: tp %d cp %d pp %d vpp %d dp %d "
            "ep %d%s, encoder %s, recompute %s, distributed optimizer %s\n",
            c->model.name[0] ? c->model.name : c->model_preset, cuda ? "cuda" : "cpu",
            cuda ? "bf16 weights/activations, fp32 grads/optimizer" : "fp32", c->ranks,
            c->parallel.tp, c->parallel.cp, c->parallel.pp, c->parallel.vpp, c->parallel.dp,
            c->parallel.ep, c->parallel.sp ? " sp" : "",
            c->model.encoder.present ? encoder_strategy_name(c->parallel.encoder.strategy)
                                     : "none",
            c->model.decoder.s.recompute == RECOMPUTE_FULL        ? "full"
            : c->model.decoder.s.recompute == RECOMPUTE_SELECTIVE ? "selective"
                                                                  : "none",
            c->parallel.distributed_optimizer ? "on" : "off");
    fprintf(out, "%-5s %5s %-18s", "stage", "rank", "role");
    for (int k = 0; k < MEM_CATEGORIES; k++)
        fprintf(out, " %11s", mem_category_name((mem_category)k));
    fprintf(out, " %11s %8s\n", "total", "in-flight");
    long long host = 0;
    for (int p = 0; p < c->parallel.pp; p++) {
        mem_rank_plan r;
        if ((rc = mem_plan_stage(c, p, &r, err)))
            return rc;
        char rl[64], b[32];
        role(rl, sizeof rl, c, &r);
        fprintf(out, "%-5d %5d %-18s", p, r.rank, rl);
        for (int k = 0; k < MEM_CATEGORIES; k++) {
            fmt_bytes(b, sizeof b, r.bytes[k]);
            fprintf(out, " %11s", b);
        }
        fmt_bytes(b, sizeof b, r.total);
        fprintf(out, " %11s %8d\n", b, r.slots);
        if (r.host_bytes > host)
            host = r.host_bytes;
    }
    char b[32];
    fmt_bytes(b, sizeof b, peak.total);
    fprintf(out, "peak: %s (%lld bytes) on rank %d (stage %d, tp rank %d)\n", b,
            (long long)peak.total, peak.rank, peak.p, peak.t);
    if (host) {
        fmt_bytes(b, sizeof b, host);
        fprintf(out, "host memory (parallel.encoder.offload): up to %s per rank\n", b);
    }
    if (cuda)
        fprintf(out, "cuda figures assume bf16 compute copies and exclude CUDA workspaces "
                "(cuBLASLt, NCCL) and allocator fragmentation: keep headroom\n");
    return 0;
}

int plan_memory_main(const cli_args *a, FILE *out, FILE *errf)
{
    hearth_err err = { { 0 } };
    run_config c;
    int rc = run_config_load(&c, a->config, a->ovr, a->n_ovr, 0, &err);
    if (!rc)
        rc = plan_memory_print(out, &c, &err);
    if (rc) {
        fprintf(errf, "hearth-train: %s\n", err.msg);
        return rc == HERR_CONFIG ? RUN_EXIT_USAGE : RUN_EXIT_FAILED;
    }
    return RUN_EXIT_DONE;
}

int plan_memory_result(run_memory *m, const run_config *c, hearth_err *err)
{
    memset(m, 0, sizeof *m);
    int rc = mem_plan_peak(c, &m->peak, err);
    if (rc)
        return rc;
    /* comm local: every rank is a thread of this process; else this process is rank 0,
     * the one that writes result.json */
    int n = c->comm == COMM_LOCAL ? c->ranks : 1;
    for (int r = 0; r < n; r++) {
        mem_rank_plan p;
        if ((rc = mem_plan_rank(c, r, &p, err)))
            return rc;
        m->process_predicted += p.total;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        m->measured_bytes = (long long)ru.ru_maxrss * 1024;   /* Linux: kilobytes */
    m->measured_source = "getrusage(RUSAGE_SELF).ru_maxrss: the process's max resident set "
                         "(every rank thread under comm local, plus code, libraries, data "
                         "and allocator overhead)";
    return 0;
}
