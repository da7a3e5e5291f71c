/* embedding.c - table lookup and its scatter-add backward.
 * ids must lie in [0, rows of table); the kernel cannot check (it is not told the
 * number of rows), the caller validates token ids once on input. */
#include "kernels.h"

#include <string.h>

void kcpu_embedding_forward(float *out, const int *ids, const float *table, int N, int C)
{
#pragma omp parallel for schedule(static) if (N >= 64)
    for (int i = 0; i < N; i++)
        memcpy(out + (size_t)i * C, table + (size_t)ids[i] * C, (size_t)C * sizeof *out);
}

/* Several tokens may share an id, so rows of dtable are not independent across tokens.
 * Threads split the columns instead and walk the tokens in order: every dtable element
 * receives its contributions in token order whatever the thread count. */
#define EMB_COLS 64

void kcpu_embedding_backward(float *dtable, const float *dout, const int *ids, int N, int C)
{
    int blocks = (C + EMB_COLS - 1) / EMB_COLS;
#pragma omp parallel for schedule(static) if (blocks > 1 && (size_t)N * C >= 65536)
    for (int b = 0; b < blocks; b++) {
        int c0 = b * EMB_COLS, c1 = c0 + EMB_COLS < C ? c0 + EMB_COLS : C;
        for (int i = 0; i < N; i++) {
            if (ids[i] < 0)
                continue;
            float *dst = dtable + (size_t)ids[i] * C;
            const float *src = dout + (size_t)i * C;
            for (int c = c0; c < c1; c++)
                dst[c] += src[c];
        }
    }
}
