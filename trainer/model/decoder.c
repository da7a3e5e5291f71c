/* decoder.c - the language decoder: embedding, image fill, positions, blocks, final
 * norm, LM head and cross-entropy, forward and backward.
 *
 * - Embedding: rows of decoder.embed.weight; rows at image-token positions are replaced
 *   by the projector outputs in order (like HF's masked_scatter), so those positions give
 *   the embedding table no gradient.  Learned positions (GPT-2) then add
 *   decoder.pos_embed.weight[i] for the position i in the sequence.
 * - Positions: mrope (model_mrope_positions per sequence), rope (index in the sequence).
 * - Blocks: causal attention within each sequence (block.c).
 * - Head: only rows with a target go through the LM head, in chunks of a fixed number of
 *   rows (HEAD_CHUNK_FLOATS / vocab) so that the logits buffer stays bounded for large
 *   vocabularies.  During training the cross-entropy backward runs chunk by chunk right
 *   after the forward, so no logits outlive their chunk.
 * - Objective: loss_scale * sum of token losses + aux_scale * sum of MoE aux losses. */
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

#define HEAD_CHUNK_FLOATS (1 << 22)

static int head_chunk(int vocab)
{
    int c = HEAD_CHUNK_FLOATS / vocab;
    return c < 1 ? 1 : c;
}

static void take(decoder_part *d, farena *fa, iarena *ia, int N, int chunk)
{
    const stack_cfg *c = &d->st.c;
    size_t n = (size_t)N, ch = (size_t)chunk, V = (size_t)d->sh->vocab;
    d->ids = ia_take(ia, n);
    d->cu = ia_take(ia, n + 1);
    d->pos3 = ia_take(ia, 3 * n);
    d->pos1 = ia_take(ia, n);
    d->trow = ia_take(ia, n);
    d->tchunk = ia_take(ia, ch);
    d->cos = fa_take(fa, n * (c->D / 2));
    d->sin = fa_take(fa, n * (c->D / 2));
    d->hf = fa_take(fa, n * c->H);
    d->meanf = fa_take(fa, n);
    d->rstdf = fa_take(fa, n);
    d->dhf = fa_take(fa, n * c->H);
    d->hc = fa_take(fa, ch * c->H);
    d->dhc = fa_take(fa, ch * c->H);
    d->logits = fa_take(fa, ch * V);
    d->dlogits = fa_take(fa, ch * V);
    d->losses = fa_take(fa, ch);
    d->dlosses = fa_take(fa, ch);
}

static int reserve(decoder_part *d, int N, hearth_err *err)
{
    int rc = stack_reserve(&d->st, N, err);
    if (rc)
        return rc;
    if (N <= d->cap_tokens && d->fbuf)
        return 0;
    int chunk = head_chunk(d->sh->vocab);
    if (chunk > N)
        chunk = N;
    farena fa = { NULL, 0 };
    iarena ia = { NULL, 0 };
    take(d, &fa, &ia, N, chunk);
    free(d->fbuf);
    free(d->ibuf);
    d->fbuf = calloc(fa.used ? fa.used : 1, sizeof(float));
    d->ibuf = calloc(ia.used ? ia.used : 1, sizeof(int));
    if (!d->fbuf || !d->ibuf) {
        free(d->fbuf);
        free(d->ibuf);
        d->fbuf = NULL;
        d->ibuf = NULL;
        d->cap_tokens = 0;
        return herr_set(err, HERR_NOMEM, "decoder: out of memory for %d tokens", N);
    }
    fa.base = d->fbuf;
    fa.used = 0;
    ia.base = d->ibuf;
    ia.used = 0;
    take(d, &fa, &ia, N, chunk);
    d->cap_tokens = N;
    d->cap_chunk = chunk;
    return 0;
}

/* Checks token and target ids; returns the number of image tokens or a negative code. */
static int check_ids(const model *m, const vlm_batch *b, int N, hearth_err *err)
{
    const decoder_shape *ds = m->dec.sh;
    int images = 0;
    for (int i = 0; i < N; i++) {
        int t = b->tokens[i], y = b->targets[i];
        if (m->enc.present && t == ds->image_token_id)
            images++;
        else if (t < 0 || t >= ds->vocab)
            return herr_set(err, HERR_RUNTIME, "decoder: token %d at position %d is outside "
                            "the vocabulary [0, %d)", t, i, ds->vocab);
        if (y != -1 && (y < 0 || y >= ds->vocab))
            return herr_set(err, HERR_RUNTIME, "decoder: target %d at position %d is "
                            "outside the vocabulary [0, %d) and not -1", y, i, ds->vocab);
    }
    return images;
}

