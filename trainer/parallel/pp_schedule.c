/* pp_schedule.c - 1F1B and interleaved 1F1B op lists, and the simulator that checks them.
 * See pp_schedule.h for the rules. */
#include "parallel/pp_schedule.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pp_schedule_len(int vpp, int M)
{
    return 2 * M * vpp;
}

static int check_sizes(int pp, int vpp, int M, hearth_err *err)
{
    if (pp < 1)
        return herr_set(err, HERR_CONFIG, "pipeline schedule: pp is %d; it must be >= 1", pp);
    if (vpp < 1)
        return herr_set(err, HERR_CONFIG, "pipeline schedule: vpp is %d; it must be >= 1", vpp);
    if (M < 1)
        return herr_set(err, HERR_CONFIG,
                        "pipeline schedule: %d micro batches; there must be at least 1", M);
    /* The op count 2*M*vpp and the checker's M*pp*vpp flags must fit an int. */
    if ((int64_t)M * vpp * pp > INT32_MAX / 2)
        return herr_set(err, HERR_CONFIG,
                        "pipeline schedule: M %d x vpp %d x pp %d is too large", M, vpp, pp);
    return 0;
}

/* The k-th entry (0 <= k < M*vpp) of the interleaved forward table: micro batches in
 * groups, each group run through chunk 0, then chunk 1, ...  Groups hold pp micro batches,
 * except the last, which takes the M % pp left over as well (pp .. 2*pp - 1 of them; all M
 * when M < pp).  A group shorter than pp cannot follow a full one: chunk c + 1 on stage 0
 * would need the output of chunk c for a micro batch that is still on its way round the
 * pipeline while stage pp - 1, at the end of its warmup, already waits for a backward --
 * a deadlock (test_short_last_group_deadlocks shows one).  A longer last group only
 * lengthens the warmup. */
static void table_entry(int pp, int vpp, int M, int k, int *micro, int *chunk)
{
    int full = M / pp > 0 ? M / pp - 1 : 0;   /* groups of exactly pp before the last */
    int gsz = pp * vpp;                       /* table entries per such group */
    if (k < full * gsz) {
        int g = k / gsz, i = k % gsz;
        *chunk = i / pp;
        *micro = g * pp + i % pp;
    } else {
        int last = M - full * pp, i = k - full * gsz;
        *chunk = i / last;
        *micro = full * pp + i % last;
    }
}

static pp_op fwd_op(int pp, int vpp, int M, int k)
{
    pp_op o = {PP_FORWARD, k, 0};
    if (vpp > 1)
        table_entry(pp, vpp, M, k, &o.micro, &o.chunk);
    return o;
}

static pp_op bwd_op(int pp, int vpp, int M, int k)
{
    pp_op o = {PP_BACKWARD, k, 0};
    if (vpp > 1) {
        table_entry(pp, vpp, M, k, &o.micro, &o.chunk);
        o.chunk = vpp - 1 - o.chunk;
    }
    return o;
}

int pp_schedule_build(pp_op *ops, int cap, int pp, int vpp, int stage, int M, hearth_err *err)
{
    int rc = check_sizes(pp, vpp, M, err);
    if (rc < 0)
        return rc;
    if (stage < 0 || stage >= pp)
        return herr_set(err, HERR_CONFIG,
                        "pipeline schedule: stage %d is outside 0..%d (pp %d)", stage, pp - 1, pp);
    int total = M * vpp, len = pp_schedule_len(vpp, M);
    if (cap < len)
        return herr_set(err, HERR_RUNTIME,
                        "pipeline schedule: room for %d ops, %d needed", cap, len);

    /* Warmup: enough forwards in flight that the first backward reaches this stage just as
     * the steady state begins.  Interleaved: two hops per later stage (down and back up)
     * plus one group for every extra chunk (Megatron's formula).  The group is the largest
     * one: the k-th backward is the last chunk's pass of the k-th table entry, which sits
     * (vpp - 1) group lengths further down the forward table. */
    /* Megatron also makes every forward a warmup one when M == pp; this model needs no
     * such case (the checker passes without it) and holds fewer activations. */
    int gmax = M < pp ? M : pp + M % pp;
    int warm = vpp == 1 ? pp - stage - 1 : (pp - stage - 1) * 2 + (vpp - 1) * gmax;
    if (warm > total)
        warm = total;

    int n = 0;
    for (int k = 0; k < warm; k++)
        ops[n++] = fwd_op(pp, vpp, M, k);
    for (int k = 0; k < total - warm; k++) {
        ops[n++] = fwd_op(pp, vpp, M, warm + k);
        ops[n++] = bwd_op(pp, vpp, M, k);
    }
    for (int k = total - warm; k < total; k++)
        ops[n++] = bwd_op(pp, vpp, M, k);
    return n;
}

