-- Run leases (ADR 0009): who executes an open run, until when it is known to be alive, and when
-- the run was closed (after which the store refuses further appends to it).

ALTER TABLE runs
    ADD COLUMN owner text,                          -- store.leases.Owner id of the executing process
    ADD COLUMN lease_expires_at double precision,   -- epoch seconds on the server's clock; renewed
    ADD COLUMN closed_at double precision;          -- set by finish_run; appends then fail

-- Runs left open by a thoughtgate from before leases: nobody renews them, so they are closed as
-- interrupted a minute after this upgrade unless they end first.
UPDATE runs SET owner = 'legacy', lease_expires_at = extract(epoch FROM now()) + 60
WHERE status IN ('pending', 'running');

-- The few open runs, for the sweep that closes runs whose owner is gone.
CREATE INDEX open_runs_by_owner ON runs (owner, lease_expires_at)
WHERE status IN ('pending', 'running') AND closed_at IS NULL;
