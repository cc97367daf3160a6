"""Spans, sampling, the producer hook and metrics, on local (not global) providers."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, StatusCode

from nsqworker.message import FINISH, Message
from nsqworker.producing import PublishCall
from nsqworker.task import Reject, Retry, TaskSpec
from nsqworker.telemetry import tracing as telemetry
from nsqworker.telemetry.envelope import wrap_envelope
from nsqworker.telemetry.metrics import register_worker_metrics
from nsqworker.telemetry.tracing import (
    ProducerInstrumentation,
    TaskInstrumentation,
    run_async,
    run_sync,
)

NSQD = "10.0.0.7:4150"


def make_spec(envelope: bool | None = True) -> TaskSpec:
    return TaskSpec("archive", "clicks", "archiver", lambda m: None, False, envelope=envelope)


def make_msg(body: bytes = b'{"id": 1}', attempts: int = 1, n: int = 1) -> Message:
    return Message(f"{n:016x}".encode(), body, 0, attempts, "clicks", "archiver", NSQD)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def sdk(exporter: InMemorySpanExporter, sampler: Sampler | None = None) -> TracerProvider:
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    return sdk(exporter)


def instrument(provider: trace.TracerProvider, **kw: Any) -> TaskInstrumentation:
    kw.setdefault("meter_provider", NoOpMeterProvider())
    return TaskInstrumentation(kw.pop("spec", make_spec()), tracer_provider=provider, **kw)


def only_span(exporter: InMemorySpanExporter, name: str = "process clicks") -> ReadableSpan:
    spans = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(spans) == 1, [s.name for s in exporter.get_finished_spans()]
    return spans[0]


# --- the process span ------------------------------------------------------------------


def test_success_span_has_the_messaging_attributes_from_the_start(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    inst = instrument(provider, client_id="worker-1")
    msg = make_msg(attempts=2)
    token = inst.start(msg)
    assert token is not None
    assert token[0].is_recording()
    inst.end(token, FINISH, None, 0.01)

    span = only_span(exporter)
    assert span.kind is SpanKind.CONSUMER
    assert span.parent is None
    assert dict(span.attributes or {}) == {
        "messaging.system": "nsq",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "clicks",
        "messaging.consumer.group.name": "archiver",
        "messaging.client.id": "worker-1",
        "messaging.message.id": "0000000000000001",
        "messaging.nsq.message.attempts": 2,
        "messaging.message.body.size": 9,
        "server.address": "10.0.0.7",
        "server.port": 4150,
        "messaging.nsq.outcome": "fin",
    }
    assert list(span.events) == []  # a success is told by the status and the attribute
    assert span.status.status_code is StatusCode.OK


def test_touches_are_counted_on_the_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    inst = instrument(provider)
    msg = make_msg()
    token = inst.start(msg)
    msg.touch_count = 3
    inst.end(token, FINISH, None, 120.0)
    assert only_span(exporter).attributes["messaging.nsq.message.touches"] == 3  # type: ignore[index]


def test_retry_is_a_req_event_with_its_delay_and_an_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    inst = instrument(provider)
    token = inst.start(make_msg())
    inst.end(token, Retry(3.0), Retry(3.0, "database busy"), 0.2)

    span = only_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "Retry"  # type: ignore[index]
    req = [e for e in span.events if e.name == "req"]
    assert len(req) == 1
    assert dict(req[0].attributes or {}) == {
        "messaging.nsq.requeue.delay": 3.0,
        "messaging.nsq.requeue.backoff": True,
    }
    assert any(e.name == "exception" for e in span.events)


def test_handler_exception_gives_its_class_qualname(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    class Broken(Exception):
        pass

    inst = instrument(provider)
    inst.end(inst.start(make_msg()), Retry(None), Broken("no"), 0.1)
    span = only_span(exporter)
    assert span.attributes["error.type"] == Broken.__qualname__  # type: ignore[index]
    req = next(e for e in span.events if e.name == "req")
    assert "messaging.nsq.requeue.delay" not in (req.attributes or {})  # the policy's choice


def test_requeue_without_backoff_is_not_an_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    inst = instrument(provider)
    inst.end(inst.start(make_msg()), Retry(0.0, backoff=False), None, 0.1)
    span = only_span(exporter)
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes["messaging.nsq.outcome"] == "req"  # type: ignore[index]
    assert [e.name for e in span.events] == ["req"]


def test_dead_letter_event_carries_the_reason(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    inst = instrument(provider)
    inst.end(inst.start(make_msg(attempts=5)), Reject("bad payload"), Reject("bad payload"), 0.1)

    span = only_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "Reject"  # type: ignore[index]
    event = next(e for e in span.events if e.name == "dead_letter")
    assert dict(event.attributes or {}) == {"messaging.nsq.dead_letter.reason": "bad payload"}
    assert span.attributes["messaging.nsq.outcome"] == "dead_letter"  # type: ignore[index]


def test_handler_runs_inside_the_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    inst = instrument(provider)
    tracer = provider.get_tracer("app")
    seen: list[trace.Span] = []

    def handler(msg: Message) -> str:
        seen.append(trace.get_current_span())
        with tracer.start_as_current_span("write to s3"):
            return "ok"

    token = inst.start(make_msg())
    assert run_sync(token, handler, make_msg()) == "ok"
    inst.end(token, FINISH, None, 0.01)
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached again

    process = only_span(exporter)
    child = only_span(exporter, "write to s3")
    assert seen[0].get_span_context() == process.context
    assert child.parent is not None and child.parent.span_id == process.context.span_id


async def test_async_handler_runs_inside_the_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    inst = instrument(provider)

    async def handler(msg: Message) -> int:
        return trace.get_current_span().get_span_context().span_id

    token = inst.start(make_msg())
    span_id = await run_async(token, handler, make_msg())
    inst.end(token, FINISH, None, 0.01)
    assert span_id == only_span(exporter).context.span_id
    assert await run_async(None, handler, make_msg()) == 0


# --- envelopes: unwrap, link or parent ---------------------------------------------------


def send(provider: TracerProvider, body: bytes) -> tuple[bytes, trace.SpanContext]:
    producer = ProducerInstrumentation(envelope=True, tracer_provider=provider)
    call = PublishCall("clicks", [body], "PUB", None, True)
    with producer(call) as span:
        call.nsqd_address, call.published = NSQD, 1
    assert span is not None
    return call.bodies[0], span.get_span_context()


def test_envelope_is_stripped_and_the_span_linked_to_the_producer(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    wrapped, sent = send(provider, b"payload")
    assert wrapped != b"payload"
    inst = instrument(provider)
    msg = make_msg(wrapped)
    token = inst.start(msg)
    assert msg.body == b"payload"
    inst.end(token, FINISH, None, 0.01)

    span = only_span(exporter)
    assert span.parent is None
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (sent.trace_id, sent.span_id)
    ]
    assert span.links[0].context.is_remote
    assert span.attributes["messaging.message.body.size"] == len(b"payload")  # type: ignore[index]


def test_parent_mode_makes_the_producer_span_the_parent(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    wrapped, sent = send(provider, b"payload")
    inst = instrument(provider, parent_mode="parent")
    msg = make_msg(wrapped)
    inst.end(inst.start(msg), FINISH, None, 0.01)

    span = only_span(exporter)
    assert msg.body == b"payload"
    assert span.context.trace_id == sent.trace_id
    assert span.parent is not None and span.parent.span_id == sent.span_id
    assert not span.links


def test_parent_mode_follows_the_settings(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    class Settings:
        trace_parent_mode = "parent"
        client_id = "from-settings"
        tracing_envelope = True

    wrapped, sent = send(provider, b"payload")
    inst = TaskInstrumentation(
        make_spec(None), Settings(),  # type: ignore[arg-type]
        tracer_provider=provider, meter_provider=NoOpMeterProvider(),
    )  # fmt: skip
    inst.end(inst.start(make_msg(wrapped)), FINISH, None, 0.01)
    span = only_span(exporter)
    assert span.parent is not None and span.parent.span_id == sent.span_id and not span.links
    assert span.attributes is not None
    assert span.attributes["messaging.client.id"] == "from-settings"
    with pytest.raises(ValueError, match="parent_mode"):
        TaskInstrumentation(make_spec(), parent_mode="child")


def test_envelope_false_leaves_even_a_valid_envelope_alone(provider: TracerProvider) -> None:
    wrapped = wrap_envelope(b"payload", {})
    msg = make_msg(wrapped)
    instrument(provider, spec=make_spec(envelope=False)).start(msg)
    assert msg.body is wrapped


def test_envelope_is_stripped_without_an_sdk_too() -> None:
    msg = make_msg(wrap_envelope(b"payload", {"traceparent": "junk"}))
    inst = instrument(trace.ProxyTracerProvider())
    assert inst.start(msg) is None
    assert msg.body == b"payload"


def test_raw_body_is_untouched_and_unlinked(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    raw = b"\xc1\xffNW\x01 but not an envelope"
    msg = make_msg(raw)
    inst = instrument(provider)
    inst.end(inst.start(msg), FINISH, None, 0.01)
    assert msg.body is raw
    assert not only_span(exporter).links


# --- cost and sampling ------------------------------------------------------------------


def test_without_an_sdk_start_returns_none_and_allocates_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = trace.ProxyTracerProvider()  # what the API returns while no SDK is installed
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: proxy)
    inst = TaskInstrumentation(make_spec())  # it looks again every RECHECK_EVERY messages:
    # test_a_provider_installed_later_is_picked_up
    msgs = [make_msg(n=n) for n in range(1000)]
    inst.end(inst.start(msgs[0]), FINISH, None, 0.001)  # warm up
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for msg in msgs:
            assert inst.start(msg) is None
            inst.end(None, FINISH, None, 0.001)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before < 2048, "the no-SDK path should not build per-message objects"


@pytest.mark.parametrize(
    "sampler",
    [ALWAYS_OFF, TraceIdRatioBased(0), ParentBased(TraceIdRatioBased(0)), ParentBased(ALWAYS_OFF)],
)
def test_sampling_at_zero_starts_nothing(exporter: InMemorySpanExporter, sampler: Sampler) -> None:
    inst = instrument(sdk(exporter, sampler))
    assert all(inst.start(make_msg(n=n)) is None for n in range(500))
    assert not exporter.get_finished_spans()


def test_ratio_sampling_keeps_its_rate_and_every_started_span(
    exporter: InMemorySpanExporter,
) -> None:
    inst = instrument(sdk(exporter, ParentBased(TraceIdRatioBased(0.05))))
    assert inst.presampled  # decided before building anything
    tokens = [inst.start(make_msg(n=n)) for n in range(10_000)]
    started = [t for t in tokens if t is not None]
    for token in started:
        inst.end(token, FINISH, None, 0.001)
    assert 350 < len(started) < 650  # 5% of 10 000, not 0.25% (deciding twice)
    assert len(exporter.get_finished_spans()) == len(started)


def test_ratio_sampling_follows_a_sampled_parent(exporter: InMemorySpanExporter) -> None:
    provider = sdk(exporter, ParentBased(TraceIdRatioBased(0)))
    wrapped, sent = send(sdk(InMemorySpanExporter()), b"payload")  # sampled upstream
    inst = instrument(provider, parent_mode="parent")
    token = inst.start(make_msg(wrapped))
    assert token is not None
    assert token[0].get_span_context().trace_id == sent.trace_id
    assert instrument(provider).start(make_msg(wrapped)) is None  # link mode: a root


def test_a_provider_installed_later_is_picked_up(
    monkeypatch: pytest.MonkeyPatch, provider: TracerProvider
) -> None:
    installed: list[trace.TracerProvider] = [trace.ProxyTracerProvider()]
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: installed[-1])
    inst = TaskInstrumentation(make_spec())
    assert inst.start(make_msg()) is None
    installed.append(provider)  # what trace.set_tracer_provider does, in effect
    tokens = [inst.start(make_msg(n=n)) for n in range(telemetry.RECHECK_EVERY)]
    assert tokens[0] is None and tokens[-1] is not None


# --- producer -------------------------------------------------------------------------


def test_send_span_for_a_batch(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    producer = ProducerInstrumentation(tracer_provider=provider)
    call = PublishCall("clicks", [b"a", b"b", b"c"], "MPUB")
    with producer(call):
        call.nsqd_address, call.published = NSQD, 3
    assert call.bodies == [b"a", b"b", b"c"]  # no envelope asked for

    span = only_span(exporter, "send clicks")
    assert span.kind is SpanKind.PRODUCER
    assert dict(span.attributes or {}) == {
        "messaging.system": "nsq",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "clicks",
        "messaging.batch.message_count": 3,
        "server.address": "10.0.0.7",
        "server.port": 4150,
    }
    assert producer.sent_counts() == {("clicks", None): 3}


def test_failed_send_is_an_error(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    producer = ProducerInstrumentation(tracer_provider=provider)
    call = PublishCall("clicks", [b"a"], "PUB")
    with pytest.raises(TimeoutError), producer(call):
        raise TimeoutError("nsqd did not answer")
    span = only_span(exporter, "send clicks")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "TimeoutError"  # type: ignore[index]
    assert "messaging.batch.message_count" not in (span.attributes or {})
    assert producer.sent_counts() == {("clicks", "TimeoutError"): 1}


def test_hook_without_an_sdk_still_wraps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    producer = telemetry.producer_instrumentation(envelope=True)
    call = PublishCall("clicks", [b"a"], "PUB", None, True)
    with producer(call) as span:
        call.published = 1
    assert span is None
    assert call.bodies[0].endswith(b"a") and call.bodies[0] != b"a"


def test_hook_without_an_sdk_counts_and_notices_a_provider_installed_later(
    monkeypatch: pytest.MonkeyPatch, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    installed: list[trace.TracerProvider] = [trace.ProxyTracerProvider()]
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: installed[-1])
    producer = telemetry.producer_instrumentation()
    for _ in range(3):
        call = PublishCall("clicks", [b"a"], "PUB")
        with producer(call) as span:
            call.published = 1
        assert span is None
    call = PublishCall("clicks", [b"a", b"b", b"c"], "MPUB")
    with pytest.raises(TimeoutError), producer(call):
        call.published = 1
        raise TimeoutError
    assert producer.sent_counts() == {("clicks", None): 4, ("clicks", "TimeoutError"): 2}
    installed.append(provider)
    spans = []
    for _ in range(telemetry.RECHECK_EVERY):
        call = PublishCall("clicks", [b"a"], "PUB")
        with producer(call) as span:
            call.published = 1
        spans.append(span)
    assert spans[0] is None and spans[-1] is not None
    assert len(exporter.get_finished_spans()) == sum(s is not None for s in spans)
    assert producer.sent_counts()[("clicks", None)] == 4 + telemetry.RECHECK_EVERY


# --- metrics --------------------------------------------------------------------------


class FakeWorker:
    def __init__(self) -> None:
        self.received = 7

    def stats(self) -> dict[str, Any]:
        task = {"name": "archive", "topic": "clicks", "channel": "archiver"}
        task |= {"received": self.received, "finished": 5, "requeued": 2, "in_flight": 3}
        task |= {"rdy": 10, "connections": 2, "backoff_level": 1, "dead_lettered": 0}
        return {"pid": 1, "ready": True, "tasks": {"archive": task}}


@pytest.fixture
def metric_reader() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_worker_stats_become_observable_metrics(
    metric_reader: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, reader = metric_reader
    worker = FakeWorker()
    unregister = register_worker_metrics(worker, meter_provider=provider)
    found = points(reader)
    consumed = found["messaging.client.consumed.messages"]
    assert [p.value for p in consumed] == [7]
    assert dict(consumed[0].attributes) == {
        "messaging.system": "nsq",
        "messaging.operation.name": "process",
        "messaging.destination.name": "clicks",
        "messaging.consumer.group.name": "archiver",
        "nsqworker.task": "archive",
    }
    for name, value in [
        ("nsqworker.messages.in_flight", 3),
        ("nsqworker.rdy", 10),
        ("nsqworker.connections", 2),
        ("nsqworker.backoff.level", 1),
        ("nsqworker.messages.requeued", 2),
    ]:
        assert [p.value for p in found[name]] == [value], name
    unregister()
    assert "messaging.client.consumed.messages" not in points(reader)


def test_duration_histogram_only_with_an_sdk_meter(
    metric_reader: tuple[MeterProvider, InMemoryMetricReader], provider: TracerProvider
) -> None:
    meter_provider, reader = metric_reader
    inst = TaskInstrumentation(make_spec(), tracer_provider=provider, meter_provider=meter_provider)
    inst.end(inst.start(make_msg()), FINISH, None, 0.004)
    inst.end(None, Retry(None), ValueError("x"), 700.0)
    (ok, failed) = sorted(
        points(reader)["messaging.process.duration"], key=lambda p: "error.type" in p.attributes
    )
    assert tuple(ok.explicit_bounds) == telemetry.DURATION_BUCKETS
    assert ok.count == 1 and failed.count == 1
    assert failed.attributes["error.type"] == "ValueError"
    assert inst.timed
    assert not instrument(provider).timed  # NoOpMeterProvider: nothing recorded


def test_duration_buckets_match_the_workers() -> None:
    from nsqworker.stats import DURATION_BUCKETS

    assert tuple(map(float, DURATION_BUCKETS)) == tuple(map(float, telemetry.DURATION_BUCKETS))


def test_sent_messages_are_read_from_the_producers(
    metric_reader: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    meter_provider, reader = metric_reader
    producer = ProducerInstrumentation(meter_provider=meter_provider)
    producer.end_send(None, topic="clicks", sent=4)
    producer.end_send(None, TimeoutError(), topic="clicks", failed=1)
    sent = points(reader)["messaging.client.sent.messages"]
    assert sorted((p.attributes.get("error.type", ""), p.value) for p in sent) == [
        ("", 4),
        ("TimeoutError", 1),
    ]


# --- configure_from_env, in a fresh interpreter (global providers are set once) --------

_PROBE = """
import json, sys
from opentelemetry import trace
from nsqworker.telemetry.setup import configure_from_env
if sys.argv[1] == "app":
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(app := TracerProvider())
done = configure_from_env()
provider = trace.get_tracer_provider()
print(json.dumps({"done": done, "provider": type(provider).__name__,
                  "sampler": getattr(getattr(provider, "sampler", None), "get_description",
                                     lambda: None)(),
                  "app": sys.argv[1] == "app" and provider is app}))
