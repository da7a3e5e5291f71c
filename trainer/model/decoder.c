/* decoder.c - one pipeline stage of the language decoder (model_par.h): embedding, image
 * fill, positions, blocks, final norm, LM head and cross-entropy, forward and backward.
 *
 * - Embedding (has_embed): rows of this rank's vocabulary slice of decoder.embed.weight,
 *   zeros for tokens outside it, summed over tp (under sp a reduce-scatter keeps this
 *   rank's rows).  Rows at image-token positions are then replaced by the image rows in
 *   order (like HF's masked_scatter), so those positions give the embedding table no
 *   gradient.  Learned positions (GPT-2) add decoder.pos_embed.weight[i] for the position
 *   i in the sequence.
 * - Positions: mrope (model_mrope_positions per sequence), rope (index in the sequence),
 *   for all N tokens on every stage (attention sees every token).
 * - Blocks: causal attention within each sequence (block.c); the residual stream holds
 *   the rank's local rows.
 * - Head (has_head): final norm on the local rows, gathered to all N rows under sp, then
 *   the vocabulary-parallel head and cross-entropy over rows with a target (head.c).
 * - Objective: loss_scale * sum of token losses + aux_scale * sum of MoE aux losses.
 * - Context parallelism (cp > 1): this rank's N tokens are chunks c and 2 cp - 1 - c of
 *   every sequence (lrow maps them to rows of the micro batch); positions are computed
 *   for the whole micro batch and the local rows taken; the embedding, image rows, head
 *   and loss see local tokens only; loss and target counts are summed over cp.
 * - Sequence chunks (seq_chunks K > 1, docs/parallel/chunks.md): the object's tokens are
 *   chunk j of every sequence (lrow maps them, as under cp); positions of the whole micro
 *   batch, local rows taken; attention reads and fills the owner's key/value cache
 *   (chunk_attn.c), which begin of chunk 0 sizes. */
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

/* Logits held at once by the head: 16 MiB on the cpu; on a GPU 4 GiB, so that a micro
 * batch's rows fit one chunk (GPT-2's 16 x 1024 rows of 50257, the Qwen2.5-VL-3B shape's
 * 4096 of 151936): with several chunks the backward computes every chunk's logits a
 * second time (one more LM-head GEMM over the micro batch), and small chunks leave the
 * GPU idle.  The gradient is written over the logits (head.c), so this is the head's
 * only vocabulary-wide buffer. */
#define HEAD_CHUNK_FLOATS (1 << 22)
#define HEAD_CHUNK_FLOATS_GPU (1 << 30)

static int head_chunk(const kdev *dev, int vocab)
{
    int floats = kdev_get_kind(dev) == KDEV_CPU ? HEAD_CHUNK_FLOATS : HEAD_CHUNK_FLOATS_GPU;
    int c = floats / (vocab > 0 ? vocab : 1);
    return c < 1 ? 1 : c;
}

/* The decoder's buffers beside its stack's, carved from four arenas: host ints (ia) and
 * floats (ha: RoPE tables, head statistics), device ints (da) and floats (fa).
 * N: this rank's tokens (the micro batch's Nf / cp). */
typedef struct {
    farena fa, ha;
    iarena ia, da;
    size_t doubles;         /* the device's lse and csum */
} dec_arenas;