/* ---- simulation ---------------------------------------------------------------------- */

typedef struct {
    int pp, vpp, M, nv;        /* nv = pp * vpp virtual stages */
    unsigned char *fdone;      /* [micro * nv + v] */
    unsigned char *bdone;
} sim;

static int op_ready(const sim *s, int m, int v, pp_op_kind kind)
{
    if (kind == PP_FORWARD)
        return v == 0 || s->fdone[(size_t)m * s->nv + v - 1];
    return s->fdone[(size_t)m * s->nv + v] &&
           (v == s->nv - 1 || s->bdone[(size_t)m * s->nv + v + 1]);
}

/* Appends to buf what a blocked op waits for. */
static void describe_wait(const sim *s, int p, int at, const pp_op *o, char *buf, size_t room)
{
    int v = o->chunk * s->pp + p;
    const char *what;
    int wv = v;
    if (o->kind == PP_FORWARD) {
        what = "forward";
        wv = v - 1;
    } else if (!s->fdone[(size_t)o->micro * s->nv + v]) {
        what = "forward";
    } else {
        what = "backward";
        wv = v + 1;
    }
    size_t used = strlen(buf);
    if (used + 1 >= room)
        return;
    snprintf(buf + used, room - used,
             "%sstage %d op %d (%s of micro %d, virtual stage %d) waits for the %s of micro %d, "
             "virtual stage %d (stage %d)",
             used ? "; " : "", p, at, o->kind == PP_FORWARD ? "forward" : "backward", o->micro, v,
             what, o->micro, wv, wv % s->pp);
}

