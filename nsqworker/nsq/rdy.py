"""RDY planning, pure: how a consumer spreads max_in_flight over its connections.

nsqd treats RDY as a window: it sends while its in-flight count for the connection is
below RDY. So RDY is set, never refilled, and the planner only runs when something
changes (a connection comes or goes, backoff moves, a turn in a rotation ends).

Invariant: the capacity a connection *commits* is ``max(rdy, in_flight, held)``, and
the sum of commitments never exceeds max_in_flight. ``held`` covers the trap of
lowering RDY: nsqd may already have put up to the old RDY on the wire, so after a
decrease the old value stays committed for a short settle time, unless every message
the old window allowed is already in our hands (then nothing can be on the wire).
Likewise a FIN that brings an over-committed connection (in flight above its RDY) down
frees its capacity only after the settle time: nsqd counts the message in flight until
it has read the FIN, and an RDY sent to another nsqd at once may be served first.

A connection on ``standby`` (the idle lane of an nsqd read on two connections, see
:mod:`nsqworker.nsq.lanes`) is planned no RDY, and when one goes to standby its old
window is not held: its capacity passes to the other lane at once. Messages nsqd had
already put on the wire then arrive on top of the new window, so nsqd may briefly have
up to one window more in flight; the consumer still runs at most max_in_flight
callbacks at once (the rest wait in order).

When connections outnumber max_in_flight (and while probing, a window of one), turns rotate: each holder keeps RDY 1 for
at most ``rotate_after`` seconds (``idle_after`` if nothing arrives), and the next turn
goes to the connection served least recently, so no nsqd can starve or be skipped.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Mode", "Slot", "plan", "released"]

# Seconds a decreased window stays committed when messages may still be on the wire.
RDY_SETTLE = 0.1
# A turn (connections > max_in_flight) lasts at most this long while messages flow...
ROTATE_AFTER = 0.5
# ...and ends this early when nothing arrives on it.
IDLE_AFTER = 0.1

NEVER = float("-inf")


class Mode(Enum):
    """What the consumer wants from its connections as a whole."""

    NORMAL = "normal"
    PAUSED = "paused"
    PROBING = "probing"


@dataclass(eq=False)
class Slot:
    """The planner's view of one connection."""

    key: Hashable
    max_rdy: int = 2500
    rdy: int = 0
    in_flight: int = 0
    held: int = 0
    held_until: float = NEVER
    turn_started: float = NEVER
    last_served: float = NEVER
    last_message: float = NEVER
    retiring: bool = False
    standby: bool = False
    extra: dict[str, object] = field(default_factory=dict)

    def committed(self, now: float) -> int:
        """Capacity this connection may be using at ``now``."""
        held = self.held if now < self.held_until else 0
        return max(self.rdy, self.in_flight, held)


def plan(
    slots: Sequence[Slot],
    max_in_flight: int,
    now: float,
    mode: Mode = Mode.NORMAL,
    *,
    settle: float = RDY_SETTLE,
    rotate_after: float = ROTATE_AFTER,
    idle_after: float = IDLE_AFTER,
) -> list[tuple[Slot, int]]:
    """Update the slots' RDY for ``now`` and return the (slot, new RDY) to send.

    Decreases are applied at once; increases only as far as uncommitted capacity
    allows, least recently served first. The slots are mutated (rdy, held, turns).
    """
    if not slots:
        return []
    targets = _targets(slots, max_in_flight, now, mode, rotate_after, idle_after)
    changes: list[tuple[Slot, int]] = []
    for slot, target in zip(slots, targets, strict=True):
        if target < slot.rdy:
            _decrease(slot, target, now, settle)
            changes.append((slot, target))
    available = max_in_flight - sum(slot.committed(now) for slot in slots)
    growing = [(s, t) for s, t in zip(slots, targets, strict=True) if t > s.rdy]
    growing.sort(key=lambda st: (st[0].last_served if st[0].rdy == 0 else now, str(st[0].key)))
    for slot, target in growing:
        before = slot.committed(now)
        floor = max(before, slot.rdy)
        allowed = min(target, floor + max(available, 0))
        if allowed <= slot.rdy:
            continue
        if slot.rdy == 0:
            slot.turn_started = now
        slot.rdy = allowed
        slot.last_served = now
        available -= slot.committed(now) - before
        changes.append((slot, allowed))
    for slot in slots:
        if slot.rdy > 0:
            slot.last_served = now
    return changes


