"""What telemetry costs per message: ``python bench/bench_telemetry.py [--messages N]``.

Measures, in one run and one process, microseconds per message of what the worker
does around a handler: ``TaskInstrumentation.start``, the span's Context attached in
the message's own copy of the Context (as ``TaskRunner.call_async`` does), ``end``
with the outcome FIN:

1. no SDK: no tracer or meter provider installed (the global proxies);
2. 1% sampling: SDK TracerProvider, ParentBased(TraceIdRatioBased(0.01)),
   BatchSpanProcessor with an exporter that drops everything;
3. 100% sampling: the same provider with the default sampler (every span recorded);
4. bare SDK span: ``tracer.start_span(...)`` + ``span.end()`` with the same attributes
   on the 100% provider, the floor that 3 is compared with;
5. the same bare span plus ``add_event("fin")``, as a wrapper that records the outcome
   as an event would (3 records it as status OK and an attribute instead);
6. the same span as a hand-written wrapper would make it: ``with
   tracer.start_as_current_span(...)`` (current while the handler runs) and
   ``add_event("fin")``.

Each case runs ``--repeat`` passes, interleaved; the best pass is printed (the machine's
other load only ever adds time).

The differences ("100% minus bare span", "... + event") are what the framework adds
around the SDK. They are measured on cases 3 to 5 again with a provider whose span
processor drops each span as it ends, after the other providers are shut down, so no
export thread runs: the BatchSpanProcessor's thread competes for the GIL and moves
single passes by several microseconds, more than the difference itself. Each is the median of the passes' paired differences (the
100% pass right before the bare one).
"""

from __future__ import annotations

import argparse
import contextvars
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from nsqworker.message import FINISH, Message
from nsqworker.task import TaskSpec
from nsqworker.telemetry.tracing import TaskInstrumentation


class DropExporter(SpanExporter):
    """Accepts every batch and does nothing with it."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def provider(sampler: ParentBased | None = None, batch: bool = True) -> TracerProvider:
    """An SDK TracerProvider with a BatchSpanProcessor (or, ``batch=False``, one that
    hands each span over as it ends) and a dropping exporter."""
    tp = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    if batch:
        tp.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=65536))
    else:
        tp.add_span_processor(SimpleSpanProcessor(DropExporter()))
    return tp


def messages(count: int) -> list[Message]:
    """Distinct messages as the consumer would hand them over."""
    return [
        Message(f"{i:016x}".encode(), b'{"id": 1}', 0, 1, "clicks", "archive", "127.0.0.1:4150")
        for i in range(count)
    ]


def per_message(run: Callable[[list[Message]], None], msgs: list[Message]) -> float:
    """Microseconds per message of one pass of ``run`` over ``msgs``."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        run(msgs)
        return (time.perf_counter() - started) / len(msgs) * 1e6
    finally:
        gc.enable()


def instrumented(inst: TaskInstrumentation) -> Callable[[list[Message]], None]:
    """start, the span's Context attached in a copy of the current one, end, per
    message, as the worker calls them (``end`` without a token only when it records a
    histogram); the worker copies the Context for every message, traced or not."""
    start, end = inst.start, inst.end
    attach, copy_context = otel_context.attach, contextvars.copy_context

    def run(msgs: list[Message]) -> None:
        for msg in msgs:
            token = start(msg)
            if token is not None:
                copy_context().run(attach, token[1])  # where the handler would run
            if token is not None or inst.timed:
                end(token, FINISH, None, 0.001)

    return run


