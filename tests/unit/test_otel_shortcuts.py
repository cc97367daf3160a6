"""The sampled path uses the public OpenTelemetry API only, and gives what it gives."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import nsqworker.telemetry as telemetry_package
from nsqworker.message import FINISH, Message
from nsqworker.task import TaskSpec
from nsqworker.telemetry.sampling import _DISABLED, _GENERIC, _RATIO, _sampling_plan
from nsqworker.telemetry.shortcuts import context_with
from nsqworker.telemetry.tracing import TaskInstrumentation


def provider(exporter: InMemorySpanExporter, **kw: Any) -> TracerProvider:
    tp = TracerProvider(**kw)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp


def test_no_private_opentelemetry_names_are_used() -> None:
    """No ``obj._name`` attribute and no ``from opentelemetry... import _name`` in
    nsqworker/telemetry: an SDK upgrade cannot break or silently slow a shortcut."""
    private = []
    for path in Path(telemetry_package.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentel"):
                private += [f"{path.name}: {a.name}" for a in node.names if a.name[0] == "_"]
            name = node.attr if isinstance(node, ast.Attribute) else ""
            if name.startswith("_") and not name.startswith("__"):
                value = node.value  # type: ignore[attr-defined]
                if not (isinstance(value, ast.Name) and value.id in ("self", "cls")):
                    private.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert private == []


def plan(sampler: sampling.Sampler) -> tuple[int, int, bool]:
    tp = TracerProvider(sampler=sampler)
    mode, bound, parent_based, _ = _sampling_plan(tp, tp.get_tracer("t"))
    return mode, bound, parent_based


@pytest.mark.parametrize("rate", [0.01, 0.5, 1e-6, 1 / 3])
def test_ratio_samplers_are_read_through_their_description(rate: float) -> None:
    bound = sampling.TraceIdRatioBased(rate).bound
    assert plan(sampling.TraceIdRatioBased(rate)) == (_RATIO, bound, False)
    assert plan(sampling.ParentBased(sampling.TraceIdRatioBased(rate))) == (_RATIO, bound, True)
    assert plan(sampling.ParentBased(sampling.ALWAYS_OFF)) == (_RATIO, 0, True)


def test_other_samplers_are_left_to_the_sdk() -> None:
    assert plan(sampling.ALWAYS_ON)[0] == _GENERIC
    assert plan(sampling.ParentBased(sampling.ALWAYS_ON))[0] == _GENERIC
    odd = sampling.ParentBased(
        sampling.TraceIdRatioBased(0.1), remote_parent_not_sampled=sampling.ALWAYS_ON
    )
    assert plan(odd)[0] == _GENERIC
    assert _sampling_plan(trace.NoOpTracerProvider(), trace.NoOpTracer())[0] == _DISABLED


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
