-- 0003_experiment_manage.sql - experiments as things a user manages: archived ones are
-- hidden from listings (`hearth archive`), tags group them (`hearth tag`), `hearth rm`
-- removes one with everything recorded about its runs.
--
-- Archiving hides, it removes nothing: plan dedup, `hearth check` baselines and `hearth
-- select` still read an archived experiment's runs, and a command naming it still works.

-- NULL while the experiment is in view; when it was archived otherwise.
ALTER TABLE experiments ADD COLUMN archived_at TEXT;

-- An experiment's tags, one row each; removed with the experiment.
CREATE TABLE experiment_tags (
    experiment  INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
    tag         TEXT NOT NULL,
    PRIMARY KEY (experiment, tag)
) WITHOUT ROWID;
-- `hearth status --tag T`: the experiments of a tag.
CREATE INDEX experiment_tags_by_tag ON experiment_tags (tag, experiment);
