"""Broken nsqd and broken networks, each against a real nsqd (or a real misbehaving
socket): what the worker notices, how fast, and that no message is lost."""

from __future__ import annotations

import asyncio
import time

import pytest

from nsqworker.message import Message
from nsqworker.testing import NsqdFactory
from nsqworker.testing.faults import MagicCloser, SilentServer, TcpProxy
from nsqworker.testing.holds import holds_async
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration


@pytest.mark.slow
async def test_nsqd_kill_9_mid_stream_loses_nothing(nsqd_factory: NsqdFactory, kit) -> None:
    # --mem-queue-size=0: every message goes through nsqd's disk queue, which records how
    # far it was read only when it syncs. A clean restart after publishing syncs once;
    # --sync-every and --sync-timeout keep it from syncing again before the kill -9.
    # The restarted nsqd on the same data path therefore delivers again every message,
    # those finished and those in flight (nsqd keeps in-flight state in memory only).
    # What this proves is the worker's side: it survives the crash, reconnects, and
    # handles every message at least once. With nsqd's defaults a kill -9 can lose what
    # was read from disk since the last sync, in flight or not: nsqd's durability.
    nsqd = nsqd_factory(
        extra_args=["--mem-queue-size=0", "--sync-every=1000000", "--sync-timeout=1h"]
    )
    nsqd.create_channel(kit.TOPIC, kit.CHANNEL)
    bodies = [f"m{i}" for i in range(300)]
    nsqd.mpublish(kit.TOPIC, bodies)
    nsqd.restart()
    assert nsqd.depth(kit.TOPIC, kit.CHANNEL) == 300
    seen = kit.Seen()

    async def slow(msg: Message) -> None:
        await asyncio.sleep(0.005)

    settings = kit.fast(nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=20)
    async with Worker(kit.registry(seen, slow), settings) as worker:
        await kit.until(lambda: sum(seen.bodies.values()) >= 60, 10, "no progress")
        nsqd.kill()
        nsqd.restart()
        await kit.until(
            lambda: not seen.missing(bodies),
            30,
            lambda: f"lost after kill -9: {seen.missing(bodies)[:5]} {worker.stats().tasks}",
        )
        # Both read at once: handlers still running finish during the drain below.
        stats, handled = worker.stats().tasks["record"], len(seen.attempts)
    # Every handler run is timed in the step it ends in, and counted as a delivery: as
    # finished, or still in flight until the dispatcher's done-callback runs.
    assert handled == stats.duration.count, (stats, handled)
    assert stats.finished <= handled <= stats.finished + stats.in_flight, (stats, handled)
    assert stats.received == stats.finished + stats.in_flight  # none failed, none requeued
    assert stats.connection_errors.get("closed", 0) >= 1, stats.connection_errors
    assert sum(n - 1 for n in seen.bodies.values()) >= 60  # the replay: at least once


async def test_an_nsqd_that_never_answers_identify_times_out(
    nsqd_factory: NsqdFactory, kit
) -> None:
    nsqd = nsqd_factory()
    with SilentServer() as silent:
        seen = kit.Seen()
        settings = kit.fast(nsqd_tcp_addresses=[silent.address, nsqd.tcp_address])
        started = time.monotonic()
        async with Worker(kit.registry(seen), settings) as worker:
            assert time.monotonic() - started < settings.dial_timeout + 1.5
            nsqd.publish(kit.TOPIC, b"through the good one")
            await kit.until(lambda: seen.bodies["through the good one"], 5, "not consumed")
            await kit.until(
                lambda: worker.stats().tasks["record"].connection_errors.get("timeout"),
                5,
                "no IDENTIFY timeout counted",
            )
            assert worker.ready  # the good nsqd is subscribed


async def test_an_nsqd_that_closes_after_the_magic(nsqd_factory: NsqdFactory, kit) -> None:
    nsqd = nsqd_factory()
    with MagicCloser() as closer:
        seen = kit.Seen()
        settings = kit.fast(nsqd_tcp_addresses=[closer.address, nsqd.tcp_address])
        async with Worker(kit.registry(seen), settings) as worker:
            nsqd.publish(kit.TOPIC, b"x")
            await kit.until(lambda: seen.bodies["x"], 5, "not consumed")
            await kit.until(lambda: closer.accepted >= 2, 5, "no reconnect attempts")
            errors = worker.stats().tasks["record"].connection_errors
    assert errors.get("closed", 0) >= 1, errors


