/* bench_layers.c - hearth-train --bench-layers (bench_layers.h). */
#include "bench_layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "device_info.h"
#include "kdev.h"
#include "model/fp8.h"
#include "model/rng.h"
#include "outputs.h"
#include "run.h"
#include "shape/fp8_linears.h"
#include "shape/version.h"

/* Token counts per linear: these multiples of the micro batch's count, so that a policy
 * has measured counts on both sides of the run's (select_fp8 never extrapolates). */
static const double TOKEN_SCALES[] = { 0.25, 0.5, 1.0, 2.0 };
#define N_SCALES ((int)(sizeof TOKEN_SCALES / sizeof TOKEN_SCALES[0]))
/* Timed repeats behind each median (after one untimed warm-up of each path).  The cpu's
 * timings mean little anyway; keep its whole bench of a tiny model within seconds. */
#define REPEATS_CPU 5
#define REPEATS_CUDA 20

/* One benchmarked linear at one token count. */
typedef struct {
    const fp8_linear *lin;
    int64_t tokens, rows;
    double base_ms, fp8_ms;
    double err_out, err_dinp, err_dw;   /* relative L2 of the FP8 results to the baseline */
    int repeats;
} bench_row;

/* The buffers of one shape on the device: operands, and each path's results. */
typedef struct {
    float *x, *w, *dy;
    float *out[2], *dx[2], *dw[2];   /* [0] baseline, [1] fp8 */
} bench_bufs;

/* layer_bench.json's names: the routed experts are their own component there. */
static const char *row_component(const fp8_linear *l)
{
    if (l->kind == FP8_EXPERT_FC1 || l->kind == FP8_EXPERT_FC2)
        return "experts";
    return fp8_comp_name(l->comp);
}

/* Linears a run meets (every kind has a layer_bench.json name, fp8_kind_name). */
static int benchable(const fp8_linear *l)
{
    return l->tokens > 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, dbl_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int dev_fail(kdev *dev, int rc, const char *what, hearth_err *err)
{
    return herr_set(err, rc < 0 ? rc : HERR_RUNTIME, "bench-layers: %s: %s", what,
                    kdev_errmsg(dev));
}

static void bufs_release(kdev *dev, bench_bufs *b)
{
    kdev_release(dev, b->x);
    kdev_release(dev, b->w);
    kdev_release(dev, b->dy);
    for (int i = 0; i < 2; i++) {
        kdev_release(dev, b->out[i]);
        kdev_release(dev, b->dx[i]);
        kdev_release(dev, b->dw[i]);
    }
    memset(b, 0, sizeof *b);
}

/* Host-drawn operand values per tensor, at most: a larger tensor repeats them (device
 * copies), as drawing and uploading an LM head's gradient (151936 columns) took most of
 * a 3B model's bench.  The timings do not depend on the values. */
#define FILL_DRAWN ((size_t)1 << 22)
/* Elements of each result that the fp8 error is measured over (the first ones). */
#define ERR_SAMPLE ((size_t)1 << 24)

/* Random operands: x, w and dy from N(0, 1) scaled as a layer sees them (w ~ 1/sqrt(K)),
 * FILL_DRAWN values each, repeated. */
static int bufs_fill(kdev *dev, bench_bufs *b, hrng *rng, size_t M, size_t K, size_t N,
                     hearth_err *err)
{
    size_t nx = M * K, nw = N * K, ny = M * N;
    size_t sizes[9] = { nx, nw, ny, ny, ny, nx, nx, nw, nw };
    float **slots[9] = { &b->x, &b->w, &b->dy, &b->out[0], &b->out[1], &b->dx[0], &b->dx[1],
                         &b->dw[0], &b->dw[1] };
    for (int i = 0; i < 9; i++)
        if (kdev_alloc(dev, (void **)slots[i], sizes[i] * sizeof(float)))
            return dev_fail(dev, HERR_NOMEM, "device memory for the operands", err);
    size_t big = nx > nw ? (nx > ny ? nx : ny) : (nw > ny ? nw : ny);
    big = big < FILL_DRAWN ? big : FILL_DRAWN;
    float *h = malloc(big * sizeof *h);
    if (!h)
        return herr_set(err, HERR_NOMEM, "bench-layers: out of memory");
    float *dst[3] = { b->x, b->w, b->dy };
    size_t n[3] = { nx, nw, ny };
    double sd[3] = { 1.0, 1.0 / sqrt((double)K), 1.0 / sqrt((double)N) };
    int rc = 0;
    for (int t = 0; t < 3 && !rc; t++) {
        size_t drawn = n[t] < big ? n[t] : big;
        for (size_t i = 0; i < drawn; i++)
            h[i] = (float)(hrng_normal(rng) * sd[t]);
        rc = kdev_upload(dev, dst[t], h, drawn * sizeof(float));
        for (size_t done = drawn; !rc && done < n[t]; done *= 2)   /* doubling copies */
            rc = kdev_copy(dev, dst[t] + done, dst[t],
                           (n[t] - done < done ? n[t] - done : done) * sizeof(float));
    }
    free(h);
    return rc ? dev_fail(dev, rc, "uploading the operands", err) : 0;
}

/* ||a - b|| / ||b|| of two device tensors, over their first ERR_SAMPLE elements. */
static int rel_l2(kdev *dev, const float *a, const float *b, size_t n, double *out,
                  hearth_err *err)
{
    n = n < ERR_SAMPLE ? n : ERR_SAMPLE;
    float *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb);
    int rc = ha && hb ? 0 : herr_set(err, HERR_NOMEM, "bench-layers: out of memory");
    if (!rc && ((rc = kdev_download(dev, ha, a, n * sizeof *ha)) ||
                (rc = kdev_download(dev, hb, b, n * sizeof *hb))))
        rc = dev_fail(dev, rc, "downloading the results", err);
    if (!rc) {
        double d = 0, s = 0;
        for (size_t i = 0; i < n; i++) {
            double e = (double)ha[i] - hb[i];
            d += e * e;
            s += (double)hb[i] * hb[i];
        }
        *out = s > 0 ? sqrt(d / s) : sqrt(d);
    }
    free(ha);
    free(hb);
    return rc;
}

