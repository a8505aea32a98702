"""A durable run waits out an outage of its store (ADR 0152).

A run's store can stop answering for a while -- PostgreSQL restarting, failing over or refusing
connections, a connection lost mid-call, a SQLite file another process holds locked past the busy
timeout (``errors.store_outage``). A run that is not durable cannot continue after that, so it
fails, as before. A durable run can: its checkpoints and its log say where it was. So its
execution stops where the store failed, records nothing of the failure (no ``failed`` end, no
checkpoint of the step that failed), and waits here for the store, asking again after a pause
that doubles up to :data:`MAX_PAUSE_S`, for ``durability.store_outage_wait_s`` at most. Each
try is a log line: the run, the store's refusal in its public words (never a password), and how
long is left. Once the store answers, the execution continues from its checkpoints, as a resume
does (``run.resumed`` says why). Past the wait, the run is left open: nothing can be recorded on
a store that refuses, and an open run whose lease lapsed is what every process already knows how
to resume once the store answers (ADR 0149 left this open).

The try is the renewal of the run's lease: once the store answers, nobody's sweep takes the run
from the execution about to continue it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from thoughtgate.errors import StoreUnavailableError, failure_text, store_outage
from thoughtgate.orchestration.leases import LeaseKeeper

__all__ = ["FIRST_PAUSE_S", "MAX_PAUSE_S", "STORE_BACK", "left_open", "wait_for_store"]

log = logging.getLogger("thoughtgate.durable")

FIRST_PAUSE_S = 0.5
"""The pause before the first try; each later one doubles it, up to :data:`MAX_PAUSE_S`."""
MAX_PAUSE_S = 15.0
"""The longest pause between two tries: an outage that ended is noticed within this much (and a
try may itself wait the store's own timeout, the PostgreSQL pool's wait for a connection)."""

STORE_BACK = "its store was unavailable for a while; it continues from its checkpoints"
"""Why a run that waited out its store's outage resumed (its ``run.resumed`` reason)."""


async def wait_for_store(
    keeper: LeaseKeeper, run_id: str, outage: StoreUnavailableError, wait_s: float
) -> bool:
    """Wait for the store of ``run_id``, which refused with ``outage``, for ``wait_s`` at most:
    whether it answered (the run's lease renewed). Any other error than an outage is raised."""
    began = time.monotonic()
    deadline = began + wait_s
    pause = FIRST_PAUSE_S
    reason = failure_text(outage)
    tries = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        wait = min(pause, left)
        tries += 1
        log.warning(
            "run %s: its store is unavailable (%s); trying again in %.1f s (try %d, %.0f s of "
            "%.0f s waited)",
            run_id,
            reason,
            wait,
            tries,
            time.monotonic() - began,
            wait_s,
        )
        await asyncio.sleep(wait)
        try:
            await keeper.store.renew_leases(keeper.owner.owner_id, keeper.ttl_s, [run_id])
        except Exception as exc:
            again = store_outage(exc)
            if again is None:
                raise
            reason = failure_text(again)
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        log.warning(
            "run %s: its store answers again after %.1f s; the run continues from its checkpoints",
            run_id,
            time.monotonic() - began,
        )
        return True


def left_open(run_id: str, outage: StoreUnavailableError, wait_s: float) -> StoreUnavailableError:
    """The error a durable run's execution stops with when its store did not answer within
    ``wait_s``: the run is left open, to resume once the store answers. Not an outage itself:
    nothing waits for it again."""
    text = (
        f"run {run_id} stopped executing here: its store stayed unavailable for more than "
        f"{wait_s:g} s (durability.store_outage_wait_s) -- {failure_text(outage)}. The run is "
        "left open and resumes from its checkpoints once the store answers (a daemon's sweep "
        f"puts it back on its queue; a run of thoughtgate run waits for thoughtgate resume {run_id})"
    )
    return StoreUnavailableError(text)
