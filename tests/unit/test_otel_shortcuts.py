"""The SDK shortcuts give what the public API gives, and are taken with the pinned SDK."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nsqworker.nsq.message import FINISH, Message
from nsqworker.task import TaskSpec
from nsqworker.telemetry.shortcuts import add_plain_event, context_with, direct_events
from nsqworker.telemetry.tracing import TaskInstrumentation


def provider(exporter: InMemorySpanExporter, **kw: Any) -> TracerProvider:
    tp = TracerProvider(**kw)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp


def event_fields(span: Any) -> list[tuple[str, dict[str, Any], int]]:
    return [(e.name, dict(e.attributes or {}), e.dropped_attributes) for e in span.events]


def test_the_shortcut_is_taken_for_sdk_spans() -> None:
    # Fails when an SDK upgrade moves the internals: the public fallback then runs
    # (correct, 3x slower), and docs/observability.md's cost figures need a new look.
    span = TracerProvider().get_tracer("t").start_span("s")
    assert direct_events(span)


def test_plain_event_reads_back_as_the_public_one() -> None:
    exporter = InMemorySpanExporter()
    tracer = provider(exporter).get_tracer("t")
    for add in (lambda s: add_plain_event(s, "fin"), lambda s: s.add_event("fin")):
        span = tracer.start_span("s")
        before = time.time_ns()
        add(span)
        after = time.time_ns()
        span.end()
        (event,) = exporter.get_finished_spans()[-1].events
        assert before <= event.timestamp <= after
    shortcut, public = exporter.get_finished_spans()
    assert event_fields(shortcut) == event_fields(public) == [("fin", {}, 0)]
    assert shortcut.to_json().count('"name": "fin"') == 1


def test_plain_event_respects_the_span_event_limit() -> None:
    exporter = InMemorySpanExporter()
    tracer = provider(exporter, span_limits=SpanLimits(max_events=1)).get_tracer("t")
    span = tracer.start_span("s")
    add_plain_event(span, "first")
    add_plain_event(span, "fin")
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert [e.name for e in finished.events] == ["fin"]
    assert finished.dropped_events == 1


def test_plain_event_on_an_ended_span_is_ignored() -> None:
    exporter = InMemorySpanExporter()
    span = provider(exporter).get_tracer("t").start_span("s")
    span.end()
    add_plain_event(span, "fin")
    assert list(exporter.get_finished_spans()[0].events) == []


def test_other_spans_get_the_public_call() -> None:
    class Recorder(trace.NonRecordingSpan):
        def __init__(self) -> None:
            super().__init__(trace.INVALID_SPAN_CONTEXT)
            self.events: list[str] = []

        def add_event(self, name: str, attributes: Any = None, timestamp: Any = None) -> None:
            self.events.append(name)

    span = Recorder()
    add_plain_event(span, "fin")
    assert not direct_events(span)
    assert span.events == ["fin"]


def test_context_with_matches_set_span_in_context() -> None:
    span = TracerProvider().get_tracer("t").start_span("s")
    empty = context_with(span, otel_context.Context())
    assert empty == trace.set_span_in_context(span, otel_context.Context())
    assert trace.get_current_span(empty) is span

    # A non-empty parent (a remote context with baggage) is kept, as the API keeps it.
    parent = baggage.set_baggage("region", "eu", otel_context.Context())
    explicit = context_with(span, parent)
    assert explicit == trace.set_span_in_context(span, parent)
    assert trace.get_current_span(explicit) is span
    assert baggage.get_baggage("region", explicit) == "eu"


def test_reused_attribute_dict_never_leaks_into_earlier_spans() -> None:
    # start() refills one attribute dict per nsqd address: the SDK must have copied it.
    exporter = InMemorySpanExporter()
    spec = TaskSpec("archive", "clicks", "archiver", lambda m: None, False)
    inst = TaskInstrumentation(
        spec, tracer_provider=provider(exporter), meter_provider=NoOpMeterProvider()
    )
    tokens = []
    for n in range(3):
        msg = Message(f"{n:016x}".encode(), b"x" * (n + 1), 0, n + 1, "clicks", "a", "h:4150")
        tokens.append(inst.start(msg))
    for token in tokens:
        inst.end(token, FINISH, None, 0.001)
    keys = ("messaging.message.id", "messaging.nsq.message.attempts")
    keys += ("messaging.message.body.size",)
    seen = [tuple(dict(s.attributes or {})[k] for k in keys) for s in exporter.get_finished_spans()]
    assert seen == [(f"{n:016x}", n + 1, n + 1) for n in range(3)]
