/* test_safetensors.c - the safetensors reader and writer: bitwise round trips of random
 * tensors in every dtype and shape (scalars and zero-size dimensions included), BF16/F16
 * conversion against an independent reference (nearest value found by search, not by bit
 * tricks), sharded checkpoints, metadata, corrupted files and failed writes (nothing
 * half-written left), and a file written by the Hugging Face safetensors library.
 * Random values from a clock seed (printed; HEARTH_TEST_SEED replays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "safetensors.h"
#include "kernels.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}

#define SEED ((unsigned long long)g_rng.seed)

/* rc must be an error whose message contains every given substring. */
static void expect_err(int rc, const hearth_err *err, const char *a, const char *b,
                       const char *c)
{
    if (rc == 0)
        fail_msg("expected an error mentioning \"%s\" (seed %llu)", a, SEED);
    const char *subs[] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (subs[i] && !strstr(err->msg, subs[i]))
            fail_msg("error \"%s\" does not mention \"%s\" (seed %llu)", err->msg, subs[i],
                     SEED);
}

static uint32_t fbits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float ffrom(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- independent conversion reference ---------------------------------------------
 * A format is described by its mantissa bits; the value of a non-negative bit pattern is
 * computed with ldexp, and fp32 -> format picks the nearest pattern by binary search over
 * the (monotonic) non-negative patterns, ties to the even pattern.  The first infinity
 * pattern counts as the value 2^(emax+1), which is exactly IEEE's overflow rule. */
typedef struct {
    int mbits;      /* 7 (BF16) or 10 (F16) */
    int ebits;      /* 8 or 5 */
} ref_fmt;

static const ref_fmt REF_BF16 = {7, 8}, REF_F16 = {10, 5};

static uint32_t ref_inf(ref_fmt f)
{
    return ((1u << f.ebits) - 1) << f.mbits;
}

/* Value of non-negative pattern h (h <= inf pattern). */
static double ref_value(ref_fmt f, uint32_t h)
{
    int bias = (1 << (f.ebits - 1)) - 1;
    uint32_t e = h >> f.mbits, m = h & ((1u << f.mbits) - 1);
    if (e == 0)
        return ldexp((double)m, 1 - bias - f.mbits);
    return ldexp((double)((1u << f.mbits) + m), (int)e - bias - f.mbits);
}

/* Nearest pattern of fp32 x (not NaN), sign included. */
static uint16_t ref_round(ref_fmt f, float x)
{
    uint32_t sign = signbit(x) ? 1u << (f.ebits + f.mbits) : 0;
    double a = fabs((double)x);
    uint32_t inf = ref_inf(f);
    if (a >= ref_value(f, inf))
        return (uint16_t)(sign | inf);
    uint32_t lo = 0, hi = inf;   /* value(lo) <= a < value(hi) */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ref_value(f, mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dlo = a - ref_value(f, lo), dhi = ref_value(f, hi) - a;
    uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1u) ? hi : lo;
    return (uint16_t)(sign | r);
}

static int ref_is_nan(ref_fmt f, uint16_t h)
{
    uint32_t inf = ref_inf(f), mag = h & ((1u << (f.ebits + f.mbits)) - 1);
    return mag > inf;
}

/* All 2^16 patterns to fp32 exactly; every finite one back bitwise. */
static void check_exhaustive(ref_fmt f, float (*to32)(uint16_t), uint16_t (*from32)(float),
                             const char *what)
{
    uint32_t signbit16 = 1u << (f.ebits + f.mbits);
    for (uint32_t h = 0; h < 0x10000; h++) {
        float x = to32((uint16_t)h);
        if (ref_is_nan(f, (uint16_t)h)) {
            if (!isnan(x))
                fail_msg("%s: pattern 0x%04x is NaN but converts to %g", what, h, x);
            if (!ref_is_nan(f, from32(x)))
                fail_msg("%s: NaN 0x%04x does not stay NaN", what, h);
            continue;
        }
        uint32_t mag = h & (signbit16 - 1);
        double want = mag == ref_inf(f) ? INFINITY : ref_value(f, mag);
        if (h & signbit16)
            want = -want;
        if ((double)x != want || (signbit(x) != 0) != ((h & signbit16) != 0))
            fail_msg("%s: 0x%04x -> %.9g, want %.9g", what, h, x, want);
        if (from32(x) != h)
            fail_msg("%s: 0x%04x -> %.9g -> 0x%04x", what, h, x, from32(x));
    }
}

/* Midpoints between neighbouring patterns (exact in fp32) and their fp32 neighbours:
 * every tie and near-tie of the format. */
static void check_ties(ref_fmt f, uint16_t (*from32)(float), const char *what)
{
    uint32_t inf = ref_inf(f);
    for (uint32_t h = 0; h < inf; h++) {
        float mid = (float)((ref_value(f, h) + ref_value(f, h + 1)) / 2);
        if ((double)mid != (ref_value(f, h) + ref_value(f, h + 1)) / 2)
            fail_msg("%s: midpoint after 0x%04x not exact in fp32", what, h);
        float xs[3] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int k = 0; k < 3; k++)
            for (int s = 0; s < 2; s++) {
                float x = s ? -xs[k] : xs[k];
                uint16_t got = from32(x), want = ref_round(f, x);
                if (got != want)
                    fail_msg("%s: %a -> 0x%04x, reference 0x%04x", what, x, got, want);
            }
    }
}

