-- A run's lifecycle events in order (EventLog.read_types: `thoughtgate check-index`, ADR 0066),
-- found without visiting its other events -- its deltas, thousands in a long run. Partial: a
-- delta gets no entry, so appending one costs what it did. The predicate is spelled exactly as
-- codec.LIFECYCLE_INDEX_PREDICATE, which the query repeats word for word (SQLite uses a partial
-- index only then); its types are fixed here, a new one needs a new migration.
--
-- Built from the rows already there inside the migration's transaction (the file's write lock
-- is held while it is built; once, at the first start of this version).

CREATE INDEX lifecycle_events ON events (run_id, seq)
WHERE (type = 'capability.resolved' OR type = 'run.error' OR type = 'run.failed' OR type = 'run.interrupted' OR type = 'run.resumed' OR type = 'run.settlement.completed' OR type = 'run.started' OR type = 'task.completed' OR type = 'task.started' OR type = 'worker.completed');
