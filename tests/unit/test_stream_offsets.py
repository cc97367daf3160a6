"""The stream offset watermark: never past an unfinished message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqworker.streams.offsets import Watermark


def test_moves_over_finished_offsets_at_the_front_only() -> None:
    w = Watermark()
    for offset in (3, 4, 7, 8):
        w.delivered(offset)
    w.settled(4)
    assert w.value is None and len(w) == 3
    w.settled(3)
    assert w.value == 4
    w.settled(8)
    assert w.value == 4  # 7 is still running
    w.settled(7)
    assert w.value == 8 and len(w) == 0 and w.dirty
    w.stored = 8
    assert not w.dirty


def test_offsets_must_increase() -> None:
    w = Watermark()
    w.delivered(5)
    with pytest.raises(ValueError, match="must increase"):
        w.delivered(5)


@given(st.permutations(list(range(40))), st.integers(0, 40))
def test_never_past_an_unsettled_offset(order: list[int], settle_count: int) -> None:
    w = Watermark()
    for offset in range(40):
        w.delivered(offset * 2)  # gaps, as in a filtered chunk
    settled = order[:settle_count]
    for offset in settled:
        w.settled(offset * 2)
    unsettled = sorted(set(range(40)) - set(settled))
    expected = (
        None
        if not settled
        else (
            (unsettled[0] - 1) * 2
            if unsettled and unsettled[0] > 0
            else (None if unsettled else 78)
        )
    )
    if unsettled and unsettled[0] == 0:
        expected = None
    assert w.value == expected
    assert len(w) == len(unsettled)
