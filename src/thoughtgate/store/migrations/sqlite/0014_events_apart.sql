-- Reasoning kept apart from the rest of an event (ADR 0160). `events_apart` holds, as a JSON
-- object, the top-level payload fields the declarations class as reasoning or trace
-- (`access.filter.stored_apart`: a turn's reasoning, its parts, sizes and error details, a
-- telemetry_only turn's `trace`, a task's `system`/`history`/`tools`), or the whole payload of a
-- `reasoning.delta`; the event's row keeps the rest (`{}` for a delta) and `apart = 1`. NULL:
-- nothing apart (most events, and every row written before this version, whose payload stays
-- whole; nothing is rewritten).
--
-- A table of its own, not a column of `events`: that table is clustered on (run_id, seq)
-- (WITHOUT ROWID), and a seek through it compares whole cells, overflow pages included, so a
-- long value in the row would be read by every read that passes it, whoever reads. Here the long
-- value sits in a rowid table, reached through its key's index only by a read that asks for it
-- (`codec.SQLITE_PAYLOAD_SQL`); a read for a reader who may see none of it never does.
ALTER TABLE events ADD COLUMN apart INTEGER;

CREATE TABLE events_apart (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    apart TEXT NOT NULL,                         -- JSON object
    PRIMARY KEY (run_id, seq)
);
