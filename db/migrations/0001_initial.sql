-- 0001_initial.sql - the first schema of Hearth's results database (DESIGN.md, "Results
-- database").  Applied in one transaction together with `PRAGMA user_version = 1`.
--
-- Timestamps are UTC text 'YYYY-MM-DDTHH:MM:SS.sssZ': sortable, readable, and understood by
-- SQLite's date functions.  Every table that hangs off a run cascades on its deletion, so
-- removing a run never leaves orphans.

-- An experiment is identified by its name (DESIGN.md, "Experiment spec"); resubmitting a
-- changed spec updates the stored text and adds runs.
CREATE TABLE experiments (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    spec_path   TEXT,
    spec_text   TEXT,
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- One row per run: `run_id` is "<experiment>-<seq>".  `state` moves only along the transition
-- table in orchestrator/run_state.c; `attempts` counts submissions; `backend_job_id` is the
-- current attempt's job (earlier ones are in run_events).
CREATE TABLE runs (
    id              INTEGER PRIMARY KEY,
    run_id          TEXT NOT NULL UNIQUE,
    experiment_id   INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
    seq             INTEGER NOT NULL,
    config_json     TEXT NOT NULL,
    config_hash     TEXT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'submitted', 'running', 'requeued',
                                     'completed', 'failed', 'cancelled', 'timeout')),
    backend         TEXT,
    backend_job_id  TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    exit_code       INTEGER,
    run_dir         TEXT,
    created_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    submitted_at    TEXT,
    started_at      TEXT,
    ended_at        TEXT,
    updated_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (experiment_id, seq)
);
-- Plan dedup: "how many runs of this hash are completed" reads only this index.
CREATE INDEX runs_by_hash_state ON runs (config_hash, state);
-- Status / progress counts per experiment.
CREATE INDEX runs_by_experiment_state ON runs (experiment_id, state);

-- Every state transition, with the backend job of that attempt: the history behind `state`.
CREATE TABLE run_events (
    id              INTEGER PRIMARY KEY,
    run             INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    at              TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    from_state      TEXT NOT NULL,
    to_state        TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    backend         TEXT,
    backend_job_id  TEXT,
    exit_code       INTEGER,
    note            TEXT
);
CREATE INDEX run_events_by_run ON run_events (run, id);

-- The flattened resolved config, one row per leaf ("parallel.tp"), so that filters on config
-- keys are index lookups instead of JSON parsing over every run.  Key names are interned in
-- config_keys; `types` is the set of value types seen for the key (bits: 1 number,
-- 2 string, 4 bool, 8 JSON array/object, 16 null), which lets the query compiler type keys.
CREATE TABLE config_keys (
    id     INTEGER PRIMARY KEY,
    key    TEXT NOT NULL UNIQUE,
    types  INTEGER NOT NULL DEFAULT 0
);

-- Exactly one of num (numbers), txt (strings; arrays/objects as their JSON text) and flag
-- (bools, 0/1) is set, or none for a JSON null: a comparison never matches a value of
-- another type.
CREATE TABLE run_config_kv (
    run     INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key_id  INTEGER NOT NULL REFERENCES config_keys(id),
    num     NUMERIC,
    txt     TEXT,
    flag    INTEGER,
    PRIMARY KEY (run, key_id)
) WITHOUT ROWID;
CREATE INDEX run_config_kv_num ON run_config_kv (key_id, num) WHERE num IS NOT NULL;
CREATE INDEX run_config_kv_txt ON run_config_kv (key_id, txt) WHERE txt IS NOT NULL;
CREATE INDEX run_config_kv_flag ON run_config_kv (key_id, flag) WHERE flag IS NOT NULL;

-- RUN_DIR/metrics.jsonl, one row per step (DESIGN.md, "Trainer outputs").  Fields the
-- trainer adds later land in `extra` (a JSON object) until a migration gives them a column.
CREATE TABLE metrics (
    run             INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step            INTEGER NOT NULL,
    loss            REAL,
    grad_norm       REAL,
    lr              REAL,
    step_ms         REAL,
    tokens          INTEGER,
    tokens_per_s    REAL,
    encoder_ms      REAL,
    decoder_ms      REAL,
    peak_mem_bytes  INTEGER,
    extra           TEXT,
    PRIMARY KEY (run, step)
) WITHOUT ROWID;

-- RUN_DIR/result.json, one row per run.  `exit_status` keeps the trainer's value as written
-- (no type affinity); `versions` is the JSON object as written.
CREATE TABLE results (
    run                   INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    steps                 INTEGER,
    step_ms_median        REAL,
    step_ms_p10           REAL,
    step_ms_p90           REAL,
    tokens_per_s          REAL,
    tokens_per_s_per_gpu  REAL,
    flops_per_token       REAL,
    mfu                   REAL,
    peak_mem_bytes        INTEGER,
    final_loss            REAL,
    exit_status,
    device                TEXT,
    device_count          INTEGER,
    nodes                 INTEGER,
    versions              TEXT,
    extra                 TEXT,
    ingested_at           TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX results_tokens_per_s ON results (tokens_per_s);
CREATE INDEX results_tokens_per_s_per_gpu ON results (tokens_per_s_per_gpu);
CREATE INDEX results_mfu ON results (mfu);
CREATE INDEX results_step_ms_median ON results (step_ms_median);
CREATE INDEX results_peak_mem_bytes ON results (peak_mem_bytes);
CREATE INDEX results_final_loss ON results (final_loss);

-- RUN_DIR/layer_bench.json (bench mode): per component / layer kind / token count / tp, the
-- bf16 and fp8 forward+backward times (quantisation included) and the quantisation cost
-- alone, on one GPU model.  `select fp8` reads it.
CREATE TABLE layer_bench (
    id          INTEGER PRIMARY KEY,
    run         INTEGER REFERENCES runs(id) ON DELETE CASCADE,
    gpu         TEXT NOT NULL,
    component   TEXT NOT NULL CHECK (component IN ('encoder', 'projector', 'decoder')),
    layer_kind  TEXT NOT NULL,
    tokens      INTEGER NOT NULL,
    tp          INTEGER NOT NULL DEFAULT 1,
    bf16_ms     REAL,
    fp8_ms      REAL,
    quant_ms    REAL,
    UNIQUE (run, component, layer_kind, tokens, tp)
);
CREATE INDEX layer_bench_lookup ON layer_bench (gpu, component, layer_kind, tp, tokens);

-- Decisions of `hearth select encoder|fp8` with their evidence, so that a choice can be
-- explained later.  `subject` is the canonical JSON of what was decided for (model, GPU,
-- layout, token count); `method` says whether measurements or the cost model decided.
CREATE TABLE selections (
    id            INTEGER PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('encoder', 'fp8')),
    subject       TEXT NOT NULL,
    subject_hash  TEXT NOT NULL,
    decision      TEXT NOT NULL,
    method        TEXT NOT NULL CHECK (method IN ('measured', 'cost_model')),
    evidence      TEXT NOT NULL,
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX selections_lookup ON selections (kind, subject_hash, created_at);