static void take(decoder_part *d, dec_arenas *a, int N, int Nf, int chunk)
{
    const stack_cfg *c = &d->st.c;
    size_t n = (size_t)N, nf = (size_t)Nf, ch = (size_t)chunk, V = (size_t)(d->v1 - d->v0);
    size_t nl = (size_t)(d->sp ? N / d->tp : N), half = (size_t)c->D / 2;
    int sliced = d->cp > 1 || d->seq_chunks > 1;   /* local rows are not the micro batch */
    iarena *ia = &a->ia, *da = &a->da;
    farena *fa = &a->fa, *ha = &a->ha;
    d->ids = ia_take(ia, n);
    d->tgt = ia_take(ia, n);
    d->imgk = ia_take(ia, n);
    d->lrow = ia_take(ia, n);
    d->cp_pos = d->cp > 1 ? ia_take(ia, (size_t)d->cp * n) : NULL;
    d->cu = ia_take(ia, n + 1);
    d->pos3 = ia_take(ia, 3 * nf);
    d->pos1 = ia_take(ia, nf);
    d->trow = ia_take(ia, n);
    d->ttgt = ia_take(ia, n);
    d->erow = ia_take(ia, n);
    d->prow = ia_take(ia, n);
    d->imgdst = ia_take(ia, nf);   /* image rows of the whole micro batch: < Nf */
    d->cp_pos_d = d->cp > 1 ? ia_take(da, (size_t)d->cp * n) : NULL;
    d->cu_d = ia_take(da, n + 1);
    d->trow_d = ia_take(da, n);
    d->ttgt_d = ia_take(da, n);
    d->erow_d = ia_take(da, n);
    d->prow_d = ia_take(da, n);
    d->imgk_d = ia_take(da, n);
    d->imgdst_d = ia_take(da, nf);
    d->cos = fa_take(ha, nf * half);
    d->sin = fa_take(ha, nf * half);
    d->cosl = sliced ? fa_take(ha, n * half) : d->cos;
    d->sinl = sliced ? fa_take(ha, n * half) : d->sin;
    d->losses_h = fa_take(ha, n);
    d->cos_d = fa_take(fa, n * half);
    d->sin_d = fa_take(fa, n * half);
    d->xg = d->tp > 1 ? fa_take(fa, n * c->H) : NULL;
    d->pbuf = d->sh->s.pos == POS_LEARNED ? fa_take(fa, nl * c->H) : NULL;
    a->doubles = n + 2 * ch;
    if (!d->has_head) {
        d->hl = d->hf = d->meanf = d->rstdf = d->dhf = d->dhl = NULL;
        d->hc = d->dhc = d->logits = d->losses = d->cmax = NULL;
        return;
    }
    d->hf = fa_take(fa, n * c->H);
    d->hl = d->sp ? fa_take(fa, nl * c->H) : d->hf;
    d->meanf = fa_take(fa, nl);
    d->rstdf = fa_take(fa, nl);
    d->dhf = fa_take(fa, n * c->H);
    d->dhl = d->sp ? fa_take(fa, nl * c->H) : d->dhf;
    d->hc = fa_take(fa, ch * c->H);
    d->dhc = fa_take(fa, ch * c->H);
    d->logits = fa_take(fa, ch * V);
    d->losses = fa_take(fa, n);
    d->cmax = fa_take(fa, ch);
}

static void release_buffers(decoder_part *d)
{
    kdev *dev = d->st.c.dev;
    kdev_release(dev, d->fbuf);
    kdev_release(dev, d->ibuf_d);
    kdev_release(dev, d->dbuf_d);
    free(d->ibuf);
    free(d->hbuf);
    d->fbuf = NULL;
    d->ibuf_d = NULL;
    d->dbuf_d = NULL;
    d->ibuf = NULL;
    d->hbuf = NULL;
}

void decoder_free(decoder_part *d)
{
    if (d->st.c.dev)
        release_buffers(d);
    stack_free(&d->st);
}

static int reserve(decoder_part *d, int N, int Nf, hearth_err *err)
{
    d->st.chunked = d->seq_chunks > 1;
    int rc = stack_reserve(&d->st, N, err);
    if (rc)
        return rc;
    /* N = Nf / cp / chunks; the local RoPE rows are separate buffers only when sliced */
    int sliced = d->cp > 1 || d->seq_chunks > 1;
    if (Nf <= d->cap_tokens && N <= d->cap_local && d->fbuf && (d->cosl != d->cos) == sliced)
        return 0;
    /* The same chunk on every tp rank (the cross-entropy's collectives run per chunk):
     * sized for the largest vocabulary slice. */
    int chunk = head_chunk(d->st.c.dev, (d->sh->vocab + d->tp - 1) / d->tp);
    if (chunk > N)
        chunk = N;
    dec_arenas a = { 0 };
    take(d, &a, N, Nf, chunk);
    kdev *dev = d->st.c.dev;
    release_buffers(d);
    d->cap_tokens = 0;
    d->ibuf = calloc(a.ia.used ? a.ia.used : 1, sizeof(int));
    d->hbuf = calloc(a.ha.used ? a.ha.used : 1, sizeof(float));
    if (!d->ibuf || !d->hbuf)
        rc = herr_set(err, HERR_NOMEM, "decoder: out of memory");
    if (!rc)
        rc = dev_alloc(dev, (void **)&d->fbuf, a.fa.used * sizeof(float), "decoder", err);
    if (!rc)
        rc = dev_alloc(dev, (void **)&d->ibuf_d, a.da.used * sizeof(int), "decoder", err);
    if (!rc)
        rc = dev_alloc(dev, (void **)&d->dbuf_d, a.doubles * sizeof(double), "decoder", err);
    if (rc) {
        release_buffers(d);
        return herr_prefix(err, rc, "decoder: buffers for %d tokens", N);
    }
    /* lse [N], then csum [2 chunk] */
    d->lse_d = d->dbuf_d;
    d->csum_d = d->dbuf_d + N;
    a = (dec_arenas){ .fa = { d->fbuf, 0 }, .ha = { d->hbuf, 0 }, .ia = { d->ibuf, 0 },
                      .da = { d->ibuf_d, 0 } };
    take(d, &a, N, Nf, chunk);
    d->cap_tokens = Nf;
    d->cap_local = N;
    d->cap_chunk = chunk;
    return 0;
}

