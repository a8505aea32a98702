-- The live, searchable run list (store/listing.py): which key started a run, and a change feed.
--
-- change_seq is the number of a run's latest change (created, or its status, usage, error or
-- metadata changed); run_changes holds the last number handed out. Both are written inside the
-- write transaction that changes the run, so numbers follow commit order and a reader resuming
-- "after N" never misses a change.

ALTER TABLE runs ADD COLUMN started_by TEXT;                  -- API key id; NULL: CLI / Python API
ALTER TABLE runs ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;

CREATE TABLE run_changes (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    last_change INTEGER NOT NULL
);

-- Runs from before this version: one change each, in the order they were stored.
UPDATE runs SET change_seq = rowid;
INSERT INTO run_changes (id, last_change) VALUES (1, COALESCE((SELECT MAX(rowid) FROM runs), 0));

CREATE UNIQUE INDEX runs_by_change ON runs (change_seq);

-- Keyset pages of a filtered list walk one of these newest first (every SQLite index ends with
-- the rowid, the tie-break of the list order), so a page costs the same at any depth.
CREATE INDEX runs_by_status ON runs (status, created_at);
CREATE INDEX runs_by_model ON runs (model, created_at);
CREATE INDEX runs_by_mode ON runs (chain_of_thought, created_at);
CREATE INDEX runs_by_key ON runs (started_by, created_at) WHERE started_by IS NOT NULL;
