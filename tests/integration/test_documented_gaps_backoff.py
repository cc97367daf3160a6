"""Backoff's probe rotation across several real nsqd (docs/consumer.md, "Backoff": "A
probe is RDY 1 on one nsqd, rotating like a window of one"; nsqworker/nsq/rdy.py: "the
next turn goes to the connection served least recently, so no nsqd can starve or be
skipped").

What the planner guarantees, whatever the machine's load, is the order of the turns:
each RDY 1 of a probe goes to the connection whose last turn ended longest ago, so while
the flow keeps probing, every three consecutive probe turns over three nsqd go to three
different nsqd. Which nsqd's message then decides a probe is timing (a turn on an nsqd
that sends nothing within 0.1 s passes on, and its message may still arrive), so the
messages are held only to what timing cannot take away: every nsqd sends probes, and
nsqd's own REQ counts match what the handler saw, nsqd by nsqd. A run opened by a quiet
probe window (nothing arriving for 2 s: a very loaded machine) starts a new rotation:
turns are compared within one stretch of probing.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from nsqworker.consumer import Consumer
from nsqworker.message import Message, Outcome, Retry
from nsqworker.nsq.rdy import Mode, Slot, plan
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory, NsqdProcess, wait_until

TOPIC, CHANNEL = "probes", "c"
NSQD = 3
TURNS = 12  # probe turns to watch: four rounds over the three nsqd


def requeued(nsqd: NsqdProcess) -> int:
    stats = nsqd.channel_stats(TOPIC, CHANNEL) or {}
    return int(stats.get("requeue_count", 0))


def stretches(turns: Sequence[str | None]) -> list[list[str]]:
    """The probe turns split where the flow opened (None) in between."""
    runs = [list(g) for opened, g in itertools.groupby(turns, lambda t: t is None) if not opened]
    return [[t for t in run if t is not None] for run in runs]


async def test_each_probe_turn_goes_to_the_nsqd_served_least_recently(
    nsqd_factory: NsqdFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    nsqds = [nsqd_factory() for _ in range(NSQD)]
    for n in nsqds:
        n.create_channel(TOPIC, CHANNEL)
    # The planner's own record of each turn: the RDY it grants, and in which mode.
    turns: list[str | None] = []  # an nsqd given the probe's RDY 1; None: the flow opened

    def recorded(slots: Sequence[Slot], window: int, now: float, mode: Mode = Mode.NORMAL,
                 **options: Any) -> list[tuple[Slot, int]]:  # fmt: skip
        changes = plan(slots, window, now, mode, **options)
        for slot, count in changes:
            if count > 0:
                turns.append(slot.key.address if mode is Mode.PROBING else None)  # type: ignore[attr-defined]
        return changes

    monkeypatch.setattr("nsqworker.nsq.subscription.plan", recorded)
    seen: Counter[str] = Counter()
    probes: Counter[str] = Counter()  # messages that arrived once probing had begun

    def fail(msg: Message) -> Outcome:
        seen[msg.nsqd_address] += 1
        if any(turns):
            probes[msg.nsqd_address] += 1
        return Retry(0.0, backoff=True)  # REQ at once: every nsqd keeps its backlog

    settings = Settings(
        nsqd_tcp_addresses=[n.tcp_address for n in nsqds], backoff_multiplier=0.05,
        max_backoff_duration=0.1, max_attempts=1000, log_level="critical",
    )  # fmt: skip
    consumer = Consumer(TOPIC, CHANNEL, fail, settings, max_in_flight=NSQD)
    await consumer.start()
    try:
        # The sync point: every connection up before the first message exists, so each
        # turn is planned over all three.
        await wait_until(lambda: consumer.stats().subscription.connected == NSQD, 20,
                         lambda: f"connected: {consumer.stats().subscription}")  # fmt: skip
        for n in nsqds:
            n.mpublish(TOPIC, [f"{n.tcp_port}-{i}" for i in range(5)])
        await wait_until(
            lambda: sum(t is not None for t in turns) >= TURNS, 60,
            lambda: f"{TURNS} probe turns: {turns}",
        )  # fmt: skip
    finally:
        await consumer.stop(5.0)
    addresses = {n.tcp_address for n in nsqds}
    assert set(t for t in turns if t is not None) == addresses, turns
    for run in stretches(turns):
        for i in range(len(run) - NSQD + 1):
            window = run[i : i + NSQD]
            assert len(set(window)) == NSQD, f"turns {i}-{i + NSQD - 1} of {run}: {window}"
    # The messages, from nsqd's side: every nsqd sent probes, and every message the
    # handler failed was REQed to the nsqd that sent it.
    assert set(probes) == addresses, (probes, turns)
    await wait_until(
        lambda: all(requeued(n) == seen[n.tcp_address] for n in nsqds), 10,
        lambda: f"REQs {[requeued(n) for n in nsqds]}, handled {seen}",
    )  # fmt: skip
