-- 0005_layer_bench_shared_kinds.sql - the MoE shared expert's linears in layer benchmarks:
-- kinds 'shared_fc1' and 'shared_fc2' (docs/fp8.md names them; `hearth-train
-- --bench-layers` measures them for a model with decoder.moe.shared_ffn > 0).
--
-- SQLite cannot widen a CHECK in place: the table is rebuilt with the same columns and
-- every row, then its index.

CREATE TABLE layer_bench_new (
    id          INTEGER PRIMARY KEY,
    bench       INTEGER NOT NULL REFERENCES layer_bench_sets(id) ON DELETE CASCADE,
    component   TEXT NOT NULL CHECK (component IN ('encoder', 'projector', 'decoder', 'experts')),
    kind        TEXT NOT NULL CHECK (kind IN ('qkv', 'proj', 'fc1', 'fc2', 'expert_fc1',
                                              'expert_fc2', 'shared_fc1', 'shared_fc2',
                                              'lm_head', 'router')),
    tp          INTEGER NOT NULL CHECK (tp >= 1),
    tokens      INTEGER NOT NULL CHECK (tokens >= 1),
    bf16_ms     REAL NOT NULL CHECK (bf16_ms > 0),
    fp8_ms      REAL NOT NULL CHECK (fp8_ms > 0),
    repeats     INTEGER NOT NULL CHECK (repeats >= 1),
    fp8_err     REAL CHECK (fp8_err IS NULL OR fp8_err >= 0),
    UNIQUE (bench, component, kind, tp, tokens)
);
INSERT INTO layer_bench_new (id, bench, component, kind, tp, tokens, bf16_ms, fp8_ms, repeats,
                             fp8_err)
    SELECT id, bench, component, kind, tp, tokens, bf16_ms, fp8_ms, repeats, fp8_err
    FROM layer_bench;
DROP TABLE layer_bench;
ALTER TABLE layer_bench_new RENAME TO layer_bench;
CREATE INDEX layer_bench_by_set ON layer_bench (bench, component, kind, tp, tokens);