/* Which tokens this rank holds (d->lrow) and, under cp, every cp rank's positions
 * (d->cp_pos): rank r holds chunks r and 2 cp - 1 - r of each sequence, in that order. */
static void cp_layout(decoder_part *d, int n_seq, int S)
{
    int cp = d->cp > 1 ? d->cp : 1, Lc = S / cp, C = S / (2 * cp), N = n_seq * Lc;
    int K = d->seq_chunks > 1 ? d->seq_chunks : 1;
    if (K > 1) {   /* chunk j of every sequence; every chunk's positions for the cache */
        int Cs = S / K, Nc = n_seq * Cs;
        for (int i = 0; i < Nc; i++)
            d->lrow[i] = i / Cs * S + d->seq_chunk * Cs + i % Cs;
        return;
    }
    if (cp == 1) {
        for (int i = 0; i < N; i++)
            d->lrow[i] = i;
        return;
    }
    for (int r = 0; r < cp; r++)
        for (int sq = 0; sq < n_seq; sq++)
            for (int half = 0; half < 2; half++) {
                int ch = half ? 2 * cp - 1 - r : r;
                for (int j = 0; j < C; j++) {
                    int i = sq * Lc + half * C + j, pos = ch * C + j;
                    d->cp_pos[(size_t)r * N + i] = pos;
                    if (r == d->c)
                        d->lrow[i] = sq * S + pos;
                }
            }
}

/* Checks the micro batch's Nf token and target ids and copies those of this rank's
 * tokens (image tokens as -1, with their image row in imgk); returns the number of image
 * tokens of the micro batch or a negative code. */
static int take_ids(model *m, const vlm_batch *b, int Nf, hearth_err *err)
{
    decoder_part *d = &m->dec;
    const decoder_shape *ds = d->sh;
    int img = m->shape.encoder.present ? ds->image_token_id : -1;   /* tokens are >= 0 */
    int images = 0, N = Nf;
    for (int i = 0; i < N; i++) {
        int t = b->tokens[i], y = b->targets[i];
        if (t == img && img >= 0)
            images++;
        else if (t < 0 || t >= ds->vocab)
            return herr_set(err, HERR_RUNTIME, "decoder: token %d at position %d is outside "
                            "the vocabulary [0, %d)", t, i, ds->vocab);
        if (y != -1 && (y < 0 || y >= ds->vocab))
            return herr_set(err, HERR_RUNTIME, "decoder: target %d at position %d is "
                            "outside the vocabulary [0, %d) and not -1", y, i, ds->vocab);
    }
    /* lrow increases: one sweep */
    for (int i = 0, li = 0, k = 0; i < N && li < d->n_tokens; i++) {
        int is_img = img >= 0 && b->tokens[i] == img;
        if (d->lrow[li] == i) {
            d->ids[li] = is_img ? -1 : b->tokens[i];
            d->tgt[li] = b->targets[i];
            d->imgk[li] = is_img ? k : -1;
            li++;
        }
        k += is_img;
    }
    return images;
}

/* The local rows of the RoPE tables (cp > 1, chunks), uploaded. */
static int positions_local(decoder_part *d, hearth_err *err)
{
    size_t w = (size_t)d->st.c.D / 2;
    if (d->cp > 1 || d->seq_chunks > 1)
        for (int i = 0; i < d->n_tokens; i++) {
            memcpy(d->cosl + i * w, d->cos + (size_t)d->lrow[i] * w, w * sizeof(float));
            memcpy(d->sinl + i * w, d->sin + (size_t)d->lrow[i] * w, w * sizeof(float));
        }
    size_t bytes = (size_t)d->n_tokens * w * sizeof(float);
    int rc = dev_upload(d->st.c.dev, d->cos_d, d->cosl, bytes, err);
    return rc ? rc : dev_upload(d->st.c.dev, d->sin_d, d->sinl, bytes, err);
}

