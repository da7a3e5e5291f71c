/* test_kernels_fp8.c - FP8 emulation: every code, ties to even, saturation, subnormals,
 * NaN/inf, and random values against a brute-force nearest-value search in double; the
 * cpu device's FP8 linear (kdev_fp8_matmul_*) is exactly that emulation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdev.h"
#include "kernels.h"
#include "support/testutil.h"

/* The formats written out from their definition (OCP FP8), independent of fp8.c. */
typedef struct {
    int ebits, mbits, bias;
    double max;
    int ieee;   /* E5M2: the all-ones exponent is inf/NaN; E4M3: only S.1111.111 is NaN */
} ref_fmt;
static const ref_fmt REF[2] = { { 4, 3, 7, 448.0, 0 }, { 5, 2, 15, 57344.0, 1 } };

/* Value of a code: 0 = finite (*v set), 1 = NaN, 2 = inf (*v = +-inf). */
static int ref_value(int code, const ref_fmt *F, double *v)
{
    int s = code >> 7, ef = (code >> F->mbits) & ((1 << F->ebits) - 1);
    int m = code & ((1 << F->mbits) - 1), top = (1 << F->ebits) - 1;
    double sign = s ? -1.0 : 1.0;
    if (F->ieee && ef == top) {
        *v = sign * INFINITY;
        return m ? 1 : 2;
    }
    if (!F->ieee && ef == top && m == (1 << F->mbits) - 1)
        return 1;
    double mag = ef == 0 ? m * pow(2.0, 1 - F->bias - F->mbits)
                         : (1.0 + m / (double)(1 << F->mbits)) * pow(2.0, ef - F->bias);
    *v = sign * mag;
    return 0;
}

/* Nearest finite code of x by search over all non-negative finite codes; ties pick the
 * even code (LSB 0); beyond max: max. */
