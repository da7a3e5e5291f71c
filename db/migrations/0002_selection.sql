-- 0002_selection.sql - layer benchmarks as `hearth bench ingest` records them, and the
-- decisions of `hearth select` and of `auto` values in specs (docs/select.md).
--
-- 0001's layer_bench had no model, no repeats, no `experts` component and no CUDA/cuBLASLt
-- versions, and nothing ever wrote it: it is replaced.  One ingested layer_bench.json is a
-- set (layer_bench_sets); selection reads the newest set per GPU and model, so rows measured
-- under different software never mix.

DROP TABLE layer_bench;

CREATE TABLE layer_bench_sets (
    id                INTEGER PRIMARY KEY,
    run               INTEGER REFERENCES runs(id) ON DELETE SET NULL,
    source            TEXT NOT NULL,
    content_sha256    TEXT NOT NULL UNIQUE,
    gpu               TEXT NOT NULL,
    model             TEXT NOT NULL,
    cuda_version      TEXT,
    cublaslt_version  TEXT,
    ingested_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX layer_bench_sets_lookup ON layer_bench_sets (gpu, model, id);

-- One measured linear: forward + backward times in bf16 and in fp8 (quantisation
-- included), the median over `repeats` timed runs.
CREATE TABLE layer_bench (
    id          INTEGER PRIMARY KEY,
    bench       INTEGER NOT NULL REFERENCES layer_bench_sets(id) ON DELETE CASCADE,
    component   TEXT NOT NULL CHECK (component IN ('encoder', 'projector', 'decoder', 'experts')),
    kind        TEXT NOT NULL CHECK (kind IN ('qkv', 'proj', 'fc1', 'fc2', 'expert_fc1',
                                              'expert_fc2', 'lm_head', 'router')),
    tp          INTEGER NOT NULL CHECK (tp >= 1),
    tokens      INTEGER NOT NULL CHECK (tokens >= 1),
    bf16_ms     REAL NOT NULL CHECK (bf16_ms > 0),
    fp8_ms      REAL NOT NULL CHECK (fp8_ms > 0),
    repeats     INTEGER NOT NULL CHECK (repeats >= 1),
    UNIQUE (bench, component, kind, tp, tokens)
);
CREATE INDEX layer_bench_by_set ON layer_bench (bench, component, kind, tp, tokens);

-- What `hearth select encoder|fp8` decided, and what `auto` values of a submitted spec
-- resolved to, with the evidence (JSON) that decided it.  `experiment` and `config_hash`
-- are set for decisions made for a spec's point; `method` says whether measurements,
-- the cost model, or both decided ('none': no data, the default was kept).
CREATE TABLE decisions (
    id           INTEGER PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('encoder', 'fp8')),
    experiment   TEXT,
    config_hash  TEXT,
    subject      TEXT NOT NULL,
    decision     TEXT NOT NULL,
    method       TEXT NOT NULL CHECK (method IN ('measured', 'predicted', 'mixed', 'none')),
    evidence     TEXT NOT NULL,
    created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX decisions_by_kind ON decisions (kind, created_at);
CREATE INDEX decisions_by_point ON decisions (experiment, config_hash);
