-- Every ended run closed (ADR 0134). `closed_at` came with migration 4, set by `finish_run`
-- only: a run ended before it, or given a terminal status by anything but `finish_run`
-- (`update_run`, `create_run`/`admit_run` of an ended run, an appended terminal event,
-- `rebuild_run_index`), kept `closed_at IS NULL`: appends to it were still taken, and an
-- execution's check of its hold (`Holder.check`) took it for open. PostgreSQL's open-run indexes
-- keep the whole predicate (status and `closed_at`), so they never held such runs; SQLite's did
-- (schema version 12, ADR 0127). Every such write now closes its run on both stores; this closes
-- the ones already stored.
--
-- A run is closed at the time it ended, as best the store knows it: its last terminal event's
-- time (the events that give a run an ended status), else its `updated_at` (the last change of
-- its row, at or after the write that ended it; `NOT NULL` since migration 1, so `created_at` is
-- only the last resort that constraint already guarantees). Never the migration's own time.
--
-- One pass over `runs` (no index holds ended runs without `closed_at`), once, at the first start
-- of this version; it locks only the rows it closes.

UPDATE runs
SET closed_at = COALESCE(
    (SELECT max(e.ts) FROM events e
     WHERE e.run_id = runs.run_id
       AND e.type IN ('run.settlement.completed', 'run.failed', 'run.error', 'run.interrupted')),
    updated_at,
    created_at
)
WHERE closed_at IS NULL AND status NOT IN ('pending', 'running');