/* Random fp32 bit patterns (all exponents) and random values in the format's range. */
static void check_random(ref_fmt f, uint16_t (*from32)(float), int emin, int emax,
                         const char *what)
{
    for (int i = 0; i < 200000; i++) {
        float x;
        if (i % 2)
            x = ffrom((uint32_t)tu_next(&g_rng));
        else
            x = ldexpf((float)tu_uniform(&g_rng) + 0.5f, tu_randint(&g_rng, emin, emax + 1)) *
                (tu_next(&g_rng) & 1 ? -1.0f : 1.0f);
        uint16_t got = from32(x);
        if (isnan(x)) {
            if (!ref_is_nan(f, got))
                fail_msg("%s: NaN 0x%08x -> 0x%04x, not NaN (seed %llu)", what, fbits(x), got,
                         SEED);
            continue;
        }
        uint16_t want = ref_round(f, x);
        if (got != want)
            fail_msg("%s: %a -> 0x%04x, reference 0x%04x (seed %llu)", what, x, got, want,
                     SEED);
    }
}

static void test_bf16_conversion(void **state)
{
    (void)state;
    check_exhaustive(REF_BF16, kcpu_bf16_decode, kcpu_bf16_encode, "bf16");
    check_ties(REF_BF16, kcpu_bf16_encode, "bf16");
    check_random(REF_BF16, kcpu_bf16_encode, -140, 129, "bf16");
    /* Named cases. */
    assert_int_equal(kcpu_bf16_encode(1.0f + 0x1p-8f), 0x3f80);          /* tie -> even down */
    assert_int_equal(kcpu_bf16_encode(1.0f + 3 * 0x1p-8f), 0x3f82);      /* tie -> even up */
    assert_int_equal(kcpu_bf16_encode(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_int_equal(kcpu_bf16_encode(FLT_MAX), 0x7f80);                 /* overflow to inf */
    assert_int_equal(kcpu_bf16_encode(-FLT_MAX), 0xff80);
    assert_int_equal(kcpu_bf16_encode(ffrom(0x7f7f7fffu)), 0x7f7f);       /* just below */
    assert_int_equal(kcpu_bf16_encode(-INFINITY), 0xff80);
    assert_int_equal(kcpu_bf16_encode(ffrom(0x00010000u)), 0x0001);       /* subnormal */
    assert_int_equal(kcpu_bf16_encode(ffrom(0x00008000u)), 0x0000);       /* tie -> 0 */
    assert_int_equal(kcpu_bf16_encode(ffrom(0x00018000u)), 0x0002);       /* tie -> even */
    assert_int_equal(kcpu_bf16_encode(-0.0f), 0x8000);
    assert_true(ref_is_nan(REF_BF16, kcpu_bf16_encode(ffrom(0x7f800001u))));  /* low payload */
    assert_true(ref_is_nan(REF_BF16, kcpu_bf16_encode(ffrom(0xffffffffu))));
}

static void test_f16_conversion(void **state)
{
    (void)state;
    check_exhaustive(REF_F16, st_f16_to_f32, st_f32_to_f16, "f16");
    check_ties(REF_F16, st_f32_to_f16, "f16");
    check_random(REF_F16, st_f32_to_f16, -27, 17, "f16");
    assert_int_equal(st_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);          /* tie -> even down */
    assert_int_equal(st_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);      /* tie -> even up */
    assert_int_equal(st_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(st_f32_to_f16(nextafterf(65520.0f, 0)), 0x7bff);
    assert_int_equal(st_f32_to_f16(65520.0f), 0x7c00);                 /* tie -> inf */
    assert_int_equal(st_f32_to_f16(-1e6f), 0xfc00);
    assert_int_equal(st_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(st_f32_to_f16(0x1p-24f), 0x0001);                 /* smallest subnormal */
    assert_int_equal(st_f32_to_f16(0x1p-25f), 0x0000);                 /* tie -> 0 */
    assert_int_equal(st_f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001);
    assert_int_equal(st_f32_to_f16(3 * 0x1p-25f), 0x0002);             /* tie -> even */
    assert_int_equal(st_f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);      /* rounds to normal */
    assert_int_equal(st_f32_to_f16(ffrom(0x00000001u)), 0x0000);       /* fp32 subnormal */
    assert_int_equal(st_f32_to_f16(-0.0f), 0x8000);
    assert_true(ref_is_nan(REF_F16, st_f32_to_f16(ffrom(0x7f800001u))));
    assert_true(ref_is_nan(REF_F16, st_f32_to_f16(-NAN)));
    assert_int_equal(fbits(st_f16_to_f32(0x8001)), fbits(-0x1p-24f));
}

static void test_dtype_table(void **state)
{
    (void)state;
    const char *names[] = {"F32", "BF16", "F16", "F64", "I64", "I32", "U8", "I8", "BOOL"};
    const size_t sizes[] = {4, 2, 2, 8, 8, 4, 1, 1, 1};
    for (int d = 0; d < ST_DTYPE_COUNT; d++) {
        assert_string_equal(st_dtype_name((st_dtype)d), names[d]);
        assert_int_equal(st_dtype_size((st_dtype)d), sizes[d]);
    }
    assert_null(st_dtype_name(ST_DTYPE_COUNT));
    assert_int_equal(st_dtype_size(ST_DTYPE_COUNT), 0);
}

/* ---- random tensors ------------------------------------------------------------------ */

typedef struct {
    char name[64];
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel, nbytes;
    uint8_t *data;
} rand_tensor;

static void rand_tensor_make(rand_tensor *t, int i, int max_dim)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "layers.%d.w%llu", i,
             (unsigned long long)(tu_next(&g_rng) % 1000));
    t->dtype = (st_dtype)tu_randint(&g_rng, 0, ST_DTYPE_COUNT);
    t->ndim = tu_randint(&g_rng, 0, 10) == 0 ? ST_MAX_DIMS : tu_randint(&g_rng, 0, 5);
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        /* Size-1 dimensions keep 8-d tensors small; now and then a zero-size one. */
        int big = t->ndim <= 4;
        t->shape[d] = tu_randint(&g_rng, 0, 12) == 0 ? 0
                    : tu_randint(&g_rng, 1, big ? max_dim + 1 : 3);
        t->numel *= (size_t)t->shape[d];
    }
    t->nbytes = t->numel * st_dtype_size(t->dtype);
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    for (size_t b = 0; b < t->nbytes; b++)
        t->data[b] = (uint8_t)tu_next(&g_rng);
}

static void check_tensor(const st_tensor *got, const rand_tensor *want)
{
    assert_non_null(got);
    assert_string_equal(got->name, want->name);
    assert_int_equal(got->dtype, want->dtype);
    assert_int_equal(got->ndim, want->ndim);
    for (int d = 0; d < want->ndim; d++)
        assert_int_equal(got->shape[d], want->shape[d]);
    assert_int_equal(got->numel, want->numel);
    assert_int_equal(got->nbytes, want->nbytes);
    if (want->nbytes && memcmp(got->data, want->data, want->nbytes) != 0)
        fail_msg("tensor %s: bytes differ after the round trip (seed %llu)", want->name, SEED);
}

/* Names made unique by their index prefix; n random tensors added to w (borrowed). */
static rand_tensor *add_random(st_writer *w, int n, int max_dim)
{
    rand_tensor *t = calloc((size_t)n, sizeof *t);
    hearth_err err = {{0}};
    for (int i = 0; i < n; i++) {
        rand_tensor_make(&t[i], i, max_dim);
        if (st_writer_add(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, t[i].data,
                          t[i].nbytes, &err) != 0)
            fail_msg("add %s: %s", t[i].name, err.msg);
    }
    return t;
}

static void free_random(rand_tensor *t, int n)
{
    for (int i = 0; i < n; i++)
        free(t[i].data);
    free(t);
}

static int count_suffix(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    size_t ls = strlen(suffix);
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        n += l >= ls && strcmp(e->d_name + l - ls, suffix) == 0;
    }
    closedir(d);
    return n;
}

