"""The NATS JetStream transport against real nats-server: a cluster losing a node, the
window bound, bad input, publishing, and RPC refused."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from nsqworker import Producer, Registry, SyncProducer, Worker
from nsqworker.consumer import Consumer
from nsqworker.errors import ConfigurationError, InvalidName, LocalProtocolError, MessageTooLarge
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.nats import NatsProducer
from nsqworker.settings import Settings
from nsqworker.testing import wait_until
from nsqworker.testing.nats import NatsCluster, NatsServerProcess


def settings(*urls: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "transport": "nats",
        "nats_servers": list(urls),
        "retry_delay": 0.05,
        "backoff_multiplier": 0.0,
        "reconnect_delay": 0.05,
        "max_reconnect_delay": 0.5,
        "drain_timeout": 5.0,
        "health_port": 0,
        "log_level": "warning",
    }
    return Settings(**(values | overrides))


def subject() -> str:
    return f"jobs.{uuid.uuid4().hex[:8]}"


async def consumer_info(url: str, stream: str, durable: str) -> Any:
    import nats

    nc = await nats.connect(url)
    try:
        return await nc.jetstream().consumer_info(stream, durable)
    finally:
        await nc.close()


# ---------------------------------------------------------------------------- cluster


async def test_killing_the_connected_node_loses_nothing(nats_cluster: NatsCluster) -> None:
    """kill -9 the server the worker reads from, mid-backlog: it moves to a node it knows
    only from the cluster's INFO, and every message is handled; redeliveries (acks lost
    with the node) are counted and bounded by what was in flight."""
    first, second, _ = nats_cluster.servers
    topic, total, window = subject(), 600, 20
    opts = {"nats_stream_replicas": 3, "msg_timeout": 2.0}
    async with NatsProducer(settings=settings(second.url, **opts)) as producer:
        await producer.publish_many(topic, [f"m{i}".encode() for i in range(total)])
    seen: Counter[bytes] = Counter()

    async def handle(msg: Message) -> Outcome:
        await asyncio.sleep(0.002)
        seen[msg.body] += 1
        return FINISH

    consumer = Consumer(topic, "work", handle, settings(first.url, **opts), max_in_flight=window)
    await consumer.start()
    try:
        await wait_until(lambda: len(seen) >= 150, timeout=20, message="no progress")
        first.kill()
        killed_at = len(seen)
        await wait_until(lambda: len(seen) == total, timeout=60, message=lambda: f"{len(seen)}")
        assert consumer.subscription.stats().connections[0]["address"] != f"127.0.0.1:{first.port}"
    finally:
        await consumer.stop(2.0)
    assert killed_at < total  # the node died mid-backlog
    duplicates = sum(n - 1 for n in seen.values())
    assert duplicates <= 2 * window, duplicates  # only deliveries whose ack was lost


async def test_never_more_in_hand_than_max_in_flight(nats_server: NatsServerProcess) -> None:
    """The pull asks for at most the free window: in hand plus asked for never passes
    max_in_flight, and neither does the server's ack-pending count, but for acks it has
    not applied yet (it reads acks apart from pull requests)."""
    topic = subject()
    async with NatsProducer(settings=settings(nats_server.url)) as producer:
        await producer.publish_many(topic, [b"x"] * 60)
    running = peak = done = 0

    async def slow(msg: Message) -> Outcome:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        done += 1
        return FINISH

    consumer = Consumer(topic, "slow", slow, settings(nats_server.url), max_in_flight=4)
    await consumer.start()
    samples, windows = [], []
    stream = topic.replace(".", "_")
    while done < 60:
        windows.append(consumer.subscription.stats().window)
        info = await consumer_info(nats_server.url, stream, "slow")
        samples.append(info.num_ack_pending)
        await asyncio.sleep(0.03)
    await consumer.stop(1.0)
    assert peak <= 4
    assert max(windows) <= 4, windows
    assert max(samples) <= 8, samples
    assert sorted(samples)[len(samples) // 2] <= 4, samples
    assert max(samples) >= 2, samples


async def test_a_pull_request_goes_out_in_the_middle_of_a_read(
    nats_server: NatsServerProcess,
) -> None:
    """A pull request is written as soon as a quarter of the window is free, with the
    acks settled before it, while the rest of the read is still being handled: the server
    starts on it meanwhile. Here the handler holds the loop at the message after that
    quarter, and the server delivers past the first window while it is held. Written at
    the end of the read instead, the pipeline drains while the worker is busy (about
    190k instead of 250k msgs/s in bench/nats.py)."""
    topic, total, window = subject(), 1000, 400
    async with NatsProducer(settings=settings(nats_server.url)) as producer:
        await producer.publish_many(topic, [b"x"] * total)
    handled = 0
    held: list[int] = []  # what the server had delivered while the loop was held

    def delivered_while_held() -> int:
        stream = topic.replace(".", "_")
        with ThreadPoolExecutor(1) as pool:  # its own event loop: this one is held
            deadline = time.monotonic() + 3
            while True:
                info = pool.submit(asyncio.run, consumer_info(nats_server.url, stream, "pulls"))
                delivered = int(info.result().delivered.consumer_seq)
                if delivered > window or time.monotonic() > deadline:
                    return delivered
                time.sleep(0.02)

    def handle(msg: Message) -> Outcome:
        nonlocal handled
        handled += 1
        if handled == window // 4 + 1:  # the quarter freed: a pull for it was written
            held.append(delivered_while_held())
        return FINISH

    consumer = Consumer(topic, "pulls", handle, settings(nats_server.url), max_in_flight=window)
    await consumer.start()
    await wait_until(lambda: handled == total, timeout=30)
    await consumer.stop(1.0)
    assert held == [window + window // 4], held


async def test_a_long_handler_is_kept_alive_past_ack_wait(nats_server: NatsServerProcess) -> None:
    topic = subject()
    async with NatsProducer(settings=settings(nats_server.url)) as producer:
        await producer.publish(topic, b"long")
    calls = 0

    async def long(msg: Message) -> Outcome:
        nonlocal calls
        calls += 1
        await asyncio.sleep(3.0)  # three ack_waits
        return FINISH

    opts = settings(nats_server.url, msg_timeout=1.0)
    consumer = Consumer(topic, "long", long, opts, max_in_flight=2)
    await consumer.start()
    await asyncio.sleep(4.0)
    await consumer.stop(1.0)
    assert calls == 1  # never redelivered while it ran


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("topic", ["jobs.*", "jobs.>", "has space", "a..b", ""])
def test_a_subject_that_is_not_publishable_is_refused(topic: str) -> None:
    # @task refuses these at import already (task names are portable: NSQ's rule); the
    # transport's own check names the NATS rule for code that goes around @task.
    from nsqworker.task import TaskDefinitionError

    if topic != "a..b":  # a valid NSQ name, an invalid subject
        with pytest.raises(TaskDefinitionError, match="topic"):
            Registry().task(topic, channel="c")(lambda msg: None)
    with pytest.raises(InvalidName, match="NATS subject"):
        Consumer(topic, "c", lambda m: FINISH, settings("nats://127.0.0.1:1"))


def test_a_channel_that_is_not_a_consumer_name_is_refused() -> None:
    with pytest.raises(InvalidName, match="consumer name"):
        Consumer("jobs.a", "a.b", lambda m: FINISH, settings("nats://127.0.0.1:1"))


async def test_a_body_over_max_payload_names_the_sizes(nats_server: NatsServerProcess) -> None:
    async with NatsProducer(settings=settings(nats_server.url)) as producer:
        with pytest.raises(MessageTooLarge, match=r"over the NATS server's max_payload \(1048576"):
            await producer.publish(subject(), b"x" * (1024 * 1024 + 1))


async def test_a_stream_whose_subjects_overlap_another_is_a_clear_error(
    nats_server: NatsServerProcess,
) -> None:
    import nats

    nc = await nats.connect(nats_server.url)
    await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.>"])
    await nc.close()
    # A stream named in the settings that does not exist yet cannot take orders.new:
    named = settings(nats_server.url, nats_stream="MINE")
    consumer = Consumer("orders.new", "c", lambda m: FINISH, named)
    with pytest.raises(ConfigurationError, match=r"'MINE' for subject 'orders\.new'.*overlap"):
        await consumer.start()
    await consumer.stop(0)


async def test_wrong_credentials_are_a_configuration_error(tmp_path: Any) -> None:
    with NatsServerProcess(extra_args=["--user", "app", "--pass", "right"]) as server:
        wrong = settings(server.url, nats_user="app", nats_password="wrong")
        consumer = Consumer("jobs.a", "c", lambda m: FINISH, wrong)
        with pytest.raises(ConfigurationError, match="refused the login") as info:
            await consumer.start()
        assert "wrong" not in str(info.value)  # the password is never printed
        await consumer.stop(0)
        right = settings(server.url, nats_user="app", nats_password="right")
        async with NatsProducer(settings=right) as producer:
            await producer.publish("jobs.a", b"ok")


# ---------------------------------------------------------------------------- publishing


async def test_producer_with_nats_settings_publishes_with_acks(
    nats_server: NatsServerProcess,
) -> None:
    topic = subject()
    producer = Producer(settings=settings(nats_server.url))
    assert isinstance(producer, NatsProducer)
    async with producer:
        started = time.monotonic()
        await producer.publish_many(topic, [b"%d" % i for i in range(2000)])
        took = time.monotonic() - started
        await producer.publish_json(topic, {"last": True})
    import nats

    nc = await nats.connect(nats_server.url)
    info = await nc.jetstream().stream_info(topic.replace(".", "_"))
    await nc.close()
    assert info.state.messages == 2001
    assert took < 5, took  # pipelined: one round trip each would be far slower


async def test_a_delayed_publish_arrives_after_its_delay(nats_server: NatsServerProcess) -> None:
    """A real delay: the stream holds a schedule, the server publishes it when due; the
    channel never sees the schedule itself."""
    topic = subject()
    arrivals: list[tuple[bytes, float]] = []
    consumer = Consumer(
        topic, "later", lambda m: arrivals.append((m.body, time.monotonic())) or FINISH,
        settings(nats_server.url),
    )  # fmt: skip
    async with NatsProducer(settings=settings(nats_server.url)) as producer:
        started = time.monotonic()
        await producer.publish(topic, b"later", delay=1.5)
        await producer.publish(topic, b"now")
        await consumer.start()
        await wait_until(lambda: len(arrivals) == 2, timeout=10, message=str(arrivals))
        with pytest.raises(LocalProtocolError, match="delay must be seconds"):
            await producer.publish(topic, b"x", delay=-1)
    await asyncio.sleep(0.5)
    await consumer.stop(0)
    (first, _), (last, at) = arrivals
    assert (first, last) == (b"now", b"later") and len(arrivals) == 2
    assert 1.4 <= at - started < 4.0, at - started


async def test_a_delay_on_a_stream_without_schedules_is_a_clear_error(
    nats_server: NatsServerProcess,
) -> None:
    import nats

    nc = await nats.connect(nats_server.url)
    await nc.jetstream().add_stream(name="PLAIN", subjects=["plain.>"])
    await nc.close()
    async with NatsProducer(settings=settings(nats_server.url)) as producer:
        with pytest.raises(ConfigurationError, match="'PLAIN' cannot hold a delayed message"):
            await producer.publish("plain.job", b"x", delay=1.0)
        await producer.publish("plain.job", b"x")  # without a delay it is fine


def test_sync_producer_on_nats(nats_server: NatsServerProcess) -> None:
    topic = subject()
    producer = SyncProducer(settings=settings(nats_server.url))
    try:
        producer.publish(topic, b"one")
        producer.publish_many(topic, [b"two", b"three"])
    finally:
        producer.close()
    got: list[bytes] = []

    async def read() -> None:
        consumer = Consumer(
            topic, "sync", lambda m: got.append(m.body) or FINISH, settings(nats_server.url)
        )
        await consumer.start()
        await wait_until(lambda: len(got) == 3, timeout=10, message=str(got))
        await consumer.stop(0)

    asyncio.run(read())
    assert got == [b"one", b"two", b"three"]


# ---------------------------------------------------------------------------- telemetry


async def test_spans_say_nats_and_carry_the_subject_consumer_and_sequence(
    nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    topic, done = subject(), []
    registry = Registry()

    @registry.task(topic, channel="traced")
    async def handle(msg: Message) -> None:
        done.append(msg.id)

    async with NatsProducer(settings=settings(nats_server.url)) as producer:
        await producer.publish_many(topic, [b"a", b"b"])
    worker = Worker(registry, settings(nats_server.url))
    await worker.start()
    try:
        await wait_until(lambda: len(done) == 2, timeout=10, message=str(done))
    finally:
        await worker.stop()
    spans = [s for s in exporter.get_finished_spans() if s.name == f"process {topic}"]
    assert len(spans) == 2
    attrs = dict(spans[0].attributes or {})
    assert attrs["messaging.system"] == "nats"
    assert attrs["messaging.destination.name"] == topic
    assert attrs["messaging.consumer.group.name"] == "traced"
    assert attrs["messaging.message.id"] in {"1", "2"}  # the stream sequence
    assert attrs["messaging.nats.message.attempts"] == 1
    assert attrs["server.port"] == nats_server.port
    provider.shutdown()
