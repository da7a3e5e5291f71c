/* bench_db.c - the results database at scale (issue "Benchmarks"):
 *
 *   build    N runs (default 1M) with their flattened configs through runs_db_insert, in one
 *            transaction, plus a result row per run (prepared statement); not a target,
 *            printed for reference
 *   ingest   1M metric rows from metrics.jsonl files (target < 5 s)
 *   query    a filter on a result field and a config key over all N runs, written as CSV
 *            to /dev/null, on a freshly opened connection (target < 100 ms; median of 5,
 *            and the first run alone), and one with an order and a limit
 *   dedup    completed/active counts of 100k config hashes against the N runs
 *            (target < 2 s)
 *
 * Usage: bench_db [runs [--keep]]   (the database lives in $TMPDIR or /tmp and is removed
 * after, unless --keep)
 * Every timed result is checked against counts known from the generated data; the exit
 * status is 1 when one is wrong (a missed target is reported, not an error). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>





#include "db.h"
#include "ingest.h"
#include "query.h"
#include "runs_db.h"
#include "tests/unit/support/testutil.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Process CPU time: on a shared machine the wall clock also counts other programs. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void hash_of(uint64_t i, char out[65])
{
    /* A deterministic, well-spread 64-hex-digit name per index. */
    uint64_t x = i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    for (int k = 0; k < 4; k++) {
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 27;
        snprintf(out + 16 * k, 17, "%016llx", (unsigned long long)x);
    }
}

static int failures = 0;

/* One line of the table; `cpu` is the process CPU time of the step (-1: not measured). */
static void row(const char *what, long n, double secs, double cpu, double target)
{
    char t[32] = "-", status[16] = "-", c[32] = "-";
    if (target > 0) {
        snprintf(t, sizeof t, "< %g s", target);
        snprintf(status, sizeof status, "%s", secs < target ? "ok" : "OVER");
    }
    if (cpu >= 0)
        snprintf(c, sizeof c, "%.3f s", cpu);
    printf("%-52s %9ld %10.3f s %10s %9s  %s\n", what, n, secs, c, t, status);
    fflush(stdout);
}

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "bench_db: WRONG RESULT: %s\n", what);
        failures++;
    }
}

static const char *const strategies[] = {"uniform", "hetero_tp", "hetero_dp", "full_separation"};
static const char *const fp8s[] = {"off", "all", "selective"};