static int exists(const char *dir, const char *name)
{
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void test_round_trip(void **state)
{
    (void)state;
    char dir[512], path[1024];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "st"), 0);
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    for (int rep = 0; rep < 20; rep++) {
        hearth_err err = {{0}};
        st_writer *w;
        assert_int_equal(st_writer_init(&w, &err), 0);
        int n = tu_randint(&g_rng, 0, 13);
        rand_tensor *t = add_random(w, n, 7);
        char val[3][40];
        for (int k = 0; k < 3; k++) {
            snprintf(val[k], sizeof val[k], "v%llu", (unsigned long long)tu_next(&g_rng));
            char key[8];
            snprintf(key, sizeof key, "k%d", k);
            assert_int_equal(st_writer_metadata(w, key, k == 1 ? "replaced" : val[k], &err), 0);
        }
        assert_int_equal(st_writer_metadata(w, "k1", val[1], &err), 0);
        if (st_writer_write(w, path, &err) != 0)
            fail_msg("write: %s", err.msg);
        st_writer_free(w);

        st_file *f;
        if (st_file_open(&f, path, &err) != 0)
            fail_msg("open: %s (seed %llu)", err.msg, SEED);
        assert_int_equal(st_file_count(f), n);
        for (int i = 0; i < n; i++) {
            check_tensor(st_file_at(f, i), &t[i]);   /* add order is data order */
            check_tensor(st_file_find(f, t[i].name), &t[i]);
        }
        assert_null(st_file_at(f, n));
        assert_null(st_file_find(f, "absent"));
        for (int k = 0; k < 3; k++) {
            char key[8];
            snprintf(key, sizeof key, "k%d", k);
            assert_non_null(st_file_metadata(f, key));
            assert_string_equal(st_file_metadata(f, key), val[k]);
        }
        assert_null(st_file_metadata(f, "absent"));
        st_file_close(f);
        free_random(t, n);

        /* The data block starts 8-aligned: the header is padded. */
        FILE *fp = fopen(path, "rb");
        uint8_t len8[8];
        assert_int_equal(fread(len8, 1, 8, fp), 8);
        fclose(fp);
        assert_int_equal(len8[0] % 8, 0);
    }
    /* Zero-size tensors share offsets: they come back in add order, not name order. */
    hearth_err err = {{0}};
    st_writer *w;
    assert_int_equal(st_writer_init(&w, &err), 0);
    int64_t s0[1] = {0}, s03[2] = {0, 3}, s2[1] = {2};
    float v[2] = {1, 2};
    assert_int_equal(st_writer_add(w, "zz", ST_F32, 1, s0, NULL, 0, &err), 0);
    assert_int_equal(st_writer_add(w, "aa", ST_BF16, 2, s03, NULL, 0, &err), 0);
    assert_int_equal(st_writer_add(w, "mm", ST_F32, 1, s2, v, sizeof v, &err), 0);
    assert_int_equal(st_writer_add(w, "bb", ST_I64, 1, s0, NULL, 0, &err), 0);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);
    st_file *f;
    assert_int_equal(st_file_open(&f, path, &err), 0);
    const char *order[4] = {"zz", "aa", "mm", "bb"};
    for (int i = 0; i < 4; i++)
        assert_string_equal(st_file_at(f, i)->name, order[i]);
    st_file_close(f);
    assert_int_equal(count_suffix(dir, ".tmp"), 0);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* add_f32 converts; st_tensor_to_f32 reads back exactly what the conversion gave. */