/* One forward + backward of path p (0 baseline, 1 fp8), gradients zeroed first (the
 * backward accumulates); returns its wall time in ms through *ms, the device drained. */
static int pass(kdev *dev, fp8_layer *f, const bench_row *r, bench_bufs *b, int p, double *ms,
                hearth_err *err)
{
    int M = (int)r->rows, K = r->lin->K, N = r->lin->N, kind = r->lin->kind, rc;
    kdev_zero(dev, b->dx[p], (size_t)M * K * sizeof(float));
    kdev_zero(dev, b->dw[p], (size_t)N * K * sizeof(float));
    if ((rc = kdev_sync(dev)))
        return dev_fail(dev, rc, "zeroing gradients", err);
    double t0 = now_ms();
    if (p == 0) {
        kdev_matmul_forward(dev, b->out[0], b->x, b->w, NULL, M, K, N);
        kdev_matmul_backward(dev, b->dx[0], b->dw[0], NULL, b->dy, b->x, b->w, M, K, N);
    } else if ((rc = fp8_linear_forward(dev, f, kind, 0, (int)r->tokens, b->out[1], b->x,
                                        b->w, NULL, M, K, N, err)) ||
               (rc = fp8_linear_backward(dev, f, kind, 0, b->dx[1], b->dw[1], NULL, b->dy,
                                         b->x, b->w, M, K, N, err))) {
        return rc;
    }
    if ((rc = kdev_sync(dev)))
        return dev_fail(dev, rc, p ? "the fp8 linear" : "the baseline linear", err);
    *ms = now_ms() - t0;
    return 0;
}

/* Times both paths, interleaved so that drift of the machine hits both alike, and
 * measures the fp8 error on the last repeat's results. */
static int bench_one(kdev *dev, bench_row *r, hrng *rng, int repeats, hearth_err *err)
{
    const fp8_linear *l = r->lin;
    size_t M = (size_t)r->rows, K = (size_t)l->K, N = (size_t)l->N;
    bench_bufs b = { 0 };
    fp8_layer *f = NULL;
    double t[2][REPEATS_CUDA], ms;
    int rc = fp8_layer_create(&f, l->comp, l->kind, l->tp, err);
    if (!rc)
        rc = bufs_fill(dev, &b, rng, M, K, N, err);
    for (int p = 0; !rc && p < 2; p++)          /* warm-up: allocations, caches, clocks */
        rc = pass(dev, f, r, &b, p, &ms, err);
    for (int i = 0; !rc && i < repeats; i++)
        for (int p = 0; !rc && p < 2; p++)
            rc = pass(dev, f, r, &b, p, &t[p][i], err);
    if (!rc && !(rc = rel_l2(dev, b.out[1], b.out[0], M * N, &r->err_out, err)) &&
        !(rc = rel_l2(dev, b.dx[1], b.dx[0], M * K, &r->err_dinp, err)))
        rc = rel_l2(dev, b.dw[1], b.dw[0], N * K, &r->err_dw, err);
    if (!rc) {
        r->base_ms = median(t[0], repeats);
        r->fp8_ms = median(t[1], repeats);
        r->repeats = repeats;
    }
    fp8_layer_free(f);
    bufs_release(dev, &b);
    return rc;
}

