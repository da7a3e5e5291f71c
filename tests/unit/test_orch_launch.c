/* test_orch_launch.c - how a run is launched: job.json's "launch" (nodes, gpus_per_node)
 * round-trips and defaults to a CPU run when absent; the real templates/sbatch.sh.tmpl,
 * run with a stand-in srun and trainer, starts the trainer alone for a CPU run and through
 * `srun --mpi=pmix` with nodes x gpus_per_node tasks for a cuda run (rank 0 --out RUN_DIR,
 * rank R --out RUN_DIR/rank-R), every rank with --resume RUN_DIR when the run directory
 * holds a checkpoint and --force otherwise; the plan rule ranks_match_gpus prunes a cuda point whose
 * ranks disagree with nodes x gpus_per_node and keeps the others.  Random shapes, seeded
 * (HEARTH_TEST_SEED repeats a run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "plan.h"
#include "rundir.h"
#include "shape/file_read.h"
#include "shape/run_config.h"
#include "support/spectest.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

static tu_rng g_rng;

/* A run directory written with rundir_write from the template text `tmpl`. */
static void write_run(const char *run_dir, const char *workdir, const char *trainer,
                      int nodes, int gpus, int cpus, const char *tmpl)
{
    run_config c;
    hearth_err err = {{0}};
    assert_int_equal(run_config_parse(&c, "t", "model: tiny-vlm\n", NULL, 0, 0, &err), 0);
    char *json = run_config_canonical_json(&c, &err);
    assert_non_null(json);
    char hash[65];
    assert_int_equal(run_config_hash(&c, hash, &err), 0);
    rundir_job j = { 0 };
    j.run_id = "exp-1";
    j.experiment = "exp";
    j.backend = "slurm";
    j.trainer = (char *)trainer;
    j.workdir = (char *)workdir;
    j.config_hash = hash;
    j.cpus_per_task = cpus;
    j.repeat = 1;
    j.pack = 1;
    j.nodes = nodes;
    j.gpus_per_node = gpus;
    if (rundir_write(run_dir, &j, json, "t.tmpl", tmpl, &err))
        fail_msg("rundir_write: %s", err.msg);
    free(json);
}

static void test_job_json_launch(void **state)
{
    (void)state;
    char d[256], run_dir[320], path[400];
    assert_int_equal(tu_tmpdir_make(d, sizeof d, "launch"), 0);
    snprintf(run_dir, sizeof run_dir, "%s/exp/exp-1", d);
    hearth_err err = {{0}};
    for (int round = 0; round < 8; round++) {
        int gpus = round == 0 ? 0 : tu_randint(&g_rng, 0, 9);
        int nodes = tu_randint(&g_rng, 1, 65);
        write_run(run_dir, d, "/bin/true", nodes, gpus, tu_randint(&g_rng, 1, 17),
                  "N={{NODES}} G={{GPUS_PER_NODE}}\n");
        rundir_job back, copy;
        assert_int_equal(rundir_job_read(run_dir, &back, &err), 0);
        assert_int_equal(back.nodes, nodes);
        assert_int_equal(back.gpus_per_node, gpus);
        assert_int_equal(rundir_job_copy(&copy, &back, &err), 0);
        assert_int_equal(copy.nodes, nodes);
        assert_int_equal(copy.gpus_per_node, gpus);
        rundir_job_free(&copy);
        rundir_job_free(&back);
        char *text = NULL, want[64];
        snprintf(path, sizeof path, "%s/job.sh", run_dir);
        assert_int_equal(file_read_bounded(path, FILE_READ_MAX_TEXT, &text, NULL, &err), 0);
        snprintf(want, sizeof want, "N='%d' G='%d'\n", nodes, gpus);
        assert_string_equal(text, want);
        free(text);
    }
    /* Written before launches existed: no "launch" key is a CPU run. */
    snprintf(path, sizeof path, "%s/job.json", run_dir);
    const char *old = "{\"run_id\": \"x\", \"experiment\": \"e\", \"backend\": \"slurm\", "
                      "\"trainer\": \"t\", \"workdir\": \"/\", \"config_hash\": \"h\", "
                      "\"cpus_per_task\": 2, \"time_limit_s\": 0, \"retries\": 0, "
                      "\"repeat\": 1, \"max_concurrent\": 0%s}";
    char buf[1024];
    snprintf(buf, sizeof buf, old, "");
    assert_int_equal(tu_write_text(path, buf), 0);
    rundir_job back;
    assert_int_equal(rundir_job_read(run_dir, &back, &err), 0);
    assert_int_equal(back.nodes, 1);
    assert_int_equal(back.gpus_per_node, 0);
    rundir_job_free(&back);
    /* A malformed launch names itself. */
    snprintf(buf, sizeof buf, old, ", \"launch\": {\"nodes\": 2, \"gpus_per_node\": -1}");
    assert_int_equal(tu_write_text(path, buf), 0);
    assert_int_equal(rundir_job_read(run_dir, &back, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "gpus_per_node"));
    snprintf(buf, sizeof buf, old, ", \"launch\": [2, 2]");
    assert_int_equal(tu_write_text(path, buf), 0);
    assert_int_equal(rundir_job_read(run_dir, &back, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "launch"));
    assert_int_equal(tu_tmpdir_remove(d), 0);
}

