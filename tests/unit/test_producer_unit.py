"""Producer without nsqd: pure helpers, and failover logic over fake connections."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

import nsqworker.nsq.pool as pool_module
import nsqworker.nsq.producer as producer_module
from nsqworker.errors import (
    ConfigurationError,
    ConnectionClosed,
    InvalidName,
    LocalProtocolError,
    MessageTooLarge,
    NoConnection,
    NSQDError,
    PublishError,
)
from nsqworker.nsq import protocol
from nsqworker.nsq.producer import Producer
from nsqworker.nsq.publishing import (
    PublishCall,
    delay_to_ms,
    parse_size_limit,
    split_batches,
    to_bytes,
)
from nsqworker.nsq.sync_producer import SyncProducer

# --- pure helpers ------------------------------------------------------------------


def test_to_bytes() -> None:
    assert to_bytes(b"a") == b"a"
    assert to_bytes("é") == "é".encode()
    assert to_bytes(bytearray(b"ab")) == b"ab"
    assert to_bytes(memoryview(b"ab")) == b"ab"
    for bad in (12, 1.5, None, {"a": 1}, [b"a"]):
        with pytest.raises(TypeError, match=type(bad).__name__):
            to_bytes(bad)


def test_delay_to_ms() -> None:
    assert delay_to_ms(0) == 0
    assert delay_to_ms(1.5) == 1500
    assert delay_to_ms(0.0004) == 0
    assert delay_to_ms(3600) == 3_600_000
    for bad in (-0.001, 3600.001, float("nan"), float("inf"), True, "5"):
        with pytest.raises(LocalProtocolError):
            delay_to_ms(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PUB message too big 1048577 > 1048576", ("message", 1048576)),
        ("DPUB message too big 2000 > 1024", ("message", 1024)),
        ("MPUB message too big 2000 > 1024", ("message", 1024)),
        ("MPUB body too big 5242881 > 5242880", ("body", 5242880)),
        ("MPUB invalid message count 0", None),
        ('PUB topic name "x y" is not valid', None),
        ("", None),
    ],
)
def test_parse_size_limit(text: str, expected: tuple[str, int] | None) -> None:
    assert parse_size_limit(text) == expected


def test_split_examples() -> None:
    mib5 = protocol.DEFAULT_MAX_BODY_SIZE
    bodies = [b"x" * 500 * 1024] * 12
    assert [len(b) for b in split_batches(bodies, mib5)] == [10, 2]
    assert split_batches([], mib5) == []
    assert split_batches([b"a", b"b"], mib5) == [[b"a", b"b"]]
    # exactly the limit fits: 4 + (4 + 2) * 2 == 16
    assert split_batches([b"ab", b"cd"], 16) == [[b"ab", b"cd"]]
    assert split_batches([b"ab", b"cd"], 15) == [[b"ab"], [b"cd"]]
    # a body too big on its own gets its own batch
    assert split_batches([b"a", b"x" * 100, b"b"], 20) == [[b"a"], [b"x" * 100], [b"b"]]


@given(
    st.lists(st.binary(min_size=1, max_size=64), max_size=60),
    st.integers(min_value=9, max_value=400),
)
def test_split_properties(bodies: list[bytes], limit: int) -> None:
    batches = split_batches(bodies, limit)
    assert [b for batch in batches for b in batch] == bodies  # order kept, nothing lost
    for batch in batches:
        assert batch
        size = protocol.mpub_size(batch)
        assert size <= limit or len(batch) == 1
        assert len(batch) <= (max(limit, size) - 4) // 5  # nsqd's count limit
    for previous, following in itertools.pairwise(batches):
        assert protocol.mpub_size([*previous, following[0]]) > limit  # greedy


# --- fake nsqd ----------------------------------------------------------------------


class FakeNsqd:
    """What a fake connection talks to: up or down, and a script of answers."""

    def __init__(self) -> None:
        self.up = True
        self.received: list[bytes] = []
        self.script: list[str | NSQDError] = []  # "ok", "drop" or an error, per request
        self.gate: asyncio.Event | None = None  # when set up, answers wait for it
        self.connections: list[FakeConnection] = []
        self.dials = 0


SERVERS: dict[str, FakeNsqd] = {}


class FakeConnection:
    def __init__(self, address: str, config: Any = None, *, on_close: Any = None) -> None:
        self.address = address
        self.nsqd = SERVERS[address]
        self.on_close = on_close
        self.connected = False
        self.closed = False
        self.write_paused = False
        self.done = asyncio.Event()

    async def connect(self) -> None:
        self.nsqd.dials += 1
        if not self.nsqd.up:
            raise ConnectionClosed(f"cannot connect to nsqd at {self.address}: refused")
        self.connected = True
        self.nsqd.connections.append(self)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionClosed("closed")
        self.write_paused = False

    def submit(self, command: bytes, timeout: float | None = None) -> asyncio.Future[bytes]:
        if not self.connected:
            raise ConnectionClosed(f"connection to nsqd at {self.address} is closed")
        return asyncio.ensure_future(self._answer(command))

    async def _answer(self, command: bytes) -> bytes:
        await asyncio.sleep(0)
        if self.nsqd.gate is not None:
            await self.nsqd.gate.wait()
        step = self.nsqd.script.pop(0) if self.nsqd.script else None
        if step == "drop":
            self.lose()
            raise ConnectionClosed(f"connection to nsqd at {self.address} lost")
        if isinstance(step, NSQDError):
            asyncio.get_running_loop().call_soon(self.lose)  # nsqd closes after it
            raise PublishError(step.code, step.message)
        self.nsqd.received.append(command)
        return b"OK"

    def lose(self) -> None:
        if self.closed:
            return
        self.connected, self.closed = False, True
        if self in self.nsqd.connections:
            self.nsqd.connections.remove(self)
        if self.on_close is not None:
            self.on_close(self, ConnectionClosed("lost"))
        self.done.set()

    def abort(self) -> None:
        self.lose()

    async def close(self, timeout: float = 5.0) -> None:
        self.lose()

    async def wait_closed(self) -> None:
        await self.done.wait()


@pytest.fixture
def nsqds(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, FakeNsqd]]:
    monkeypatch.setattr(pool_module, "Connection", FakeConnection)
    SERVERS.clear()
    SERVERS.update({"a:1": FakeNsqd(), "b:2": FakeNsqd()})
    yield SERVERS
    SERVERS.clear()


def pubs(nsqd: FakeNsqd) -> list[bytes]:
    return [c.rsplit(b"\n", 1)[1][4:] for c in nsqd.received if c.startswith(b"PUB ")]


async def up(producer: Producer, count: int) -> None:
    for _ in range(100):
        if len(producer.connected) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(producer.connected)


# --- failover ------------------------------------------------------------------------


async def test_round_robin(nsqds: dict[str, FakeNsqd]) -> None:
    async with Producer(["a:1", "b:2"], timeout=1) as producer:
        await up(producer, 2)
        for i in range(10):
            await producer.publish("t", b"%d" % i)
    assert len(pubs(nsqds["a:1"])) == 5
    assert len(pubs(nsqds["b:2"])) == 5


async def test_connection_lost_is_retried_elsewhere_twice(nsqds: dict[str, FakeNsqd]) -> None:
    a, b = nsqds["a:1"], nsqds["b:2"]
    async with Producer(["a:1", "b:2"], timeout=1) as producer:
        await up(producer, 2)
        a.script = ["drop"]
        await producer.publish("t", b"x")  # one of these two goes to a: dropped, retried on b
        await producer.publish("t", b"x")
        assert pubs(a) + pubs(b) == [b"x", b"x"]
        assert pubs(b) == [b"x", b"x"]
        await up(producer, 2)
        a.script, b.script = ["drop"], ["drop"]
        await producer.publish("t", b"y")  # dropped twice: the third attempt, alone, stores it
        assert pubs(a) + pubs(b) == [b"x", b"x", b"y"]
        await up(producer, 2)
        a.script, b.script = ["drop", "drop"], ["drop", "drop"]
        with pytest.raises(ConnectionClosed):
            await producer.publish("t", b"w")  # dropped three times: raised
        assert len(a.script) + len(b.script) == 1  # three attempts, no fourth
        a.script, b.script = [], []
        await up(producer, 2)
        await producer.publish("t", b"z")  # and the producer still works


async def test_single_nsqd_retry_waits_for_the_redial(nsqds: dict[str, FakeNsqd]) -> None:
    a = nsqds["a:1"]
    async with Producer("a:1", timeout=2) as producer:
        a.script = ["drop"]
        await producer.publish("t", b"x")
    assert pubs(a) == [b"x"]
    assert a.dials == 2


async def test_refusal_is_not_retried_and_does_not_break_the_producer(
    nsqds: dict[str, FakeNsqd],
) -> None:
    a, b = nsqds["a:1"], nsqds["b:2"]
    async with Producer(["a:1", "b:2"], timeout=1) as producer:
        await up(producer, 2)
        a.script = [NSQDError("E_BAD_TOPIC", "PUB topic name is not valid")]
        b.script = [NSQDError("E_BAD_TOPIC", "PUB topic name is not valid")]
        with pytest.raises(PublishError) as info:
            await producer.publish("t", b"x")
        assert info.value.code == "E_BAD_TOPIC"
        assert len(a.script) + len(b.script) == 1  # only one nsqd was asked
        a.script, b.script = [], []
        for _ in range(4):
            await producer.publish("t", b"next")
    assert len(pubs(a) + pubs(b)) == 4


async def test_storage_failure_is_retried_elsewhere(nsqds: dict[str, FakeNsqd]) -> None:
    a, b = nsqds["a:1"], nsqds["b:2"]
    async with Producer(["a:1", "b:2"], timeout=1) as producer:
        await up(producer, 2)
        a.script = [NSQDError("E_PUB_FAILED", "PUB failed exiting")]
        await producer.publish("t", b"x")
        await producer.publish("t", b"x")
        assert pubs(b) == [b"x", b"x"]
        b.script = [NSQDError("E_PUB_FAILED", "PUB failed exiting")] * 2
        a.script = [NSQDError("E_PUB_FAILED", "PUB failed exiting")] * 2
        await up(producer, 2)
        with pytest.raises(PublishError, match="E_PUB_FAILED"):
            await producer.publish("t", b"y")  # retried once only


async def test_size_limit_is_learned(nsqds: dict[str, FakeNsqd]) -> None:
    a = nsqds["a:1"]
    async with Producer("a:1", timeout=1) as producer:
        a.script = [NSQDError("E_BAD_MESSAGE", "PUB message too big 2000 > 1024")]
        with pytest.raises(PublishError, match="1024") as info:
            await producer.publish("t", b"x" * 2000)
        assert info.value.code == "E_BAD_MESSAGE"
        assert producer.max_message_size == 1024
        with pytest.raises(MessageTooLarge):
            await producer.publish("t", b"x" * 2000, delay=1)
        a.script = [NSQDError("E_BAD_BODY", "MPUB body too big 10048 > 4096")]
        with pytest.raises(PublishError, match="4096"):
            await producer.publish_many("t", [b"x" * 1000] * 10)
        assert producer.max_body_size == 4096
        sent = len(a.received)
        await producer.publish_many("t", [b"x" * 1000] * 10)
        assert len(a.received) - sent == 3  # 4 + 4 * 1004 <= 4096


async def test_given_limits_are_checked_before_sending(nsqds: dict[str, FakeNsqd]) -> None:
    async with Producer("a:1", timeout=1, max_message_size=10, max_body_size=30) as producer:
        with pytest.raises(MessageTooLarge):
            await producer.publish("t", b"x" * 11)
        with pytest.raises(MessageTooLarge):
            await producer.publish_many("t", [b"a", b"x" * 11])
        with pytest.raises(LocalProtocolError):
            await producer.publish_many("t", [])
        await producer.publish_many("t", [b"x" * 10] * 3)  # 3 MPUBs of one
    assert len(nsqds["a:1"].received) == 3


async def test_split_batch_failure_says_what_was_published(nsqds: dict[str, FakeNsqd]) -> None:
    a = nsqds["a:1"]
    async with Producer("a:1", timeout=1, max_body_size=30) as producer:
        a.script = ["ok", NSQDError("E_BAD_TOPIC", "no")]
        with pytest.raises(PublishError) as info:
            await producer.publish_many("t", [b"x" * 10] * 3)
    assert any("1 of 3 messages were published" in n for n in info.value.__notes__)


async def test_no_connection_names_every_address(nsqds: dict[str, FakeNsqd]) -> None:
    nsqds["a:1"].up = nsqds["b:2"].up = False
    producer = Producer(["a:1", "b:2"], timeout=0.2)
    with pytest.raises(NoConnection) as info:
        await producer.publish("t", b"x")
    await producer.close()
    text = str(info.value)
    assert "0.2 s" in text
    assert "a:1: cannot connect" in text
    assert "b:2: cannot connect" in text
    assert nsqds["a:1"].dials >= 2  # redialled with backoff meanwhile


async def test_closed_producer_refuses(nsqds: dict[str, FakeNsqd]) -> None:
    producer = Producer("a:1")
    await producer.close()
    with pytest.raises(ConnectionClosed):
        await producer.publish("t", b"x")


async def test_topic_check_is_cached_but_lets_no_invalid_name_through(
    nsqds: dict[str, FakeNsqd], monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[object] = []
    check = protocol.check_topic
    monkeypatch.setattr(protocol, "check_topic", lambda t: checked.append(t) or check(t))
    monkeypatch.setattr(producer_module, "TOPIC_CACHE_SIZE", 3)
    bad: list[Any] = ["bad topic", "", "x" * 65, "a\n", "t#nope", 12, None, b"t", ["t"]]
    async with Producer("a:1", timeout=1) as producer:
        for _ in range(3):
            await producer.publish("t", b"x")
        assert checked == ["t"]  # a valid name is checked once
        await producer.publish_many("t", [b"y"])
        await producer.publish("t", b"z", delay=1)
        for _ in range(3):
            for name in bad:
                with pytest.raises(InvalidName):
                    await producer.publish(name, b"x")
                with pytest.raises(InvalidName):
                    await producer.publish(name, b"x", delay=1)
                with pytest.raises(InvalidName):
                    await producer.publish_many(name, [b"x"])
        assert checked.count("bad topic") == 9  # an invalid one every time
        before = checked.count("t")
        for i in range(10):  # the cache stays bounded
            await producer.publish(f"t{i}", b"x")
        await producer.publish("t", b"x")
        assert checked.count("t") == before + 1  # "t" was forgotten: checked again
    assert nsqds["a:1"].received.count(b"PUB t\n\x00\x00\x00\x01x") == 4
    assert len(nsqds["a:1"].received) == 3 + 2 + 10 + 1  # no invalid name was sent


async def test_close_waits_for_publishes_in_flight(nsqds: dict[str, FakeNsqd]) -> None:
    a = nsqds["a:1"]
    a.gate = asyncio.Event()
    producer = Producer("a:1", timeout=2)
    await producer.connect()
    publishes = asyncio.gather(
        producer.publish("t", b"1"), producer.publish_many("t", [b"2"]), producer.publish("t", b"3")
    )
    await asyncio.sleep(0.01)
    closing = asyncio.create_task(producer.close())
    await asyncio.sleep(0.05)
    assert not closing.done() and a.connections  # held open while the publishes wait
    a.gate.set()
    await publishes
    await asyncio.wait_for(closing, 1)
    assert not a.connections
    assert pubs(a) == [b"1", b"3"]


async def test_close_gives_up_waiting_after_its_timeout(nsqds: dict[str, FakeNsqd]) -> None:
    nsqds["a:1"].gate = asyncio.Event()  # never answers
    producer = Producer("a:1", timeout=5)
    publish = asyncio.create_task(producer.publish("t", b"x"))
    await asyncio.sleep(0.05)
    started = asyncio.get_running_loop().time()
    await producer.close(timeout=0.1)
    assert asyncio.get_running_loop().time() - started < 1
    publish.cancel()


async def test_a_paused_connection_is_drained_first(nsqds: dict[str, FakeNsqd]) -> None:
    async with Producer("a:1", timeout=1) as producer:
        conn = nsqds["a:1"].connections[0]
        conn.write_paused = True
        await producer.publish("t", b"x")
        assert not conn.write_paused
    assert pubs(nsqds["a:1"]) == [b"x"]


async def test_instrumentation_sees_the_retry(nsqds: dict[str, FakeNsqd]) -> None:
    seen: list[tuple[int, str | None]] = []

    @contextlib.contextmanager
    def instrument(call: PublishCall) -> Iterator[None]:
        yield
        seen.append((call.published, call.nsqd_address))

    a, b = nsqds["a:1"], nsqds["b:2"]
    async with Producer(["a:1", "b:2"], timeout=1) as producer:
        await up(producer, 2)
        producer.instrumentation = instrument
        a.script = ["drop"]
        await producer.publish("t", b"x")  # one of these two goes to a: dropped, retried on b
        await producer.publish("t", b"x")
    assert seen == [(1, "b:2"), (1, "b:2")]
    assert pubs(b) == [b"x", b"x"]


def test_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Producer("a:1, b:2,a:1").addresses == ["a:1", "b:2"]
    assert Producer(["[::1]:4150"]).addresses == ["[::1]:4150"]
    bad: str | list[str]
    for bad in ("nohost", "a:", "a:x", "a:70000", []):
        with pytest.raises(ConfigurationError):
            Producer(bad)
    monkeypatch.delenv("NSQWORKER_NSQD_TCP_ADDRESSES", raising=False)
    monkeypatch.setenv("NSQWORKER_NSQD_TCP_ADDRESSES", "c:3")
    assert Producer().addresses == ["c:3"]
    with pytest.raises(ConfigurationError, match="timeout"):
        Producer("a:1", timeout=0)


# --- telemetry seam --------------------------------------------------------------------


async def test_instrumentation_wraps_each_call(nsqds: dict[str, FakeNsqd]) -> None:
    seen: list[tuple[str, str, int, str | None, BaseException | None]] = []

    @contextlib.contextmanager
    def instrument(call: PublishCall) -> Iterator[None]:
        call.bodies = [b"env:" + b for b in call.bodies]
        try:
            yield
        except BaseException as exc:
            seen.append((call.operation, call.topic, call.published, call.nsqd_address, exc))
            raise
        seen.append((call.operation, call.topic, call.published, call.nsqd_address, None))

    async with Producer("a:1", timeout=1) as producer:
        producer.instrumentation = instrument
        await producer.publish("t", b"x")
        await producer.publish("t", b"x", delay=1)
        await producer.publish_many("t", [b"1", b"2"])
        nsqds["a:1"].script = [NSQDError("E_BAD_TOPIC", "no")]
        with pytest.raises(PublishError):
            await producer.publish("t", b"x")
    assert [s[:4] for s in seen] == [
        ("PUB", "t", 1, "a:1"),
        ("DPUB", "t", 1, "a:1"),
        ("MPUB", "t", 2, "a:1"),
        ("PUB", "t", 0, None),
    ]
    assert isinstance(seen[-1][4], PublishError)
    assert pubs(nsqds["a:1"]) == [b"env:x"]


def test_a_producer_gets_its_telemetry_hook_with_its_transports_system() -> None:
    from nsqworker.telemetry.tracing import ProducerInstrumentation

    hook = Producer("a:1", envelope=True).instrumentation
    assert isinstance(hook, ProducerInstrumentation) and hook.envelope
    assert hook.system == "nsq"
    assert isinstance(Producer("a:1", envelope=False).instrumentation, ProducerInstrumentation)
    from nsqworker.nats import NatsProducer
    from nsqworker.settings import Settings
    from nsqworker.streams import StreamProducer

    nats = NatsProducer(settings=Settings(transport="nats"))
    streams = StreamProducer(settings=Settings(transport="rabbitmq-stream"))
    assert [p.instrumentation.system for p in (nats, streams)] == ["nats", "rabbitmq"]


# --- SyncProducer -------------------------------------------------------------------


def test_sync_producer_lifecycle(nsqds: dict[str, FakeNsqd]) -> None:
    producer = SyncProducer(["a:1"], timeout=1)
    assert producer.loop_thread.thread.daemon
    producer.publish("t", "x")
    producer.publish_json("t", {"a": [1, "é"]})
    producer.publish_many("t", iter([b"1", b"2"]))
    assert pubs(nsqds["a:1"]) == [b"x", '{"a":[1,"é"]}'.encode()]
    producer.close()
    assert not producer.loop_thread.thread.is_alive()
    assert nsqds["a:1"].connections == []
    producer.close()
    with pytest.raises(ConnectionClosed):
        producer.publish("t", b"x")


def test_sync_producer_closes_at_exit(
    nsqds: dict[str, FakeNsqd], monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", registered.remove)
    producer = SyncProducer("a:1", timeout=1)
    assert registered == [producer.close]
    producer.publish("t", b"x")
    registered[0]()  # what the interpreter does at exit
    assert registered == []
    assert not producer.loop_thread.thread.is_alive()


def test_sync_producer_refuses_its_own_loop(nsqds: dict[str, FakeNsqd]) -> None:
    with SyncProducer("a:1", timeout=1) as producer:

        async def inside() -> None:
            producer.publish("t", b"x")

        with pytest.raises(RuntimeError, match="own event loop"):
            asyncio.run_coroutine_threadsafe(inside(), producer.loop_thread.loop).result(2)


# --- publish command helpers ---------------------------------------------------------


async def test_line_reader_splits_and_skips_empty_lines() -> None:
    from nsqworker.cli.publish import _LineReader

    text = "a\r\n\nb\n\r\n" + "c" * 70_000 + "\nlast without newline"
    reader = _LineReader(io.StringIO(text), asyncio.get_running_loop())
    batches = []
    while (batch := await reader.batch(2)) is not None:
        batches.append(batch)
    assert batches == [[b"a", b"b"], [b"c" * 70_000, b"last without newline"]]
    assert reader.bytes_read == len(text)


def test_publish_command_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    from nsqworker.cli.publish import _Run

    run = _Run("clicks", None, Console(file=io.StringIO()))
    run.count = 10_000
    monkeypatch.setattr(run, "started", 100.0)
    monkeypatch.setattr("time.perf_counter", lambda: 100.42)
    assert run.summary() == "published 10,000 messages to clicks in 0.42 s (23,810 msg/s)"
    run.count, run.delay = 1, 5.0
    assert run.summary() == "published 1 message delayed 5 s to clicks in 0.42 s"


async def test_quiet_publishes_are_still_counted(nsqds: dict[str, FakeNsqd]) -> None:
    # No SDK installed: PUB skips the hook's context manager but reports its outcome.
    from nsqworker.telemetry.tracing import ProducerInstrumentation

    async with Producer("a:1", timeout=1) as producer:
        hook = producer.instrumentation
        assert isinstance(hook, ProducerInstrumentation)
        assert hook.quiet()
        for _ in range(3):
            await producer.publish("t", b"x")
        nsqds["a:1"].script = [NSQDError("E_BAD_TOPIC", "no")]
        with pytest.raises(PublishError):
            await producer.publish("t", b"x")
        await producer.publish("t", b"x", delay=1)  # DPUB: through the context manager
    assert hook.sent_counts() == {("t", None): 4, ("t", "PublishError"): 1}
