"""Adaptive output buffering against a real nsqd: an unbuffered lane for a trickle, a
buffered one under a backlog, and nothing lost or run twice in between."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from nsqworker.consumer import Consumer
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory, NsqdProcess, NsqlookupdProcess, wait_until

TOPIC = "lanes_test"
CHANNEL = "c"
BODY = 2048  # big bodies: the fast lane's byte rate passes UP_RATE on a loaded machine


def settings(nsqd: NsqdProcess, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nsqd_tcp_addresses": [nsqd.tcp_address],
        "backoff_multiplier": 0.0,
        "drain_timeout": 5.0,
        "dial_timeout": 2.0,
    }
    values.update(overrides)
    return Settings(**values)


def preload(nsqd: NsqdProcess, count: int, prefix: str = "m") -> list[bytes]:
    nsqd.create_channel(TOPIC, CHANNEL)
    bodies = [f"{prefix}{i:06d}".encode().ljust(BODY, b".") for i in range(count)]
    for start in range(0, count, 500):
        nsqd.mpublish(TOPIC, bodies[start : start + 500], binary=True)
    return bodies


def lane(consumer: Consumer) -> str:
    return consumer.stats().connections[0].lane


async def test_a_backlog_drains_on_the_bulk_lane_and_a_trickle_returns_to_the_fast_one(
    nsqd: NsqdProcess,
) -> None:
    # Large enough that the bulk lane is up before the backlog is gone: with the suite's
    # other processes busy, it took over only after 15,000-20,000 messages.
    bodies = preload(nsqd, 30_000)
    seen: Counter[bytes] = Counter()
    lanes: list[str] = []
    trickle: list[str] = []
    consumer: Consumer

    def handle(msg: Message) -> Outcome:
        seen[msg.body] += 1
        if msg.body.startswith(b"t"):
            trickle.append(lane(consumer))
        elif len(seen) % 500 == 0:
            lanes.append(lane(consumer))
        return FINISH

    consumer = Consumer(TOPIC, CHANNEL, handle, settings(nsqd), max_in_flight=500)
    await consumer.start()
    try:
        assert lane(consumer) == "fast"
        await wait_until(
            lambda: len(seen) == len(bodies), timeout=60, message=lambda: f"{len(seen)} seen"
        )
        assert "bulk" in lanes, lanes
        assert set(seen) == set(bodies) and set(seen.values()) == {1}
        await wait_until(lambda: lane(consumer) == "fast", timeout=2, message="back to fast")
        for i in range(20):
            await asyncio.to_thread(nsqd.publish, TOPIC, f"t{i}")
            await asyncio.sleep(0.01)
        await wait_until(lambda: len(trickle) == 20, timeout=20, message=f"trickle {trickle}")
        assert set(trickle) == {"fast"}
        stats = consumer.stats()
        assert (stats.finished, stats.rdy, stats.in_flight) == (len(bodies) + 20, 500, 0)
    finally:
        await consumer.stop()


async def test_moving_lanes_never_runs_more_than_max_in_flight_handlers(
    nsqd: NsqdProcess,
) -> None:
    bodies = preload(nsqd, 6_000)
    seen: Counter[bytes] = Counter()
    running = peak = 0
    lanes: set[str] = set()
    consumer: Consumer

    async def handle(msg: Message) -> Outcome:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        lanes.add(lane(consumer))
        await asyncio.sleep(0.001)
        running -= 1
        seen[msg.body] += 1
        return FINISH

    consumer = Consumer(TOPIC, CHANNEL, handle, settings(nsqd), max_in_flight=64)
    await consumer.start()
    try:
        await wait_until(
            lambda: len(seen) == len(bodies), timeout=60, message=lambda: f"{len(seen)} seen"
        )
    finally:
        await consumer.stop()
    assert "bulk" in lanes
    assert peak <= 64
    assert set(seen.values()) == {1}


async def test_stop_on_the_bulk_lane_loses_nothing(nsqd: NsqdProcess) -> None:
    bodies = preload(nsqd, 20_000)  # far more than drain in the time it takes to stop
    finished: Counter[bytes] = Counter()
    consumer: Consumer

    async def handle(msg: Message) -> Outcome:
        await asyncio.sleep(0.002)
        finished[msg.body] += 1
        return FINISH

    consumer = Consumer(TOPIC, CHANNEL, handle, settings(nsqd), max_in_flight=200)
    await consumer.start()
    await wait_until(lambda: lane(consumer) == "bulk", timeout=20, message="bulk lane")
    await consumer.stop()
    assert 0 < len(finished) < len(bodies)
    assert (nsqd.channel_stats(TOPIC, CHANNEL) or {}).get("in_flight_count") == 0

    rest = Consumer(TOPIC, CHANNEL, handle, settings(nsqd), max_in_flight=200)
    await rest.start()
    try:
        await wait_until(
            lambda: len(finished) == len(bodies), timeout=20, message=f"{len(finished)}"
        )
    finally:
        await rest.stop()
    assert set(finished.values()) == {1}, "a message FINed twice"


async def test_a_lost_bulk_lane_hands_rdy_back_and_loses_nothing(nsqd: NsqdProcess) -> None:
    bodies = preload(nsqd, 10_000)
    seen: Counter[bytes] = Counter()
    lost: list[bytes] = []  # in flight on the bulk lane when it was cut
    consumer: Consumer

    async def handle(msg: Message) -> Outcome:
        bulk = consumer.subscription.connections.links[nsqd.tcp_address].bulk
        if not lost and bulk is not None and msg.receipt is bulk:
            lost.append(msg.body)
            bulk.conn.fail("test: bulk lane cut")  # its FIN cannot be sent any more
        await asyncio.sleep(0)
        seen[msg.body] += 1
        return FINISH

    # nsqd redelivers what a lost connection had in flight after msg_timeout: 1 s here.
    consumer = Consumer(TOPIC, CHANNEL, handle, settings(nsqd, msg_timeout=1), max_in_flight=300)
    await consumer.start()
    try:
        # Every message handled, and the one cut off redelivered (after msg_timeout):
        # the others may all be done before nsqd gives it back.
        await wait_until(
            lambda: set(seen) == set(bodies) and bool(lost) and seen[lost[0]] >= 2,
            timeout=20,
            message=lambda: f"{len(set(seen))} of {len(bodies)} handled, lost: {lost}",
        )
        assert seen[lost[0]] == 2  # handled, unanswered, delivered again
        stats = consumer.stats()
        assert stats.connected == 1 and stats.connections[0].connects == 1
        assert consumer.stats().subscription.errors.get("closed", 0) >= 1
        await wait_until(lambda: consumer.stats().in_flight == 0, timeout=2)
        await wait_until(
            lambda: (nsqd.channel_stats(TOPIC, CHANNEL) or {}).get("in_flight_count") == 0,
            timeout=5,
            message="nothing left in flight at nsqd",
        )
    finally:
        await consumer.stop()


async def test_an_explicit_buffer_setting_keeps_one_connection(nsqd: NsqdProcess) -> None:
    bodies = preload(nsqd, 5_000)
    seen: set[bytes] = set()

    def handle(msg: Message) -> Outcome:
        seen.add(msg.body)
        return FINISH

    for size in (-1, 16384):
        seen.clear()
        if size == 16384:
            preload(nsqd, len(bodies))
        consumer = Consumer(
            TOPIC, CHANNEL, handle, settings(nsqd, output_buffer_size=size), max_in_flight=500
        )
        await consumer.start()
        try:
            await wait_until(
                lambda: len(seen) == len(bodies), timeout=20, message=f"{len(seen)} seen"
            )
            assert lane(consumer) == "single"
            clients = (nsqd.channel_stats(TOPIC, CHANNEL) or {}).get("clients", [])
            assert len(clients) == 1
        finally:
            await consumer.stop()


async def test_a_worker_reports_its_buffered_nsqd(nsqd: NsqdProcess) -> None:
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    bodies = preload(nsqd, 10_000)
    seen: set[bytes] = set()
    buffered: list[int] = []
    reg = Registry()
    worker: Worker

    @reg.task(TOPIC, channel=CHANNEL, max_in_flight=500)
    def handle(msg: Message) -> None:
        seen.add(msg.body)

    def now_buffered() -> int:
        (task,) = worker.stats().tasks.values()
        return task.buffered

    async with Worker(reg, settings(nsqd, log_level="warning")) as worker:
        while len(seen) < len(bodies):
            buffered.append(now_buffered())
            await asyncio.sleep(0.005)
        await wait_until(lambda: now_buffered() == 0, timeout=2)
    assert 1 in buffered


async def test_an_nsqd_leaving_lookupd_mid_backlog_is_retired_on_both_lanes(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    nsqd = nsqd_factory(nsqlookupd)
    bodies = preload(nsqd, 20_000)  # at most 20,000 msg/s below: it outlasts the retire
    await wait_until(lambda: len(nsqlookupd.lookup(TOPIC)) == 1, timeout=20, message="registered")
    finished: Counter[bytes] = Counter()
    consumer: Consumer

    async def handle(msg: Message) -> Outcome:
        await asyncio.sleep(0.005)
        finished[msg.body] += 1
        return FINISH

    config = settings(
        nsqd,
        nsqd_tcp_addresses=[],
        lookupd_http_addresses=[nsqlookupd.http_address],
        lookupd_poll_interval=0.2,
        lookupd_poll_jitter=0.1,
    )
    consumer = Consumer(TOPIC, CHANNEL, handle, config, max_in_flight=100)
    await consumer.start()
    try:
        await wait_until(lambda: lane(consumer) == "bulk", timeout=20, message="bulk lane")
        # Tombstoned: lookupd stops listing the nsqd, which keeps running.
        node = f"127.0.0.1:{nsqd.http_port}"
        nsqlookupd.request("POST", "/topic/tombstone", params={"topic": TOPIC, "node": node})
        await wait_until(lambda: not consumer.stats().connections, timeout=20, message="retired")

        def closed() -> bool:  # the last FINs and CLS reach nsqd a moment later
            stats = nsqd.channel_stats(TOPIC, CHANNEL) or {}
            return stats.get("in_flight_count") == 0 and not stats.get("clients")

        await wait_until(closed, timeout=5, message="both connections closed, nothing in flight")
        stats = nsqd.channel_stats(TOPIC, CHANNEL) or {}
        assert stats.get("requeue_count") == 0 and stats.get("timeout_count") == 0
        assert set(finished.values()) == {1}
        assert 0 < len(finished) < len(bodies)
        assert len(finished) + stats["depth"] == len(bodies)
        assert not consumer.stats().subscription.errors
    finally:
        await consumer.stop()