/* Fills the RoPE tables of all Nf tokens of the micro batch (or checks learned positions
 * fit), then takes this rank's rows. */
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
        return positions_local(d, err);
    }
    /* mrope */
    const encoder_shape *es = &m->shape.encoder;
    int img = es->present ? d->sh->image_token_id : -1;   /* tokens are >= 0 */
    int merge = es->present ? es->spatial_merge : 1;
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
    return positions_local(d, err);
}

/* The index arrays of the embedding stage, built on the host and uploaded: the token's
 * row of this rank's embedding slice (erow, -1 outside it), its learned-position row
 * (prow), and for image row k its local row of the stage input (imgdst, -1 when it is
 * not one of this rank's rows). */
static int embed_index(decoder_part *d, hearth_err *err)
{
    int N = d->n_tokens, NL = d->n_local, r0 = d->row0, S = d->seq_len;
    kdev *dev = d->st.c.dev;
    for (int i = 0; i < N; i++) {
        int id = d->ids[i];
        d->erow[i] = id >= d->v0 && id < d->v1 ? id - d->v0 : -1;
        d->prow[i] = d->lrow[i] % S;
    }
    for (int k = 0; k < d->n_img; k++)
        d->imgdst[k] = -1;
    for (int i = r0; i < r0 + NL; i++)
        if (d->imgk[i] >= 0)
            d->imgdst[d->imgk[i]] = i - r0;
    size_t nb = (size_t)N * sizeof(int);
    int rc;
    if ((rc = dev_upload(dev, d->erow_d, d->erow, nb, err)) ||
        (rc = dev_upload(dev, d->prow_d, d->prow, nb, err)) ||
        (rc = dev_upload(dev, d->imgk_d, d->imgk, nb, err)))
        return rc;
    return dev_upload(dev, d->imgdst_d, d->imgdst, (size_t)d->n_img * sizeof(int), err);
}

/* Stage input of the embedding stage: st->xs[0] (local rows). */
static int embed_forward(decoder_part *d, const float *img, hearth_err *err)
{
    int N = d->n_tokens, NL = d->n_local, r0 = d->row0, H = d->st.c.H;
    kdev *dev = d->st.c.dev;
    float *x = d->st.xs[0];
    float *part = d->tp > 1 ? d->xg : x;
    int rc = embed_index(d, err);
    if (rc)
        return rc;
    kdev_gather_rows(dev, part, d->embed_w, d->erow_d, N, H);
    if (d->tp > 1)
        rc = d->sp ? comm_reduce_scatter(d->tp_comm, part, x, (size_t)NL * H, COMM_F32,
                                         COMM_SUM, err)
                   : comm_allreduce(d->tp_comm, part, x, (size_t)N * H, COMM_F32, COMM_SUM,
                                    err);
    if (rc)
        return herr_prefix(err, rc, "decoder: embedding");
    if (d->n_img > 0)
        kdev_scatter_rows(dev, x, img, d->imgdst_d, d->n_img, H);
    if (d->pos_w) {
        kdev_gather_rows(dev, d->pbuf, d->pos_w, d->prow_d + r0, NL, H);
        kdev_accumulate(dev, x, d->pbuf, (size_t)NL * H);
    }
    return dev_check(dev, err);
}

int model_stage_set_chunk(model *m, int chunk, int n_chunks, hearth_err *err)
{
    if (n_chunks < 1 || chunk < 0 || chunk >= n_chunks)
        return herr_set(err, HERR_RUNTIME, "model: chunk %d of %d", chunk, n_chunks);
    if (n_chunks > 1 && m->dec.cp > 1)
        return herr_set(err, HERR_CONFIG, "model: sequence chunks (%d) do not combine with "
                        "context parallelism (cp %d)", n_chunks, m->dec.cp);
    m->dec.seq_chunk = chunk;
    m->dec.seq_chunks = n_chunks;
    return 0;
}

/* The owner's key/value cache for the chunks of this micro batch: chunk 0 sizes it and
 * fills every chunk's positions; a later chunk checks it was sized for its micro batch
 * (its chunk 0 began on an object of the same owner). */
