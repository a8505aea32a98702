-- A run's events of some types (EventLog.read_types: `thoughtgate check-index`, ADR 0066), found
-- without visiting its other events -- its deltas, thousands in a long run. seq last, so the
-- rows of one (run, type) come in seq order and a page after a seq starts where it should.
--
-- Built from the rows already there inside the migration's transaction (the events table is
-- locked against writes while it is built; once, at the first start of this version, by one
-- replica while the others wait on the migration lock).

CREATE INDEX events_by_type ON events (run_id, type, seq);