def released(slot: Slot, now: float, settle: float = RDY_SETTLE) -> None:
    """A message of ``slot`` was settled (``in_flight`` already lowered).

    If the connection was over its RDY, what it held stays committed for ``settle``
    seconds, until nsqd has surely read the FIN (see the module docstring).
    """
    if slot.in_flight >= slot.rdy:
        before = slot.in_flight + 1
        slot.held = max(before, slot.held if now < slot.held_until else 0)
        slot.held_until = now + settle


def _decrease(slot: Slot, target: int, now: float, settle: float) -> None:
    if slot.in_flight < slot.rdy and not slot.standby:
        # Up to rdy - in_flight messages may be on the wire already.
        slot.held = max(slot.rdy, slot.held if now < slot.held_until else 0)
        slot.held_until = now + settle
    slot.rdy = target
    if target == 0:
        slot.last_served = now
        slot.turn_started = NEVER


def _targets(
    slots: Sequence[Slot],
    max_in_flight: int,
    now: float,
    mode: Mode,
    rotate_after: float,
    idle_after: float,
) -> list[int]:
    active = [i for i, s in enumerate(slots) if not s.retiring and not s.standby]
    targets = [0] * len(slots)
    if mode is Mode.PAUSED or not active:
        return targets
    if mode is Mode.PROBING:
        # A probe is a rotation with a window of one: a turn on an nsqd with nothing
        # to send ends after idle_after, so a probe never waits on an empty nsqd while
        # another has a backlog.
        for i in _rotation(slots, active, 1, now, rotate_after, idle_after):
            targets[i] = 1
        return targets
    if len(active) <= max_in_flight:
        return _fair_shares(slots, active, max_in_flight, targets)
    for i in _rotation(slots, active, max_in_flight, now, rotate_after, idle_after):
        targets[i] = 1
    return targets


def _fair_shares(
    slots: Sequence[Slot], active: list[int], max_in_flight: int, targets: list[int]
) -> list[int]:
    # The remainder goes to the connections that already hold the most, so a replan
    # with nothing changed moves nothing.
    order = sorted(active, key=lambda i: (-slots[i].rdy, str(slots[i].key)))
    budget = max_in_flight
    open_ = list(order)
    while budget > 0 and open_:
        share, extra = divmod(budget, len(open_))
        still_open = []
        for rank, i in enumerate(open_):
            want = share + (1 if rank < extra else 0)
            room = slots[i].max_rdy - targets[i]
            give = min(want, room)
            targets[i] += give
            budget -= give
            if targets[i] < slots[i].max_rdy:
                still_open.append(i)
        if len(still_open) == len(open_):
            break
        open_ = still_open
    return targets


def _age_key(slot: Slot, now: float) -> tuple[float, str]:
    return (slot.last_served if slot.rdy == 0 else now, str(slot.key))


def _rotation(
    slots: Sequence[Slot],
    active: list[int],
    max_in_flight: int,
    now: float,
    rotate_after: float,
    idle_after: float,
) -> list[int]:
    keep = []
    for i in active:
        s = slots[i]
        if s.rdy <= 0:
            continue
        busy = s.in_flight > 0 or now - max(s.turn_started, s.last_message) < idle_after
        if busy and now - s.turn_started < rotate_after:
            keep.append(i)
    keep = keep[:max_in_flight]
    waiting = sorted((i for i in active if i not in keep), key=lambda i: _age_key(slots[i], now))
    return keep + waiting[: max_in_flight - len(keep)]