static int chunk_cache_begin(model *m, int n_seq, int S, hearth_err *err)
{
    decoder_part *d = &m->dec;
    chunk_cache *cc = &(m->owner ? m->owner : m)->dec.cc;
    int K = d->seq_chunks, C = S / K, Nc = n_seq * C, L = d->st.L, KD = d->st.c.KD;
    if (d->seq_chunk > 0) {
        if (cc->K != K || cc->Nc != Nc || cc->L != L || cc->KD != KD || !cc->pos)
            return herr_set(err, HERR_RUNTIME, "decoder: chunk %d of a micro batch whose "
                            "chunk 0 did not run on this stage", d->seq_chunk);
        return 0;
    }
    size_t need = (size_t)L * 4 * (size_t)(K - 1) * (size_t)Nc * (size_t)KD;
    size_t npos = (size_t)K * (size_t)Nc;
    kdev *dev = d->st.c.dev;
    int rc;
    /* Sized anew for each micro batch's chunk 0 when it grows: its contents are the
     * micro batch's own. */
    if (need > cc->cap) {
        kdev_release(dev, cc->buf);
        cc->buf = NULL;
        cc->cap = 0;
        if ((rc = dev_alloc(dev, (void **)&cc->buf, need * sizeof(float), "the key/value "
                            "cache of sequence chunks", err)))
            return herr_prefix(err, rc, "decoder: %d chunks", K);
        cc->cap = need;
    }
    int *pos = malloc(npos * sizeof(int));
    if (!pos)
        return herr_set(err, HERR_NOMEM, "decoder: out of memory for chunk positions");
    if (npos > cc->cap_pos) {
        kdev_release(dev, cc->pos);
        cc->pos = NULL;
        cc->cap_pos = 0;
        if ((rc = dev_alloc(dev, (void **)&cc->pos, npos * sizeof(int), "chunk positions",
                            err))) {
            free(pos);
            return rc;
        }
        cc->cap_pos = npos;
    }
    cc->K = K;
    cc->Nc = Nc;
    cc->L = L;
    cc->KD = KD;
    cc->C = C;
    for (int j = 0; j < K; j++)
        for (int i = 0; i < Nc; i++)
            pos[(size_t)j * Nc + i] = j * C + i % C;
    rc = dev_upload(dev, cc->pos, pos, npos * sizeof(int), err);
    free(pos);
    return rc;
}

