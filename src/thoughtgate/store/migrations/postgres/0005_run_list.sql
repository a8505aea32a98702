-- The live, searchable run list (store/listing.py): which key started a run, and a change feed.
--
-- change_seq is the number of a run's latest change (created, or its status, usage, error or
-- metadata changed); run_changes holds the last number handed out. Every transaction that
-- changes a run bumps that one row last, so it holds the row's lock until it commits: numbers are
-- handed out in commit order, and a reader resuming "after N" never misses a change that
-- committed late.

ALTER TABLE runs
    ADD COLUMN started_by text,                      -- API key id; NULL: CLI / Python API
    ADD COLUMN change_seq bigint NOT NULL DEFAULT 0;

CREATE TABLE run_changes (
    id          integer PRIMARY KEY CHECK (id = 1),
    last_change bigint NOT NULL
);

-- Runs from before this version: one change each, in the order they were stored.
UPDATE runs SET change_seq = insert_order;
INSERT INTO run_changes (id, last_change)
VALUES (1, COALESCE((SELECT max(insert_order) FROM runs), 0));

CREATE UNIQUE INDEX runs_by_change ON runs (change_seq);

-- Keyset pages of a filtered list walk one of these newest first, so a page costs the same at
-- any depth.
CREATE INDEX runs_by_status ON runs (status, created_at DESC, insert_order DESC);
CREATE INDEX runs_by_model ON runs (model, created_at DESC, insert_order DESC);
CREATE INDEX runs_by_mode ON runs (chain_of_thought, created_at DESC, insert_order DESC);
CREATE INDEX runs_by_key ON runs (started_by, created_at DESC, insert_order DESC)
WHERE started_by IS NOT NULL;