/* Counts the lines of `path` that contain `needle`; -1 when it cannot be read. */
static int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* The real sbatch template, run outside Slurm: `srun` on PATH is a stand-in that logs its
 * arguments and runs the command once per task with SLURM_PROCID set (as srun would), the
 * trainer logs its --out. */
static void test_sbatch_template_launch(void **state)
{
    (void)state;
    char *tmpl = NULL;
    hearth_err err = {{0}};
    if (file_read_bounded("templates/sbatch.sh.tmpl", FILE_READ_MAX_TEXT, &tmpl, NULL, &err))
        fail_msg("%s (run from the repository root)", err.msg);
    char d[256], path[600], cmd[2400];
    assert_int_equal(tu_tmpdir_make(d, sizeof d, "launch-tmpl"), 0);
    snprintf(path, sizeof path, "%s/bin", d);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/bin/srun", d);
    char text[2048];
    snprintf(text, sizeof text,
             "#!/bin/bash\n"
             "echo \"$*\" >>'%s/srun.log'\n"
             "n=0\n"
             "while [ \"${1#-}\" != \"$1\" ]; do\n"
             "    case \"$1\" in --ntasks=*) n=${1#--ntasks=} ;; esac\n"
             "    shift\n"
             "done\n"
             "for ((r = 0; r < n; r++)); do SLURM_PROCID=$r \"$@\" || exit $?; done\n", d);
    assert_int_equal(tu_write_text(path, text), 0);
    assert_int_equal(chmod(path, 0755), 0);
    char trainer[400];
    snprintf(trainer, sizeof trainer, "%s/trainer.sh", d);
    snprintf(text, sizeof text,
             "#!/bin/bash\n"
             "[ \"$1\" = --config ] && [ \"$3\" = --out ] || exit 9\n"
             "echo \"rank=${SLURM_PROCID:-none} out=$4 omp=$OMP_NUM_THREADS start=${*:5}\" "
             ">>'%s/trainer.log'\n",
             d);
    assert_int_equal(tu_write_text(trainer, text), 0);
    assert_int_equal(chmod(trainer, 0755), 0);

    for (int round = 0; round < 4; round++) {
        int cuda = round % 2, nodes = cuda ? tu_randint(&g_rng, 1, 4) : 1;
        int gpus = cuda ? tu_randint(&g_rng, 1, 5) : 0, cpus = tu_randint(&g_rng, 1, 9);
        char run_dir[400];
        snprintf(run_dir, sizeof run_dir, "%s/exp/exp-%d", d, round);
        write_run(run_dir, d, trainer, nodes, gpus, cpus, tmpl);
        /* rounds 2 and 3: an earlier attempt left a checkpoint */
        char start[500] = "start=--force";
        if (round >= 2) {
            snprintf(path, sizeof path, "%s/checkpoints", run_dir);
            assert_int_equal(mkdir(path, 0755), 0);
            snprintf(path, sizeof path, "%s/checkpoints/latest", run_dir);
            assert_int_equal(tu_write_text(path, "step-00000001\n"), 0);
            snprintf(start, sizeof start, "start=--resume %s", run_dir);
        }
        snprintf(cmd, sizeof cmd, "rm -f '%s/srun.log' '%s/trainer.log'; cd '%s' && "
                 "PATH='%s/bin':\"$PATH\" ./job.sh >/dev/null 2>&1", d, d, run_dir, d);
        assert_int_equal(system(cmd), 0);
        char code[64];
        snprintf(path, sizeof path, "%s/exit_code", run_dir);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(code, sizeof code, f));
        fclose(f);
        assert_string_equal(code, "0\n");
        snprintf(path, sizeof path, "%s/srun.log", d);
        char log[400], want[600];
        snprintf(log, sizeof log, "%s/trainer.log", d);
        /* each rank (one without srun) starts afresh or resumes, as the directory says */
        if (count_lines(log, start) != (cuda ? nodes * gpus : 1))
            fail_msg("round %d: not every trainer line has \"%s\"", round, start);
        if (!cuda) {   /* the trainer alone, no srun */
            assert_int_equal(count_lines(path, ""), -1);
            snprintf(want, sizeof want, "rank=none out=%s omp=%d", run_dir, cpus);
            assert_int_equal(count_lines(log, want), 1);
            assert_int_equal(count_lines(log, "rank="), 1);
            continue;
        }
        snprintf(want, sizeof want, "--mpi=pmix --kill-on-bad-exit=1 --nodes=%d --ntasks=%d "
                 "--ntasks-per-node=%d --cpus-per-task=%d ", nodes, nodes * gpus, gpus, cpus);
        if (count_lines(path, want) != 1)
            fail_msg("srun was not called with %s", want);
        assert_int_equal(count_lines(log, "rank="), nodes * gpus);
        for (int r = 0; r < nodes * gpus; r++) {
            if (r == 0)
                snprintf(want, sizeof want, "rank=0 out=%s omp=%d", run_dir, cpus);
            else
                snprintf(want, sizeof want, "rank=%d out=%s/rank-%d omp=%d", r, run_dir, r,
                         cpus);
            if (count_lines(log, want) != 1)
                fail_msg("no trainer line \"%s\"", want);
        }
    }
    free(tmpl);
    assert_int_equal(tu_tmpdir_remove(d), 0);
}