static double row_err(const bench_row *r)
{
    return fmax(r->err_out, fmax(r->err_dinp, r->err_dw));
}

/* Positive ms for the file: a timer tick of 0 would make the row unreadable. */
static double ms_out(double ms) { return ms > 1e-6 ? ms : 1e-6; }

static char *bench_json(const run_config *c, kdev *dev, const bench_row *rows, int n)
{
    char date[32], build[160];
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    snprintf(build, sizeof build, "%s%s%s%s", version_release(),
             version_git_describe() ? " (" : "",
             version_git_describe() ? version_git_describe() : "",
             version_git_describe() ? ")" : "");
    int cuda = kdev_get_kind(dev) == KDEV_CUDA;
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        json_array_append_new(arr, json_pack(
            "{s:s, s:s, s:i, s:I, s:I, s:i, s:i, s:f, s:f, s:i, s:f, s:f, s:f, s:f}",
            "component", row_component(r->lin), "kind", fp8_kind_name(r->lin->kind),
            "tp", r->lin->tp, "tokens", (json_int_t)r->tokens, "rows", (json_int_t)r->rows,
            "K", r->lin->K, "N", r->lin->N, "bf16_ms", ms_out(r->base_ms), "fp8_ms",
            ms_out(r->fp8_ms), "repeats", r->repeats, "fp8_err", row_err(r),
            "fp8_err_out", r->err_out, "fp8_err_dinp", r->err_dinp, "fp8_err_dweight",
            r->err_dw));
    }
    char cuda_v[32], lt_v[32];
    const char *vc = device_version_text(cuda_v, sizeof cuda_v, KDEV_LIB_CUDA_RUNTIME,
                                         kdev_lib_version(dev, KDEV_LIB_CUDA_RUNTIME));
    const char *vl = device_version_text(lt_v, sizeof lt_v, KDEV_LIB_CUBLASLT,
                                         kdev_lib_version(dev, KDEV_LIB_CUBLASLT));
    json_t *o = json_pack("{s:i, s:s, s:s, s:s, s:s, s:o, s:o, s:s, s:o}", "version", 1,
                          "gpu", kdev_hw_name(dev), "device", cuda ? "cuda" : "cpu",
                          "build", build, "date", date,
                          "cuda", vc ? json_string(vc) : json_null(),
                          "cublaslt", vl ? json_string(vl) : json_null(),
                          "model", c->model.name[0] ? c->model.name : c->model_preset,
                          "rows", arr);
    if (o && !cuda)
        json_object_set_new(o, "note", json_string(
            "device cpu: the fp32 reference GEMM (as bf16_ms) against the FP8 emulation "
            "(quantise-dequantise around the same GEMM); the times say nothing about a GPU"));
    char *s = o ? json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

static void print_table(FILE *out, const char *gpu, const bench_row *rows, int n)
{
    fprintf(out, "layer benchmark on %s: forward + backward, median ms\n", gpu);
    fprintf(out, "%-10s %-11s %3s %7s %7s %6s %6s %10s %10s %8s %9s\n", "component", "kind",
            "tp", "tokens", "rows", "K", "N", "base_ms", "fp8_ms", "speedup", "fp8_err");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        fprintf(out, "%-10s %-11s %3d %7lld %7lld %6d %6d %10.4f %10.4f %8.3f %9.2e\n",
                row_component(r->lin), fp8_kind_name(r->lin->kind), r->lin->tp,
                (long long)r->tokens, (long long)r->rows, r->lin->K, r->lin->N, r->base_ms,
                r->fp8_ms, r->base_ms / ms_out(r->fp8_ms), row_err(r));
    }
}

