-- A run's events of some types (EventLog.read_types: `thoughtgate check-index`, ADR 0066), found
-- without visiting its other events -- its deltas, thousands in a long run. The table is
-- WITHOUT ROWID, so the index ends with the primary key's seq: the rows of one (run, type) come
-- in seq order, and a page after a seq starts where it should.
--
-- Built from the rows already there inside the migration's transaction (the file's write lock
-- is held while it is built; once, at the first start of this version).

CREATE INDEX events_by_type ON events (run_id, type);
