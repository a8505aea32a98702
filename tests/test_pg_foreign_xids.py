"""Widening ``pg_locks``' 32-bit transaction ids to the 64-bit ids of snapshots (ADR 0146).

A foreign transaction is learned from ``pg_locks`` (32 bits) and passed over in a snapshot's
running ids (64 bits): a wrong widening would pass over a different transaction, ours."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.store.pg_foreign_xids import widen_xid

pytestmark = pytest.mark.unit

HALF = 1 << 31


@given(st.integers(3, (1 << 62)), st.integers(-HALF + 1, HALF - 1))
def test_an_id_within_two_to_the_31_of_the_reference_widens_to_itself(
    reference: int, offset: int
) -> None:
    """Every running id is that close to the ``xmax`` read with it, across epochs included."""
    xid = max(3, reference + offset)
    assert widen_xid(xid % (1 << 32), reference) == xid


def test_an_id_just_before_an_epoch_boundary_widens_into_the_previous_epoch() -> None:
    reference = (5 << 32) + 10
    assert widen_xid((1 << 32) - 2, reference) == (5 << 32) - 2
