"""Trace envelopes from publishers the consumer does not control (docs/security.md)."""

from __future__ import annotations

from opentelemetry import baggage
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from nsqworker.message import FINISH, Message
from nsqworker.settings import Settings
from nsqworker.task import TaskSpec
from nsqworker.telemetry.envelope import wrap_envelope
from nsqworker.telemetry.tracing import TaskInstrumentation

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CRAFTED = {  # what any publisher may write: a sampled parent and baggage
    "traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01",
    "baggage": "user.id=admin",
}


def setup(**settings: object) -> tuple[TaskInstrumentation, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))  # 0 %, parent-based
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spec = TaskSpec("archive", "clicks", "archiver", lambda m: None, False)
    inst = TaskInstrumentation(
        spec, Settings(**settings),  # type: ignore[arg-type]
        tracer_provider=provider, meter_provider=NoOpMeterProvider(),
    )  # fmt: skip
    return inst, exporter


def message(body: bytes) -> Message:
    return Message(b"0" * 16, body, 0, 1, "clicks", "archiver", "127.0.0.1:4150")


def test_envelopes_are_left_alone_unless_the_consumer_opted_in() -> None:
    inst, _ = setup()  # tracing_envelope off, the task says nothing
    body = wrap_envelope(b"payload", CRAFTED)
    msg = message(body)
    inst.start(msg)
    assert msg.body == body  # the handler sees what was published


def test_a_crafted_sampled_flag_does_not_force_sampling_and_baggage_is_dropped() -> None:
    inst, exporter = setup(tracing_envelope=True, trace_parent_mode="parent")
    msg = message(wrap_envelope(b"payload", CRAFTED))
    token = inst.start(msg)
    assert msg.body == b"payload"  # stripped: opted in
    assert token is None  # our 0 % sampler decided, not the publisher's flag
    assert not exporter.get_finished_spans()


def test_trace_trust_remote_follows_the_publisher() -> None:
    inst, exporter = setup(
        tracing_envelope=True, trace_parent_mode="parent", trace_trust_remote=True
    )
    token = inst.start(message(wrap_envelope(b"payload", CRAFTED)))
    assert token is not None
    assert baggage.get_baggage("user.id", token[1]) == "admin"
    inst.end(token, FINISH, None, 0.01)
    (span,) = exporter.get_finished_spans()
    assert f"{span.context.trace_id:032x}" == TRACE_ID


def test_baggage_is_dropped_from_an_untrusted_envelope() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # always on: a span either way
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spec = TaskSpec("archive", "clicks", "archiver", lambda m: None, False)
    inst = TaskInstrumentation(
        spec, Settings(tracing_envelope=True, trace_parent_mode="parent"),  # type: ignore[arg-type]
        tracer_provider=provider, meter_provider=NoOpMeterProvider(),
    )  # fmt: skip
    token = inst.start(message(wrap_envelope(b"payload", CRAFTED)))
    assert token is not None
    assert baggage.get_baggage("user.id", token[1]) is None
