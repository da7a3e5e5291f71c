/* select_cost.c - the analytic step-time model (select_cost.h). */
#include "select_cost.h"

#include <math.h>
#include <string.h>

void select_cost_nominal(device_kind d, select_cost_rates *r)
{
    memset(r, 0, sizeof *r);
    if (d == DEVICE_CUDA) {
        r->flops_per_s = 4e14;
        r->link_bytes_per_s = 2e11;
        r->host_bytes_per_s = 2.5e10;
        strcpy(r->source, "nominal cuda rate");
    } else {
        r->flops_per_s = 1e9;
        r->link_bytes_per_s = 1e10;
        r->host_bytes_per_s = 1e10;
        strcpy(r->source, "nominal cpu rate");
    }
}

int select_cost_rate_from_bench(const model_shape *m, const select_bench_set *b,
                                double *flops_per_s)
{
    const stack_shape *d = &m->decoder.s;
    double q = (double)d->heads * d->head_dim, kv = (double)d->kv_heads * d->head_dim;
    double up = d->mlp == MLP_SWIGLU ? 2.0 * d->ffn : d->ffn;
    double flops = 0, ms = 0;
    for (size_t i = 0; i < b->n; i++) {
        const select_bench_row *r = &b->rows[i];
        if (strcmp(r->component, "decoder") != 0)
            continue;
        double in, out;
        if (strcmp(r->kind, "qkv") == 0) { in = d->hidden; out = q + 2 * kv; }
        else if (strcmp(r->kind, "proj") == 0) { in = q; out = d->hidden; }
        else if (strcmp(r->kind, "fc1") == 0) { in = d->hidden; out = up; }
        else if (strcmp(r->kind, "fc2") == 0) { in = d->ffn; out = d->hidden; }
        else continue;
        /* forward + backward: 3 GEMMs of 2 * tokens * in * out / tp */
        flops += 6.0 * (double)r->tokens * in * out / r->tp;
        ms += r->bf16_ms;
    }
    if (!(flops > 0 && ms > 0))
        return 0;
    *flops_per_s = flops / (ms / 1e3);
    return 1;
}

static double ring(double n)
{
    return n > 1 ? (n - 1) / n : 0;
}

void select_cost_predict(const run_config *c, const select_cost_rates *r, select_cost *out)
{
    memset(out, 0, sizeof *out);
    const model_shape *m = &c->model;
    shape_flops fl;
    shape_count_flops(m, c->train.seq_len, &fl);
    shape_params pa;
    shape_count_params(m, &pa);
    double tp = c->parallel.tp, pp = c->parallel.pp, vpp = c->parallel.vpp;
    double dp = c->parallel.dp > 0 ? c->parallel.dp : 1, cp = c->parallel.cp;
    double mb = c->train.micro_batch, gb = c->train.global_batch;
    double M = gb / (mb * dp);
    if (M < 1)
        M = 1;
    double rate = r->flops_per_s, bw = r->link_bytes_per_s;
    double B = c->precision.compute == COMPUTE_BF16 ? 2 : 4, Bg = 4;
    double h = m->decoder.s.hidden;

    /* decoder compute per stage per micro batch, and its gradient reduction per step */
    double t_dec = fl.decoder_per_token * c->train.seq_len * mb / (tp * pp * cp * rate);
    double comm_step = 2 * ring(dp) * (double)pa.decoder / (tp * pp) * Bg / bw;

    /* images of one micro batch (the synthetic data's means) */
    double t_enc = 0, comm_mb = 0, enc_step = 0, emb = 0;
    if (m->encoder.present) {
        const encoder_shape *e = &m->encoder;
        double unit = (double)e->patch * e->spatial_merge;
        double side = (c->data.image_px_min + c->data.image_px_max) / 2.0;
        side = fmax(unit, round(side / unit) * unit);
        double n_img = mb * (c->data.images_min + c->data.images_max) / 2.0;
        double N = (side / e->patch) * (side / e->patch);
        double P = n_img * N, U = P / ((double)e->spatial_merge * e->spatial_merge);
        double he = e->s.hidden, Le = e->s.layers;
        double F = n_img * (N * fl.encoder_per_patch + N * N * fl.encoder_per_patch_sq) +
                   P * fl.projector_per_patch;
        double phi = (double)(pa.encoder + pa.projector);
        double G = tp * pp * cp;
        double etp = c->parallel.encoder.tp > 0 ? c->parallel.encoder.tp : 1, R = tp / etp;
        double route = ring(tp) * U * h * B;
        switch (c->parallel.encoder.strategy) {
        case ENC_UNIFORM:
            t_enc = F / (tp * rate);
            comm_mb = Le * 4 * 2 * ring(tp) * P * he * B;
            comm_step += 2 * ring(dp) * phi / tp * Bg / bw;
            emb = fmin(pp, M) * U * h * B;
            break;
        case ENC_HETERO_TP:
            t_enc = F / (tp * rate);
            comm_mb = Le * 8 * ring(etp) * P * he * B / R + route;
            comm_step += 2 * ring(R * dp) * phi / etp * Bg / bw;
            emb = fmin(pp, M) * R * U * h * B;
            break;
        case ENC_HETERO_DP:
            t_enc = F / (tp * rate);
            comm_mb = route;
            comm_step += 2 * ring(tp * dp) * phi * Bg / bw;
            emb = fmin(pp, M) * tp * U * h * B;
            break;
        case ENC_FULL_SEPARATION:
            enc_step = ceil(M / G) * F / rate;
            comm_step += 2 * ring(G) * M * U * h * B / bw + 2 * ring(G * dp) * phi * Bg / bw;
            if (c->parallel.encoder.offload) {
                comm_step += 2 * M * U * h * B / r->host_bytes_per_s;
                emb = U * h * B;
            } else {
                emb = M * U * h * B;
            }
            break;
        }
    }
    double stage0 = t_dec + t_enc + comm_mb / bw;
    double slowest = fmax(stage0, t_dec);
    double fill = (pp - 1) / vpp;
    out->decoder_s = M * t_dec;
    out->encoder_s = M * t_enc + enc_step;
    out->comm_s = M * comm_mb / bw + comm_step;
    out->bubble_s = fill * slowest + M * (slowest - stage0 > 0 ? slowest - stage0 : 0);
    out->step_s = (M + fill) * slowest + enc_step + comm_step;
    out->tokens_per_s = out->step_s > 0 ? gb * c->train.seq_len / out->step_s : 0;
    out->embedding_bytes = emb;
}
