-- The open runs in run id order (RunIndex.open_runs, ADR 0074 / 0079): a sweep reads them a page
-- after a cursor, and a page is a range read of this index from the cursor on, in order. Before
-- it, each page read every open run (SQLite through `runs_by_status`, PostgreSQL through
-- `open_runs_by_owner`) and sorted them by id.
-- Partial: an ended run has no entry. The predicate is spelled exactly as
-- codec.OPEN_RUN_PREDICATE, which every query of open runs repeats word for word.
--
-- It replaces `open_runs_by_owner` (owner, lease_expires_at), which no statement reads in that
-- order any more (every one that names an owner names its run too): a lease renewal, every few
-- seconds for every run executing, then changes no indexed column, and on PostgreSQL it is a
-- heap-only update that writes no index entry (ADR 0079).
--
-- Built from the rows already there inside the migration's transaction, not CONCURRENTLY (which
-- cannot run in one): the runs table is locked against writes while it is built, once, at the
-- first start of this version, by one replica while the others wait on the migration lock. The
-- table's every row is read (one row a run, not its events), the open ones written.

CREATE INDEX open_runs_by_id ON runs (run_id)
WHERE status IN ('pending', 'running') AND closed_at IS NULL;

DROP INDEX open_runs_by_owner;

-- The planner takes the index for a page only when it knows how many runs are open: a table it
-- has no statistics of is taken to hold a handful, and a handful is read whole and sorted. An
-- upgraded store is analyzed here (a sample of the table's rows, in this transaction); a new one
-- by autovacuum as its runs come and go.
ANALYZE runs;
