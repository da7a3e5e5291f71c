/* test_parallel_state.c - rank coordinates and process groups from the layout.
 *
 * Random valid layouts (tp, cp, pp, dp, ep carved out of dp, every encoder strategy):
 * coordinates against a table built by nested loops (pp outermost, tp innermost: the
 * rank order of DESIGN.md written independently of the module's div/mod), every group
 * kind of both components against member lists built from that table, group sizes,
 * partition (every rank with the component in exactly one group of each kind, members
 * agreeing on the group), invalid layouts rejected; then threads on the local backend
 * create the states and check, through the communicators, that each group connects
 * exactly its members. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "parallel/parallel_state.h"
#include "support/ranks.h"
#include "support/testutil.h"

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}

#define MAXW 128

static int pick(const int *v, int n) { return v[tu_randint(&g_rng, 0, n)]; }

/* A random valid layout with world <= maxw. */
static ps_layout random_layout(int maxw)
{
    static const int tps[] = { 1, 2, 3, 4, 8 }, cps[] = { 1, 1, 2, 3 }, pps[] = { 1, 2, 3, 4 };
    for (;;) {
        ps_layout l = { 0 };
        l.tp = pick(tps, 5);
        l.cp = pick(cps, 4);
        l.pp = pick(pps, 4);
        l.dp = tu_randint(&g_rng, 1, 7);
        int eps[6], ne = 0;
        for (int e = 1; e <= l.dp; e++)
            if (l.dp % e == 0)
                eps[ne++] = e;
        l.ep = pick(eps, ne);
        l.world = l.tp * l.cp * l.pp * l.dp;
        if (l.world > maxw)
            continue;
        l.enc_strategy = (encoder_strategy)tu_randint(&g_rng, 0, 4);
        if (l.enc_strategy == ENC_UNIFORM) {
            l.enc_tp = l.tp;
        } else if (l.enc_strategy == ENC_HETERO_TP) {
            int d[8], nd = 0;
            for (int e = 1; e < l.tp; e++)
                if (l.tp % e == 0)
                    d[nd++] = e;
            if (!nd)
                continue;   /* tp 1 has no smaller divisor */
            l.enc_tp = pick(d, nd);
        } else {
            l.enc_tp = 1;
        }
        return l;
    }
}

/* rank_tbl[p][d][c][t] by counting in nested loops, and its inverse. */
typedef struct {
    int rank[4][8][3][8];
    int t[MAXW], c[MAXW], d[MAXW], p[MAXW];
} table;

static void build_table(const ps_layout *l, table *tb)
{
    int r = 0;
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int c = 0; c < l->cp; c++)
                for (int t = 0; t < l->tp; t++) {
                    tb->rank[p][d][c][t] = r;
                    tb->t[r] = t;
                    tb->c[r] = c;
                    tb->d[r] = d;
                    tb->p[r] = p;
                    r++;
                }
    assert_int_equal(r, l->world);
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* The expected members of rank r's group, from the table: enumerate the varying
 * coordinates, then sort (group order is increasing world rank). */
