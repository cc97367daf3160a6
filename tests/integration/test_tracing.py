"""Trace context across a real nsqd: the envelope round trip, link and parent modes, and
raw bodies from other clients left untouched."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nsqworker.message import Message
from nsqworker.nsq.producer import Producer
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.telemetry.tracing import ProducerInstrumentation
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker

CHANNEL = "traced"
NOT_AN_ENVELOPE = b"\xc1\xffNW\x01" + b"\x00\x04" + b"a=b!" + b"\x00\x00\x00\x00raw bytes"


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    yield
    structlog.configure(**saved)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An SDK provider seen as the global one by nsqworker, without installing it for
    good (the global provider can be set only once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    yield provider, exporter
    provider.shutdown()


def settings(nsqd: NsqdProcess, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nsqd_tcp_addresses": [nsqd.tcp_address],
        "reconnect_delay": 0.05,
        "dial_timeout": 2.0,
        "drain_timeout": 5.0,
    }
    return Settings(**(values | overrides))


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def recording_task(reg: Registry, topic: str, seen: list[tuple[bytes, trace.SpanContext]]) -> None:
    @reg.task(topic, channel=CHANNEL)
    async def handle(msg: Message) -> None:
        seen.append((msg.body, trace.get_current_span().get_span_context()))


async def test_envelope_links_the_process_span_and_raw_bodies_stay_raw(
    nsqd: NsqdProcess, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    topic = "traced_link"
    nsqd.create_channel(topic, CHANNEL)
    producer = ProducerInstrumentation(envelope=True, tracer_provider=provider)
    send_span = producer.start_send(topic)
    assert send_span is not None
    (wrapped,) = producer.wrap([b'{"id": 7}'], send_span, "application/json")
    nsqd.publish(topic, wrapped)  # over HTTP, as any client could
    producer.end_send(send_span, topic=topic, sent=1)
    nsqd.publish(topic, b'{"id": 8}')
    nsqd.publish(topic, NOT_AN_ENVELOPE)

    reg = Registry()
    seen: list[tuple[bytes, trace.SpanContext]] = []
    recording_task(reg, topic, seen)
    async with Worker(reg, settings(nsqd, tracing_envelope=True)):
        await wait_until(lambda: len(seen) == 3)

    bodies = dict(seen)
    assert set(bodies) == {b'{"id": 7}', b'{"id": 8}', NOT_AN_ENVELOPE}
    sent = send_span.get_span_context()
    processed = {s.context.span_id: s for s in named(exporter, f"process {topic}")}
    assert len(processed) == 3

    enveloped = processed[bodies[b'{"id": 7}'].span_id]  # the handler ran inside its span
    assert enveloped.parent is None
    assert [(link.context.trace_id, link.context.span_id) for link in enveloped.links] == [
        (sent.trace_id, sent.span_id)
    ]
    assert enveloped.attributes["server.port"] == nsqd.tcp_port  # type: ignore[index]
    for raw in (b'{"id": 8}', NOT_AN_ENVELOPE):
        span = processed[bodies[raw].span_id]
        assert not span.links
        assert span.attributes["messaging.message.body.size"] == len(raw)  # type: ignore[index]


async def test_parent_mode_through_the_producer(
    nsqd: NsqdProcess, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    _, exporter = spans
    topic = "traced_parent"
    nsqd.create_channel(topic, CHANNEL)
    async with Producer([nsqd.tcp_address], envelope=True) as producer:
        await producer.publish(topic, b"hello")
    (send_span,) = named(exporter, f"send {topic}")
    assert send_span.kind is trace.SpanKind.PRODUCER
    assert send_span.attributes["server.address"] == "127.0.0.1"  # type: ignore[index]

    reg = Registry()
    seen: list[tuple[bytes, trace.SpanContext]] = []
    recording_task(reg, topic, seen)
    async with Worker(reg, settings(nsqd, trace_parent_mode="parent", tracing_envelope=True)):
        await wait_until(lambda: seen)

    [(body, current)] = seen
    assert body == b"hello"
    (process,) = named(exporter, f"process {topic}")
    assert process.context.trace_id == send_span.context.trace_id == current.trace_id
    assert process.parent is not None and process.parent.span_id == send_span.context.span_id
    assert list(process.events) == []
    assert process.attributes["messaging.nsq.outcome"] == "fin"  # type: ignore[index]
    assert process.status.status_code is trace.StatusCode.OK


async def test_duration_histogram_counts_untraced_messages_too(
    nsqd: NsqdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Metrics without tracing: start() gives no token, yet every message is timed.
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: meter_provider)
    reg = Registry()
    done: list[str] = []

    @reg.task("timed_async", channel=CHANNEL)
    async def handle_async(msg: Message) -> None:
        done.append("async")

    @reg.task("timed_sync", channel=CHANNEL)
    def handle_sync(msg: Message) -> None:
        done.append("sync")

    for topic in ("timed_async", "timed_sync"):
        nsqd.create_channel(topic, CHANNEL)
        for n in range(3):
            nsqd.publish(topic, b"%d" % n)
    async with Worker(reg, settings(nsqd)):
        await wait_until(lambda: len(done) == 6)
        await wait_until(lambda: sum(_durations(reader).values()) == 6)
    assert _durations(reader) == {"timed_async": 3, "timed_sync": 3}
    meter_provider.shutdown()


def _durations(reader: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "messaging.process.duration":
                    for point in metric.data.data_points:
                        topic = str(point.attributes["messaging.destination.name"])
                        counts[topic] = counts.get(topic, 0) + point.count
    return counts


async def test_worker_log_lines_carry_the_process_span(
    nsqd: NsqdProcess, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    import io
    import json

    from nsqworker.logging import configure_logging

    _, exporter = spans
    out = io.StringIO()
    configure_logging("debug", "json", out)  # successes log at debug
    reg = Registry()

    @reg.task("logs_eager", channel=CHANNEL)
    async def eager(msg: Message) -> None:
        pass

    @reg.task("logs_suspends", channel=CHANNEL)
    async def suspends(msg: Message) -> None:
        await asyncio.sleep(0)

    @reg.task("logs_sync", channel=CHANNEL)
    def in_thread(msg: Message) -> None:
        pass

    @reg.task("logs_fails", channel=CHANNEL, max_attempts=1)
    async def fails(msg: Message) -> None:
        raise ValueError("boom")

    topics = ("logs_eager", "logs_suspends", "logs_sync", "logs_fails")
    for topic in topics:
        nsqd.create_channel(topic, CHANNEL)
        nsqd.publish(topic, b"x")
    async with Worker(reg, settings(nsqd, log_level="debug")):
        await wait_until(lambda: sum(len(named(exporter, f"process {t}")) for t in topics) == 4)
    spans_by_id = {
        str(s.attributes["messaging.message.id"]): s.context  # type: ignore[index]
        for t in topics
        for s in named(exporter, f"process {t}")
    }
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    about_messages = {
        line["task"].rpartition(".")[2]: line for line in lines if "id" in line and "task" in line
    }
    assert set(about_messages) == {"eager", "suspends", "in_thread", "fails"}, lines
    for task, line in about_messages.items():
        context = spans_by_id[line["id"]]
        assert line.get("trace_id") == format(context.trace_id, "032x"), task
        assert line.get("span_id") == format(context.span_id, "016x"), task
