"""Producer, SyncProducer and the publish command against real nsqd processes."""

from __future__ import annotations

import asyncio
import io
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from rich.console import Console

from nsqworker.cli.publish import publish_command
from nsqworker.errors import (
    InvalidName,
    LocalProtocolError,
    MessageTooLarge,
    NoConnection,
    PublishError,
)
from nsqworker.nsq.connection import Connection
from nsqworker.nsq.producer import Producer
from nsqworker.nsq.protocol import Response, encode_frame
from nsqworker.nsq.sync_producer import SyncProducer
from nsqworker.testing import NsqdFactory, NsqdProcess, free_port, wait_for

pytestmark = pytest.mark.integration

# Every message on disk at once (nothing only in memory), so a SIGKILL loses at most
# what nsqd acknowledged before its next fsync (see test_failover_*).
DURABLE = ["--mem-queue-size=0", "--sync-every=1"]


def message_count(nsqd: NsqdProcess, topic: str) -> int:
    stats = nsqd.topic_stats(topic)
    return 0 if stats is None else int(stats["message_count"])


def wait_count(nsqd: NsqdProcess, topic: str, expected: int) -> None:
    wait_for(
        lambda: message_count(nsqd, topic) == expected,
        timeout=10,
        message=lambda: f"{topic}: {message_count(nsqd, topic)} messages, want {expected}",
    )


async def read_all(nsqd: NsqdProcess, topic: str) -> list[bytes]:
    """Every message held by ``topic`` on ``nsqd``, read through a new channel."""
    stats = nsqd.topic_stats(topic)
    expected = 0 if stats is None else int(stats["depth"])
    bodies: list[bytes] = []
    done = asyncio.Event()
    if not expected:
        return bodies

    def on_message(timestamp: int, attempts: int, message_id: bytes, body: bytes) -> None:
        bodies.append(body)
        conn.fin(message_id)
        if len(bodies) >= expected:
            done.set()

    conn = Connection(nsqd.tcp_address, on_message=on_message)
    await conn.connect()
    await conn.subscribe(topic, "check")
    conn.rdy(2500)
    await asyncio.wait_for(done.wait(), 20)
    await conn.close()
    return bodies


# --- single nsqd ---------------------------------------------------------------------


async def test_publish_round_trip(nsqd: NsqdProcess) -> None:
    async with Producer([nsqd.tcp_address], timeout=2) as producer:
        await producer.publish("clicks", b'{"id": 1}')
        await producer.publish("clicks", "text is utf-8: é")
        await producer.publish_json("clicks", {"id": 2})
    assert message_count(nsqd, "clicks") == 3
    assert sorted(await read_all(nsqd, "clicks")) == sorted(
        [b'{"id": 1}', "text is utf-8: é".encode(), b'{"id":2}']
    )


async def test_publish_without_connect_starts_on_demand(nsqd: NsqdProcess) -> None:
    producer = Producer(nsqd.tcp_address, timeout=2)
    try:
        await producer.publish("clicks", b"x")
    finally:
        await producer.close()
    assert message_count(nsqd, "clicks") == 1


async def test_concurrent_publishes_are_pipelined_on_one_connection(nsqd: NsqdProcess) -> None:
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        await asyncio.gather(*(producer.publish("clicks", b"%d" % i) for i in range(2000)))
    stats = nsqd.stats()
    assert message_count(nsqd, "clicks") == 2000
    assert len(stats.get("producers") or []) <= 1  # nsqd saw one client at most


async def test_dpub_is_deferred(nsqd: NsqdProcess) -> None:
    nsqd.create_channel("later", "c")
    async with Producer([nsqd.tcp_address], timeout=2) as producer:
        await producer.publish("later", b"in a minute", delay=60)
        await producer.publish_json("later", {"a": 1}, delay=30.5)
    wait_for(lambda: (nsqd.channel_stats("later", "c") or {}).get("deferred_count") == 2)
    assert nsqd.depth("later", "c") == 0


async def test_mpub_ten_thousand(nsqd: NsqdProcess) -> None:
    bodies = [b"message %d" % i for i in range(10_000)]
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        await producer.publish_many("bulk", bodies)
    assert message_count(nsqd, "bulk") == 10_000
    assert sorted(await read_all(nsqd, "bulk")) == sorted(bodies)