static int expected_members(const ps_layout *l, const table *tb, ps_component comp,
                            ps_group_kind kind, int r, int *out)
{
    int t = tb->t[r], c = tb->c[r], d = tb->d[r], p = tb->p[r], n = 0;
    int ep = l->ep, e = d % ep, q = d / ep, etp = l->enc_tp;
    int has_enc = l->enc_strategy == ENC_FULL_SEPARATION || p == 0;
    if (comp == PS_ENCODER) {
        if (!has_enc)
            return 0;
        if (kind == PS_TP) {
            for (int i = 0; i < etp; i++)
                out[n++] = tb->rank[p][d][c][(t / etp) * etp + i];
        } else if (kind == PS_DP) {
            int p_lo = l->enc_strategy == ENC_FULL_SEPARATION ? 0 : p;
            int p_hi = l->enc_strategy == ENC_FULL_SEPARATION ? l->pp : p + 1;
            for (int pp = p_lo; pp < p_hi; pp++)
                for (int dd = 0; dd < l->dp; dd++)
                    for (int cc = 0; cc < l->cp; cc++)
                        for (int b = 0; b < l->tp / etp; b++)
                            out[n++] = tb->rank[pp][dd][cc][b * etp + t % etp];
        } else {
            return 0;
        }
    } else {
        switch (kind) {
        case PS_TP:
            for (int i = 0; i < l->tp; i++) out[n++] = tb->rank[p][d][c][i];
            break;
        case PS_CP:
            for (int i = 0; i < l->cp; i++) out[n++] = tb->rank[p][d][i][t];
            break;
        case PS_DP:
            for (int i = 0; i < l->dp; i++) out[n++] = tb->rank[p][i][c][t];
            break;
        case PS_PP:
            for (int i = 0; i < l->pp; i++) out[n++] = tb->rank[i][d][c][t];
            break;
        case PS_EP:
            for (int i = 0; i < ep; i++) out[n++] = tb->rank[p][q * ep + i][c][t];
            break;
        case PS_EDP:
            for (int qq = 0; qq < l->dp / ep; qq++)
                for (int cc = 0; cc < l->cp; cc++)
                    out[n++] = tb->rank[p][qq * ep + e][cc][t];
            break;
        case PS_DP_CP:
            for (int dd = 0; dd < l->dp; dd++)
                for (int cc = 0; cc < l->cp; cc++)
                    out[n++] = tb->rank[p][dd][cc][t];
            break;
        case PS_MP:
            for (int pp = 0; pp < l->pp; pp++)
                for (int cc = 0; cc < l->cp; cc++)
                    for (int tt = 0; tt < l->tp; tt++)
                        out[n++] = tb->rank[pp][d][cc][tt];
            break;
        default:
            return 0;
        }
    }
    qsort(out, (size_t)n, sizeof *out, cmp_int);
    return n;
}

/* Group sizes written as formulas (DESIGN-level statements, not enumerations). */
static int expected_size(const ps_layout *l, ps_component comp, ps_group_kind kind)
{
    if (comp == PS_ENCODER) {
        if (kind == PS_TP)
            return l->enc_tp;
        if (kind == PS_DP)
            return l->enc_strategy == ENC_FULL_SEPARATION ? l->world / l->enc_tp
                                                          : l->world / (l->enc_tp * l->pp);
        return 0;
    }
    switch (kind) {
    case PS_TP: return l->tp;
    case PS_CP: return l->cp;
    case PS_DP: return l->dp;
    case PS_PP: return l->pp;
    case PS_EP: return l->ep;
    case PS_EDP: return l->cp * l->dp / l->ep;
    case PS_DP_CP: return l->cp * l->dp;
    case PS_MP: return l->tp * l->cp * l->pp;
    default: return 0;
    }
}

static void describe(const ps_layout *l, char *buf, size_t n)
{
    snprintf(buf, n, "world %d tp %d cp %d pp %d dp %d ep %d %s etp %d (seed %llu)", l->world,
             l->tp, l->cp, l->pp, l->dp, l->ep, encoder_strategy_name(l->enc_strategy),
             l->enc_tp, (unsigned long long)g_rng.seed);
}

