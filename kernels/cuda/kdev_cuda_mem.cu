/* kdev_cuda_mem.cu - device memory of the cuda backend: allocation with the pointer ->
 * size map behind kdev_mem_stats, host <-> device transfers, device copies, sync.
 *
 * Everything is enqueued on the device's stream.  Uploads wait for their copy, because
 * the caller may reuse its host buffer as soon as kdev_upload returns; downloads wait
 * because the caller reads the result. */
#include "cuda/kdev_cuda_internal.h"

#include <stdint.h>
#include <stdlib.h>

/* ---- the pointer -> size map: open addressing, linear probing, power-of-two capacity,
 * at most half full; deletion shifts the probe chain back (no tombstones). */

static size_t map_home(const void *p, size_t cap)
{
    /* cudaMalloc pointers are 256-byte aligned: the low bits carry nothing */
    uint64_t h = ((uint64_t)(uintptr_t)p >> 8) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static int map_grow(cuda_state *s)
{
    size_t cap = s->map_cap ? s->map_cap * 2 : 256;
    cuda_block *m = (cuda_block *)calloc(cap, sizeof *m);
    if (!m)
        return HERR_NOMEM;
    for (size_t i = 0; i < s->map_cap; i++) {
        if (!s->map[i].p)
            continue;
        size_t j = map_home(s->map[i].p, cap);
        while (m[j].p)
            j = (j + 1) & (cap - 1);
        m[j] = s->map[i];
    }
    free(s->map);
    s->map = m;
    s->map_cap = cap;
    return 0;
}

static int map_put(cuda_state *s, void *p, size_t bytes)
{
    if ((s->map_used + 1) * 2 > s->map_cap && map_grow(s))
        return HERR_NOMEM;
    size_t j = map_home(p, s->map_cap);
    while (s->map[j].p)
        j = (j + 1) & (s->map_cap - 1);
    s->map[j].p = p;
    s->map[j].bytes = bytes;
    s->map_used++;
    return 0;
}

/* Removes p; returns 1 and its size when it was there. */
static int map_take(cuda_state *s, const void *p, size_t *bytes)
{
    if (!s->map_cap)
        return 0;
    size_t mask = s->map_cap - 1, j = map_home(p, s->map_cap);
    while (s->map[j].p && s->map[j].p != p)
        j = (j + 1) & mask;
    if (!s->map[j].p)
        return 0;
    *bytes = s->map[j].bytes;
    s->map[j].p = NULL;
    s->map_used--;
    /* shift back the entries after j that probed past it */
    for (size_t i = (j + 1) & mask; s->map[i].p; i = (i + 1) & mask) {
        size_t h = map_home(s->map[i].p, s->map_cap);
        /* the entry at i may move to j when j lies cyclically in [h, i) */
        if (((i - h) & mask) >= ((i - j) & mask)) {
            s->map[j] = s->map[i];
            s->map[i].p = NULL;
            j = i;
        }
    }
    return 1;
}

/* ---- the ops ------------------------------------------------------------------------ */

int cuda_alloc(kdev *d, void **p, size_t bytes)
{
    cuda_state *s = cuda_st(d);
    void *q = NULL;
    /* one byte for bytes == 0: every pointer stays unique, as the cpu backend's are */
    cudaError_t e = cudaMalloc(&q, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kdev_fail(d, HERR_NOMEM, "alloc: %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    int rc = cuda_err(d, cudaMemsetAsync(q, 0, bytes ? bytes : 1, s->stream), "alloc: memset");
    if (!rc && map_put(s, q, bytes))
        rc = kdev_fail(d, HERR_NOMEM, "alloc: out of host memory for the allocation map");
    if (rc) {
        cudaFree(q);
        return rc;
    }
    s->current += bytes;
    if (s->current > s->peak)
        s->peak = s->current;
    *p = q;
    return 0;
}

size_t cuda_act_bytes(const kdev *d)
{
    return cuda_st(d)->prec == KDEV_PREC_BF16 ? 2 : 4;
}

int cuda_alloc_act(kdev *d, void **p, size_t count)
{
    cuda_state *s = cuda_st(d);
    size_t esz = cuda_act_bytes(d);
    if (esz == sizeof(float))
        return cuda_alloc(d, p, count * esz);
    if (s->act_n == s->act_cap) {
        size_t cap = s->act_cap ? 2 * s->act_cap : 16;
        cuda_block *a = (cuda_block *)realloc(s->act, cap * sizeof *a);
        if (!a)
            return kdev_fail(d, HERR_NOMEM, "alloc_act: out of host memory");
        s->act = a;
        s->act_cap = cap;
    }
    int rc = cuda_alloc(d, p, count * esz);
    if (rc)
        return rc;
    s->act[s->act_n].p = *p;
    s->act[s->act_n].bytes = count * esz;
    s->act_n++;
    return 0;
}

int cuda_act16(const kdev *d, const void *p)
{
    const cuda_state *s = cuda_st(d);
    const char *c = (const char *)p;
    for (size_t i = 0; p && i < s->act_n; i++)
        if (c >= (const char *)s->act[i].p && c < (const char *)s->act[i].p + s->act[i].bytes)
            return 1;
    return 0;
}

int cuda_no_act16(kdev *d, const char *op, const char *arg, const void *p)
{
    if (!cuda_act16(d, p))
        return 0;
    return kdev_fail(d, HERR_ARG, "%s: %s lies in bf16 activation memory, which this op "
                     "does not take", op, arg);
}

/* Forgets p as activation memory (if it was). */
static void act_forget(cuda_state *s, const void *p)
{
    for (size_t i = 0; i < s->act_n; i++)
        if (s->act[i].p == p) {
            s->act[i] = s->act[--s->act_n];
            return;
        }
}

void cuda_release(kdev *d, void *p)
{
    cuda_state *s = cuda_st(d);
    size_t bytes;
    act_forget(s, p);
    if (!map_take(s, p, &bytes)) {
        /* not ours: freeing it could free another owner's memory */
        kdev_fail(d, HERR_ARG, "release: %p was not allocated by this device", p);
        return;
    }
    /* work still queued may read the block */
    cudaStreamSynchronize(s->stream);
    cudaFree(p);
    s->current -= bytes;
}

void cuda_release_all(kdev *d)
{
    cuda_state *s = cuda_st(d);
    for (size_t i = 0; i < s->map_cap; i++)
        if (s->map[i].p) {
            cudaFree(s->map[i].p);
            s->map[i].p = NULL;
        }
    s->map_used = 0;
    s->act_n = 0;
    s->current = 0;
}

int cuda_upload(kdev *d, void *dst, const void *host, size_t bytes)
{
    cudaStream_t st = cuda_stream(d);
    int rc = cuda_err(d, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, st),
                      "upload");
    return rc ? rc : cuda_err(d, cudaStreamSynchronize(st), "upload: sync");
}

int cuda_download(kdev *d, void *host, const void *src, size_t bytes)
{
    cudaStream_t st = cuda_stream(d);
    int rc = cuda_err(d, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, st),
                      "download");
    return rc ? rc : cuda_err(d, cudaStreamSynchronize(st), "download: sync");
}

int cuda_copy(kdev *d, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return 0;
    return cuda_err(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                       cuda_stream(d)), "copy");
}

