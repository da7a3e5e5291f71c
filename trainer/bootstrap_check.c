/* bootstrap_check.c - `hearth-train --check-bootstrap` (see bootstrap.h).
 *
 * Round 1: every rank all-gathers a fixed-size record: a text "rank R of N on HOST pid P",
 * 32 random bytes, and an FNV-1a checksum of both.  Each rank checks that record i is
 * intact and names rank i of the same N.  Round 2: every rank all-gathers a checksum of its
 * whole view from round 1; all must be equal, so a rank that received different bytes
 * than the others is caught too.  Each rank writes its report with one write, so lines of
 * several ranks sharing a terminal do not interleave mid-line. */
#include "bootstrap.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define TEXT_LEN 200
#define RAND_LEN 32

typedef struct {
    char text[TEXT_LEN];
    unsigned char rnd[RAND_LEN];
    unsigned char sum[8];   /* FNV-1a 64 of text and rnd, little-endian */
} check_record;

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV_INIT 0xcbf29ce484222325ull

static void put_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64le(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint64_t record_sum(const check_record *r)
{
    return fnv1a(fnv1a(FNV_INIT, r->text, TEXT_LEN), r->rnd, RAND_LEN);
}

/* A growing report buffer, printed at once at the end. */
typedef struct {
    char *s;
    size_t len, cap;
} report;

static void rep_printf(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rep_printf(report *r, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(r->s ? r->s + r->len : NULL, r->s ? r->cap - r->len : 0, fmt, ap);
        va_end(ap);
        if (k < 0)
            return;
        if (r->s && r->len + (size_t)k < r->cap) {
            r->len += (size_t)k;
            return;
        }
        size_t cap = (r->cap + (size_t)k + 1) * 2;
        char *s = realloc(r->s, cap);
        if (!s)
            return;
        r->s = s;
        r->cap = cap;
    }
}

/* Checks record i of the gathered view; returns 0 or writes why into why. */
static int check_one(const check_record *r, int i, int size, char *why, size_t cap)
{
    if (memchr(r->text, '\0', TEXT_LEN) == NULL) {
        snprintf(why, cap, "text not terminated");
        return -1;
    }
    if (get_u64le(r->sum) != record_sum(r)) {
        snprintf(why, cap, "checksum mismatch (bytes damaged in transit)");
        return -1;
    }
    int rr = -1, nn = -1;
    if (sscanf(r->text, "rank %d of %d", &rr, &nn) != 2) {
        snprintf(why, cap, "does not start with \"rank R of N\"");
        return -1;
    }
    if (rr != i) {
        snprintf(why, cap, "names rank %d, expected %d", rr, i);
        return -1;
    }
    if (nn != size) {
        snprintf(why, cap, "says the world has %d ranks, this rank has %d", nn, size);
        return -1;
    }
    return 0;
}

/* The host and local rank a record states ("... on HOST pid P local L"). */
static int record_place(const check_record *r, char host[256], int *local)
{
    int rr, nn;
    long pid;
    return sscanf(r->text, "rank %d of %d on %255s pid %ld local %d", &rr, &nn, host, &pid,
                  local) == 5 ? 0 : -1;
}

/* Local ranks must number each host's ranks 0..k-1 (they choose the GPU). */
static int check_local_ranks(const check_record *all, int size, int rank, report *rep)
{
    int bad = 0;
    char hi[256], hj[256];
    for (int i = 0; i < size; i++) {
        int li, lj, count = 0, dup = 0;
        if (record_place(&all[i], hi, &li))
            continue;   /* already reported by check_one */
        for (int j = 0; j < size; j++) {
            if (record_place(&all[j], hj, &lj) || strcmp(hi, hj))
                continue;
            count++;
            dup += j < i && lj == li;
        }
        if (li < 0 || li >= count || dup) {
            rep_printf(rep, "rank %d: FAIL: rank %d has local rank %d on %s, which has %d "
                       "rank%s%s\n", rank, i, li, hi, count, count > 1 ? "s" : "",
                       dup ? " (taken twice)" : "");
            bad++;
        }
    }
    return bad;
}

static int run_check(bootstrap *b, report *rep, hearth_err *err)
{
    int rank = bootstrap_rank(b), size = bootstrap_size(b);
    rep_printf(rep, "rank %d: bootstrap %s: rank %d of %d, local rank %d, node %s, pid %ld\n",
               rank, bootstrap_kind_name(bootstrap_get_kind(b)), rank, size,
               bootstrap_local_rank(b), bootstrap_node_name(b), (long)getpid());

    check_record mine;
    memset(&mine, 0, sizeof mine);
    snprintf(mine.text, TEXT_LEN, "rank %d of %d on %s pid %ld local %d", rank, size,
             bootstrap_node_name(b), (long)getpid(), bootstrap_local_rank(b));
    if (getrandom(mine.rnd, RAND_LEN, 0) != RAND_LEN)
        return herr_set(err, HERR_RUNTIME, "getrandom failed");
    put_u64le(mine.sum, record_sum(&mine));

    check_record *all = calloc((size_t)size, sizeof *all);
    if (!all)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = bootstrap_allgather_blob(b, &mine, sizeof mine, all, err);
    if (rc) {
        free(all);
        return rc;
    }
    int bad = 0;
    if (memcmp(&all[rank], &mine, sizeof mine)) {
        rep_printf(rep, "rank %d: FAIL: my own slot does not hold my blob\n", rank);
        bad++;
    }
    for (int i = 0; i < size; i++) {
        char why[160];
        int ok = check_one(&all[i], i, size, why, sizeof why) == 0;
        char hex[2 * 8 + 1];
        for (int k = 0; k < 8; k++)
            snprintf(hex + 2 * k, 3, "%02x", all[i].rnd[k]);
        rep_printf(rep, "rank %d: blob from rank %d: \"%.*s\" random %s... %s%s\n", rank, i,
                   (int)strnlen(all[i].text, TEXT_LEN), all[i].text, hex, ok ? "ok" : "FAIL: ",
                   ok ? "" : why);
        bad += !ok;
    }
    bad += check_local_ranks(all, size, rank, rep);

    /* Round 2: does every rank hold the very same view? */
    unsigned char digest[8];
    put_u64le(digest, fnv1a(FNV_INIT, all, (size_t)size * sizeof *all));
    unsigned char *digests = malloc((size_t)size * sizeof digest);
    if (!digests) {
        free(all);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    rc = bootstrap_allgather_blob(b, digest, sizeof digest, digests, err);
    for (int i = 0; !rc && i < size; i++) {
        if (memcmp(digests + (size_t)i * sizeof digest, digest, sizeof digest)) {
            rep_printf(rep, "rank %d: FAIL: rank %d received a different set of blobs\n",
                       rank, i);
            bad++;
        }
    }
    free(digests);
    free(all);
    if (rc)
        return rc;
    if (bad)
        rep_printf(rep, "rank %d: bootstrap check FAILED (%d problem%s)\n", rank, bad,
                   bad > 1 ? "s" : "");
    else
        rep_printf(rep, "rank %d: bootstrap check passed: %d rank%s, identical views\n", rank,
                   size, size > 1 ? "s" : "");
    return bad ? HERR_RUNTIME : 0;
}

int bootstrap_check_main(FILE *out, FILE *errf)
{
    hearth_err err = { { 0 } };
    bootstrap *b = NULL;
    report rep = { 0 };
    int rc = bootstrap_init(&b, &err);
    if (!rc)
        rc = run_check(b, &rep, &err);
    if (rep.s) {
        fwrite(rep.s, 1, rep.len, out);
        fflush(out);
    }
    if (rc && err.msg[0]) {
        if (b)
            fprintf(errf, "hearth-train: rank %d: %s\n", bootstrap_rank(b), err.msg);
        else
            fprintf(errf, "hearth-train: %s\n", err.msg);
    }
    free(rep.s);
    bootstrap_free(b);
    return rc ? (rc == HERR_CONFIG ? 2 : 1) : 0;
}
