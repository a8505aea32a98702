"""Two ``thoughtgate serve`` replicas on one PostgreSQL database behave as one service: keys and
tickets from either work on both, a reader on one replica follows a run executing on the other
live and in order, and ``Last-Event-ID`` resumes against either replica."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator

import pytest
from support.faults import (
    Frame,
    RawSSE,
    Replicas,
    ends_run,
    event_frames,
    follow,
    replicas,
    ticker_prompt,
)

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]

STEPS, GAP_MS = 40, 40  # a run that stays live for about 1.6 s


@pytest.fixture(scope="module")
def pair() -> Iterator[Replicas]:
    with replicas() as started:
        yield started


def _same_as_stored(frames: list[Frame], stored: list[dict[str, object]]) -> None:
    got = [f.json() for f in frames]
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1)), "gap, duplicate or reorder"
    assert got == stored
    assert [f.id for f in frames] == [e["seq"] for e in got]


def test_keys_made_once_or_on_either_replica_work_on_both(pair: Replicas) -> None:
    a, b = pair.urls
    for url in (a, b):
        me = pair.client(url).get("/v1/me")
        assert me.status_code == 200 and me.json()["role"] == "owner"
    made = pair.client(b).post("/v1/keys", json={"name": "vic", "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    viewer = made.json()["key"]
    assert pair.client(a, viewer).get("/v1/me").json()["role"] == "viewer"
    assert pair.client(b).delete("/v1/keys/vic").status_code in (200, 204)
    assert pair.client(a, viewer).get("/v1/me").status_code == 401  # revoked on B, gone on A


async def test_a_reader_on_b_follows_a_run_on_a_live_and_in_order(pair: Replicas) -> None:
    a, b = pair.urls
    run_id = pair.start_run(a, ticker_prompt(STEPS, GAP_MS))
    ticket = pair.ticket(a, run_id)  # issued by A, accepted by B (shared secret in the store)
    frames = event_frames(await follow(b, run_id, ticket))
    assert pair.status(a, run_id) == "completed"
    assert ends_run(frames[-1])
    _same_as_stored(frames, pair.events(a, run_id))
    _same_as_stored(frames, pair.events(b, run_id))
    deltas = [f for f in frames if f.json()["type"] == "message.delta"]
    assert len(deltas) == STEPS  # one per step, none lost on the way between replicas
    # Live, not replayed at the end: the deltas reached B spread over the run's lifetime, each
    # soon after A emitted it (NOTIFY, not the 3 s safety poll).
    assert frames[-1].at - deltas[0].at > STEPS * GAP_MS / 1000 * 0.6
    lags = [f.at - float(f.json()["ts"]) for f in deltas]
    assert statistics.median(lags) < 0.25, lags


async def test_resume_with_last_event_id_against_either_replica(pair: Replicas) -> None:
    a, b = pair.urls
    run_id = pair.start_run(a, ticker_prompt(STEPS, GAP_MS))
    ticket = pair.ticket(b, run_id)
    seen: list[Frame] = []
    # B dropped after 12 frames -> A (Last-Event-ID header) dropped at 27 -> B (query) to the end.
    plan: list[tuple[str, str, int | None]] = [
        (b, "header", 12),
        (a, "header", 27),
        (b, "query", None),
    ]
    for url, via, drop_at in plan:
        conn = await RawSSE.open(
            url, run_id, ticket, last_event_id=seen[-1].id if seen else None, via=via
        )
        assert conn.status == 200
        async for frame in conn.frames():
            if frame.id is not None:
                seen.append(frame)
            if drop_at is not None and len(seen) >= drop_at:
                break
        conn.abort()
        if drop_at is not None:
            assert pair.status(a, run_id) == "running"  # dropped mid-run, not after the end
    assert pair.status(b, run_id) == "completed"
    assert ends_run(seen[-1])
    _same_as_stored(seen, pair.events(b, run_id))
    # resuming after the end answers 204 on either replica
    for url in (a, b):
        done = await RawSSE.open(url, run_id, ticket, last_event_id=seen[-1].id)
        assert done.status == 204
        await done.close()


async def test_revoking_a_key_on_b_ends_its_stream_on_a_within_5_s(pair: Replicas) -> None:
    """The attack across replicas: a stream keeps delivering reasoning on A after its key was
    revoked through B (or a demoted key keeps its old role on A)."""
    a, b = pair.urls
    made = pair.client(b).post("/v1/keys", json={"name": "leaky-dev", "role": "developer"})
    assert made.status_code == 201, made.text
    key_id, key = made.json()["key_id"], made.json()["key"]
    run_id = pair.start_run(a, ticker_prompt(400, 50))  # about 20 s of reasoning and text
    ticket = pair.ticket(a, run_id, key)
    conn = await RawSSE.open(a, run_id, ticket)
    assert conn.status == 200
    frames: list[Frame] = []
    revoked_at = 0.0
    try:
        async for frame in conn.frames():
            frames.append(frame)
            if not revoked_at and any(
                f.event == "" and "reasoning.delta" in f.data for f in frames
            ):
                gone = await asyncio.to_thread(pair.client(b).delete, f"/v1/keys/{key_id}")
                assert gone.status_code == 200, gone.text
                revoked_at = time.time()
    finally:
        await conn.close()
    assert revoked_at, "no reasoning arrived before the revocation"
    ended_at = frames[-1].at
    assert frames[-1].event == "access_revoked", frames[-1]
    assert ended_at - revoked_at < 5.0, ended_at - revoked_at
    assert pair.status(a, run_id) == "running"  # the stream ended, not the run
    for url in (a, b):  # and the ticket opens nothing on either replica
        again = await RawSSE.open(url, run_id, ticket)
        assert again.status == 401
        await again.close()
    owners = await RawSSE.open(b, run_id, pair.ticket(b, run_id))
    assert owners.status == 200  # other keys' streams are unaffected
    owners.abort()
