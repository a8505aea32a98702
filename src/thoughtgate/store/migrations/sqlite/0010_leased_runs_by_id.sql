-- The open runs a process holds, in run id order (RunIndex.open_runs(expired=True), ADR 0082):
-- the sweep's read of the runs whose lease expired is a range read of this index, which visits
-- the held runs -- at most the replicas' concurrency, plus those whose process is gone -- and
-- none of the queued or suspended runs, however many wait. Before it, that read visited every
-- open run through `open_runs_by_id`.
-- Partial, its predicate spelled exactly as codec.LEASED_RUN_PREDICATE, which the expired read
-- repeats word for word. A lease renewal changes none of its columns (owner, status, closed_at,
-- run_id): renewals write nothing more. A claim, a release and a run's end write its entry.
--
-- Built from the rows already there inside the migration's transaction (the file's write lock
-- is held while it is built; once, at the first start of this version). The table's every row
-- is read, the held open ones written.

CREATE INDEX leased_runs_by_id ON runs (run_id)
WHERE status IN ('pending', 'running') AND closed_at IS NULL AND owner IS NOT NULL;