int model_stage_forward_begin(model *m, const vlm_batch *b, const float *img, int n_img_rows,
                              const float *x_in, hearth_err *err)
{
    decoder_part *d = &m->dec;
    stack *sk = &d->st;
    const stack_cfg *c = &sk->c;
    d->pending = 0;
    d->begun = 0;
    if (!d->present)
        return herr_set(err, HERR_RUNTIME, "model: this model holds no decoder stage");
    if (!b || b->n_seq < 1 || b->seq_len < 1 || !b->tokens || !b->targets)
        return herr_set(err, HERR_RUNTIME, "model: empty batch");
    if ((long)b->n_seq * b->seq_len > (1L << 28))
        return herr_set(err, HERR_RUNTIME, "decoder: batch too large");
    int S = b->seq_len, Nf = b->n_seq * S, H = c->H;
    if (d->cp > 1 && S % (2 * d->cp))
        return herr_set(err, HERR_RUNTIME, "decoder: context parallelism needs seq_len %d "
                        "divisible by 2 x cp = %d", S, 2 * d->cp);
    int K = d->seq_chunks > 1 ? d->seq_chunks : 1;
    if (K > 1 && (S % K || d->cp > 1 || d->seq_chunk < 0 || d->seq_chunk >= K))
        return herr_set(err, HERR_RUNTIME, "decoder: chunk %d of %d needs seq_len %d "
                        "divisible by the chunks and cp 1 (cp %d)", d->seq_chunk, K, S, d->cp);
    int N = d->cp > 1 ? Nf / d->cp : Nf / K;   /* this rank's (chunk's) tokens */
    if (d->sp && N % d->tp)
        return herr_set(err, HERR_RUNTIME, "decoder: sequence parallel needs the %d tokens "
                        "of a micro batch (on this cp rank) to be divisible by tp %d", N,
                        d->tp);
    if (!d->has_embed && !x_in)
        return herr_set(err, HERR_RUNTIME, "decoder: a stage without the embedding needs "
                        "its input");
    int rc = reserve(d, N, Nf, err);
    if (rc)
        return rc;
    d->n_tokens = N;
    cp_layout(d, b->n_seq, S);
    if (K > 1 && (rc = chunk_cache_begin(m, b->n_seq, S, err)))
        return rc;
    int n_img = take_ids(m, b, Nf, err);
    if (n_img < 0)
        return n_img;
    if (d->has_embed && (n_img != n_img_rows || (n_img > 0 && !img)))
        return herr_set(err, HERR_RUNTIME, "decoder: the text has %d image tokens but %d "
                        "image rows are given", n_img, img ? n_img_rows : 0);
    d->n_full = Nf;
    d->n_img = n_img;
    d->n_local = model_local_tokens(m, Nf);
    d->row0 = d->sp ? d->t * d->n_local : 0;
    d->seq_len = S;
    if ((rc = positions(m, b, err)))
        return rc;

    if (d->has_embed) {
        if ((rc = embed_forward(d, img, err)))
            return rc;
    } else {
        kdev_copy(c->dev, sk->xs[0], x_in, (size_t)d->n_local * H * sizeof(float));
    }

    /* Pinned MoE routing (model_pin_routing) applies to batches of the same size. */
    size_t per = (size_t)N * c->K, n_moe = 0;
    for (int l = 0; l < sk->L; l++)
        if (sk->layers[l].moe)
            sk->layers[l].pin = m->pin_route ? m->pin_route + per * n_moe++ : NULL;
    if (m->pin_route && m->n_pin != per * n_moe)
        return herr_set(err, HERR_RUNTIME, "decoder: the pinned routing has %zu entries, "
                        "this batch routes %zu", m->n_pin, per * n_moe);
    for (int sq = 0; sq <= b->n_seq; sq++)
        d->cu[sq] = sq * (N / b->n_seq);
    if ((rc = dev_upload(c->dev, d->cu_d, d->cu, ((size_t)b->n_seq + 1) * sizeof(int), err)) ||
        (d->cp_pos && (rc = dev_upload(c->dev, d->cp_pos_d, d->cp_pos,
                                       (size_t)d->cp * N * sizeof(int), err))))
        return rc;
    d->ctx = (stack_ctx){
        .N = N, .N_local = d->n_local, .cos = c->rope ? d->cos_d : NULL,
        .sin = c->rope ? d->sin_d : NULL, .cu = d->cu_d, .nseq = b->n_seq,
        .max_seq = N / b->n_seq, .cu_full = d->cu_d, .nseq_full = b->n_seq,
        .max_seq_full = N / b->n_seq, .cp_pos = d->cp_pos_d,
        .cc = K > 1 ? &(m->owner ? m->owner : m)->dec.cc : NULL,
        .chunk = K > 1 ? d->seq_chunk : 0,
    };
    d->begun = 1;
    return 0;
}

/* The head of a begun micro batch whose stack has run: final norm (gathered under sp),
 * target rows, loss. */
static int head_part_forward(decoder_part *d, double *loss, hearth_err *err)
{
    stack *sk = &d->st;
    const decoder_shape *ds = d->sh;
    int N = d->n_tokens, H = sk->c.H, rc;
    *loss = 0;
    d->n_targets = d->n_targets_all = 0;
    if (!d->has_head)
        return 0;
    kdev *dev = sk->c.dev;
    norm_forward(dev, ds->s.norm, d->hl, d->meanf, d->rstdf, sk->xs[sk->L], d->norm_w, d->norm_b,
                 d->n_local, H, ds->s.norm_eps);
    if (d->sp && (rc = comm_all_gather(d->tp_comm, d->hl, d->hf, (size_t)d->n_local * H,
                                       COMM_F32, err)))
        return herr_prefix(err, rc, "decoder: final norm");
    int nt = 0;
    for (int i = 0; i < N; i++)
        if (d->tgt[i] != -1) {
            d->ttgt[nt] = d->tgt[i];
            d->trow[nt++] = i;
        }
    d->n_targets = d->n_targets_all = nt;
    if ((rc = dev_upload(dev, d->trow_d, d->trow, (size_t)nt * sizeof(int), err)) ||
        (rc = dev_upload(dev, d->ttgt_d, d->ttgt, (size_t)nt * sizeof(int), err)))
        return rc;
    if ((rc = head_forward(d, loss, err)) || !d->cp_comm)
        return rc;
    /* the whole micro batch's, on every cp rank */
    double sum[2] = { *loss, nt };
    if ((rc = comm_allreduce(d->cp_comm, sum, sum, 2, COMM_F64, COMM_SUM, err)))
        return herr_prefix(err, rc, "decoder: loss over cp");
    *loss = sum[0];
    d->n_targets_all = (int)sum[1];
    return 0;
}

