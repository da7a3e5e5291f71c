-- 0004_layer_bench_provenance.sql - what measured a layer benchmark set, and how far the
-- FP8 results were from the baseline (docs/select.md, "Layer benchmarks").
--
-- Files written by `hearth-train --bench-layers` say which device ran them ('cpu': the
-- fp32 reference against the FP8 emulation, whose speedups say nothing about a GPU;
-- 'cuda'), which trainer build and when.  Older files have none of it: NULL.

ALTER TABLE layer_bench_sets ADD COLUMN device TEXT CHECK (device IN ('cpu', 'cuda'));
ALTER TABLE layer_bench_sets ADD COLUMN build TEXT;
-- When the benchmark ran (ISO 8601 UTC, as the file gives it); ingested_at is when it
-- was recorded.
ALTER TABLE layer_bench_sets ADD COLUMN measured_at TEXT;

-- The FP8 result's relative error against the baseline: the largest relative L2 error of
-- the forward output and of the input and weight gradients.  NULL: not measured.
ALTER TABLE layer_bench ADD COLUMN fp8_err REAL CHECK (fp8_err IS NULL OR fp8_err >= 0);
