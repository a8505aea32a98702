-- Every ended run closed (ADR 0134). `closed_at` came with schema version 5, set by
-- `finish_run` only: a run ended before version 5, or given a terminal status by anything but
-- `finish_run` (`update_run`, `create_run`/`admit_run` of an ended run, an appended terminal
-- event, `rebuild_run_index`), kept `closed_at IS NULL`. Since version 12 the open-run indexes
-- (`open_runs_by_id`, `leased_runs_by_id`) hold every run with `closed_at IS NULL`, so they held
-- those too, and every read of open runs skipped them by status, row by row. Every such write
-- now closes its run; this closes the ones already stored, so the indexes hold open runs only.
--
-- A run is closed at the time it ended, as best the store knows it:
-- 1. its last terminal event's time (`run.settlement.completed`, `run.failed`, `run.error`,
--    `run.interrupted`: the events that give a run an ended status, the log being the record of
--    when it ended);
-- 2. else its `updated_at` (a status written without an event: the last change of its row, at or
--    after the write that ended it; `NOT NULL` since version 1, so `created_at` is never needed,
--    and kept only as the last resort the column's constraint already guarantees).
-- Never the migration's own time: a run that ended in 2025 did not close at the upgrade.
--
-- Only rows in `open_runs_by_id` are candidates (`closed_at IS NULL`): SQLite reads them through
-- that index, the open runs plus these, not the whole table.

UPDATE runs
SET closed_at = COALESCE(
    (SELECT max(e.ts) FROM events e
     WHERE e.run_id = runs.run_id
       AND e.type IN ('run.settlement.completed', 'run.failed', 'run.error', 'run.interrupted')),
    updated_at,
    created_at
)
WHERE closed_at IS NULL AND status NOT IN ('pending', 'running');