/* The rows to measure: every benchable linear at each scale of its token count (distinct
 * counts only).  *rows is malloc'd. */
static int plan_rows(const fp8_linear *lin, int n_lin, bench_row **rows, int *n,
                     hearth_err *err)
{
    *rows = calloc((size_t)n_lin * N_SCALES + 1, sizeof **rows);
    *n = 0;
    if (!*rows)
        return herr_set(err, HERR_NOMEM, "bench-layers: out of memory");
    for (int i = 0; i < n_lin; i++) {
        if (!benchable(&lin[i]))
            continue;
        int64_t last = 0;
        for (int s = 0; s < N_SCALES; s++) {
            int64_t t = llround(lin[i].tokens * TOKEN_SCALES[s]);
            if (t < 1 || t == last)
                continue;
            int64_t rows_of = llround((double)lin[i].rows * t / lin[i].tokens);
            (*rows)[(*n)++] = (bench_row){ .lin = &lin[i], .tokens = t,
                                           .rows = rows_of < 1 ? 1 : rows_of };
            last = t;
        }
    }
    return 0;
}

static int bench_run(const run_config *c, const char *out_dir, FILE *out, FILE *errf,
                     hearth_err *err)
{
    fp8_linear lin[FP8_LINEARS_MAX];
    int n_lin = fp8_linears_of(c, lin), n = 0;
    bench_row *rows = NULL;
    kdev *dev = NULL;
    char msg[256] = "";
    int cuda = c->device == DEVICE_CUDA;
    int rc = kdev_create(&dev, cuda ? KDEV_CUDA : KDEV_CPU, msg, sizeof msg);
    if (rc)
        return herr_set(err, rc, "bench-layers: device %s: %s", cuda ? "cuda" : "cpu", msg);
    /* the baseline is what a run computes: bf16 GEMMs on a GPU */
    if (cuda && (rc = kdev_set_precision(dev, KDEV_PREC_BF16)))
        rc = dev_fail(dev, rc, "bf16 precision", err);
    if (!rc)
        rc = plan_rows(lin, n_lin, &rows, &n, err);
    hrng rng;
    hrng_init(&rng, c->train.seed);
    int repeats = cuda ? REPEATS_CUDA : REPEATS_CPU;
    for (int i = 0, first = 0; !rc && i < n; i++) {
        const fp8_linear *l = rows[i].lin;
        if ((rc = bench_one(dev, &rows[i], &rng, repeats, err)))
            herr_prefix(err, rc, "bench-layers: %s %s at %lld tokens", row_component(l),
                        fp8_kind_name(l->kind), (long long)rows[i].tokens);
        if (!rc && (i + 1 == n || rows[i + 1].lin != l)) {
            fprintf(errf, "hearth-train: bench-layers: %s %s (tp %d, K %d, N %d): %d token "
                    "counts measured\n", row_component(l), fp8_kind_name(l->kind), l->tp,
                    l->K, l->N, i + 1 - first);
            first = i + 1;
        }
    }
    char *text = rc ? NULL : bench_json(c, dev, rows, n);
    if (!rc && !text)
        rc = herr_set(err, HERR_NOMEM, "bench-layers: out of memory");
    if (!rc && !(rc = outputs_mkdir_p(out_dir, err)))
        rc = outputs_write_atomic(out_dir, "layer_bench.json", text, err);
    if (!rc) {
        print_table(out, kdev_hw_name(dev), rows, n);
        fprintf(out, "written: %s/layer_bench.json (%d rows)%s\n", out_dir, n,
                cuda ? "" : "; device cpu: the fp32 reference against the FP8 emulation, "
                "the speedups say nothing about a GPU");
    }
    free(text);
    free(rows);
    kdev_free(dev);
    return rc;
}

int bench_layers_main(const cli_args *a, FILE *out, FILE *errf)
{
    hearth_err err = { { 0 } };
    run_config c;
    int rc = run_config_load(&c, a->config, a->ovr, a->n_ovr, 0, &err);
    if (!rc)
        rc = bench_run(&c, a->out_dir, out, errf, &err);
    if (rc) {
        fprintf(errf, "hearth-train: %s\n", err.msg);
        return rc == HERR_CONFIG ? RUN_EXIT_USAGE : RUN_EXIT_FAILED;
    }
    return RUN_EXIT_DONE;
}