static void test_groups_math(void **state)
{
    (void)state;
    table *tb = malloc(sizeof *tb);
    int *got = malloc(MAXW * sizeof(int)), *want = malloc(MAXW * sizeof(int));
    int *other = malloc(MAXW * sizeof(int));
    for (int trial = 0; trial < 300; trial++) {
        ps_layout l = random_layout(MAXW);
        char what[256];
        describe(&l, what, sizeof what);
        hearth_err err;
        if (ps_layout_check(&l, &err))
            fail_msg("%s: rejected: %s", what, err.msg);
        build_table(&l, tb);
        for (int r = 0; r < l.world; r++) {
            ps_coords k;
            ps_coords_of(&l, r, &k);
            if (k.t != tb->t[r] || k.c != tb->c[r] || k.d != tb->d[r] || k.p != tb->p[r] ||
                k.e != k.d % l.ep || k.q != k.d / l.ep)
                fail_msg("%s: coordinates of rank %d", what, r);
            if (ps_rank_of(&l, k.t, k.c, k.d, k.p) != r)
                fail_msg("%s: ps_rank_of(coords of %d)", what, r);
        }
        for (int comp = 0; comp < 2; comp++) {
            for (int kind = 0; kind < PS_KINDS; kind++) {
                int seen[MAXW] = { 0 }, with = 0;
                for (int r = 0; r < l.world; r++) {
                    int idx;
                    int n = ps_group_members(&l, (ps_component)comp, (ps_group_kind)kind, r,
                                             got, &idx);
                    int wn = expected_members(&l, tb, (ps_component)comp, (ps_group_kind)kind,
                                              r, want);
                    if (n != wn || memcmp(got, want, (size_t)n * sizeof(int)))
                        fail_msg("%s: %s %s group of rank %d: got %d members, want %d", what,
                                 ps_component_name((ps_component)comp),
                                 ps_group_kind_name((ps_group_kind)kind), r, n, wn);
                    if (!n) {
                        if (idx != -1)
                            fail_msg("%s: index %d for no group", what, idx);
                        continue;
                    }
                    with++;
                    if (n != expected_size(&l, (ps_component)comp, (ps_group_kind)kind))
                        fail_msg("%s: %s %s group size %d, want %d", what,
                                 ps_component_name((ps_component)comp),
                                 ps_group_kind_name((ps_group_kind)kind), n,
                                 expected_size(&l, (ps_component)comp, (ps_group_kind)kind));
                    if (idx < 0 || idx >= n || got[idx] != r)
                        fail_msg("%s: rank %d at index %d", what, r, idx);
                    /* partition: every member sees the same list, and each rank is listed
                     * in exactly one group (counted once, from the group's first member) */
                    for (int m = 0; m < n; m++) {
                        int oi;
                        int on = ps_group_members(&l, (ps_component)comp, (ps_group_kind)kind,
                                                  got[m], other, &oi);
                        if (on != n || memcmp(other, got, (size_t)n * sizeof(int)) || oi != m)
                            fail_msg("%s: %s: members of rank %d's group disagree", what,
                                     ps_group_kind_name((ps_group_kind)kind), r);
                        if (got[0] == r)
                            seen[got[m]]++;
                    }
                }
                for (int r = 0; r < l.world; r++) {
                    int present = ps_present(&l, (ps_component)comp, r);
                    int want_seen = present && expected_size(&l, (ps_component)comp,
                                                             (ps_group_kind)kind) > 0;
                    if (seen[r] != want_seen)
                        fail_msg("%s: %s %s: rank %d appears %d times", what,
                                 ps_component_name((ps_component)comp),
                                 ps_group_kind_name((ps_group_kind)kind), r, seen[r]);
                }
                (void)with;
            }
        }
    }
    free(tb);
    free(got);
    free(want);
    free(other);
}

static void test_layout_check(void **state)
{
    (void)state;
    hearth_err err;
    for (int trial = 0; trial < 50; trial++) {
        ps_layout l = random_layout(64), b;
        assert_int_equal(ps_layout_check(&l, &err), 0);
        b = l;
        b.world += 1;
        assert_int_equal(ps_layout_check(&b, &err), HERR_CONFIG);
        b = l;
        b.ep = l.dp + 1;
        assert_int_equal(ps_layout_check(&b, &err), HERR_CONFIG);
        b = l;
        b.tp = 0;
        assert_int_equal(ps_layout_check(&b, &err), HERR_CONFIG);
        b = l;
        if (l.enc_strategy == ENC_UNIFORM) {
            b.enc_tp = l.tp + 1;
        } else if (l.enc_strategy == ENC_HETERO_TP) {
            b.enc_tp = l.tp;   /* must be smaller */
        } else {
            b.enc_tp = 2;
        }
        assert_int_equal(ps_layout_check(&b, &err), HERR_CONFIG);
    }
    ps_layout h = { .world = 8, .tp = 4, .cp = 1, .pp = 1, .dp = 2, .ep = 1,
                    .enc_strategy = ENC_HETERO_TP, .enc_tp = 3 };
    assert_int_equal(ps_layout_check(&h, &err), HERR_CONFIG);   /* 3 does not divide 4 */
}

