-- thoughtgate: concurrently
-- The open runs a process holds, in run id order (RunIndex.open_runs(expired=True), ADR 0082):
-- the sweep's read of the runs whose lease expired is a range read of this index, which visits
-- the held runs -- at most the replicas' concurrency, plus those whose process is gone -- and
-- none of the queued or suspended runs, however many wait. Before it, that read visited every
-- open run through `open_runs_by_id`.
-- Partial, its predicate spelled exactly as codec.LEASED_RUN_PREDICATE, which the expired read
-- repeats word for word. A lease renewal changes none of its columns, nor of its predicate
-- (owner, status, closed_at, run_id): a renewal stays a heap-only update (ADR 0079). An index on
-- `lease_expires_at` would have made the read proportional to the expired leases alone, at the
-- cost of every renewal writing an entry in every index of `runs` again (measured: ADR 0082).
--
-- Built CONCURRENTLY, outside a transaction (the marker above, ADR 0082): runs keep being
-- written meanwhile; an index a failed build left INVALID is dropped and built again.

CREATE INDEX CONCURRENTLY IF NOT EXISTS leased_runs_by_id ON runs (run_id)
WHERE status IN ('pending', 'running') AND closed_at IS NULL AND owner IS NOT NULL;

ANALYZE runs;
