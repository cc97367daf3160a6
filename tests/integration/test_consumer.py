"""The Consumer against real nsqd and nsqlookupd: flow control, discovery, failure."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Any

import pytest

from nsqworker.consumer import Consumer
from nsqworker.message import FINISH, Message, Outcome, Retry
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory, NsqdProcess, NsqlookupdProcess, wait_until
from nsqworker.testing.holds import holds_async, window

TOPIC = "consumer_test"
CHANNEL = "c"


def fast_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "retry_delay": 0.1,
        "backoff_multiplier": 0.0,
        "lookupd_poll_interval": 0.3,
        "lookupd_poll_jitter": 0.1,
        "reconnect_delay": 0.05,
        "max_reconnect_delay": 0.5,
        "drain_timeout": 5.0,
        "dial_timeout": 2.0,
        "heartbeat_interval": 5.0,
    }
    values.update(overrides)
    return Settings(**values)


def channel(nsqd: NsqdProcess) -> dict[str, Any]:
    return nsqd.channel_stats(TOPIC, CHANNEL) or {}


async def in_flight_total(nsqds: list[NsqdProcess]) -> int:
    stats = await asyncio.gather(*(asyncio.to_thread(channel, n) for n in nsqds))
    return sum(s.get("in_flight_count", 0) for s in stats)


async def test_in_flight_never_exceeds_max_in_flight_across_three_nsqd(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqds = [nsqd_factory() for _ in range(3)]
    for n in nsqds:
        n.create_channel(TOPIC, CHANNEL)
        n.mpublish(TOPIC, [f"m{i}" for i in range(15)])
    running = 0
    peak = 0
    done = 0

    async def slow(msg: Message) -> Outcome:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.15)
        running -= 1
        done += 1
        return FINISH

    settings = fast_settings(nsqd_tcp_addresses=[n.tcp_address for n in nsqds])
    consumer = Consumer(TOPIC, CHANNEL, slow, settings, max_in_flight=5)
    await consumer.start()
    samples = []
    while done < 45:
        samples.append(await in_flight_total(nsqds))
        await asyncio.sleep(0.02)
    await consumer.stop()
    assert len(samples) > 10
    assert max(samples) <= 5, samples
    assert max(samples) >= 3  # the window was actually used
    assert peak <= 5
    assert all(n.depth(TOPIC, CHANNEL) == 0 for n in nsqds)


async def test_five_nsqd_with_max_in_flight_one_are_all_drained(nsqd_factory: NsqdFactory) -> None:
    nsqds = [nsqd_factory() for _ in range(5)]
    for n in nsqds:
        n.create_channel(TOPIC, CHANNEL)
        n.mpublish(TOPIC, [f"{n.tcp_port}-{i}" for i in range(10)])
    seen: Counter[str] = Counter()

    def handle(msg: Message) -> Outcome:
        seen[msg.nsqd_address] += 1
        return FINISH

    settings = fast_settings(nsqd_tcp_addresses=[n.tcp_address for n in nsqds])
    consumer = Consumer(TOPIC, CHANNEL, handle, settings, max_in_flight=1)
    started = time.monotonic()
    await consumer.start()
    await wait_until(lambda: sum(seen.values()) == 50, 15.0, f"seen {seen}")
    elapsed = time.monotonic() - started
    await consumer.stop()
    assert all(seen[n.tcp_address] == 10 for n in nsqds), seen
    assert elapsed < 8.0
    assert consumer.stats().finished == 50


async def test_lookupd_discovers_new_nsqd_and_drops_vanished_ones(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    first = nsqd_factory(nsqlookupd)
    first.create_channel(TOPIC, CHANNEL)
    await wait_until(lambda: len(nsqlookupd.lookup(TOPIC)) == 1, message="first registered")
    seen: list[str] = []

    def handle(msg: Message) -> Outcome:
        seen.append(msg.body.decode())
        return FINISH

    settings = fast_settings(lookupd_http_addresses=[nsqlookupd.http_address])
    consumer = Consumer(TOPIC, CHANNEL, handle, settings)
    await consumer.start()
    assert consumer.subscribed
    first.publish(TOPIC, "one")
    await wait_until(lambda: "one" in seen)

    second = nsqd_factory(nsqlookupd)
    second.create_channel(TOPIC, CHANNEL)
    second.publish(TOPIC, "two")
    registered = time.monotonic()
    await wait_until(lambda: "two" in seen, 5.0, "message on the new nsqd")
    # Found within about one poll interval (0.3 s, jitter 10 %), plus connect time.
    assert time.monotonic() - registered < 1.5
    addresses = {c.address for c in consumer.stats().connections}
    assert addresses == {first.tcp_address, second.tcp_address}

    second.stop()  # a clean exit unregisters it from nsqlookupd
    await wait_until(
        lambda: {c.address for c in consumer.stats().connections} == {first.tcp_address},
        5.0,
        "vanished nsqd dropped",
    )
    await consumer.stop()
    assert consumer.stats().received == 2


async def test_consumption_resumes_after_kill_and_restart(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory()
    nsqd.create_channel(TOPIC, CHANNEL)
    seen: list[str] = []

    def handle(msg: Message) -> Outcome:
        seen.append(msg.body.decode())
        return FINISH

    consumer = Consumer(
        TOPIC, CHANNEL, handle, fast_settings(nsqd_tcp_addresses=[nsqd.tcp_address])
    )
    await consumer.start()
    nsqd.publish(TOPIC, "before")
    await wait_until(lambda: seen == ["before"])
    await asyncio.to_thread(nsqd.kill)
    await wait_until(lambda: not consumer.subscribed, 5.0, "connection loss noticed")
    await asyncio.to_thread(nsqd.restart)
    await wait_until(lambda: consumer.subscribed, 5.0, "reconnected")
    nsqd.publish(TOPIC, "after")
    await wait_until(lambda: "after" in seen, 5.0, "consumed after restart")
    await consumer.stop()
    assert consumer.stats().connections[0].connects == 2


async def test_backoff_pauses_then_probes_with_rdy_one(nsqd: NsqdProcess) -> None:
    nsqd.create_channel(TOPIC, CHANNEL)
    nsqd.mpublish(TOPIC, [f"m{i}" for i in range(30)])
    failures = 2
    calls = 0

    async def handle(msg: Message) -> Outcome:
        nonlocal failures, calls
        calls += 1
        if failures > 0:
            failures -= 1
            await asyncio.sleep(0.01)
            return Retry(0.0, backoff=True)
        # Slow enough that the RDY 1 probe stays visible in /stats for a while.
        await asyncio.sleep(0.25)
        return FINISH

    settings = fast_settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], backoff_multiplier=0.4, max_backoff_duration=5.0
    )
    consumer = Consumer(TOPIC, CHANNEL, handle, settings, max_in_flight=10)
    await consumer.start()
    observed: list[int] = []
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline and consumer.stats().finished < 30:
        clients = (await asyncio.to_thread(channel, nsqd)).get("clients") or []
        if clients:
            rdy = clients[0]["ready_count"]
            if not observed or observed[-1] != rdy:
                observed.append(rdy)
        await asyncio.sleep(0.02)
    await consumer.stop()
    assert consumer.stats().finished == 30
    # Full window, paused at 0, one probe at 1, then the full window again.
    assert 0 in observed and 1 in observed, observed
    assert observed.index(0) < observed.index(1)
    assert observed[-1] == 10 or observed[-1] == 0, observed
    assert 10 in observed[observed.index(1) :], observed


async def test_requeue_delay_grows_exponentially_with_attempts(
    nsqd: NsqdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    nsqd.create_channel(TOPIC, CHANNEL)
    nsqd.publish(TOPIC, "retry me")
    deliveries: list[tuple[int, float]] = []
    asked: list[float] = []  # the REQ delays the consumer sent, as it sent them

    def handle(msg: Message) -> Outcome:
        deliveries.append((msg.attempts, time.monotonic()))
        return Retry(None)

    settings = fast_settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], retry_delay=0.2, retry_multiplier=2.0
    )
    consumer = Consumer(TOPIC, CHANNEL, handle, settings, max_attempts=5)
    retry = consumer.subscription.retry

    def recorded(msg: Message, delay: float) -> None:
        asked.append(delay)
        retry(msg, delay)

    monkeypatch.setattr(consumer.subscription, "retry", recorded)
    await consumer.start()
    await wait_until(lambda: len(deliveries) == 5, 15.0, f"deliveries {deliveries}")
    await consumer.stop()
    assert [a for a, _ in deliveries] == [1, 2, 3, 4, 5]
    # The delays asked: 0.2 s x 2^(attempts-1), +-10 % jitter (the fifth is rejected).
    assert len(asked) == 4, asked
    for delay, expected in zip(asked, [0.2, 0.4, 0.8, 1.6], strict=True):
        assert expected * 0.9 - 1e-9 <= delay <= expected * 1.1 + 1e-9, asked
    # nsqd honours each: never early, and late by no more than a loaded machine makes it
    # (a bound on the wall clock, so the run's slack). nsqd only starts scanning a new
    # channel's deferred queue on its 5 s refresh, so the first gap says nothing.
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(deliveries[1:])]
    for gap, delay in zip(gaps, asked[1:], strict=True):
        assert delay - 0.01 <= gap <= delay + window(1.0), (gaps, asked)


async def test_max_attempts_ends_in_give_up_hook_exactly_once(nsqd: NsqdProcess) -> None:
    nsqd.create_channel(TOPIC, CHANNEL)
    nsqd.mpublish(TOPIC, [f"m{i}" for i in range(5)])
    handled: Counter[str] = Counter()
    given_up: Counter[str] = Counter()
    hook_failures = {f"m{i}" for i in range(5)}

    def handle(msg: Message) -> Outcome:
        handled[msg.body.decode()] += 1
        return Retry(0.0)

    async def give_up(msg: Message, reason: str) -> None:
        body = msg.body.decode()
        assert reason == "max attempts exceeded"
        if body in hook_failures:  # the hook fails once per message: requeued, not lost
            hook_failures.discard(body)
            raise RuntimeError("dead-letter store down")
        given_up[body] += 1

    settings = fast_settings(nsqd_tcp_addresses=[nsqd.tcp_address], retry_delay=0.0)
    consumer = Consumer(TOPIC, CHANNEL, handle, settings, max_attempts=2, on_reject=give_up)
    await consumer.start()
    await wait_until(lambda: len(given_up) == 5, 10.0, f"given up {given_up}")
    await holds_async(
        lambda: all(count == 1 for count in given_up.values()), 1.0, f"given up twice {given_up}"
    )
    await consumer.stop()
    assert all(count == 1 for count in given_up.values()), given_up
    assert all(count == 2 for count in handled.values()), handled
    stats = channel(nsqd)
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0
    assert consumer.stats().given_up == 5


async def test_auto_touch_keeps_a_long_handler_alive(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory(extra_args=["--msg-timeout=2s"])
    nsqd.create_channel(TOPIC, CHANNEL)
    nsqd.publish(TOPIC, "long job")
    calls = 0
    touches = 0

    async def handle(msg: Message) -> Outcome:
        nonlocal calls, touches
        calls += 1
        # nsqd scans a new channel for timeouts from its first 5 s refresh on, so run
        # well past that: without TOUCH the message would time out at 2 s.
        await asyncio.sleep(7.5)
        touches = msg.touch_count
        return FINISH

    settings = fast_settings(nsqd_tcp_addresses=[nsqd.tcp_address], msg_timeout=2.0)
    consumer = Consumer(TOPIC, CHANNEL, handle, settings)
    await consumer.start()
    await wait_until(lambda: consumer.stats().finished == 1, 12.0, "long job finished")
    await consumer.stop()
    stats = channel(nsqd)
    assert stats["timeout_count"] == 0
    assert stats["requeue_count"] == 0
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)
    assert calls == 1
    assert touches >= 6  # every msg_timeout / 2


async def test_stop_loses_nothing(nsqd: NsqdProcess) -> None:
    nsqd.create_channel(TOPIC, CHANNEL)
    published = 300
    nsqd.mpublish(TOPIC, [f"m{i}" for i in range(published)])

    async def handle(msg: Message) -> Outcome:
        await asyncio.sleep(0.05 * (int(msg.body[1:]) % 7))
        return FINISH

    settings = fast_settings(nsqd_tcp_addresses=[nsqd.tcp_address])
    consumer = Consumer(TOPIC, CHANNEL, handle, settings, max_in_flight=25)
    await consumer.start()
    await wait_until(lambda: consumer.stats().finished >= 40)
    await consumer.stop(drain_timeout=0.12)
    stats = channel(nsqd)
    processed = consumer.stats().finished
    assert 40 <= processed < published
    assert stats["in_flight_count"] == 0
    assert processed + stats["depth"] + stats["deferred_count"] == published
    assert stats["timeout_count"] == 0


async def test_config_without_any_nsqd_is_refused() -> None:
    with pytest.raises(ValueError, match="NSQWORKER_NSQD_TCP_ADDRESSES"):
        Consumer(TOPIC, CHANNEL, lambda m: FINISH, Settings())