"""


def probe(env: dict[str, str], mode: str = "plain") -> dict[str, Any]:
    clean = {"PATH": "/usr/bin:/bin", "OTEL_METRICS_EXPORTER": "none"} | env
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], env=clean, capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_configure_does_nothing_without_an_endpoint() -> None:
    assert probe({}) == {"done": {}, "provider": "ProxyTracerProvider", "sampler": None,
                         "app": False}  # fmt: skip


def test_configure_installs_otlp_with_the_env_sampler() -> None:
    result = probe(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
        }
    )
    assert result["done"] == {"traces": "otlp"}
    assert result["provider"] == "TracerProvider"
    assert "TraceIdRatioBased{0.25}" in result["sampler"]


def test_configure_leaves_an_application_provider_alone() -> None:
    result = probe({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, mode="app")
    assert result["done"] == {} and result["app"] is True


@pytest.mark.parametrize(
    "sampler", [None, ParentBased(TraceIdRatioBased(0.5))], ids=["always-on", "ratio"]
)
def test_a_span_current_around_the_worker_is_not_the_parent(
    exporter: InMemorySpanExporter, sampler: Sampler | None
) -> None:
    # e.g. a span around the program's startup: every message would join its trace.
    provider = sdk(exporter, sampler)
    wrapped, _ = send(sdk(InMemorySpanExporter()), b"x")
    with provider.get_tracer("app").start_as_current_span("startup") as startup:
        tokens = [instrument(provider).start(make_msg(n=n)) for n in range(200)]
        linked = instrument(provider).start(make_msg(wrapped))
    started = [t for t in [*tokens, linked] if t is not None]
    assert 40 < len(started) <= 201  # the ratio is the sampler's, not the startup span's
    for token in started:
        assert token[0].parent is None  # type: ignore[attr-defined]
        assert token[0].get_span_context().trace_id != startup.get_span_context().trace_id
        assert trace.get_current_span(token[1]) is token[0]