/* Fills the RoPE tables for this batch (or checks learned positions fit). */
static int positions(model *m, const vlm_batch *b, hearth_err *err)
{
    decoder_part *d = &m->dec;
    const stack_shape *s = &d->sh->s;
    int S = b->seq_len, N = b->n_seq * S, D = s->head_dim;
    float theta = (float)s->rope_theta;
    if (s->pos == POS_LEARNED) {
        if (S > d->sh->max_positions)
            return herr_set(err, HERR_RUNTIME, "decoder: seq_len %d exceeds the %d learned "
                            "positions", S, d->sh->max_positions);
        return 0;
    }
    if (s->pos == POS_ROPE) {
        for (int i = 0; i < N; i++)
            d->pos1[i] = i % S;
        kcpu_rope_table_1d(d->cos, d->sin, d->pos1, N, D, theta);
        return 0;
    }
    /* mrope */
    int img = m->enc.present ? d->sh->image_token_id : -1;  /* tokens are >= 0 */
    int merge = m->enc.present ? m->enc.sh->spatial_merge : 1;
    int cursor = 0;
    for (int sq = 0; sq < b->n_seq; sq++) {
        int rc = model_mrope_positions(d->pos3, b->tokens + (size_t)sq * S, S, img,
                                       b->grid_thw, b->n_images, merge, &cursor, err);
        if (rc)
            return herr_prefix(err, rc, "decoder: sequence %d", sq);
        size_t off = (size_t)sq * S * (D / 2);
        kcpu_rope_table_mrope(d->cos + off, d->sin + off, d->pos3, s->mrope_section, S, D,
                              theta);
    }
    if (cursor != b->n_images)
        return herr_set(err, HERR_RUNTIME, "decoder: only %d of %d images have tokens",
                        cursor, b->n_images);
    return 0;
}

