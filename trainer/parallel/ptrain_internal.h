/* ptrain_internal.h - the parallel trainer's state, shared by the files of ptrain:
 *   ptrain.c         create/free, the step (data, loss scale, statistics, optimizer)
 *   ptrain_pipe.c    the decoder pipeline: op lists, activation slots, send/recv
 *   ptrain_encode.c  the encoder strategies: who encodes which images, routing of
 *                    embeddings and their gradients, the deferred encoder backward
 *   ptrain_local.c   ranks as threads (ptrain_local.h) */
#ifndef HEARTH_PTRAIN_INTERNAL_H
#define HEARTH_PTRAIN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "data_source.h"
#include "model/model_par.h"
#include "parallel/param_sync.h"
#include "parallel/parallel_state.h"
#include "parallel/pp_schedule.h"
#include "parallel/ptrain.h"
#include "schedule.h"

/* One of this rank's micro batches of the step. */
typedef struct {
    synth_batch data;
    vlm_batch view;
    int n_units;            /* image tokens (decoder rows that come from the projector) */
    size_t *img_off;        /* [n_images + 1]: first unit of each image */
    size_t *pix_off;        /* [n_images + 1]: first patch of each image */
    float *img;             /* [n_units, Hd]: embeddings, filled before the stage-0 forward */
    float *img_grad;        /* [n_units, Hd]: their gradient, after the stage-0 backward */
    size_t cap_img_off, cap_pix_off, cap_img, cap_img_grad;
} pt_micro;

/* An activation slot: a model clone that carries one micro batch in flight. */
typedef struct {
    model *m;               /* owned (the chunk's owner model for slot 0: borrowed) */
    int micro;              /* -1: free */
    float *xin;             /* the stage input received for this micro batch, then
                               (free after the forward) its output gradient */
    size_t cap_xin;
} pt_slot;

/* One image an encoding rank encodes: (micro batch, image within it). */
typedef struct {
    int micro, image;
} pt_image;

/* The encoding of one group of micro batches by this rank (see ptrain_encode.c). */
typedef struct {
    int active;
    int first, count;       /* micro batches [first, first + count) */
    pt_image *mine;         /* the images this rank encodes, in encoding order */
    int n_mine, cap_mine;
    int units;              /* their rows */
    model *m;               /* encoder slot (a clone of chunk 0) holding the activations */
} pt_enc_group;

struct ptrain {
    run_config cfg;
    ps_layout lay;
    comm *world;
    int rank;
    parallel_state *dec, *enc;
    int Hd;                 /* decoder hidden */
    int vpp, n_virtual;     /* chunks per rank, virtual stages (pp * vpp) */
    model **chunk;          /* [vpp] owners of the parameters */
    pt_slot **slots;        /* [vpp][n_slots[v]] */
    int *n_slots;
    param_sync *sync;
    data_source *src;       /* this rank's samples (data.kind) */
    synth_params data;      /* their geometry: data_source_params(src) */
    lr_schedule sched;
    int M, M_local;         /* micro batches of the step, of this DP rank */
    pt_micro *micro;        /* [M_local] */
    int *mb_index;          /* [M_local]: which of the step's M micro batches each is
                               (d M_local + j, or data.balance's choice) */
    double *mb_cost;        /* data.balance: [M] estimated cost of each micro batch */
    int *mb_rank;           /* data.balance: [M] the DP rank that trains it */
    synth_batch probe;      /* data.balance: a micro batch read for its cost */
    pp_op *ops;             /* op.micro is a unit: micro batches [unit*u, unit*u + unit) */
    int n_ops;
    int unit;               /* micro batches per unit: 2 under a2a_overlap with MoE, else 1 */
    int K;                  /* parallel.chunks: sequence chunks per micro batch; K > 1:
                               a unit is one chunk q of micro batch q / K (chunk q % K) */
    const float *chunk_img; /* K > 1: the image rows of the micro batch whose chunks are
                               on the embedding stage (from its chunk 0's encode) */
    long chunk_targets;     /* K > 1: targets counted by the head over the chunks so far */
    float loss_scale, aux_scale;
    /* encoder (ptrain_encode.c) */
    int has_encoder;        /* the model has an encoder on this rank */
    int enc_mode;           /* PT_ENC_* */
    int enc_group_size;     /* micro batches encoded together (R, or M_local) */
    int enc_n_ranks;        /* ranks that encode them (R replicas, or the MP group) */
    int enc_me;             /* this rank's index among them (-1: does not encode) */
    double enc_linear;      /* ViT balance: cost = patches^2 + enc_linear * patches */
    pt_enc_group *groups;   /* [M_local]: indexed by the group's first micro batch */
    model **enc_pool;       /* encoder activation slots (clones of chunk 0) */
    int *enc_pool_busy;
    int n_enc_pool;
    int *assign, *owner;    /* [images of a group] */
    int64_t *patches;
    size_t cap_assign, cap_owner, cap_patches;
    int *grids;             /* [3 * images] of what this rank encodes */
    float *pixels;
    size_t cap_grids, cap_pixels;
    float *rows;            /* gathered embeddings / packed gradients */
    size_t cap_rows;
    size_t *counts;          /* gather counts per group rank */
    size_t cap_counts;
    float *offload;         /* full_separation + offload: the step's embeddings, packed */
    size_t cap_offload;
    size_t *offload_off;    /* [M_local + 1]: where micro j's rows start in offload */
    size_t cap_offload_off;
    float *img_work;        /* full_separation + offload: the one micro batch prefetched */
    size_t cap_img_work;
    /* per-step sums on this rank (reduced in ptrain_step) */
    double loss_sum, aux_sum, enc_ms, dec_ms;
    int step;
};

/* ptrain_pipe.c */
int pt_pipe_init(ptrain *t, hearth_err *err);
int pt_pipe_run(ptrain *t, hearth_err *err);
void pt_pipe_free(ptrain *t);

/* ptrain_encode.c */
enum { PT_ENC_NONE = 0, PT_ENC_GROUPED = 1, PT_ENC_FULL_SEPARATION = 2 };
int pt_encode_init(ptrain *t, hearth_err *err);
/* Before the pipeline (full_separation: phase 1). */
int pt_encode_step_begin(ptrain *t, hearth_err *err);
/* Called right before micro batch j's forward on the embedding chunk: *img gets its
 * embeddings ([n_units, Hd], valid until the next call). */
int pt_encode_before_forward(ptrain *t, int j, const float **img, hearth_err *err);
/* Called right after micro batch j's backward on the embedding chunk (img_grad filled). */
int pt_encode_after_backward(ptrain *t, int j, hearth_err *err);
/* After the pipeline (full_separation: phase 3). */
int pt_encode_step_end(ptrain *t, hearth_err *err);
void pt_encode_free(ptrain *t);

/* ptrain.c */
double pt_now_ms(void);
/* Grows a buffer to hold n elements of size elem (keeps contents). */
int pt_grow(void **p, size_t *cap, size_t n, size_t elem, hearth_err *err);

#endif