static void test_f32_paths(void **state)
{
    (void)state;
    char dir[512], path[1024];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "st"), 0);
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    enum { N = 1000 };
    float *x = tu_falloc(N), *y = tu_falloc(N);
    for (int i = 0; i < N; i++)
        x[i] = i % 7 == 0 ? ffrom((uint32_t)tu_next(&g_rng))
                          : (float)(tu_normal(&g_rng) * ldexp(1, tu_randint(&g_rng, -30, 20)));
    double *d = tu_dalloc(N);
    for (int i = 0; i < N; i++)
        d[i] = tu_normal(&g_rng);
    hearth_err err = {{0}};
    st_writer *w;
    assert_int_equal(st_writer_init(&w, &err), 0);
    int64_t shape[2] = {10, N / 10};
    assert_int_equal(st_writer_add_f32(w, "f32", ST_F32, 2, shape, x, &err), 0);
    assert_int_equal(st_writer_add_f32(w, "bf16", ST_BF16, 2, shape, x, &err), 0);
    assert_int_equal(st_writer_add_f32(w, "f16", ST_F16, 2, shape, x, &err), 0);
    assert_int_equal(st_writer_add(w, "f64", ST_F64, 2, shape, d, N * sizeof *d, &err), 0);
    int64_t ishape[1] = {4};
    int32_t ints[4] = {1, 2, 3, 4};
    assert_int_equal(st_writer_add(w, "i32", ST_I32, 1, ishape, ints, sizeof ints, &err), 0);
    expect_err(st_writer_add_f32(w, "i8", ST_I8, 1, ishape, x, &err), &err, "i8", "I8", NULL);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);

    st_file *f;
    assert_int_equal(st_file_open(&f, path, &err), 0);
    assert_int_equal(st_file_count(f), 5);
    assert_int_equal(st_tensor_to_f32(st_file_find(f, "f32"), y, N, &err), 0);
    assert_int_equal(memcmp(x, y, sizeof(float) * N), 0);
    assert_int_equal(st_tensor_to_f32(st_file_find(f, "bf16"), y, N, &err), 0);
    for (int i = 0; i < N; i++) {
        uint16_t want = isnan(x[i]) ? 0 : ref_round(REF_BF16, x[i]);
        if (isnan(x[i]) ? !isnan(y[i]) : fbits(y[i]) != (uint32_t)want << 16)
            fail_msg("bf16[%d]: %a read back as %a (seed %llu)", i, x[i], y[i], SEED);
    }
    assert_int_equal(st_tensor_to_f32(st_file_find(f, "f16"), y, N, &err), 0);
    for (int i = 0; i < N; i++) {
        if (isnan(x[i])) {
            assert_true(isnan(y[i]));
            continue;
        }
        uint16_t h = ref_round(REF_F16, x[i]);
        double want = (h & 0x7fff) == 0x7c00 ? INFINITY : ref_value(REF_F16, h & 0x7fff);
        if (h & 0x8000)
            want = -want;
        if ((double)y[i] != want || !signbit(y[i]) != !signbit(want))
            fail_msg("f16[%d]: %a read back as %a, want %a (seed %llu)", i, x[i], y[i], want,
                     SEED);
    }
    assert_int_equal(st_tensor_to_f32(st_file_find(f, "f64"), y, N, &err), 0);
    for (int i = 0; i < N; i++)
        assert_true(y[i] == (float)d[i]);
    expect_err(st_tensor_to_f32(st_file_find(f, "f64"), y, N - 1, &err), &err, "f64", NULL,
               NULL);
    expect_err(st_tensor_to_f32(st_file_find(f, "i32"), y, 4, &err), &err, "i32", "I32", NULL);
    st_file_close(f);
    free(x);
    free(y);
    free(d);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