async def test_mpub_takes_str_and_bytes_like_bodies_and_names_a_bad_one(
    nsqd: NsqdProcess,
) -> None:
    bodies: list[Any] = ["text é", bytearray(b"array"), memoryview(b"view"), b"bytes"]
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        await producer.publish_many("mixed", (b for b in bodies))  # any iterable
        with pytest.raises(TypeError, match="got int"):
            await producer.publish_many("mixed", [b"fine", 42])  # type: ignore[list-item]
    assert sorted(await read_all(nsqd, "mixed")) == sorted(
        [b"text \xc3\xa9", b"array", b"view", b"bytes"]
    )


async def test_mpub_larger_than_max_body_size_is_split(nsqd: NsqdProcess) -> None:
    bodies = [bytes([65 + i]) * 500 * 1024 for i in range(12)]  # 6 MB > 5 MiB
    async with Producer([nsqd.tcp_address], timeout=10) as producer:
        await producer.publish_many("big", bodies)
    assert message_count(nsqd, "big") == 12
    assert sorted(await read_all(nsqd, "big")) == sorted(bodies)


async def test_oversized_body_is_learned_and_the_producer_keeps_working(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqd = nsqd_factory(extra_args=["--max-msg-size=1024"])
    async with Producer([nsqd.tcp_address], timeout=3) as producer:
        unknown = producer.max_message_size
        assert unknown is None
        with pytest.raises(PublishError) as info:
            await producer.publish("t", b"x" * 2000)
        assert info.value.code == "E_BAD_MESSAGE"
        assert "1024" in str(info.value)
        assert producer.max_message_size == 1024
        # nsqd closed the connection after the fatal error; the next publish still works
        await producer.publish("t", b"fits")
        await producer.publish("t", b"y" * 1024)
        with pytest.raises(MessageTooLarge) as too_large:
            await producer.publish("t", b"x" * 2000)
        assert too_large.value.limit == 1024
        with pytest.raises(MessageTooLarge):
            await producer.publish_many("t", [b"ok", b"x" * 1025])
        await producer.publish_many("t", [b"ok", b"ok"])
    assert message_count(nsqd, "t") == 4


async def test_publishes_pipelined_behind_a_fatal_error_are_retried(
    nsqd_factory: NsqdFactory,
) -> None:
    """nsqd closes the connection after the oversized one, and resets it, as our writes
    of the 2,000 behind it are still arriving: the error frame is then often lost with
    the connection. Every other publish still arrives, and only the bad one fails (its
    second attempt goes alone, so its error is read)."""
    nsqd = nsqd_factory(extra_args=["--max-msg-size=1024"])
    total = 2050
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        good = [producer.publish("t", b"%d" % i) for i in range(50)]
        bad = producer.publish("t", b"x" * 2000)
        more = [producer.publish("t", b"%d" % i) for i in range(50, total)]
        results = await asyncio.gather(*good, bad, *more, return_exceptions=True)
    errors = [r for r in results if r is not None]
    assert len(errors) == 1, errors[:3]
    assert isinstance(errors[0], PublishError)
    assert errors[0].code == "E_BAD_MESSAGE"
    assert message_count(nsqd, "t") >= total  # at least once: every good one arrived
    assert set(await read_all(nsqd, "t")) == {b"%d" % i for i in range(total)}


async def test_oversized_mpub_body_is_learned_then_split(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory(extra_args=["--max-body-size=4096", "--max-msg-size=1024"])
    bodies = [bytes([65 + i]) * 1000 for i in range(10)]
    async with Producer([nsqd.tcp_address], timeout=3) as producer:
        with pytest.raises(PublishError) as info:
            await producer.publish_many("t", bodies)
        assert info.value.code == "E_BAD_BODY"
        assert "4096" in str(info.value)
        assert producer.max_body_size == 4096
        await producer.publish_many("t", bodies)  # now split into MPUBs under 4096 bytes
    assert message_count(nsqd, "t") == 10


async def test_local_errors_send_nothing(nsqd: NsqdProcess) -> None:
    async with Producer([nsqd.tcp_address], timeout=2) as producer:
        with pytest.raises(InvalidName):
            await producer.publish("bad topic!", b"x")
        with pytest.raises(TypeError, match="int"):
            await producer.publish("t", 12)  # type: ignore[arg-type]
        with pytest.raises(LocalProtocolError, match="3600"):
            await producer.publish("t", b"x", delay=3601)
        with pytest.raises(LocalProtocolError):
            await producer.publish("t", b"")
        await producer.publish("t", b"still fine")
    assert message_count(nsqd, "t") == 1


async def test_no_connection_within_the_timeout() -> None:
    address = f"127.0.0.1:{free_port()}"
    producer = Producer([address], timeout=0.5)
    started = time.monotonic()
    with pytest.raises(NoConnection) as info:
        await producer.publish("t", b"x")
    elapsed = time.monotonic() - started
    await producer.close()
    assert 0.4 < elapsed < 2.0
    assert address in str(info.value)
    assert "0.5 s" in str(info.value)
    with pytest.raises(NoConnection):
        async with Producer([address], timeout=0.3):
            pass


async def test_an_nsqd_that_never_answers_times_out_within_the_timeout() -> None:
    """Negotiates, then swallows every command: each publish fails with TimeoutError."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)  # magic
        await reader.readline()  # IDENTIFY
        (size,) = struct.unpack(">I", await reader.readexactly(4))
        await reader.readexactly(size)
        writer.write(encode_frame(Response(b"OK")))
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with Producer([address], timeout=0.3) as producer:
            started = time.monotonic()
            with pytest.raises(TimeoutError, match="may or may not have been stored"):
                await producer.publish("t", b"x")
            assert 0.25 < time.monotonic() - started < 1.0
            started = time.monotonic()
            results = await asyncio.gather(
                *(producer.publish("t", b"%d" % i) for i in range(200)), return_exceptions=True
            )
            assert all(isinstance(r, TimeoutError) for r in results)
            assert 0.25 < time.monotonic() - started < 1.0
            with pytest.raises(TimeoutError):
                await producer.publish("t", b"x", timeout=0.1)  # shorter than those before
            with pytest.raises(TimeoutError):
                await producer.publish_many("t", [b"a", b"b"])
            assert producer.connected == [address]  # a timeout does not drop the connection
    finally:
        server.close()


async def test_nsqd_started_late_is_used_once_it_listens(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory()
    address = nsqd.tcp_address
    nsqd.stop()
    producer = Producer([address], timeout=10)
    try:
        publish = asyncio.create_task(producer.publish("t", b"late"))
        await asyncio.sleep(0.5)
        assert not publish.done()
        await asyncio.to_thread(nsqd.restart)
        await publish
    finally:
        await producer.close()
    assert message_count(nsqd, "t") == 1


# --- several nsqd ---------------------------------------------------------------------


async def test_round_robin_over_every_nsqd(nsqd_factory: NsqdFactory) -> None:
    first, second = nsqd_factory(), nsqd_factory()
    async with Producer([first.tcp_address, second.tcp_address], timeout=3) as producer:
        await asyncio.sleep(0.2)  # the second connection may come up just after connect()
        wait_for(lambda: len(producer.connected) == 2)
        for i in range(100):
            await producer.publish("t", b"%d" % i)
    assert message_count(first, "t") + message_count(second, "t") == 100
    assert message_count(first, "t") >= 40
    assert message_count(second, "t") >= 40


@pytest.mark.slow
@pytest.mark.parametrize(("how", "may_lose"), [("kill", 1), ("stop", 0)])
async def test_failover_when_an_nsqd_dies_mid_stream(
    nsqd_factory: NsqdFactory, how: str, may_lose: int
) -> None:
    """Every publish that returned keeps its message; none fails for the caller.

    With SIGKILL, nsqd (even with --mem-queue-size=0 --sync-every=1) answers OK before
    it persists the write position, so its last acknowledged message can be lost: that
    is nsqd's durability, not the producer's, hence ``may_lose`` 1. SIGTERM loses none.
    """
    doomed, survivor = nsqd_factory(extra_args=DURABLE), nsqd_factory(extra_args=DURABLE)
    acked: list[bytes] = []
    after_death: list[bytes] = []
    dead = threading.Event()
    stop = asyncio.Event()

    async def publisher(worker: int, producer: Producer) -> None:
        n = 0
        while not stop.is_set():
            body = b"%d-%d" % (worker, n)
            was_dead = dead.is_set()
            await producer.publish("t", body)  # any exception fails the test
            acked.append(body)
            if was_dead:
                after_death.append(body)
            n += 1

    producer = Producer([doomed.tcp_address, survivor.tcp_address], timeout=5)
    await producer.connect()
    await asyncio.to_thread(wait_for, lambda: len(producer.connected) == 2)
    workers = [asyncio.create_task(publisher(w, producer)) for w in range(20)]
    await _until(lambda: len(acked) >= 200, workers)
    await asyncio.to_thread(doomed.kill if how == "kill" else doomed.stop)
    dead.set()
    await _until(lambda: len(after_death) >= 200, workers)
    stop.set()
    await asyncio.gather(*workers)
    await producer.close()

    await asyncio.to_thread(doomed.restart)
    on_survivor = await read_all(survivor, "t")
    on_doomed = await read_all(doomed, "t")
    assert set(after_death) <= set(on_survivor)
    missing = set(acked) - set(on_survivor) - set(on_doomed)
    assert len(missing) <= may_lose, sorted(missing)[:10]
    assert len(on_doomed) >= 20  # it took its share before dying


async def _until(predicate: Callable[[], bool], tasks: list[asyncio.Task[None]]) -> None:
    """Wait (at most 20 s) for ``predicate``; fail at once if a task failed."""
    deadline = time.monotonic() + 20
    while not predicate():
        for task in tasks:
            if task.done():
                task.result()
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


# --- SyncProducer ------------------------------------------------------------------


def test_sync_producer_from_many_threads(nsqd: NsqdProcess) -> None:
    errors: list[BaseException] = []

    with SyncProducer([nsqd.tcp_address], timeout=5) as producer:

        def work(worker: int) -> None:
            try:
                for i in range(200):
                    producer.publish("sync", b"%d-%d" % (worker, i))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        producer.publish_many("sync", [b"a", b"b"])
        producer.publish_json("sync", {"done": True})
    assert errors == []
    assert message_count(nsqd, "sync") == 8 * 200 + 3
    assert not producer.loop_thread.thread.is_alive()
    producer.close()  # idempotent


def test_sync_producer_errors_and_closed_state(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory(extra_args=["--max-msg-size=1024"])
    producer = SyncProducer(nsqd.tcp_address, timeout=2)
    try:
        producer.connect()
        with pytest.raises(PublishError):
            producer.publish("t", b"x" * 2000)
        with pytest.raises(MessageTooLarge):
            producer.publish("t", b"x" * 2000)
        producer.publish("t", b"ok", delay=1)
    finally:
        producer.close()
    with pytest.raises(ConnectionError):
        producer.publish("t", b"closed")


def test_sync_producer_unreachable() -> None:
    producer = SyncProducer(f"127.0.0.1:{free_port()}", timeout=0.3)
    with producer, pytest.raises(NoConnection):
        producer.publish("t", b"x")


# --- publish command ---------------------------------------------------------------


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, force_terminal=False), out


def test_publish_command_stdin_lines(nsqd: NsqdProcess) -> None:
    console, out = _console()
    lines = "".join(f"line {i}\n" if i % 100 else f"line {i}\n\n" for i in range(1000))
    code = publish_command(
        "clicks",
        None,
        nsqd=[nsqd.tcp_address],
        delay=None,
        stdin=io.StringIO(lines),
        console=console,
    )
    assert code == 0, out.getvalue()
    assert message_count(nsqd, "clicks") == 1000
    summary = out.getvalue().strip()
    assert summary.startswith("published 1,000 messages to clicks in ")
    assert "msg/s" in summary
    assert "\n" not in summary


def test_publish_command_one_body_and_delay(nsqd: NsqdProcess) -> None:
    nsqd.create_channel("clicks", "c")
    console, out = _console()
    assert (
        publish_command("clicks", '{"id": 1}', nsqd=[nsqd.tcp_address], delay=None, console=console)
        == 0
    )
    assert "published 1 message to clicks" in out.getvalue()
    stdin = io.StringIO("a\nb\nc\n")
    assert (
        publish_command(
            "clicks", "-", nsqd=[nsqd.tcp_address], delay=30, stdin=stdin, console=console
        )
        == 0
    )
    wait_for(lambda: (nsqd.channel_stats("clicks", "c") or {}).get("deferred_count") == 3)
    assert nsqd.depth("clicks", "c") == 1


def test_publish_command_errors() -> None:
    console, out = _console()
    nowhere = f"127.0.0.1:{free_port()}"
    assert publish_command("bad topic", "x", nsqd=[nowhere], delay=None, console=console) == 2
    assert publish_command("t", "x", nsqd=[nowhere], delay=-1, console=console) == 2
    code = publish_command("t", "x", nsqd=[nowhere], delay=None, console=console, timeout=0.3)
    assert code == 1
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 3
    assert all(line.startswith("error") for line in lines)
    assert nowhere in lines[2]
