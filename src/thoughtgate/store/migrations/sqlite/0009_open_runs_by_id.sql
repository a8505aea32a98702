-- The open runs in run id order (RunIndex.open_runs, ADR 0074 / 0079): a sweep reads them a page
-- after a cursor, and a page is a range read of this index from the cursor on, in order. Before
-- it, each page read every open run (SQLite through `runs_by_status`, PostgreSQL through
-- `open_runs_by_owner`) and sorted them by id.
-- Partial: an ended run has no entry. The predicate is spelled exactly as
-- codec.OPEN_RUN_PREDICATE, which every query of open runs repeats word for word.
--
-- It replaces `open_runs_by_owner` (owner, lease_expires_at), which no statement reads in that
-- order any more (every one that names an owner names its run too): a lease renewal, every few
-- seconds for every run executing, then changes no indexed column and writes one index entry
-- fewer (ADR 0079).
--
-- Built from the rows already there inside the migration's transaction (the file's write lock
-- is held while it is built; once, at the first start of this version). The table's every row
-- is read, the open ones written.

CREATE INDEX open_runs_by_id ON runs (run_id)
WHERE status IN ('pending', 'running') AND closed_at IS NULL;

DROP INDEX open_runs_by_owner;