/* Rows of w 16-byte units, dst and src rows dp and sp units apart; rows on the grid's y. */
__global__ void cuda_copy_2d_kernel(uint4 *dst, size_t dp, const uint4 *src, size_t sp,
                                    size_t w, size_t rows)
{
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < w;
             c += (size_t)gridDim.x * blockDim.x)
            dst[r * dp + c] = src[r * sp + c];
}

/* Whether every one of the values is a multiple of 16. */
static int all16(uintptr_t a, uintptr_t b, size_t c, size_t d, size_t e)
{
    return ((a | b | c | d | e) & 15) == 0;
}

int cuda_copy_2d(kdev *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                 size_t width, size_t rows)
{
    if (!width || !rows)
        return 0;
    /* one row: no pitch constraint (cudaMemcpy2D wants width <= both pitches) */
    if (rows == 1)
        return cuda_copy(d, dst, src, width);
    if (width > dpitch || width > spitch)
        return kdev_fail(d, HERR_ARG, "copy_2d: width %zu exceeds a pitch (%zu, %zu)", width,
                         dpitch, spitch);
    /* 16-byte rows and pitches (the qkv split): a kernel of 16-byte loads, which moved
     * more than cudaMemcpy2DAsync's ~1.6 TB/s there */
    if (all16((uintptr_t)dst, (uintptr_t)src, dpitch, spitch, width)) {
        size_t w = width / 16;
        unsigned gx = (unsigned)((w + 255) / 256);
        dim3 grid(gx < 65535 ? gx : 65535, (unsigned)(rows < 65535 ? rows : 65535));
        cuda_copy_2d_kernel<<<grid, 256, 0, cuda_stream(d)>>>((uint4 *)dst, dpitch / 16,
                                                             (const uint4 *)src, spitch / 16,
                                                             w, rows);
        return cuda_launched(d, "copy_2d");
    }
    return cuda_err(d, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                         cudaMemcpyDeviceToDevice, cuda_stream(d)),
                    "copy_2d");
}

int cuda_zero(kdev *d, void *p, size_t bytes)
{
    if (!bytes)
        return 0;
    return cuda_err(d, cudaMemsetAsync(p, 0, bytes, cuda_stream(d)), "zero");
}

int cuda_sync(kdev *d)
{
    int rc = cuda_err(d, cudaStreamSynchronize(cuda_stream(d)), "sync");
    return rc ? rc : cuda_err(d, cudaGetLastError(), "sync: an earlier launch");
}

void cuda_mem_stats(const kdev *d, size_t *peak, size_t *current)
{
    const cuda_state *s = cuda_st(d);
    *peak = s->peak;
    *current = s->current;
}
