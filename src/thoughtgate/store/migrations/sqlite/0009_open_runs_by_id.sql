-- The open runs in run id order (RunIndex.open_runs, ADR 0074 / 0079): a sweep reads them a page
-- after a cursor, and a page is a range read of this index from the cursor on, in order. Before
-- it, each page read every open run (SQLite through `runs_by_status`, PostgreSQL through
-- `open_runs_by_owner`) and sorted them by id.
-- Partial: an ended run has no entry. The predicate is spelled exactly as
-- codec.OPEN_RUN_PREDICATE, which every query of open runs repeats word for word.
--
-- Built from the rows already there inside the migration's transaction (the file's write lock
-- is held while it is built; once, at the first start of this version). The table's every row
-- is read, the open ones written.

CREATE INDEX open_runs_by_id ON runs (run_id)
WHERE status IN ('pending', 'running') AND closed_at IS NULL;