static void test_writer_rejects(void **state)
{
    (void)state;
    char dir[512], path[1024];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "st"), 0);
    snprintf(path, sizeof path, "%s/r.safetensors", dir);
    hearth_err err = {{0}};
    st_writer *w;
    assert_int_equal(st_writer_init(&w, &err), 0);
    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t s23[2] = {2, 3}, neg[2] = {2, -3}, huge[3] = {INT64_MAX / 2, INT64_MAX / 2, 4};
    int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    char longname[ST_NAME_MAX + 1];
    memset(longname, 'x', ST_NAME_MAX);
    longname[ST_NAME_MAX] = '\0';
    assert_int_equal(st_writer_add(w, "a", ST_F32, 2, s23, v, sizeof v, &err), 0);
    expect_err(st_writer_add(w, "a", ST_F32, 2, s23, v, sizeof v, &err), &err, "\"a\"", "twice",
               NULL);
    expect_err(st_writer_add(w, "b", ST_F32, 2, s23, v, sizeof v - 4, &err), &err, "\"b\"",
               "24 bytes", NULL);
    expect_err(st_writer_add(w, "c", ST_F32, 2, neg, v, sizeof v, &err), &err, "\"c\"",
               "negative", NULL);
    expect_err(st_writer_add(w, "d", ST_F32, 3, huge, v, sizeof v, &err), &err, "\"d\"",
               "overflow", NULL);
    expect_err(st_writer_add(w, "e", ST_F32, 9, s9, v, 4, &err), &err, "\"e\"", "dimensions",
               NULL);
    expect_err(st_writer_add(w, "__metadata__", ST_F32, 2, s23, v, sizeof v, &err), &err,
               "__metadata__", "reserved", NULL);
    expect_err(st_writer_add(w, "", ST_F32, 2, s23, v, sizeof v, &err), &err, "empty", NULL,
               NULL);
    expect_err(st_writer_add(w, longname, ST_F32, 2, s23, v, sizeof v, &err), &err, "longer",
               NULL, NULL);
    expect_err(st_writer_add(w, "f", ST_DTYPE_COUNT, 2, s23, v, sizeof v, &err), &err, "\"f\"",
               "dtype", NULL);
    expect_err(st_writer_add_f32(w, "a", ST_BF16, 2, s23, v, &err), &err, "\"a\"", "twice", NULL);
    /* A refused name stays free. */
    assert_int_equal(st_writer_add(w, "b", ST_F32, 1, s23, v, 8, &err), 0);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);
    st_file *f;
    assert_int_equal(st_file_open(&f, path, &err), 0);
    assert_int_equal(st_file_count(f), 2);
    assert_string_equal(st_file_at(f, 0)->name, "a");
    assert_string_equal(st_file_at(f, 1)->name, "b");
    st_file_close(f);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* ---- sharded checkpoints --------------------------------------------------------------- */

static void check_set(const char *dir, rand_tensor *t, int n, const char *meta)
{
    hearth_err err = {{0}};
    st_set *s;
    if (st_set_open(&s, dir, &err) != 0)
        fail_msg("st_set_open: %s (seed %llu)", err.msg, SEED);
    assert_int_equal(st_set_count(s), n);
    for (int i = 0; i < n; i++) {
        check_tensor(st_set_at(s, i), &t[i]);
        check_tensor(st_set_find(s, t[i].name), &t[i]);
    }
    assert_null(st_set_find(s, "absent"));
    assert_string_equal(st_set_metadata(s, "step"), meta);
    st_set_close(s);
}

static void test_sharded(void **state)
{
    (void)state;
    char dir[512], path[1024];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "st"), 0);
    for (int rep = 0; rep < 8; rep++) {
        hearth_err err = {{0}};
        st_writer *w;
        assert_int_equal(st_writer_init(&w, &err), 0);
        int n = tu_randint(&g_rng, 2, 16);
        rand_tensor *t = add_random(w, n, 6);
        char meta[32];
        snprintf(meta, sizeof meta, "%d", rep);
        assert_int_equal(st_writer_metadata(w, "step", meta, &err), 0);
        size_t max = (size_t)tu_randint(&g_rng, 1, 200), total = 0;
        /* Expected greedy shards, computed here independently. */
        int shard_of[16], ns = 0;
        size_t cur = 0;
        for (int i = 0; i < n; i++) {
            if (i == 0 || (cur > 0 && cur + t[i].nbytes > max)) {
                ns++;
                cur = 0;
            }
            cur += t[i].nbytes;
            total += t[i].nbytes;
            shard_of[i] = ns;
        }
        if (st_writer_write_dir(w, dir, max, &err) != 0)
            fail_msg("write_dir: %s", err.msg);
        check_set(dir, t, n, meta);
        if (ns == 1) {
            assert_true(exists(dir, "model.safetensors"));
            assert_false(exists(dir, "model.safetensors.index.json"));
        } else {
            assert_false(exists(dir, "model.safetensors"));
            assert_int_equal(count_suffix(dir, ".safetensors"), ns);
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
            json_error_t jerr;
            json_t *idx = json_load_file(path, 0, &jerr);
            assert_non_null(idx);
            assert_int_equal(json_integer_value(json_object_get(
                                 json_object_get(idx, "metadata"), "total_size")), total);
            json_t *wm = json_object_get(idx, "weight_map");
            assert_int_equal(json_object_size(wm), n);
            for (int i = 0; i < n; i++) {
                char want[64];
                snprintf(want, sizeof want, "model-%05d-of-%05d.safetensors", shard_of[i], ns);
                assert_string_equal(json_string_value(json_object_get(wm, t[i].name)), want);
                assert_true(exists(dir, want));
                /* Each shard stays within the limit unless it holds one larger tensor. */
                snprintf(path, sizeof path, "%s/%s", dir, want);
                st_file *f;
                assert_int_equal(st_file_open(&f, path, &err), 0);
                size_t bytes = 0;
                int nonempty = 0;
                for (int j = 0; j < st_file_count(f); j++) {
                    bytes += st_file_at(f, j)->nbytes;
                    nonempty += st_file_at(f, j)->nbytes > 0;
                }
                assert_true(bytes <= max || nonempty == 1);
                assert_string_equal(st_file_metadata(f, "step"), meta);
                st_file_close(f);
            }
            json_decref(idx);
        }
        /* The same tensors unsharded into the same directory: the stale index goes. */
        assert_int_equal(st_writer_write_dir(w, dir, 0, &err), 0);
        assert_false(exists(dir, "model.safetensors.index.json"));
        check_set(dir, t, n, meta);
        /* Leftover shards of the sharded layout are not ours to judge; clear them. */
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -f '%s'/model-*", dir);
        assert_int_equal(system(cmd), 0);
        st_writer_free(w);
        free_random(t, n);
    }
    /* Exact fits: 4 tensors of 8 bytes under a limit of 16 make 2 shards of 2. */
    hearth_err err = {{0}};
    st_writer *w;
    assert_int_equal(st_writer_init(&w, &err), 0);
    float v[2] = {1, 2};
    int64_t s2[1] = {2};
    const char *names[4] = {"p", "q", "r", "s"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(st_writer_add_f32(w, names[i], ST_F32, 1, s2, v, &err), 0);
    assert_int_equal(st_writer_write_dir(w, dir, 16, &err), 0);
    st_writer_free(w);
    assert_int_equal(count_suffix(dir, ".safetensors"), 2);
    assert_true(exists(dir, "model-00002-of-00002.safetensors"));
    st_set *s;
    assert_int_equal(st_set_open(&s, dir, &err), 0);
    assert_int_equal(st_set_count(s), 4);
    for (int i = 0; i < 4; i++)
        assert_string_equal(st_set_at(s, i)->name, names[i]);
    st_set_close(s);
    assert_int_equal(count_suffix(dir, ".tmp"), 0);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* ---- corrupted files and inconsistent sets ------------------------------------------- */

/* Writes the 8-byte length (hlen, or strlen(header) when hlen is -1), the header and
 * `data` zero bytes. */
static void write_raw(const char *path, const char *header, long long hlen, size_t data)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint64_t len = hlen < 0 ? strlen(header) : (uint64_t)hlen;
    for (int i = 0; i < 8; i++)
        fputc((int)((len >> (8 * i)) & 0xff), fp);
    fputs(header, fp);
    for (size_t i = 0; i < data; i++)
        fputc(0, fp);
    assert_int_equal(fclose(fp), 0);
}