int decoder_run(model *m, const vlm_batch *b, int train, float loss_scale, float aux_scale,
                int need_dimg, model_stats *st, hearth_err *err)
{
    decoder_part *d = &m->dec;
    const decoder_shape *ds = d->sh;
    stack *sk = &d->st;
    const stack_cfg *c = &sk->c;
    int S = b->seq_len, H = c->H, V = ds->vocab;
    if ((long)b->n_seq * S > (1L << 28))
        return herr_set(err, HERR_RUNTIME, "decoder: batch too large");
    int N = b->n_seq * S;

    int n_img = check_ids(m, b, N, err);
    if (n_img < 0)
        return n_img;
    if (n_img != m->enc.n_units)
        return herr_set(err, HERR_RUNTIME, "decoder: the text has %d image tokens but the "
                        "%d images give %d", n_img, b->n_images, m->enc.n_units);
    int rc = reserve(d, N, err);
    if (rc)
        return rc;
    d->n_tokens = N;
    if ((rc = positions(m, b, err)))
        return rc;

    /* Embedding, image fill, learned positions. */
    int img = m->enc.present ? ds->image_token_id : -1;
    for (int i = 0; i < N; i++)
        d->ids[i] = b->tokens[i] == img ? 0 : b->tokens[i];
    float *x = sk->xs[0];
    kcpu_embedding_forward(x, d->ids, d->embed_w, N, H);
    if (n_img > 0) {
        int k = 0;
        for (int i = 0; i < N; i++)
            if (b->tokens[i] == img)
                memcpy(x + (size_t)i * H, m->img_feat + (size_t)k++ * H,
                       (size_t)H * sizeof(float));
    }
    if (d->pos_w)
        for (int i = 0; i < N; i++)
            kcpu_accumulate(x + (size_t)i * H, d->pos_w + (size_t)(i % S) * H, (size_t)H);

    /* Pinned MoE routing (model_pin_routing) applies to batches of the same size. */
    size_t per = (size_t)N * c->K, n_moe = 0;
    for (int l = 0; l < sk->L; l++)
        if (sk->layers[l].moe)
            sk->layers[l].pin = m->pin_route ? m->pin_route + per * n_moe++ : NULL;
    if (m->pin_route && m->n_pin != per * n_moe)
        return herr_set(err, HERR_RUNTIME, "decoder: the pinned routing has %zu entries, "
                        "this batch routes %zu", m->n_pin, per * n_moe);
    for (int sq = 0; sq <= b->n_seq; sq++)
        d->cu[sq] = sq * S;
    d->ctx = (stack_ctx){
        .N = N, .N_local = N, .cos = c->rope ? d->cos : NULL, .sin = c->rope ? d->sin : NULL,
        .cu = d->cu, .nseq = b->n_seq, .cu_full = d->cu, .nseq_full = b->n_seq,
    };
    double aux = 0;
    if ((rc = stack_forward(sk, &d->ctx, &aux, err)))
        return rc;
    const float *xL = sk->xs[sk->L];
    norm_forward(ds->s.norm, d->hf, d->meanf, d->rstdf, xL, d->norm_w, d->norm_b, N, H,
                 ds->s.norm_eps);

    /* Head and loss over the rows that have a target. */
    int nt = 0;
    for (int i = 0; i < N; i++)
        if (b->targets[i] != -1)
            d->trow[nt++] = i;
    if (train)
        memset(d->dhf, 0, (size_t)N * H * sizeof(float));
    double loss = 0;
    int chunk = head_chunk(V);
    for (int r0 = 0; r0 < nt; r0 += chunk) {
        int n = nt - r0 < chunk ? nt - r0 : chunk;
        for (int r = 0; r < n; r++) {
            int i = d->trow[r0 + r];
            memcpy(d->hc + (size_t)r * H, d->hf + (size_t)i * H, (size_t)H * sizeof(float));
            d->tchunk[r] = b->targets[i];
        }
        kcpu_matmul_forward(d->logits, d->hc, d->head_w, NULL, n, H, V);
        kcpu_crossentropy_forward(d->losses, d->logits, d->tchunk, n, V, -1);
        for (int r = 0; r < n; r++)
            loss += d->losses[r];
        if (!train)
            continue;
        for (int r = 0; r < n; r++)
            d->dlosses[r] = loss_scale;
        memset(d->dlogits, 0, (size_t)n * V * sizeof(float));
        kcpu_crossentropy_backward(d->dlogits, d->logits, d->tchunk, d->dlosses, n, V, -1);
        memset(d->dhc, 0, (size_t)n * H * sizeof(float));
        kcpu_matmul_backward(d->dhc, d->head_gw, NULL, d->dlogits, d->hc, d->head_w, n, H, V);
        for (int r = 0; r < n; r++)
            memcpy(d->dhf + (size_t)d->trow[r0 + r] * H, d->dhc + (size_t)r * H,
                   (size_t)H * sizeof(float));
    }
    st->loss_sum = loss;
    st->n_targets = nt;
    st->aux_loss = aux;

    /* Backward: nothing to do when the decoder is frozen and no projector waits. */
    if (!train || (ds->s.freeze && !need_dimg))
        return 0;
    float *dres = sk->sc.dres;
    memset(dres, 0, (size_t)N * H * sizeof(float));
    norm_backward(ds->s.norm, dres, d->norm_gw, d->norm_gb, d->dhf, xL, d->norm_w, d->meanf,
                  d->rstdf, N, H);
    if ((rc = stack_backward(sk, &d->ctx, aux_scale, err)))
        return rc;
    if (d->pos_gw)
        for (int i = 0; i < N; i++)
            kcpu_accumulate(d->pos_gw + (size_t)(i % S) * H, dres + (size_t)i * H, (size_t)H);
    if (n_img > 0) {
        /* Image rows feed the projector, not the embedding table. */
        int k = 0;
        for (int i = 0; i < N; i++) {
            if (b->tokens[i] != img)
                continue;
            if (need_dimg)
                memcpy(m->dimg_feat + (size_t)k * H, dres + (size_t)i * H,
                       (size_t)H * sizeof(float));
            k++;
            memset(dres + (size_t)i * H, 0, (size_t)H * sizeof(float));
        }
    }
    if (d->embed_gw)
        kcpu_embedding_backward(d->embed_gw, dres, d->ids, N, H);
    return 0;
}