static int ref_encode(double x, const ref_fmt *F)
{
    int sign = x < 0 || (x == 0 && signbit(x)) ? 0x80 : 0;
    double a = fabs(x);
    if (a >= F->max)
        a = F->max;
    int best = -1;
    double bd = INFINITY;
    for (int c = 0; c < 128; c++) {
        double v;
        if (ref_value(c, F, &v))
            continue;
        double d = fabs(v - a);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return sign | best;
}

static void test_every_code(void **state)
{
    (void)state;
    for (int f = 0; f < 2; f++) {
        const ref_fmt *F = &REF[f];
        int finite = 0;
        for (int c = 0; c < 256; c++) {
            double v;
            int k = ref_value(c, F, &v);
            float got = kcpu_fp8_decode((uint8_t)c, (kfp8_format)f);
            if (k == 1) {
                assert_true(isnan(got));
                assert_true(isnan(kcpu_fp8_decode(kcpu_fp8_encode(got, f), f)));
                continue;
            }
            if (k == 2) {
                assert_true(isinf(got) && (got < 0) == (c >> 7));
                assert_int_equal(kcpu_fp8_encode(got, f), c);
                continue;
            }
            finite++;
            assert_true((double)got == v);
            assert_true(!signbit(got) == !signbit(v));
            assert_int_equal(kcpu_fp8_encode(got, f), c);      /* round trip */
        }
        assert_int_equal(finite, f == 0 ? 254 : 248);
        assert_true(kcpu_fp8_max(f) == (float)F->max);
    }
}

static void test_ties_to_even(void **state)
{
    (void)state;
    for (int f = 0; f < 2; f++) {
        const ref_fmt *F = &REF[f];
        int ties = 0;
        for (int c = 0; c < 127; c++) {
            double lo, hi;
            if (ref_value(c, F, &lo) || ref_value(c + 1, F, &hi))
                continue;
            float mid = (float)((lo + hi) / 2);             /* exact: few mantissa bits */
            assert_true((double)mid == (lo + hi) / 2);
            int even = (c & 1) == 0 ? c : c + 1;
            for (int s = 0; s < 2; s++) {
                float x = s ? -mid : mid;
                int sg = s ? 0x80 : 0;
                assert_int_equal(kcpu_fp8_encode(x, f), sg | even);
                /* Just off the midpoint: the nearer neighbour. */
                assert_int_equal(kcpu_fp8_encode(nextafterf(x, 0.0f), f), sg | c);
                assert_int_equal(kcpu_fp8_encode(nextafterf(x, s ? -INFINITY : INFINITY), f),
                                 sg | (c + 1));
            }
            ties++;
        }
        assert_true(ties >= 120);
    }
}

static void test_saturation_nan_inf(void **state)
{
    (void)state;
    const float big[] = { 449.0f, 464.0f, 480.0f, 1000.0f, 57344.0f, 61440.0f, 1e30f, FLT_MAX };
    for (int f = 0; f < 2; f++) {
        float mx = kcpu_fp8_max(f);
        uint8_t cmax = kcpu_fp8_encode(mx, f);
        for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
            if (big[i] < mx)
                continue;
            assert_int_equal(kcpu_fp8_encode(big[i], f), cmax);
            assert_int_equal(kcpu_fp8_encode(-big[i], f), 0x80 | cmax);
            assert_true(kcpu_fp8_decode(kcpu_fp8_encode(big[i], f), f) == mx);
        }
        assert_true(isnan(kcpu_fp8_decode(kcpu_fp8_encode(NAN, f), f)));
        assert_int_equal(kcpu_fp8_encode(NAN, f) & 0x7f, 0x7f);
    }
    /* E4M3 between max and the would-be next value 480: below the midpoint 464 rounds to
     * max anyway, at and above it saturates. */
    assert_int_equal(kcpu_fp8_encode(463.0f, KFP8_E4M3), 0x7e);
    assert_int_equal(kcpu_fp8_encode(INFINITY, KFP8_E5M2), 0x7c);
    assert_int_equal(kcpu_fp8_encode(-INFINITY, KFP8_E5M2), 0xfc);
    assert_true(isnan(kcpu_fp8_decode(kcpu_fp8_encode(INFINITY, KFP8_E4M3), KFP8_E4M3)));
    assert_true(kcpu_fp8_decode(0x7e, KFP8_E4M3) == 448.0f);
    assert_true(kcpu_fp8_decode(0x7b, KFP8_E5M2) == 57344.0f);
}

static void test_subnormals(void **state)
{
    (void)state;
    const double tiny[2] = { ldexp(1.0, -9), ldexp(1.0, -16) };   /* smallest subnormals */
    for (int f = 0; f < 2; f++) {
        float t = (float)tiny[f];
        assert_true(kcpu_fp8_decode(0x01, f) == t);
        assert_int_equal(kcpu_fp8_encode(t, f), 0x01);
        assert_int_equal(kcpu_fp8_encode(t / 2, f), 0x00);          /* tie -> even (zero) */
        assert_int_equal(kcpu_fp8_encode(-t / 2, f), 0x80);
        assert_int_equal(kcpu_fp8_encode(nextafterf(t / 2, 1.0f), f), 0x01);
        assert_int_equal(kcpu_fp8_encode(1.5f * t, f), 0x02);       /* tie 1|2 -> 2 */
        assert_int_equal(kcpu_fp8_encode(2.5f * t, f), 0x02);       /* tie 2|3 -> 2 */
        assert_int_equal(kcpu_fp8_encode(t / 1024, f), 0x00);
        /* the largest subnormal and the smallest normal are one step apart */
        int mb = REF[f].mbits;
        assert_true(kcpu_fp8_decode((uint8_t)((1 << mb) - 1), f) + t ==
                    kcpu_fp8_decode((uint8_t)(1 << mb), f));
    }
}

