"""Publishes made while others are in flight go to a real nsqd as one MPUB per loop
turn (nsqworker.nsq.coalescing), and each call keeps its own outcome: order, refusals,
cancellation, mixed topics and timeouts, and a lone publish still sent at once."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from nsqworker.errors import LocalProtocolError, MessageTooLarge, PublishError
from nsqworker.nsq.connection import Connection
from nsqworker.nsq.producer import Producer
from nsqworker.testing import NsqdFactory, NsqdProcess, wait_until

from .test_producer import message_count, read_all

pytestmark = pytest.mark.integration


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[bytes, int]]]:
    """Every publish command sent, as (verb and topic, number of messages)."""
    sent: list[tuple[bytes, int]] = []
    submit = Connection.submit

    def recording(self: Connection, command: bytes, timeout: float | None = None) -> Any:
        head, _, rest = command.partition(b"\n")
        if head.startswith(b"MPUB "):
            sent.append((head, struct.unpack(">I", rest[4:8])[0]))
        elif head.startswith((b"PUB ", b"DPUB ")):
            sent.append((head, 1))
        return submit(self, command, timeout)

    monkeypatch.setattr(Connection, "submit", recording)
    yield sent


async def test_a_thousand_gathered_publishes_are_one_pub_and_one_mpub_in_order(
    nsqd: NsqdProcess, commands: list[tuple[bytes, int]]
) -> None:
    bodies = [b"%04d" % i for i in range(1000)]
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        await asyncio.gather(*(producer.publish("order", b) for b in bodies))
    # the first call found nothing in flight and went at once; the rest waited one turn
    assert commands == [(b"PUB order", 1), (b"MPUB order", 999)]
    assert await read_all(nsqd, "order") == bodies


async def test_publishing_one_at_a_time_sends_a_pub_each_at_once(
    nsqd: NsqdProcess, commands: list[tuple[bytes, int]]
) -> None:
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        for i in range(20):
            await producer.publish("lone", b"%d" % i)
    assert commands == [(b"PUB lone", 1)] * 20
    assert message_count(nsqd, "lone") == 20


async def test_topics_timeouts_dpub_and_mpub_of_one_turn_keep_each_topics_order(
    nsqd: NsqdProcess, commands: list[tuple[bytes, int]]
) -> None:
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        await producer.connect()
        calls = [producer.publish("a", b"a0"), producer.publish("b", b"b0")]
        calls += [producer.publish("a", b"a%d" % i) for i in range(1, 4)]
        calls += [producer.publish("b", b"b%d" % i, timeout=9) for i in range(1, 4)]
        calls.append(producer.publish_many("a", [b"a4", b"a5"]))  # a1-a3 go first
        calls += [producer.publish("a", b"a%d" % i) for i in range(6, 9)]
        calls.append(producer.publish("b", b"b4", delay=0))  # b1-b3 go first
        await asyncio.gather(*calls)
    assert await read_all(nsqd, "a") == [b"a%d" % i for i in range(9)]
    assert await read_all(nsqd, "b") == [b"b%d" % i for i in range(5)]
    assert commands == [
        (b"PUB a", 1),  # nothing in flight: sent at once
        (b"MPUB a", 3),  # a1-a3, sent before publish_many's
        (b"MPUB a", 2),
        (b"PUB b", 1),  # b0 and b1-b3 (another timeout) sent before the DPUB
        (b"MPUB b", 3),
        (b"DPUB b 0", 1),
        (b"MPUB a", 3),  # a6-a8, sent when the turn ended
    ]


async def test_a_refused_message_fails_alone_with_nsqds_error(
    nsqd_factory: NsqdFactory, commands: list[tuple[bytes, int]]
) -> None:
    nsqd = nsqd_factory(extra_args=["--max-msg-size=1024"])
    bodies = [b"x" * 2000 if i == 37 else b"%d" % i for i in range(100)]
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        await producer.connect()
        results = await asyncio.gather(
            *(producer.publish("t", b) for b in bodies), return_exceptions=True
        )
        errors = {i: r for i, r in enumerate(results) if r is not None}
        assert list(errors) == [37]
        assert isinstance(errors[37], PublishError) and errors[37].code == "E_BAD_MESSAGE"
        assert "--max-msg-size is 1024" in str(errors[37])  # learned: checked from now on
        with pytest.raises(MessageTooLarge):
            await producer.publish("t", b"x" * 2000)
    assert (b"MPUB t", 99) in commands  # refused whole, then each sent alone
    assert sorted(await read_all(nsqd, "t")) == sorted(b for b in bodies if len(b) < 2000)


async def test_calls_cancelled_before_the_turn_ends_are_not_sent(
    nsqd: NsqdProcess, commands: list[tuple[bytes, int]]
) -> None:
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        await producer.connect()
        tasks = [asyncio.ensure_future(producer.publish("c", b"%d" % i)) for i in range(10)]
        await asyncio.sleep(0)  # every call started: 0 sent at once, 1-9 batched
        for task in tasks[5:]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[:5] == [None] * 5
    assert all(isinstance(r, asyncio.CancelledError) for r in results[5:])
    assert commands == [(b"PUB c", 1), (b"MPUB c", 4)]
    assert await read_all(nsqd, "c") == [b"%d" % i for i in range(5)]


async def test_bad_calls_in_a_gather_raise_their_own_error_and_send_nothing(
    nsqd: NsqdProcess,
) -> None:
    async with Producer([nsqd.tcp_address], timeout=5) as producer:
        await producer.connect()
        results = await asyncio.gather(
            producer.publish("t", b"ok0"),
            producer.publish("t", b""),
            producer.publish("t", b"ok1"),
            producer.publish("t", object()),
            producer.publish("t", b"ok2"),
            return_exceptions=True,
        )
    assert results[0] is None and results[2] is None and results[4] is None
    assert isinstance(results[1], LocalProtocolError) and "empty" in str(results[1])
    assert isinstance(results[3], TypeError)
    assert await read_all(nsqd, "t") == [b"ok0", b"ok1", b"ok2"]


async def test_batches_whose_connection_is_lost_are_sent_again_losing_nothing(
    nsqd_factory: NsqdFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waves of 500 gathered publishes to two nsqd. At wave 5 the connection of a batch
    is cut as it is sent (the producer's side aborts the socket, as a network cut
    would: nsqd may or may not have stored it); at wave 12 one nsqd is stopped
    (SIGTERM: it keeps what it acknowledged). No publish fails, and every acknowledged
    message is on one of them."""
    doomed = nsqd_factory(extra_args=["--mem-queue-size=0"])
    survivor = nsqd_factory(extra_args=["--mem-queue-size=0"])
    acked: list[bytes] = []
    cut: list[Connection] = []
    submit = Connection.submit

    def recording(self: Connection, command: bytes, timeout: float | None = None) -> Any:
        answer = submit(self, command, timeout)
        if cut == [] and wave == 5 and command.startswith(b"MPUB "):
            cut.append(self)
            self.abort()  # before its answer can be read; written or not, nsqd decides
        return answer

    monkeypatch.setattr(Connection, "submit", recording)
    wave = 0
    async with Producer([doomed.tcp_address, survivor.tcp_address], timeout=10) as producer:
        await producer.connect()
        await wait_until(lambda: len(producer.connected) == 2, timeout=5, message="both up")
        for wave in range(30):
            bodies = [b"%02d-%03d" % (wave, i) for i in range(500)]
            calls: list[Any] = [producer.publish("t", b) for b in bodies]
            if wave == 12:
                calls.append(asyncio.to_thread(doomed.stop))
            await asyncio.gather(*calls)
            acked += bodies
    await asyncio.to_thread(doomed.restart)
    on_doomed = await read_all(doomed, "t")
    stored = set(await read_all(survivor, "t")) | set(on_doomed)
    assert cut, "no batch was cut"
    assert len(acked) == 15_000 and set(acked) <= stored
    assert len(on_doomed) >= 1000  # it took its share before it stopped


async def test_a_batch_larger_than_max_body_size_goes_as_several_mpubs_in_order(
    nsqd_factory: NsqdFactory, commands: list[tuple[bytes, int]]
) -> None:
    nsqd = nsqd_factory(extra_args=["--max-body-size=4096"])
    bodies = [b"%03d" % i + b"x" * 97 for i in range(100)]  # 104 bytes each in an MPUB
    async with Producer([nsqd.tcp_address], timeout=5, max_body_size=4096) as producer:
        await asyncio.gather(*(producer.publish("split", b) for b in bodies))
    assert commands == [(b"PUB split", 1), (b"MPUB split", 39), (b"MPUB split", 39),
                        (b"MPUB split", 21)]  # fmt: skip
    assert await read_all(nsqd, "split") == bodies