#define T(name, dtype, shape, b, e)                                                         \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void expect_bad(const char *path, const char *header, long long hlen, size_t data,
                       const char *w1, const char *w2)
{
    write_raw(path, header, hlen, data);
    hearth_err err = {{0}};
    st_file *f = (st_file *)1;
    int rc = st_file_open(&f, path, &err);
    assert_null(f);
    expect_err(rc, &err, path, w1, w2);
}

static void test_corrupt(void **state)
{
    (void)state;
    char dir[512], path[1024];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "st"), 0);
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    /* A valid hand-made file first, so that the cases below fail for their one reason. */
    write_raw(path, "{" T("a", "F32", "[2]", 0, 8) "," T("b", "I8", "[]", 8, 9) "}  ", -1, 9);
    hearth_err err = {{0}};
    st_file *f;
    if (st_file_open(&f, path, &err) != 0)
        fail_msg("valid file refused: %s", err.msg);
    assert_int_equal(st_file_count(f), 2);
    assert_int_equal(st_file_at(f, 1)->ndim, 0);
    assert_int_equal(st_file_at(f, 1)->numel, 1);
    st_file_close(f);

    const char *ok2 = "{" T("a", "F32", "[2]", 0, 8) "}";
    expect_bad(path, ok2, -1, 7, "\"a\"", "past the data block");            /* truncated */
    expect_bad(path, "", 0, 0, "not valid JSON", NULL);
    write_raw(path, "", 0, 0);
    assert_int_equal(truncate(path, 5), 0);
    expect_err(st_file_open(&f, path, &err), &err, path, "too short", NULL);
    expect_bad(path, ok2, 1000, 8, "header length 1000", "exceeds");
    expect_bad(path, ok2, (long long)strlen(ok2) + 9, 8, "header length", "exceeds");
    expect_bad(path, ok2, (long long)(~0ull >> 1), 8, "header length", "exceeds");
    expect_bad(path, "{\"a\": {\"dtype\": ", -1, 0, "not valid JSON", NULL);
    expect_bad(path, "[1, 2]", -1, 0, "not a JSON object", NULL);
    expect_bad(path, "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", -1, 12,
               "overlap", "\"a\"");
    expect_bad(path, "{" T("a", "F32", "[3]", 0, 8) "}", -1, 8, "\"a\"", "12 bytes");
    expect_bad(path, "{" T("a", "F8_XYZ", "[2]", 0, 8) "}", -1, 8, "\"a\"",
               "unknown dtype \"F8_XYZ\"");
    expect_bad(path, "{" T("a", "F32", "[2]", 0, 8) "," T("a", "F32", "[2]", 8, 16) "}", -1, 16,
               "duplicate", "a");
    expect_bad(path, "{" T("a", "F32", "[2,-1]", 0, 8) "}", -1, 8, "\"a\"", "shape[1]");
    expect_bad(path, "{" T("a", "F32", "[1.5]", 0, 8) "}", -1, 8, "\"a\"", "shape[0]");
    expect_bad(path, "{" T("a", "F32", "[4611686018427387904,4]", 0, 8) "}", -1, 8, "\"a\"",
               "overflow");
    expect_bad(path, "{" T("a", "F32", "[2]", 8, 0) "}", -1, 8, "\"a\"", "before");
    expect_bad(path, "{" T("a", "F32", "[2]", 4, 12) "}", -1, 12, "\"a\"", "unused");
    expect_bad(path, "{" T("a", "F32", "[2]", 0, 8) "}", -1, 12, "4 bytes after", NULL);
    expect_bad(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", -1, 8, "\"a\"",
               "data_offsets");
    expect_bad(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}",
               -1, 8, "\"a\"", "unknown key \"x\"");
    expect_bad(path, "{\"__metadata__\":{\"k\":3}}", -1, 0, "\"k\"", "not a string");
    expect_bad(path, "{\"a\":[1]}", -1, 0, "\"a\"", "not an object");

    /* A writer's file cut short anywhere is refused. */
    st_writer *w;
    assert_int_equal(st_writer_init(&w, &err), 0);
    float v[16] = {0};
    int64_t s16[1] = {16};
    assert_int_equal(st_writer_add(w, "w", ST_F32, 1, s16, v, sizeof v, &err), 0);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    for (int k = 0; k < 5; k++) {
        off_t len = (off_t)tu_randint(&g_rng, 0, (int)sb.st_size);
        assert_int_equal(truncate(path, len), 0);
        f = (st_file *)1;
        int rc = st_file_open(&f, path, &err);
        assert_null(f);
        expect_err(rc, &err, path, NULL, NULL);
        sb.st_size = len;
    }
    expect_err(st_file_open(&f, "/nonexistent/x.safetensors", &err), &err,
               "/nonexistent/x.safetensors", "cannot open", NULL);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* Writes DIR/NAME holding F32 tensors named by names[] (one element each). */