/* m[0], m[1] (NULL: one micro batch) begun objects of one stage. */
static int check_pair(model *const m[2], int begun, hearth_err *err)
{
    for (int i = 0; i < 2 && m[i]; i++) {
        const decoder_part *d = &m[i]->dec;
        if (!d->present)
            return herr_set(err, HERR_RUNTIME, "model: this model holds no decoder stage");
        if (begun ? !d->begun : !d->pending)
            return herr_set(err, HERR_RUNTIME, begun ? "model: stage forward of a micro "
                            "batch that was not begun" : "model: no pending stage forward "
                            "to go back through");
    }
    if (m[1] && (m[0] == m[1] || m[0]->dec.st.L != m[1]->dec.st.L ||
                 (m[0]->owner ? m[0]->owner : m[0]) != (m[1]->owner ? m[1]->owner : m[1])))
        return herr_set(err, HERR_RUNTIME, "model: a pair of micro batches needs two objects "
                        "of the same stage (a model and its clone)");
    return 0;
}

int model_stage_forward_pair(model *const m[2], model_stats stats[2], hearth_err *err)
{
    int n = m[1] ? 2 : 1, rc;
    if (stats)
        memset(stats, 0, (size_t)n * sizeof *stats);
    if ((rc = check_pair(m, 1, err)))
        return rc;
    stack *sk[2] = { &m[0]->dec.st, m[1] ? &m[1]->dec.st : NULL };
    const stack_ctx *ctx[2] = { &m[0]->dec.ctx, m[1] ? &m[1]->dec.ctx : NULL };
    double aux[2] = { 0, 0 };
    for (int i = 0; i < n; i++)
        m[i]->dec.begun = 0;
    if ((rc = stack_forward_pair(sk, ctx, aux, err)))
        return rc;
    for (int i = 0; i < n; i++) {
        decoder_part *d = &m[i]->dec;
        double loss = 0;
        if ((rc = head_part_forward(d, &loss, err)))
            return rc;
        if (stats) {
            stats[i].loss_sum = loss;
            stats[i].n_targets = d->n_targets_all;
            stats[i].aux_loss = aux[i];
        }
        d->pending = 1;
    }
    return 0;
}

int model_stage_forward(model *m, const vlm_batch *b, const float *img, int n_img_rows,
                        const float *x_in, model_stats *stats, hearth_err *err)
{
    if (stats)
        memset(stats, 0, sizeof *stats);
    int rc = model_stage_forward_begin(m, b, img, n_img_rows, x_in, err);
    if (rc)
        return rc;
    model *const pair[2] = { m, NULL };
    return model_stage_forward_pair(pair, stats, err);
}

const float *model_stage_output(const model *m, size_t *n_floats)
{
    const decoder_part *d = &m->dec;
    if (n_floats)
        *n_floats = (size_t)d->n_local * d->st.c.H;
    return d->st.xs ? d->st.xs[d->st.L] : NULL;
}

const float *model_stage_input_grad(const model *m, size_t *n_floats)
{
    const decoder_part *d = &m->dec;
    if (n_floats)
        *n_floats = (size_t)d->n_local * d->st.c.H;
    return d->st.sc.dres;
}

int model_local_tokens(const model *m, int n_tokens)
{
    const decoder_part *d = &m->dec;
    int K = d->seq_chunks > 1 ? d->seq_chunks : 1;
    int n = d->cp > 1 ? n_tokens / d->cp : n_tokens / K;
    return d->sp ? n / d->tp : n;
}

/* Embedding-stage backward from st->sc.dres: learned positions, image rows, embedding
 * table.  Under sp the local rows are gathered first: the vocabulary slice of every rank
 * and the image rows need every token's gradient. */