/* ---- the plan rule --------------------------------------------------------------------- */

typedef struct {
    int n;
    plan_status status[16];
    char rule[16][64];
    int ranks[16];
} rec;

static int record(void *ctx, const plan_point *p)
{
    rec *r = ctx;
    if (r->n < 16) {
        r->status[r->n] = p->status;
        snprintf(r->rule[r->n], sizeof r->rule[r->n], "%s", p->rule ? p->rule : "");
        r->ranks[r->n] = p->config->ranks;
    }
    r->n++;
    return 0;
}

static void test_plan_ranks_match_gpus(void **state)
{
    (void)state;
    char d[256], preset[320];
    assert_int_equal(tu_tmpdir_make(d, sizeof d, "launch-plan"), 0);
    snprintf(preset, sizeof preset, "%s/vlm.yaml", d);
    assert_int_equal(tu_write_text(preset,
        "encoder:\n  layers: 1\n  hidden: 64\n  ffn: 128\n  heads: 2\n  kv_heads: 2\n"
        "  head_dim: 32\n  pos: rope2d\n  patch: 8\n  spatial_merge: 2\n"
        "projector:\n  hidden: 128\n"
        "decoder:\n  layers: 2\n  hidden: 64\n  ffn: 128\n  heads: 2\n  kv_heads: 2\n"
        "  head_dim: 32\n  pos: rope\n  vocab: 128\n  image_token_id: 127\n"), 0);
    for (int round = 0; round < 6; round++) {
        int nodes = tu_randint(&g_rng, 1, 5), gpus = tu_randint(&g_rng, 1, 5);
        int want = nodes * gpus, off = tu_randint(&g_rng, 1, 4);
        /* points: ranks left out, ranks = nodes x gpus, ranks off by `off`; the same three
         * on cpu, where the rule does not apply. */
        char text[2048];
        snprintf(text, sizeof text,
                 "name: c\nbase: {model: %s, train: {global_batch: %d, micro_batch: 1}}\n"
                 "resources: {nodes: %d, gpus_per_node: %d}\n"
                 "include:\n"
                 "  - {device: cuda}\n  - {device: cuda, ranks: %d}\n"
                 "  - {device: cuda, ranks: %d}\n"
                 "  - {device: cpu, ranks: %d, train.seed: 2}\n", preset, want * (want + off),
                 nodes, gpus, want, want + off, want + off);
        spec *sp = spt_parse_ok(text);
        rec r = { 0 };
        plan_counts c;
        hearth_err err = {{0}};
        if (plan_run(sp, NULL, record, &r, &c, &err))
            fail_msg("plan: %s", err.msg);
        assert_int_equal(r.n, 4);
        assert_int_equal(r.status[0], PLAN_KEPT);
        assert_int_equal(r.ranks[0], want);
        /* the same resolved config as point 1 */
        assert_int_equal(r.status[1], PLAN_SKIPPED);
        assert_int_equal(r.status[2], PLAN_PRUNED);
        assert_string_equal(r.rule[2], "ranks_match_gpus");
        assert_int_not_equal(r.status[3], PLAN_PRUNED);
        assert_int_equal(r.ranks[3], want + off);
        spec_free(sp);
    }
    assert_int_equal(tu_tmpdir_remove(d), 0);
}

int main(void)
{
    g_rng = tu_rng_fresh_noted();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_job_json_launch),
        cmocka_unit_test(test_sbatch_template_launch),
        cmocka_unit_test(test_plan_ranks_match_gpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
