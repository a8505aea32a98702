-- The attempt of a run's latest claim, on its row (ADR 0090): the fencing token of every append
-- an execution makes, checked in the append's own statement. `run_specs.attempts` counts the
-- claims too, but an append that waited for the row lock of a claim in flight re-checks the
-- run's row as that claim left it (READ COMMITTED) while a subquery of `run_specs` still reads
-- the snapshot taken before the claim: a same-owner claim (a replica taking its own run back
-- from the queue) would let the stalled execution's append through. A column of the locked row
-- is re-read. NULL until the run's first claim: a run admitted as its claim is at attempt 1.
-- No default, no index: adding it rewrites nothing, and a renewal stays a heap-only update.

ALTER TABLE runs ADD COLUMN claim integer;
