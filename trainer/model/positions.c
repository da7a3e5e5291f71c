/* positions.c - decoder mRoPE positions (Qwen2-VL get_rope_index) and the ViT window
 * index (Qwen2.5-VL get_window_index). */
#include "model/internal.h"

int model_mrope_positions(int *pos3, const int *tokens, int seq_len, int image_token_id,
                          const int *grid_thw, int n_images, int spatial_merge,
                          int *img_cursor, hearth_err *err)
{
    int S = seq_len;
    int next = 0;   /* position the next text token takes: max so far + 1 */
    int i = 0;
    if (spatial_merge < 1)
        return herr_set(err, HERR_RUNTIME, "mrope: spatial_merge must be positive");
    while (i < S) {
        if (tokens[i] != image_token_id) {
            pos3[i] = pos3[S + i] = pos3[2 * S + i] = next++;
            i++;
            continue;
        }
        int k = *img_cursor;
        if (k >= n_images)
            return herr_set(err, HERR_RUNTIME, "mrope: image token at position %d but all "
                            "%d images are used", i, n_images);
        const int *g = grid_thw + 3 * k;
        if (g[0] < 1 || g[1] < 1 || g[2] < 1 || g[1] % spatial_merge || g[2] % spatial_merge)
            return herr_set(err, HERR_RUNTIME, "mrope: image %d has grid %dx%dx%d, not "
                            "positive multiples of spatial_merge %d", k, g[0], g[1], g[2],
                            spatial_merge);
        int gt = g[0], gh = g[1] / spatial_merge, gw = g[2] / spatial_merge;
        long n = (long)gt * gh * gw;
        if (i + n > S)
            return herr_set(err, HERR_RUNTIME, "mrope: image %d needs %ld tokens from "
                            "position %d, past the sequence end %d", k, n, i, S);
        for (long j = 0; j < n; j++)
            if (tokens[i + j] != image_token_id)
                return herr_set(err, HERR_RUNTIME, "mrope: image %d needs %ld image tokens "
                                "from position %d, found only %ld", k, n, i, j);
        int j = i;
        for (int t = 0; t < gt; t++)
            for (int h = 0; h < gh; h++)
                for (int w = 0; w < gw; w++, j++) {
                    pos3[j] = next + t;
                    pos3[S + j] = next + h;
                    pos3[2 * S + j] = next + w;
                }
        int span = gt;
        if (gh > span)
            span = gh;
        if (gw > span)
            span = gw;
        next += span;   /* max position of the image + 1 */
        i += (int)n;
        (*img_cursor)++;
    }
    return 0;
}

int vit_frame_seqlens(int *cu, const int *grid_thw, int n_images)
{
    int f = 0;
    cu[0] = 0;
    for (int i = 0; i < n_images; i++) {
        const int *g = grid_thw + 3 * i;
        for (int t = 0; t < g[0]; t++, f++)
            cu[f + 1] = cu[f] + g[1] * g[2];
    }
    return f;
}

int vit_window_index(int *win_idx, int *cu_win, const int *grid_thw, int n_images,
                     int merge, int ws)
{
    int m2 = merge * merge;
    int nw = 0;
    int unit0 = 0;  /* global index of the current frame's first unit */
    int out = 0;
    cu_win[0] = 0;
    for (int i = 0; i < n_images; i++) {
        const int *g = grid_thw + 3 * i;
        int uh = g[1] / merge, uw = g[2] / merge;
        int sh = ws > 0 ? ws : uh, sw = ws > 0 ? ws : uw;
        for (int t = 0; t < g[0]; t++) {
            for (int wy = 0; wy < uh; wy += sh)
                for (int wx = 0; wx < uw; wx += sw) {
                    int y1 = wy + sh < uh ? wy + sh : uh;
                    int x1 = wx + sw < uw ? wx + sw : uw;
                    for (int y = wy; y < y1; y++)
                        for (int x = wx; x < x1; x++)
                            win_idx[out++] = unit0 + y * uw + x;
                    cu_win[nw + 1] = cu_win[nw] + (y1 - wy) * (x1 - wx) * m2;
                    nw++;
                }
            unit0 += uh * uw;
        }
    }
    return nw;
}