static void test_random_against_reference(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    for (int f = 0; f < 2; f++) {
        const ref_fmt *F = &REF[f];
        for (int i = 0; i < 60000; i++) {
            /* log-uniform magnitudes from far below the subnormals to beyond max */
            double e = tu_uniform(&rng) * 50.0 - (f ? 30.0 : 16.0);
            float x = (float)(ldexp(1.0 + tu_uniform(&rng), (int)floor(e)));
            if (tu_uniform(&rng) < 0.5)
                x = -x;
            int want = ref_encode(x, F);
            int got = kcpu_fp8_encode(x, f);
            if (got != want)
                fail_msg("format %d x=%a: got 0x%02x want 0x%02x", f, (double)x, got, want);
        }
    }
}

static void test_amax_scale_history(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    size_t n = 1 + (size_t)tu_randint(&rng, 0, 5000);
    float *x = tu_falloc(n);
    tu_fill_normal(&rng, x, n, 0, 3);
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)x[i]));
    assert_true(kcpu_amax(x, n) == (float)m);
    assert_true(kcpu_amax(x, 0) == 0.0f);
    x[n / 2] = NAN;
    assert_true(isnan(kcpu_amax(x, n)));
    free(x);

    float a = (float)(0.1 + tu_uniform(&rng) * 10);
    assert_true(kcpu_fp8_scale(a, KFP8_E4M3, 0, 1.0f) == (float)(448.0 / a));
    assert_true(kcpu_fp8_scale(a, KFP8_E5M2, 2, 1.0f) == (float)(57344.0 / a / 4));
    assert_true(kcpu_fp8_scale(0.0f, KFP8_E4M3, 0, 7.0f) == 7.0f);
    assert_true(kcpu_fp8_scale(NAN, KFP8_E4M3, 0, 7.0f) == 7.0f);
    assert_true(kcpu_fp8_scale(INFINITY, KFP8_E4M3, 0, 7.0f) == 7.0f);
    assert_true(kcpu_fp8_scale(1e-45f, KFP8_E5M2, 0, 7.0f) == 7.0f);   /* inf scale */

    enum { H = 4 };
    float hist[H] = { 0 };
    int pos = 0;
    assert_true(kcpu_fp8_history_amax(hist, H) == 0.0f);
    const float seq[6] = { 3, 1, 2, 0.5f, 0.25f, 0.125f };
    for (int i = 0; i < 6; i++) {
        kcpu_fp8_history_push(hist, H, &pos, seq[i]);
        float want = 0;
        for (int j = i - H + 1 < 0 ? 0 : i - H + 1; j <= i; j++)
            want = seq[j] > want ? seq[j] : want;
        assert_true(kcpu_fp8_history_amax(hist, H) == want);   /* the last H only */
    }
}

static void test_qdq_random(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    size_t sizes[2] = { 1 + (size_t)tu_randint(&rng, 0, 3000), 70001 };   /* 2nd: parallel */
    for (int f = 0; f < 2; f++)
        for (int s = 0; s < 2; s++) {
            size_t n = sizes[s];
            float *x = tu_falloc(n), *out = tu_falloc(n);
            tu_fill_normal(&rng, x, n, 0, (float)exp(tu_uniform(&rng) * 10 - 5));
            float scale = kcpu_fp8_scale(kcpu_amax(x, n), f, tu_randint(&rng, 0, 3), 1.0f);
            kcpu_fp8_qdq(out, x, n, scale, f);
            double err2 = 0, ref2 = 0;
            for (size_t i = 0; i < n; i++) {
                float y = x[i] * scale;
                double v;
                ref_value(ref_encode(y, &REF[f]), &REF[f], &v);
                double want = v / scale;
                if (fabs(out[i] - want) > fabs(want) * ldexp(1.0, -23))
                    fail_msg("qdq format %d i=%zu x=%a: got %a want %a", f, i, (double)x[i],
                             (double)out[i], want);
                err2 += ((double)out[i] - x[i]) * ((double)out[i] - x[i]);
                ref2 += (double)x[i] * x[i];
            }
            /* scaled to the range: relative error of the order of the mantissa step */
            assert_true(sqrt(err2 / ref2) < (f ? 0.15 : 0.08));
            kcpu_fp8_qdq(x, x, n, scale, f);                    /* in place */
            TU_ASSERT_BITWISE(x, out, n, &rng, "qdq in place");
            free(x), free(out);
        }
}