int main(int argc, char **argv)
{
    long n_runs = argc > 1 ? atol(argv[1]) : 1000000;
    int keep = argc > 2 && strcmp(argv[2], "--keep") == 0;
    if (n_runs < 1000)
        n_runs = 1000;
    const long n_metric_rows = 1000000, n_hashes = 100000;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/hearth-bench-db-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/bench.db", dir);
    hearth_err err = {{0}};
    hearth_db *db;
    if (db_open(path, &db, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("bench_db: SQLite %s, %ld runs, database %s\n", sqlite3_libversion(), n_runs, path);
    printf("%-52s %9s %12s %10s %9s  %s\n", "case", "rows", "wall", "cpu", "target", "status");

    tu_rng rng;
    tu_rng_init(&rng, 12345);
    float *tps = malloc((size_t)n_runs * sizeof *tps);
    unsigned char *tp = malloc((size_t)n_runs), *state = malloc((size_t)n_runs);
    unsigned char *strat = malloc((size_t)n_runs);
    float *mfu = malloc((size_t)n_runs * sizeof *mfu);

    /* ---- build: the first runs through runs_db_insert (what `plan` does), the rest as
     * a bulk load of the same rows with secondary indexes rebuilt afterwards ---- */
    long n_api = n_runs < 20000 ? n_runs : 20000;
    int rc = runs_db_experiment_upsert(db, "bench", NULL, NULL, NULL, &err);
    sqlite3 *s = db_sqlite(db);
    sqlite3_stmt *res_st = NULL, *run_st = NULL, *kv_st = NULL, *upd_st = NULL;
    if (!rc &&
        (sqlite3_prepare_v2(s,
                            "INSERT INTO results (run, steps, step_ms_median, tokens_per_s, "
                            "tokens_per_s_per_gpu, mfu, peak_mem_bytes, final_loss, device) "
                            "VALUES (?1, 100, ?2, ?3, ?4, ?5, ?6, ?7, 'NVIDIA H200')",
                            -1, &res_st, NULL) != SQLITE_OK ||
         sqlite3_prepare_v2(s,
                            "INSERT INTO runs (id, run_id, experiment_id, seq, config_json, "
                            "config_hash, state, attempts) VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6, ?7)",
                            -1, &run_st, NULL) != SQLITE_OK ||
         sqlite3_prepare_v2(s,
                            "INSERT INTO run_config_kv (run, key_id, num, txt, flag) "
                            "VALUES (?1, (SELECT id FROM config_keys WHERE key = ?2), ?3, ?4, ?5)",
                            -1, &kv_st, NULL) != SQLITE_OK ||
         sqlite3_prepare_v2(s, "UPDATE runs SET state = 'completed', attempts = 1 WHERE id = ?1",
                            -1, &upd_st, NULL) != SQLITE_OK))
        rc = db_fail(db, &err, "preparing");
    char cfg[512], hash[65], run_id[32];
    double t0 = now_s(), c0 = cpu_s(), t_api = 0;
    if (!rc)
        rc = db_tx_begin(db, &err);
    for (long i = 0; i < n_runs && !rc; i++) {
        if (i == n_api) {
            rc = db_tx_end(db, 0, &err);
            t_api = now_s() - t0;
            row("insert: runs_db_insert, 9 config keys, one transaction", n_api, t_api,
                cpu_s() - c0, 0);
            t0 = now_s();
            c0 = cpu_s();
            /* Bulk load, the usual way: no journal (this is a scratch file), secondary
             * indexes dropped (their SQL kept) and rebuilt by sorting afterwards. */
            if (!rc)
                rc = db_exec(db, "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF", &err);
            if (!rc)
                rc = db_tx_begin(db, &err);
            if (!rc)
                rc = db_exec(db, "CREATE TEMP TABLE saved_idx AS SELECT name, sql FROM "
                                 "sqlite_master WHERE type = 'index' AND sql IS NOT NULL AND "
                                 "tbl_name IN ('runs', 'run_config_kv', 'results')", &err);
            /* (Collected first: an index cannot be dropped while a statement reads.) */
            char drops[32][160];
            int nd = 0;
            sqlite3_stmt *names;
            if (!rc && sqlite3_prepare_v2(s, "SELECT name FROM temp.saved_idx", -1, &names,
                                          NULL) == SQLITE_OK) {
                while (nd < 32 && sqlite3_step(names) == SQLITE_ROW)
                    snprintf(drops[nd++], sizeof drops[0], "DROP INDEX main.\"%s\"",
                             (const char *)sqlite3_column_text(names, 0));
                sqlite3_finalize(names);
            }
            for (int k = 0; k < nd && !rc; k++)
                rc = db_exec(db, drops[k], &err);
        }
        tp[i] = (unsigned char)(1 << tu_randint(&rng, 0, 4));
        strat[i] = (unsigned char)tu_randint(&rng, 0, 4);
        int pp = tu_randint(&rng, 1, 5), dp = tu_randint(&rng, 1, 17);
        int mb = 1 << tu_randint(&rng, 0, 4), offload = strat[i] == 3 && (i & 1);
        double lr = 1e-4 * tu_randint(&rng, 1, 50);
        const char *model = i % 3 ? "tiny-vlm" : "qwen2.5-vl-7b", *fp8 = fp8s[i % 3];
        snprintf(cfg, sizeof cfg,
                 "{\"model\":\"%s\",\"parallel\":{\"tp\":%d,\"pp\":%d,\"dp\":%d,"
                 "\"encoder\":{\"strategy\":\"%s\",\"offload\":%s}},"
                 "\"precision\":{\"fp8\":\"%s\"},\"train\":{\"lr\":%.17g,\"micro_batch\":%d}}",
                 model, tp[i], pp, dp, strategies[strat[i]], offload ? "true" : "false", fp8, lr,
                 mb);
        hash_of((uint64_t)i, hash);
        /* 90% completed with a result; throughput in [0, 10000). */
        state[i] = tu_randint(&rng, 0, 10) != 0;
        tps[i] = (float)(tu_uniform(&rng) * 10000.0);
        mfu[i] = (float)tu_uniform(&rng);
        int64_t pk = i + 1;
        if (i < n_api) {
            run_new rn = {"bench", cfg, hash, NULL};
            if ((rc = runs_db_insert(db, &rn, NULL, &pk, &err)))
                break;
            if (state[i]) {
                sqlite3_bind_int64(upd_st, 1, pk);
                if (sqlite3_step(upd_st) != SQLITE_DONE)
                    rc = db_fail(db, &err, "completing a run");
                sqlite3_reset(upd_st);
            }
        } else {
            snprintf(run_id, sizeof run_id, "bench-%ld", i + 1);
            sqlite3_bind_int64(run_st, 1, pk);
            sqlite3_bind_text(run_st, 2, run_id, -1, SQLITE_STATIC);
            sqlite3_bind_int64(run_st, 3, i + 1);
            sqlite3_bind_text(run_st, 4, cfg, -1, SQLITE_STATIC);
            sqlite3_bind_text(run_st, 5, hash, -1, SQLITE_STATIC);
            sqlite3_bind_text(run_st, 6, state[i] ? "completed" : "pending", -1, SQLITE_STATIC);
            sqlite3_bind_int(run_st, 7, state[i]);
            if (sqlite3_step(run_st) != SQLITE_DONE)
                rc = db_fail(db, &err, "loading a run");
            sqlite3_reset(run_st);
            /* The rows runs_db_insert would write (keys in config_keys since the first
             * runs). */
            static const char *const keys[] = {"model", "parallel.tp", "parallel.pp",
                                               "parallel.dp", "parallel.encoder.strategy",
                                               "parallel.encoder.offload", "precision.fp8",
                                               "train.lr", "train.micro_batch"};
            for (int k = 0; k < 9 && !rc; k++) {
                sqlite3_bind_int64(kv_st, 1, pk);
                sqlite3_bind_text(kv_st, 2, keys[k], -1, SQLITE_STATIC);
                switch (k) {
                case 0: sqlite3_bind_text(kv_st, 4, model, -1, SQLITE_STATIC); break;
                case 1: sqlite3_bind_int(kv_st, 3, tp[i]); break;
                case 2: sqlite3_bind_int(kv_st, 3, pp); break;
                case 3: sqlite3_bind_int(kv_st, 3, dp); break;
                case 4: sqlite3_bind_text(kv_st, 4, strategies[strat[i]], -1, SQLITE_STATIC); break;
                case 5: sqlite3_bind_int(kv_st, 5, offload); break;
                case 6: sqlite3_bind_text(kv_st, 4, fp8, -1, SQLITE_STATIC); break;
                case 7: sqlite3_bind_double(kv_st, 3, lr); break;
                default: sqlite3_bind_int(kv_st, 3, mb); break;
                }
                if (sqlite3_step(kv_st) != SQLITE_DONE)
                    rc = db_fail(db, &err, "loading a config");
                sqlite3_reset(kv_st);
                sqlite3_clear_bindings(kv_st);
            }
        }
        if (state[i] && !rc) {
            sqlite3_bind_int64(res_st, 1, pk);
            sqlite3_bind_double(res_st, 2, 50 + 100 * tu_uniform(&rng));
            sqlite3_bind_double(res_st, 3, tps[i]);
            sqlite3_bind_double(res_st, 4, tps[i] / 8);
            sqlite3_bind_double(res_st, 5, mfu[i]);
            sqlite3_bind_int64(res_st, 6, (sqlite3_int64)tu_randint(&rng, 1, 1 << 30) * 64);
            sqlite3_bind_double(res_st, 7, 2 + tu_uniform(&rng));
            if (sqlite3_step(res_st) != SQLITE_DONE)
                rc = db_fail(db, &err, "inserting a result");
            sqlite3_reset(res_st);
        }
    }
    double t_load = now_s() - t0, c_load = cpu_s() - c0;
    if (!rc && n_runs > n_api) {
        char *creates[32];
        int nc = 0;
        sqlite3_stmt *sqls;
        if (sqlite3_prepare_v2(s, "SELECT sql FROM temp.saved_idx", -1, &sqls, NULL) == SQLITE_OK) {
            while (nc < 32 && sqlite3_step(sqls) == SQLITE_ROW)
                creates[nc++] = strdup((const char *)sqlite3_column_text(sqls, 0));
            sqlite3_finalize(sqls);
        }
        for (int k = 0; k < nc; k++) {
            if (!rc)
                rc = db_exec(db, creates[k], &err);
            free(creates[k]);
        }
        if (!rc)
            rc = db_exec(db, "DROP TABLE temp.saved_idx", &err);
    }
    sqlite3_finalize(res_st);
    sqlite3_finalize(run_st);
    sqlite3_finalize(kv_st);
    sqlite3_finalize(upd_st);
    if (db_tx_depth(db))
        rc = db_tx_end(db, rc, &err);
    if (rc) {
        fprintf(stderr, "build: %s\n", err.msg);
        return 1;
    }
    if (!rc && n_runs > n_api)
        rc = db_exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL", &err);
    if (rc) {
        fprintf(stderr, "build: %s\n", err.msg);
        return 1;
    }
    /* What `PRAGMA optimize` on closing leaves behind for the planner. */
    db_exec(db, "PRAGMA analysis_limit = 1000; ANALYZE", &err);
    if (n_runs > n_api) {
        row("build: bulk load of the rest, runs + config + results", n_runs - n_api, t_load,
            c_load, 0);
        row("build: rebuild indexes, ANALYZE", n_runs, now_s() - t0 - t_load,
            cpu_s() - c0 - c_load, 0);
    }

    /* ---- ingest 1M metric rows: 4 runs x 250k steps ---- */
    const int n_ingest = 4;
    long per = n_metric_rows / n_ingest;
    char *ids[4];
    for (int r = 0; r < n_ingest; r++) {
        char rdir[400], file[500], h[65];
        snprintf(rdir, sizeof rdir, "%s/run%d", dir, r);
        mkdir(rdir, 0755);
        snprintf(file, sizeof file, "%s/metrics.jsonl", rdir);
        FILE *fp = fopen(file, "w");
        for (long s = 0; s < per; s++)
            fprintf(fp,
                    "{\"step\":%ld,\"loss\":%.6f,\"grad_norm\":%.5f,\"lr\":%.6g,"
                    "\"step_ms\":%.3f,\"tokens\":%d,\"tokens_per_s\":%.2f,\"encoder_ms\":%.3f,"
                    "\"decoder_ms\":%.3f,\"peak_mem_bytes\":%ld}\n",
                    s, 10.0 / (1 + s * 1e-3), 1 + tu_uniform(&rng), 3e-4, 100 + tu_uniform(&rng),
                    8192, 81920 + tu_uniform(&rng), 20 + tu_uniform(&rng),
                    80 + tu_uniform(&rng), 40000000000L + s);
        fclose(fp);
        hash_of((uint64_t)(n_runs + r), h);
        run_new rn = {"bench", "{\"ingest\":true}", h, rdir};
        if (runs_db_insert(db, &rn, &ids[r], NULL, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    t0 = now_s();
    c0 = cpu_s();
    long ingested = 0;
    for (int r = 0; r < n_ingest; r++) {
        ingest_summary sum;
        if (ingest_run(db, ids[r], NULL, &sum, &err)) {
            fprintf(stderr, "ingest: %s\n", err.msg);
            return 1;
        }
        ingested += sum.metric_rows;
    }
    row("ingest: metrics.jsonl (4 runs x 250k steps)", ingested, now_s() - t0, cpu_s() - c0,
        5);
    check(ingested == n_metric_rows, "ingested rows");

    /* ---- query: a result field and a config key, on a fresh connection as `hearth
     * query` has (its page cache starts empty) ---- */
    db_close(db);
    if (db_open(path, &db, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const char *filter = "tokens_per_s > 9900 and parallel.tp == 4";
    long expect = 0;
    for (long i = 0; i < n_runs; i++)
        expect += state[i] && tps[i] > 9900.0f && tp[i] == 4;
    FILE *devnull = fopen("/dev/null", "w");
    double times[5], cpus[5], first;
    long rows_out = 0;
    for (int k = 0; k < 5; k++) {
        query_opts o = {.filter = filter, .format = REPORT_CSV};
        t0 = now_s();
        c0 = cpu_s();
        if (query_runs(db, &o, devnull, &rows_out, &err)) {
            fprintf(stderr, "query: %s\n", err.msg);
            return 1;
        }
        times[k] = now_s() - t0;
        cpus[k] = cpu_s() - c0;
    }
    first = times[0];
    qsort(times, 5, sizeof *times, cmp_double);
    qsort(cpus, 5, sizeof *cpus, cmp_double);
    row("query: tokens_per_s > 9900 and parallel.tp == 4", rows_out, times[2], cpus[2], 0.1);
    row("  the same, first run on the fresh connection", rows_out, first, -1, 0.1);
    check(rows_out == expect, "query row count");

    const char *filter2 = "parallel.encoder.strategy == \"hetero_tp\" and mfu > 0.5";
    for (int k = 0; k < 5; k++) {
        query_opts o = {.filter = filter2, .order = "-tokens_per_s", .limit = 20,
                        .format = REPORT_TABLE};
        t0 = now_s();
        c0 = cpu_s();
        if (query_runs(db, &o, devnull, &rows_out, &err)) {
            fprintf(stderr, "query: %s\n", err.msg);
            return 1;
        }
        times[k] = now_s() - t0;
        cpus[k] = cpu_s() - c0;
    }
    qsort(times, 5, sizeof *times, cmp_double);
    qsort(cpus, 5, sizeof *cpus, cmp_double);
    row("query: strategy == hetero_tp and mfu > 0.5, top 20", rows_out, times[2], cpus[2],
        0.1);
    check(rows_out == 20, "top-20 row count");
    fclose(devnull);

    /* ---- dedup: 100k hashes, half of them recorded ---- */
    char (*hashes)[65] = malloc((size_t)n_hashes * 65);
    const char **hp = malloc((size_t)n_hashes * sizeof *hp);
    long *comp = malloc((size_t)n_hashes * sizeof *comp), *act = malloc((size_t)n_hashes * sizeof *act);
    long expect_completed = 0;
    for (long i = 0; i < n_hashes; i++) {
        long idx = (i & 1) ? (long)(tu_next(&rng) % (uint64_t)n_runs)
                           : n_runs + n_ingest + (long)(tu_next(&rng) % 1000000000ull);
        if (i & 1)
            expect_completed += state[idx];
        hash_of((uint64_t)idx, hashes[i]);
        hp[i] = hashes[i];
    }
    t0 = now_s();
    c0 = cpu_s();
    if (runs_db_count_by_hashes(db, "bench", hp, (size_t)n_hashes, comp, act, &err)) {
        fprintf(stderr, "dedup: %s\n", err.msg);
        return 1;
    }
    row("dedup: count by hash, 100k hashes", n_hashes, now_s() - t0, cpu_s() - c0, 2);
    long got_completed = 0, got_active = 0;
    for (long i = 0; i < n_hashes; i++) {
        got_completed += comp[i];
        got_active += act[i];
    }
    check(got_completed == expect_completed, "completed counts");
    check(got_active == (n_hashes + 1) / 2 - expect_completed, "active counts");

    for (int r = 0; r < n_ingest; r++)
        free(ids[r]);
    free(hashes);
    free(hp);
    free(comp);
    free(act);
    free(tps);
    free(tp);
    free(state);
    free(strat);
    free(mfu);
    db_close(db);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (keep)
        printf("kept %s\n", path);
    else if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return failures ? 1 : 0;
}
