/* rope.c - rotary position embedding ("rotate half" pairing) and its angle tables.
 * Angles and their cos/sin are computed in double and rounded once to float, so the
 * tables are as exact as fp32 allows even at large positions. */
#include "kernels.h"

#include <math.h>

#define PAR_TOKENS(N, H, D) ((size_t)(N) * (size_t)(H) * (size_t)(D) >= 32768)

/* (x1, x2) -> (x1 c - x2 s, x2 c + x1 s); products are exact in double, one rounding. */
void kcpu_rope_forward(float *x, const float *cos, const float *sin, int N, int H, int D)
{
    int half = D / 2;
#pragma omp parallel for schedule(static) if (PAR_TOKENS(N, H, D))
    for (int n = 0; n < N; n++) {
        const float *c = cos + (size_t)n * half, *s = sin + (size_t)n * half;
        for (int h = 0; h < H; h++) {
            float *v = x + ((size_t)n * H + h) * D;
            for (int i = 0; i < half; i++) {
                double x1 = v[i], x2 = v[i + half];
                v[i] = (float)(x1 * c[i] - x2 * s[i]);
                v[i + half] = (float)(x2 * c[i] + x1 * s[i]);
            }
        }
    }
}

/* The rotation is orthogonal: its gradient is the rotation by the opposite angle. */
void kcpu_rope_backward(float *dx, const float *cos, const float *sin, int N, int H, int D)
{
    int half = D / 2;
#pragma omp parallel for schedule(static) if (PAR_TOKENS(N, H, D))
    for (int n = 0; n < N; n++) {
        const float *c = cos + (size_t)n * half, *s = sin + (size_t)n * half;
        for (int h = 0; h < H; h++) {
            float *v = dx + ((size_t)n * H + h) * D;
            for (int i = 0; i < half; i++) {
                double g1 = v[i], g2 = v[i + half];
                v[i] = (float)(g1 * c[i] + g2 * s[i]);
                v[i + half] = (float)(g2 * c[i] - g1 * s[i]);
            }
        }
    }
}

static void put_angle(float *cos_out, float *sin_out, double angle)
{
    *cos_out = (float)cos(angle);
    *sin_out = (float)sin(angle);
}

void kcpu_rope_table_1d(float *cos, float *sin, const int *pos, int N, int D, float theta)
{
    int half = D / 2;
    for (int j = 0; j < half; j++) {
        double inv_freq = pow((double)theta, -2.0 * j / D);
        for (int n = 0; n < N; n++)
            put_angle(cos + (size_t)n * half + j, sin + (size_t)n * half + j,
                      (double)pos[n] * inv_freq);
    }
}

void kcpu_rope_table_mrope(float *cos, float *sin, const int *pos3, const int sections[3],
                           int N, int D, float theta)
{
    int half = D / 2;
    for (int j = 0; j < half; j++) {
        int row = j < sections[0] ? 0 : j < sections[0] + sections[1] ? 1 : 2;
        double inv_freq = pow((double)theta, -2.0 * j / D);
        for (int n = 0; n < N; n++)
            put_angle(cos + (size_t)n * half + j, sin + (size_t)n * half + j,
                      (double)pos3[(size_t)row * N + n] * inv_freq);
    }
}

/* D is a multiple of 4 for this table; otherwise the last column (j >= 2*(D/4)) gets
 * angle 0, i.e. that pair is left unrotated. */
void kcpu_rope_table_2d(float *cos, float *sin, const int *pos_hw, int N, int D, float theta)
{
    int half = D / 2, q = D / 4;
    for (int j = 0; j < half; j++) {
        int jj = j < q ? j : j - q, axis = j < q ? 0 : 1; /* h angles, then w angles */
        double f = pow((double)theta, -2.0 * jj / (D / 2));
        for (int n = 0; n < N; n++) {
            double angle = j < 2 * q ? (double)pos_hw[(size_t)n * 2 + axis] * f : 0.0;
            put_angle(cos + (size_t)n * half + j, sin + (size_t)n * half + j, angle);
        }
    }
}