def bare(
    tp: TracerProvider, inst: TaskInstrumentation, event: bool = False, current: bool = False
) -> Callable[[list[Message]], None]:
    """A bare SDK span with the attributes the instrumentation sets, prebuilt, and
    (``event``) the "fin" event it adds; ``current``: as ``start_as_current_span``."""
    tracer = tp.get_tracer("bench-bare")
    attrs: dict[str, Any] = {
        "messaging.system": "nsq",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "clicks",
        "messaging.consumer.group.name": "archive",
        "messaging.client.id": "bench",
        "server.address": "127.0.0.1",
        "server.port": 4150,
        "messaging.message.id": "0000000000000000",
        "messaging.nsq.message.attempts": 1,
        "messaging.message.body.size": 9,
        "messaging.nsq.outcome": "fin",
    }
    name, kind = inst.span_name, SpanKind.CONSUMER

    def run(msgs: list[Message]) -> None:
        for _ in msgs:
            span = tracer.start_span(name, kind=kind, attributes=attrs)
            if event:
                span.add_event("fin")
            span.end()

    def run_current(msgs: list[Message]) -> None:
        for _ in msgs:
            with tracer.start_as_current_span(name, kind=kind, attributes=attrs) as span:
                span.add_event("fin")

    return run_current if current else run


NO_SDK = "no SDK (global proxies)"
RATIO = "1% sampled (ParentBased ratio)"
FULL = "100% sampled, BatchSpanProcessor"
BARE = "bare SDK span, same attributes"
BARE_EVENT = "bare SDK span + 'fin' event"
BY_HAND = "start_as_current_span + 'fin' event"
FULL_SYNC = "100% sampled, no export thread"
BARE_SYNC = "bare SDK span, no export thread"
BARE_EVENT_SYNC = "bare SDK span + 'fin' event, no export thread"
OVER_BARE = "100% minus bare span"
OVER_BARE_EVENT = "100% minus bare span + event"


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Run the cases and print microseconds per message; returns them too."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=5_000, help="per pass")
    parser.add_argument("--repeat", type=int, default=30, help="passes; the best counts")
    args = parser.parse_args(argv)
    msgs = messages(args.messages)
    no_meter = NoOpMeterProvider()
    spec = TaskSpec("bench", "clicks", "archive", lambda msg: None, is_async=False)
    sampled_tp, ratio_tp = provider(), provider(ParentBased(TraceIdRatioBased(0.01)))

    def task(tp: TracerProvider | None) -> TaskInstrumentation:
        meter = None if tp is None else no_meter  # no SDK at all: the global proxies
        return TaskInstrumentation(
            spec, tracer_provider=tp, meter_provider=meter, client_id="bench"
        )

    sync_tp = provider(batch=False)
    full, ratio, full_sync = task(sampled_tp), task(ratio_tp), task(sync_tp)
    cases = {
        NO_SDK: instrumented(task(None)),
        RATIO: instrumented(ratio),
        FULL: instrumented(full),
        BARE: bare(sampled_tp, full),
        BARE_EVENT: bare(sampled_tp, full, event=True),
        BY_HAND: bare(sampled_tp, full, event=True, current=True),
    }
    synced = {
        FULL_SYNC: instrumented(full_sync),
        BARE_SYNC: bare(sync_tp, full_sync),
        BARE_EVENT_SYNC: bare(sync_tp, full_sync, event=True),
    }
    best = dict.fromkeys([*cases, *synced], float("inf"))
    for _ in range(args.repeat):
        for label, run in cases.items():
            best[label] = min(best[label], per_message(run, msgs))
    for tp in (sampled_tp, ratio_tp):
        tp.shutdown()  # no export thread may run beside the paired passes
    pairs: dict[str, list[float]] = {OVER_BARE: [], OVER_BARE_EVENT: []}
    for _ in range(args.repeat):
        passes = {label: per_message(run, msgs) for label, run in synced.items()}
        for label, us in passes.items():
            best[label] = min(best[label], us)
        pairs[OVER_BARE].append(passes[FULL_SYNC] - passes[BARE_SYNC])
        pairs[OVER_BARE_EVENT].append(passes[FULL_SYNC] - passes[BARE_EVENT_SYNC])
    for label, diffs in pairs.items():
        best[label] = statistics.median(diffs)
    for label, us in best.items():
        print(f"{label:38s} {us:8.2f} us/message")
    sync_tp.shutdown()
    return best


if __name__ == "__main__":
    main()