static void write_file_with(const char *dir, const char *name, const char *const *names, int n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    hearth_err err = {{0}};
    st_writer *w;
    assert_int_equal(st_writer_init(&w, &err), 0);
    float one = 1;
    int64_t s1[1] = {1};
    for (int i = 0; i < n; i++)
        assert_int_equal(st_writer_add_f32(w, names[i], ST_F32, 1, s1, &one, &err), 0);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);
}

static void expect_bad_set(const char *dir, const char *index, const char *w1,
                           const char *w2, const char *w3)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(tu_write_text(path, index), 0);
    hearth_err err = {{0}};
    st_set *s = (st_set *)1;
    int rc = st_set_open(&s, dir, &err);
    assert_null(s);
    expect_err(rc, &err, w1, w2, w3);
}

static void test_bad_sets(void **state)
{
    (void)state;
    char dir[512];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "st"), 0);
    hearth_err err = {{0}};
    st_set *s = (st_set *)1;
    expect_err(st_set_open(&s, dir, &err), &err, dir, "model.safetensors", NULL);
    assert_null(s);
    const char *ab[] = {"a", "b"}, *bc[] = {"b", "c"}, *c[] = {"c"};
    write_file_with(dir, "one.safetensors", ab, 2);
    write_file_with(dir, "two.safetensors", bc, 2);
    write_file_with(dir, "three.safetensors", c, 1);
    expect_bad_set(dir, "{\"weight_map\": {\"a\": \"one.safetensors\", \"b\": \"one.safetensors\","
                   " \"c\": \"two.safetensors\"}}", "\"b\"", "both", "two.safetensors");
    expect_bad_set(dir, "{\"weight_map\": {\"a\": \"one.safetensors\", \"b\": \"one.safetensors\","
                   " \"x\": \"three.safetensors\"}}", "\"x\"", "three.safetensors", "not hold");
    expect_bad_set(dir, "{\"weight_map\": {\"a\": \"one.safetensors\", \"c\": \"one.safetensors\","
                   " \"b\": \"three.safetensors\"}}", "\"c\"", "three.safetensors", NULL);
    expect_bad_set(dir, "{\"weight_map\": {\"a\": \"one.safetensors\"}}", "\"b\"",
                   "one.safetensors", "not in the weight_map");
    expect_bad_set(dir, "{\"weight_map\": {\"a\": \"../one.safetensors\"}}", "\"a\"",
                   "not a file name", NULL);
    expect_bad_set(dir, "{\"weight_map\": {\"a\": \"missing.safetensors\"}}",
                   "missing.safetensors", "cannot open", NULL);
    expect_bad_set(dir, "{\"metadata\": {}}", "weight_map", NULL, NULL);
    expect_bad_set(dir, "{\"weight_map\": ", "index.json", NULL, NULL);
    /* And the consistent index is accepted. */
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(tu_write_text(path, "{\"weight_map\": {\"a\": \"one.safetensors\", \"b\": "
                                         "\"one.safetensors\", \"c\": \"three.safetensors\"}}"),
                     0);
    assert_int_equal(st_set_open(&s, dir, &err), 0);
    assert_int_equal(st_set_count(s), 3);
    assert_string_equal(st_set_at(s, 0)->name, "a");   /* one < three by file name */
    assert_string_equal(st_set_at(s, 2)->name, "c");
    assert_null(st_set_metadata(s, "step"));
    st_set_close(s);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* ---- failed writes leave nothing behind ----------------------------------------------- */