int pp_schedule_check_ops(int pp, int vpp, int M, const pp_op *const *ops, const int *n_ops,
                          int *max_inflight, hearth_err *err)
{
    if (pp < 1 || vpp < 1 || M < 1 || (int64_t)M * vpp * pp > INT32_MAX / 2)
        return herr_set(err, HERR_RUNTIME, "pipeline check: bad sizes pp %d vpp %d M %d", pp,
                        vpp, M);
    for (int p = 0; p < pp; p++) {
        if (n_ops[p] < 0)
            return herr_set(err, HERR_RUNTIME, "pipeline check: stage %d has %d ops", p,
                            n_ops[p]);
        for (int i = 0; i < n_ops[p]; i++) {
            const pp_op *o = &ops[p][i];
            if ((o->kind != PP_FORWARD && o->kind != PP_BACKWARD) || o->micro < 0 ||
                o->micro >= M || o->chunk < 0 || o->chunk >= vpp)
                return herr_set(err, HERR_RUNTIME,
                                "pipeline check: stage %d op %d is out of range (kind %d, micro "
                                "%d, chunk %d; M %d, vpp %d)",
                                p, i, (int)o->kind, o->micro, o->chunk, M, vpp);
        }
    }

    sim s = {pp, vpp, M, pp * vpp, NULL, NULL};
    size_t cells = (size_t)M * (size_t)s.nv;
    s.fdone = calloc(cells, 1);
    s.bdone = calloc(cells, 1);
    int *pos = calloc((size_t)pp, sizeof *pos);
    int *live = calloc((size_t)pp, sizeof *live);
    int rc = 0, peak = 0;
    if (!s.fdone || !s.bdone || !pos || !live) {
        rc = herr_set(err, HERR_NOMEM, "pipeline check: out of memory");
        goto out;
    }

    /* Runs every stage as far as it can go, round after round, until no stage moves.
     * Whatever order the stages are stepped in, an op that is ready stays ready (inputs
     * only ever arrive), so the end state does not depend on that order: the stages
     * finish here exactly when they finish on real ranks. */
    for (int moved = 1; moved;) {
        moved = 0;
        for (int p = 0; p < pp; p++) {
            while (pos[p] < n_ops[p]) {
                const pp_op *o = &ops[p][pos[p]];
                int v = o->chunk * pp + p;
                size_t cell = (size_t)o->micro * s.nv + v;
                if (!op_ready(&s, o->micro, v, o->kind))
                    break;
                unsigned char *flag = o->kind == PP_FORWARD ? s.fdone : s.bdone;
                if (flag[cell]) {
                    rc = herr_set(err, HERR_RUNTIME,
                                  "pipeline check: stage %d op %d runs the %s of micro %d, "
                                  "virtual stage %d a second time",
                                  p, pos[p], o->kind == PP_FORWARD ? "forward" : "backward",
                                  o->micro, v);
                    goto out;
                }
                flag[cell] = 1;
                live[p] += o->kind == PP_FORWARD ? 1 : -1;
                if (live[p] > peak)
                    peak = live[p];
                pos[p]++;
                moved = 1;
            }
        }
    }

    char buf[sizeof err->msg];
    buf[0] = '\0';
    for (int p = 0; p < pp; p++)
        if (pos[p] < n_ops[p])
            describe_wait(&s, p, pos[p], &ops[p][pos[p]], buf, sizeof buf);
    if (buf[0]) {
        rc = herr_set(err, HERR_RUNTIME, "pipeline check: deadlock: %s", buf);
        goto out;
    }
    for (size_t c = 0; c < cells; c++) {
        if (!s.fdone[c] || !s.bdone[c]) {
            rc = herr_set(err, HERR_RUNTIME,
                          "pipeline check: the %s of micro %d, virtual stage %d never runs",
                          s.fdone[c] ? "backward" : "forward", (int)(c / (size_t)s.nv),
                          (int)(c % (size_t)s.nv));
            goto out;
        }
    }
    if (max_inflight)
        *max_inflight = peak;
out:
    free(s.fdone);
    free(s.bdone);
    free(pos);
    free(live);
    return rc;
}

int pp_schedule_check(int pp, int vpp, int M, int *max_inflight, hearth_err *err)
{
    int rc = check_sizes(pp, vpp, M, err);
    if (rc < 0)
        return rc;
    int len = pp_schedule_len(vpp, M);
    pp_op *all = malloc((size_t)pp * (size_t)len * sizeof *all);
    const pp_op **lists = malloc((size_t)pp * sizeof *lists);
    int *counts = malloc((size_t)pp * sizeof *counts);
    if (!all || !lists || !counts) {
        rc = herr_set(err, HERR_NOMEM, "pipeline check: out of memory");
        goto out;
    }
    for (int p = 0; p < pp; p++) {
        pp_op *mine = all + (size_t)p * (size_t)len;
        rc = pp_schedule_build(mine, len, pp, vpp, p, M, err);
        if (rc < 0)
            goto out;
        lists[p] = mine;
        counts[p] = rc;
    }
    rc = pp_schedule_check_ops(pp, vpp, M, lists, counts, max_inflight, err);
    if (rc < 0)
        herr_prefix(err, rc, "pp %d, vpp %d, %d micro batches", pp, vpp, M);
out:
    free(all);
    free(lists);
    free(counts);
    return rc < 0 ? rc : 0;
}
