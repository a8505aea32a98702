-- thoughtgate: concurrently
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
-- Built CONCURRENTLY, outside a transaction (the marker above, ADR 0082): the runs keep being
-- written while it is built, at the first start of this version, by the one replica that holds
-- the migration lock. Each statement completes what an earlier try began: an index left INVALID
-- by a build that failed or was killed is dropped and built again (store.pg_schema), one built
-- whole is kept; the version is recorded after the last statement.

CREATE INDEX CONCURRENTLY IF NOT EXISTS open_runs_by_id ON runs (run_id)
WHERE status IN ('pending', 'running') AND closed_at IS NULL;

DROP INDEX CONCURRENTLY IF EXISTS open_runs_by_owner;

-- The planner takes the index for a page only when it knows how many runs are open: a table it
-- has no statistics of is taken to hold a handful, and a handful is read whole and sorted. An
-- upgraded store is analyzed here (a sample of the table's rows); a new one by autovacuum as its
-- runs come and go.
ANALYZE runs;