static void test_failed_writes(void **state)
{
    (void)state;
    char dir[512], path[1024];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "st"), 0);
    hearth_err err = {{0}};
    st_writer *w;
    assert_int_equal(st_writer_init(&w, &err), 0);
    rand_tensor *t = add_random(w, 6, 5);
    /* Missing directory. */
    snprintf(path, sizeof path, "%s/nodir/x.safetensors", dir);
    expect_err(st_writer_write(w, path, &err), &err, "nodir/x.safetensors.tmp", "cannot create",
               NULL);
    /* The target is a directory: the temporary file is written, the rename fails, and the
     * temporary file must be gone. */
    snprintf(path, sizeof path, "%s/isdir.safetensors", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    expect_err(st_writer_write(w, path, &err), &err, path, "rename", NULL);
    assert_int_equal(count_suffix(dir, ".tmp"), 0);
    /* Read-only directory (meaningless for root, who may write anyway). */
    if (geteuid() != 0) {
        char ro[700];
        snprintf(ro, sizeof ro, "%s/ro", dir);
        assert_int_equal(mkdir(ro, 0500), 0);
        snprintf(path, sizeof path, "%s/x.safetensors", ro);
        expect_err(st_writer_write(w, path, &err), &err, path, "cannot create", NULL);
        assert_int_equal(count_suffix(ro, ".tmp"), 0);
        expect_err(st_writer_write_dir(w, ro, 0, &err), &err, ro, NULL, NULL);
        chmod(ro, 0700);
    }
    st_writer_free(w);
    /* A sharded write failing at its second shard removes the first and writes no index. */
    char sub[700];
    snprintf(sub, sizeof sub, "%s/ckpt", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(path, sizeof path, "%s/model-00002-of-00003.safetensors", sub);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(st_writer_init(&w, &err), 0);
    float v[2] = {1, 2};
    int64_t s2[1] = {2};
    assert_int_equal(st_writer_add_f32(w, "x", ST_F32, 1, s2, v, &err), 0);
    assert_int_equal(st_writer_add_f32(w, "y", ST_F32, 1, s2, v, &err), 0);
    assert_int_equal(st_writer_add_f32(w, "z", ST_F32, 1, s2, v, &err), 0);
    expect_err(st_writer_write_dir(w, sub, 8, &err), &err, "model-00002-of-00003", NULL, NULL);
    assert_int_equal(count_suffix(sub, ".tmp"), 0);
    assert_false(exists(sub, "model-00001-of-00003.safetensors"));
    assert_false(exists(sub, "model-00003-of-00003.safetensors"));
    assert_false(exists(sub, "model.safetensors.index.json"));
    st_writer_free(w);
    free_random(t, 6);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* ---- a file written by the Hugging Face library ---------------------------------------
 * contrib/hf/make_st_fixture.py wrote tests/data/st_fixture.safetensors; the values are
 * the formulas of that script. */
static void test_hf_fixture(void **state)
{
    (void)state;
    const char *paths[] = {"tests/data/st_fixture.safetensors",
                           "../../tests/data/st_fixture.safetensors"};
    hearth_err err = {{0}};
    st_file *f = NULL;
    for (int i = 0; i < 2 && !f; i++)
        if (access(paths[i], R_OK) == 0 && st_file_open(&f, paths[i], &err) != 0)
            fail_msg("%s", err.msg);
    if (!f)
        fail_msg("tests/data/st_fixture.safetensors not found (run from the repository root)");
    assert_int_equal(st_file_count(f), 5);
    assert_string_equal(st_file_metadata(f, "format"), "pt");
    assert_string_equal(st_file_metadata(f, "source"), "make_st_fixture.py");
    float y[8];
    const st_tensor *t = st_file_find(f, "f32");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(st_tensor_to_f32(t, y, 6, &err), 0);
    for (int i = 0; i < 6; i++)
        assert_true(y[i] == (float)(i * 0.25 - 1));
    /* (i + 1) / 3 in fp32, rounded by torch: the same patterns as the reference. */
    const char *names[2] = {"bf16", "f16"};
    for (int k = 0; k < 2; k++) {
        t = st_file_find(f, names[k]);
        assert_non_null(t);
        assert_int_equal(t->dtype, k ? ST_F16 : ST_BF16);
        assert_int_equal(t->numel, 4);
        const uint8_t *p = t->data;
        for (int i = 0; i < 4; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            float x = (float)(i + 1) / 3.0f;
            uint16_t want = ref_round(k ? REF_F16 : REF_BF16, i % 2 ? -x : x);
            if (h != want)
                fail_msg("%s[%d] = 0x%04x, reference 0x%04x", names[k], i, h, want);
        }
    }
    t = st_file_find(f, "i64");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_I64);
    assert_int_equal(t->numel, 3);
    for (int i = 0; i < 3; i++) {
        int64_t v;
        memcpy(&v, (const uint8_t *)t->data + 8 * i, 8);
        assert_int_equal(v, (int64_t)i * 1000000007 - 5);
    }
    t = st_file_find(f, "scalar");
    assert_non_null(t);
    assert_int_equal(t->ndim, 0);
    assert_int_equal(st_tensor_to_f32(t, y, 1, &err), 0);
    assert_true(y[0] == 7.5f);
    st_file_close(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_dtype_table, setup_seed),
        cmocka_unit_test_setup(test_bf16_conversion, setup_seed),
        cmocka_unit_test_setup(test_f16_conversion, setup_seed),
        cmocka_unit_test_setup(test_round_trip, setup_seed),
        cmocka_unit_test_setup(test_f32_paths, setup_seed),
        cmocka_unit_test_setup(test_writer_rejects, setup_seed),
        cmocka_unit_test_setup(test_sharded, setup_seed),
        cmocka_unit_test_setup(test_corrupt, setup_seed),
        cmocka_unit_test_setup(test_bad_sets, setup_seed),
        cmocka_unit_test_setup(test_failed_writes, setup_seed),
        cmocka_unit_test_setup(test_hf_fixture, setup_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
