-- The run list's change numbers without one row every change locks (ADR 0140).
--
-- Until now every transaction that changed a run bumped `run_changes.last_change` and held that
-- row's lock until it committed (migration 5, ADR 0012): numbers in commit order, and every
-- run-list write of the whole deployment one at a time. From now on a change is numbered
-- `base + its transaction's id` (`pg_current_xact_id()`), and a reader takes only the numbers
-- below `base + the oldest transaction id still running` (`pg_snapshot_xmin`): every transaction
-- below that has ended, so nothing can still appear under a number a reader has passed.
--
-- `base` puts the new numbers above every number handed out before: the largest so far, plus
-- one, less the oldest transaction id running now (a transaction already running, even one
-- waiting for this migration's lock, numbers above it). `ALTER TABLE` first: its lock waits for
-- the writers of the previous version still in flight, so the `UPDATE` after it sees their
-- numbers.
ALTER TABLE run_changes ADD COLUMN base bigint NOT NULL DEFAULT 0;

UPDATE run_changes
SET base = GREATEST(last_change, (SELECT COALESCE(max(change_seq), 0) FROM runs)) + 1
    - pg_snapshot_xmin(pg_current_snapshot())::text::bigint;

-- A replica of the previous version, still running during a rolling upgrade, numbers its changes
-- with `UPDATE run_changes SET last_change = last_change + 1 RETURNING last_change`: this gives
-- it the number this version would (its transaction's), so its changes are read in the same
-- order as everyone else's. It still waits for the row's lock, with the other old replicas only.
CREATE FUNCTION run_change_of_transaction() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.last_change := NEW.base + pg_current_xact_id()::text::bigint;
    RETURN NEW;
END
$$;

CREATE TRIGGER numbered_by_transaction BEFORE UPDATE OF last_change ON run_changes
FOR EACH ROW EXECUTE FUNCTION run_change_of_transaction();