/* qdq's fast rounding on the fp32 bits equals decode(encode(x)) (scale 1: x * 1 and
 * q / 1 are exact) on every code, every midpoint and its neighbours, the saturation range,
 * NaN/inf and random values. */
static void test_qdq_equals_decode_encode(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    enum { R = 40000 };
    float *x = tu_falloc(256 * 6 + R + 8), *out = tu_falloc(256 * 6 + R + 8);
    for (int f = 0; f < 2; f++) {
        size_t n = 0;
        for (int c = 0; c < 256; c++) {
            float v = kcpu_fp8_decode((uint8_t)c, f);
            float w = kcpu_fp8_decode((uint8_t)((c & 0x80) | ((c & 0x7f) + 1)), f);
            x[n++] = v;
            if ((c & 0x7f) < 0x7f && isfinite(v) && isfinite(w)) {
                float mid = (v + w) / 2;
                x[n++] = mid;
                x[n++] = nextafterf(mid, 0.0f);
                x[n++] = nextafterf(mid, mid < 0 ? -INFINITY : INFINITY);
            }
        }
        const float extra[8] = { 449.0f, 463.0f, 464.0f, 1e30f, -65000.0f, INFINITY,
                                 -INFINITY, NAN };
        for (int i = 0; i < 8; i++)
            x[n++] = extra[i];
        for (int i = 0; i < R; i++) {
            double e = tu_uniform(&rng) * 50.0 - (f ? 30.0 : 16.0);
            float v = (float)ldexp(1.0 + tu_uniform(&rng), (int)floor(e));
            x[n++] = tu_uniform(&rng) < 0.5 ? -v : v;
        }
        kcpu_fp8_qdq(out, x, n, 1.0f, f);
        for (size_t i = 0; i < n; i++) {
            float want = kcpu_fp8_decode(kcpu_fp8_encode(x[i], f), f);
            if (isnan(want) ? !isnan(out[i]) : memcmp(&want, &out[i], sizeof want))
                fail_msg("format %d x=%a: qdq %a, decode(encode) %a", f, (double)x[i],
                         (double)out[i], (double)want);
        }
    }
    free(x), free(out);
}

/* The cpu device's FP8 linear is the emulation, bit for bit: kcpu_fp8_qdq of the
 * operands, then the fp32 matmul (forward and backward, each gradient alone and both,
 * E5M2 and E4M3 gradients); without ws it refuses with HERR_NOALGO and no failure
 * status (the cpu has no FP8 GEMM). */