static int embed_backward(decoder_part *d, float *img_grad, hearth_err *err)
{
    int N = d->n_tokens, H = d->st.c.H;
    kdev *dev = d->st.c.dev;
    const float *g = d->st.sc.dres;
    if (d->sp) {
        int rc = comm_all_gather(d->tp_comm, g, d->xg, (size_t)d->n_local * H, COMM_F32,
                                 err);
        if (rc)
            return herr_prefix(err, rc, "decoder: embedding backward");
        g = d->xg;
    }
    /* Token order per row of the tables (the embedding backward's order). */
    if (d->pos_gw)
        kdev_embedding_backward(dev, d->pos_gw, g, d->prow_d, N, H);
    /* Under cp the image rows at other ranks' tokens get zeros: the encoder gradient is
     * then this rank's share, summed with the other cp ranks' in the gradient reduction. */
    if (img_grad && d->cp > 1 && d->n_img > 0)
        kdev_zero(dev, img_grad, (size_t)d->n_img * H * sizeof(float));
    /* Chunks: each writes the rows at its tokens; the first backward (chunk K-1) clears
     * the rest, so after chunk 0 every row is written once. */
    if (img_grad && d->ctx.cc && d->ctx.chunk == d->ctx.cc->K - 1 && d->n_img > 0)
        kdev_zero(dev, img_grad, (size_t)d->n_img * H * sizeof(float));
    if (img_grad)
        kdev_scatter_rows(dev, img_grad, g, d->imgk_d, N, H);
    /* Tokens outside this rank's slice have erow -1 and add nothing. */
    if (d->embed_gw)
        kdev_embedding_backward(dev, d->embed_gw, g, d->erow_d, N, H);
    return dev_check(dev, err);
}

/* The head part of the backward (or the output gradient dy) into st->sc.dres. */
static int head_part_backward(decoder_part *d, const float *dy, float loss_scale,
                              hearth_err *err)
{
    stack *sk = &d->st;
    int H = sk->c.H, NL = d->n_local, rc;
    float *dres = sk->sc.dres;
    kdev *dev = sk->c.dev;
    if (!d->has_head) {
        kdev_copy(dev, dres, dy, (size_t)NL * H * sizeof(float));
        return 0;
    }
    if ((rc = head_backward(d, loss_scale, err)))
        return rc;
    if (d->tp > 1) {
        rc = d->sp ? comm_reduce_scatter(d->tp_comm, d->dhf, d->dhl, (size_t)NL * H, COMM_F32,
                                         COMM_SUM, err)
                   : comm_allreduce(d->tp_comm, d->dhf, d->dhf, (size_t)d->n_tokens * H,
                                    COMM_F32, COMM_SUM, err);
        if (rc)
            return herr_prefix(err, rc, "decoder: head backward");
    }
    kdev_zero(dev, dres, (size_t)NL * H * sizeof(float));
    norm_backward(dev, d->sh->s.norm, dres, d->norm_gw, d->norm_gb, d->dhl, sk->xs[sk->L],
                  d->norm_w, d->meanf, d->rstdf, NL, H);
    return 0;
}

int model_stage_backward_pair(model *const m[2], const float *const dy[2], float loss_scale,
                              float aux_scale, float *const img_grad[2], hearth_err *err)
{
    int n = m[1] ? 2 : 1, rc;
    if ((rc = check_pair(m, 0, err)))
        return rc;
    for (int i = 0; i < n; i++)
        if (!m[i]->dec.has_head && !dy[i])
            return herr_set(err, HERR_RUNTIME, "decoder: a stage without the head needs the "
                            "gradient of its output");
    for (int i = 0; i < n; i++) {
        m[i]->dec.pending = 0;
        if ((rc = head_part_backward(&m[i]->dec, dy[i], loss_scale, err)))
            return rc;
    }
    stack *sk[2] = { &m[0]->dec.st, m[1] ? &m[1]->dec.st : NULL };
    const stack_ctx *ctx[2] = { &m[0]->dec.ctx, m[1] ? &m[1]->dec.ctx : NULL };
    if ((rc = stack_backward_pair(sk, ctx, aux_scale, err)))
        return rc;
    for (int i = 0; i < n; i++)
        if (m[i]->dec.has_embed && (rc = embed_backward(&m[i]->dec, img_grad[i], err)))
            return rc;
    return 0;
}

int model_stage_backward(model *m, const float *dy, float loss_scale, float aux_scale,
                         float *img_grad, hearth_err *err)
{
    model *const pair[2] = { m, NULL };
    const float *const dys[2] = { dy, NULL };
    float *const igs[2] = { img_grad, NULL };
    return model_stage_backward_pair(pair, dys, loss_scale, aux_scale, igs, err);
}
