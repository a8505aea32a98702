-- The open-run indexes keyed on what does not change while a run is open (ADR 0127).
-- `open_runs_by_id` and `leased_runs_by_id` (schema versions 9 and 10) had a predicate naming
-- `status`. SQLite rewrites a partial index's entry whenever an UPDATE's SET names a column of
-- its WHERE, whatever the values: a run's pending -> running (its first task's start, a claim)
-- deleted and re-inserted the same entry in both, two pages of that commit. Their predicates
-- now name only `closed_at` (and `owner`), which that update leaves alone.
--
-- Every query of open runs keeps its whole predicate (codec.OPEN_RUN_PREDICATE,
-- codec.LEASED_RUN_PREDICATE), whose terms include these: SQLite uses a partial index for a
-- query whose WHERE holds each term of the index's, and the status test is made on each row
-- the index gives. The indexes now also hold a run with an ended status and no `closed_at`,
-- which only a run ended before schema version 5 (its migration set no `closed_at`) or a status
-- written without `finish_run` leaves; the queries skip them by their status, as before.
--
-- Built from the rows already there inside the migration's transaction (the file's write lock
-- is held while it is built; once, at the first start of this version). The same names:
-- `INDEXED BY` names them.

DROP INDEX open_runs_by_id;
CREATE INDEX open_runs_by_id ON runs (run_id) WHERE closed_at IS NULL;

DROP INDEX leased_runs_by_id;
CREATE INDEX leased_runs_by_id ON runs (run_id) WHERE closed_at IS NULL AND owner IS NOT NULL;