/* ---- threads: the communicators connect exactly the listed members ------------------- */
static int check_state(const ps_layout *l, parallel_state *ps, int rank, hearth_err *err)
{
    int members[MAXW];
    for (int k = 0; k < PS_KINDS; k++) {
        int idx, n = ps_group_members(l, ps->component, (ps_group_kind)k, rank, members, &idx);
        if (n != ps->size[k] || idx != ps->index[k] || (n > 0) != (ps->group[k] != NULL))
            return herr_set(err, HERR_RUNTIME, "%s %s: object disagrees with the math",
                            ps_component_name(ps->component),
                            ps_group_kind_name((ps_group_kind)k));
        if (!n)
            continue;
        comm *g = ps->group[k];
        if (comm_size(g) != n || comm_rank(g) != idx)
            return herr_set(err, HERR_RUNTIME, "%s: comm rank/size", ps_group_kind_name(k));
        /* gather the world ranks through the group: must be the member list */
        int64_t mine = rank, got[MAXW], sum;
        int rc = comm_all_gather(g, &mine, got, 1, COMM_I64, err);
        if (!rc)
            rc = comm_allreduce(g, &mine, &sum, 1, COMM_I64, COMM_SUM, err);
        if (rc)
            return rc;
        int64_t want_sum = 0;
        for (int i = 0; i < n; i++) {
            want_sum += members[i];
            if (got[i] != members[i] || comm_world_rank_of(g, i) != members[i])
                return herr_set(err, HERR_RUNTIME, "%s %s: member %d is %lld, want %d",
                                ps_component_name(ps->component), ps_group_kind_name(k), i,
                                (long long)got[i], members[i]);
        }
        if (sum != want_sum)
            return herr_set(err, HERR_RUNTIME, "%s: sum", ps_group_kind_name(k));
    }
    return 0;
}

/* One rank: ctx is the (shared, read-only) ps_layout. */
static int ps_rank(void *ctx, int rank, comm *world, hearth_err *err)
{
    const ps_layout *l = ctx;
    parallel_state *dec = NULL, *enc = NULL;
    int rc = parallel_state_create(&dec, l, PS_DECODER, world, err);
    if (!rc)
        rc = parallel_state_create(&enc, l, PS_ENCODER, world, err);
    if (!rc && (dec->rank != rank || !dec->present ||
                enc->present != ps_present(l, PS_ENCODER, rank)))
        rc = herr_set(err, HERR_RUNTIME, "rank/present fields");
    /* decoder first, then encoder: the same order on every rank */
    if (!rc)
        rc = check_state(l, dec, rank, err);
    if (!rc)
        rc = check_state(l, enc, rank, err);
    parallel_state_free(dec);
    parallel_state_free(enc);
    return rc;
}

static void test_states_on_threads(void **state)
{
    (void)state;
    for (int trial = 0; trial < 12; trial++) {
        ps_layout l = random_layout(8);
        char what[256];
        describe(&l, what, sizeof what);
        hearth_err err, rank_err[8];
        int rc[8];
        assert_true(l.world <= 8);
        if (ranks_run(l.world, 20000, ps_rank, &l, rc, rank_err, &err))
            fail_msg("%s: %s", what, err.msg);
        for (int r = 0; r < l.world; r++)
            if (rc[r])
                fail_msg("%s: rank %d: %s", what, r, rank_err[r].msg);
    }
    /* a world communicator of the wrong size is refused */
    comm_world *w;
    comm *c;
    parallel_state *ps;
    hearth_err err;
    ps_layout l = { .world = 2, .tp = 2, .cp = 1, .pp = 1, .dp = 1, .ep = 1,
                    .enc_strategy = ENC_UNIFORM, .enc_tp = 2 };
    assert_int_equal(comm_local_world_create(&w, 3, NULL, &err), 0);
    assert_int_equal(comm_local_world_rank(w, 0, &c, &err), 0);
    assert_int_equal(parallel_state_create(&ps, &l, PS_DECODER, c, &err), HERR_CONFIG);
    comm_free(c);
    comm_local_world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_math),
        cmocka_unit_test(test_layout_check),
        cmocka_unit_test(test_states_on_threads),
    };
    return cmocka_run_group_tests_name("parallel_state", tests, setup_seed, NULL);
}