static void test_kdev_fp8_matmul_cpu(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int M = 1 + tu_randint(&rng, 0, 40), K = 1 + tu_randint(&rng, 0, 70), N = 1 + tu_randint(&rng, 0, 50);
    size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *x = tu_falloc(nx), *w = tu_falloc(nw), *dy = tu_falloc(ny), *b = tu_falloc((size_t)N);
    float *ws = tu_falloc(nx + nw + ny), *q = tu_falloc(nx + nw + ny);
    float *out = tu_falloc(ny), *ref = tu_falloc(ny);
    float *dx = tu_falloc(nx), *dxr = tu_falloc(nx), *dw = tu_falloc(nw), *dwr = tu_falloc(nw);
    tu_fill_normal(&rng, x, nx, 0, 2);
    tu_fill_normal(&rng, w, nw, 0, 0.1f);
    tu_fill_normal(&rng, dy, ny, 0, 1e-3f);
    tu_fill_normal(&rng, b, (size_t)N, 0, 1);
    float sx = kcpu_fp8_scale(kcpu_amax(x, nx), KFP8_E4M3, 0, 1.0f);
    float sw = kcpu_fp8_scale(kcpu_amax(w, nw), KFP8_E4M3, 0, 1.0f);
    kdev *d = NULL;
    char err[256];
    assert_int_equal(kdev_create(&d, KDEV_CPU, err, sizeof err), 0);

    /* the amaxes the calls record (kdev_fp8_amax), NaN until written */
    float am[3] = { NAN, NAN, NAN };
    kdev_fp8_amax rec = { &am[0], &am[1], &am[2] };
    assert_int_equal(kdev_fp8_matmul_forward(d, NULL, out, x, w, b, M, K, N, sx, sw, &rec),
                     HERR_NOALGO);
    assert_int_equal(kdev_status(d), 0);
    assert_true(isnan(am[0]) && isnan(am[1]));   /* HERR_NOALGO: nothing done */
    assert_int_equal(kdev_fp8_matmul_forward(d, ws, out, x, w, b, M, K, N, sx, sw, &rec), 0);
    float ax = kcpu_amax(x, nx), aw = kcpu_amax(w, nw), ay = kcpu_amax(dy, ny);
    assert_memory_equal(&am[0], &ax, sizeof ax);
    assert_memory_equal(&am[1], &aw, sizeof aw);
    assert_true(isnan(am[2]));                     /* the forward records no dy */
    kcpu_fp8_qdq(q, x, nx, sx, KFP8_E4M3);
    kcpu_fp8_qdq(q + nx, w, nw, sw, KFP8_E4M3);
    kcpu_matmul_forward(ref, q, q + nx, b, M, K, N);
    TU_ASSERT_BITWISE(out, ref, ny, &rng, "fp8 forward");

    for (int f = 0; f < 2; f++)
        for (int which = 1; which <= 3; which++) {   /* 1: dinp, 2: dw, 3: both */
            float sd = kcpu_fp8_scale(kcpu_amax(dy, ny), (kfp8_format)f, 0, 1.0f);
            float *gx = which & 1 ? dx : NULL, *gw = which & 2 ? dw : NULL;
            float *rx = which & 1 ? dxr : NULL, *rw = which & 2 ? dwr : NULL;
            tu_fill_normal(&rng, dx, nx, 0, 1);
            tu_fill_normal(&rng, dw, nw, 0, 1);
            memcpy(dxr, dx, nx * sizeof(float));
            memcpy(dwr, dw, nw * sizeof(float));
            assert_int_equal(kdev_fp8_matmul_backward(d, NULL, gx, gw, dy, x, w, M, K, N, sx,
                                                      sw, sd, (kfp8_format)f, NULL), HERR_NOALGO);
            am[2] = NAN;
            assert_int_equal(kdev_fp8_matmul_backward(d, ws, gx, gw, dy, x, w, M, K, N, sx, sw,
                                                      sd, (kfp8_format)f, &rec), 0);
            assert_memory_equal(&am[2], &ay, sizeof ay);
            kcpu_fp8_qdq(q, dy, ny, sd, (kfp8_format)f);
            kcpu_fp8_qdq(q + ny, x, nx, sx, KFP8_E4M3);
            kcpu_fp8_qdq(q + ny + nx, w, nw, sw, KFP8_E4M3);
            kcpu_matmul_backward(rx, rw, NULL, q, q + ny, q + ny + nx, M, K, N);
            TU_ASSERT_BITWISE(dx, dxr, nx, &rng, "fp8 dinp");
            TU_ASSERT_BITWISE(dw, dwr, nw, &rng, "fp8 dw");
        }
    assert_int_equal(kdev_status(d), 0);
    kdev_free(d);
    free(x), free(w), free(dy), free(b), free(ws), free(q), free(out), free(ref);
    free(dx), free(dxr), free(dw), free(dwr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code),
        cmocka_unit_test(test_ties_to_even),
        cmocka_unit_test(test_saturation_nan_inf),
        cmocka_unit_test(test_subnormals),
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_amax_scale_history),
        cmocka_unit_test(test_qdq_random),
        cmocka_unit_test(test_qdq_equals_decode_encode),
        cmocka_unit_test(test_kdev_fp8_matmul_cpu),
    };
    return cmocka_run_group_tests_name("kernels_fp8", tests, NULL, NULL);
}