@pytest.mark.slow
async def test_a_partition_is_noticed_by_missed_heartbeats_and_healed(
    nsqd_factory: NsqdFactory, kit, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = nsqd_factory()
    with TcpProxy(nsqd.tcp_address) as proxy:
        seen = kit.Seen()
        settings = kit.fast(nsqd_tcp_addresses=[proxy.address], heartbeat_interval=1.0)
        async with Worker(kit.registry(seen), settings) as worker:
            nsqd.publish(kit.TOPIC, b"before")
            await kit.until(lambda: seen.bodies["before"], 5, "not consumed before")
            proxy.pause()
            paused_at = time.monotonic()
            await kit.until(lambda: not worker.ready, 4, "the partition went unnoticed")
            noticed = time.monotonic() - paused_at
            assert noticed <= 2 * settings.heartbeat_interval + 0.6, noticed
            errors = worker.stats().tasks["record"].connection_errors
            assert errors.get("heartbeat") == 1, errors
            nsqd.publish(kit.TOPIC, b"during")
            await holds_async(lambda: not seen.bodies["during"], 1.0, "consumed while cut off")
            proxy.resume()
            await kit.until(lambda: seen.bodies["during"], 10, "not reconnected after healing")
            assert worker.ready
    assert any("no data or heartbeat" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_a_handler_blocking_the_loop_5s_loses_nothing_and_is_named(
    nsqd_factory: NsqdFactory, kit, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = nsqd_factory()
    seen = kit.Seen()

    def block(msg: Message) -> None:
        if msg.attempts == 1 and msg.body == b"blocker":
            time.sleep(5)  # on the loop: what an async handler must never do

    settings = kit.fast(
        nsqd_tcp_addresses=[nsqd.tcp_address],
        heartbeat_interval=1.0,
        watchdog_timeout=1.0,
        msg_timeout=2.0,  # so that nsqd gives back soon what it had sent on the dead connection
    )
    async with Worker(kit.registry(seen, block), settings) as worker:
        nsqd.publish(kit.TOPIC, b"blocker")
        assert worker.watchdog is not None
        await kit.until(lambda: worker.watchdog.blocks, 8, "the watchdog saw nothing")  # type: ignore[union-attr]
        await kit.until(lambda: seen.bodies["blocker"], 15, "the blocked message was lost")
        nsqd.publish(kit.TOPIC, b"after")
        await kit.until(lambda: seen.bodies["after"], 10, "not consuming after the block")
        # the watchdog's thread looks every quarter second: live again at its next look
        await kit.until(lambda: worker.live, 2, "still reported blocked after the loop turned")
        culprit = worker.watchdog.culprit
        # nsqd closes the connection after 2 missed heartbeats, so the FIN sent when the
        # handler returns goes nowhere; nsqd delivers the message again (msg_timeout 2 s)
        # on the new connection, and this time it is FINed. Nothing left, nothing lost:
        channel = lambda: nsqd.channel_stats(kit.TOPIC, kit.CHANNEL) or {}  # noqa: E731
        await kit.until(
            lambda: sum(channel().get(k, 1) for k in ("depth", "in_flight_count")) == 0,
            15,
            lambda: f"still held by nsqd: {channel()}",
        )
        assert seen.bodies["blocker"] >= 1
        # Lost either way once the loop runs again: uvloop runs the overdue liveness
        # timer ("heartbeat") before it reads nsqd's close ("closed"); asyncio reads first.
        errors = worker.stats().tasks["record"].connection_errors
        assert errors.get("closed", 0) + errors.get("heartbeat", 0) >= 1, errors
    assert culprit.startswith("task record ("), culprit  # the watchdog names the handler


async def test_a_fin_after_nsqd_timed_the_message_out_is_counted_not_fatal(
    nsqd_factory: NsqdFactory, kit, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = nsqd_factory(extra_args=["--msg-timeout=1s"])
    nsqd.create_channel(kit.TOPIC, kit.CHANNEL)
    nsqd.restart()  # nsqd scans new channels for timeouts only every few seconds
    seen = kit.Seen()

    def block(msg: Message) -> None:
        if msg.attempts == 1 and msg.body == b"late":
            time.sleep(2.5)  # the loop cannot TOUCH: nsqd times the message out

    settings = kit.fast(nsqd_tcp_addresses=[nsqd.tcp_address], watchdog_timeout=0)
    async with Worker(kit.registry(seen, block), settings) as worker:
        nsqd.publish(kit.TOPIC, b"late")
        await kit.until(lambda: seen.bodies["late"] >= 2, 15, "not redelivered after timeout")
        await kit.until(
            lambda: worker.stats().tasks["record"].connection_errors.get("fin_failed"),
            5,
            "E_FIN_FAILED not counted",
        )
        nsqd.publish(kit.TOPIC, b"next")
        await kit.until(lambda: seen.bodies["next"], 5, "the connection did not survive")
        assert worker.stats().tasks["record"].connections == 1
    assert any("E_FIN_FAILED" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("what", ["topic", "channel"])
async def test_topic_or_channel_deleted_while_consuming(
    nsqd_factory: NsqdFactory, kit, what: str
) -> None:
    nsqd = nsqd_factory()
    seen = kit.Seen()
    settings = kit.fast(nsqd_tcp_addresses=[nsqd.tcp_address])
    async with Worker(kit.registry(seen), settings) as worker:
        nsqd.publish(kit.TOPIC, b"before")
        await kit.until(lambda: seen.bodies["before"], 5, "not consumed")
        params = {"topic": kit.TOPIC} | ({"channel": kit.CHANNEL} if what == "channel" else {})
        nsqd.request("POST", f"/{what}/delete", params=params)
        # nsqd closes our connection; the worker subscribes again, which recreates both.
        await kit.until(lambda: nsqd.channel_stats(kit.TOPIC, kit.CHANNEL), 10, "no resubscribe")
        await kit.until(lambda: worker.ready, 5, "not ready after resubscribing")
        nsqd.publish(kit.TOPIC, b"after")
        await kit.until(lambda: seen.bodies["after"], 10, f"not consuming after {what} delete")


async def test_channel_paused_and_unpaused(nsqd_factory: NsqdFactory, kit) -> None:
    nsqd = nsqd_factory()
    seen = kit.Seen()
    settings = kit.fast(nsqd_tcp_addresses=[nsqd.tcp_address])
    async with Worker(kit.registry(seen), settings) as worker:
        nsqd.publish(kit.TOPIC, b"before")
        await kit.until(lambda: seen.bodies["before"], 5, "not consumed")
        channel = {"topic": kit.TOPIC, "channel": kit.CHANNEL}
        nsqd.request("POST", "/channel/pause", params=channel)
        nsqd.publish(kit.TOPIC, b"while paused")
        await holds_async(lambda: not seen.bodies["while paused"], 1.5, "consumed while paused")
        assert worker.ready  # paused by the operator is not a fault of ours
        nsqd.request("POST", "/channel/unpause", params=channel)
        await kit.until(lambda: seen.bodies["while paused"], 5, "not consumed after unpause")
