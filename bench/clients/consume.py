"""Consume: the measuring processes, one per client (``bench.child consume:<function>``).

* :func:`worker` - the full ``@task`` path, a no-op async or sync handler;
* :func:`consumer` - the raw :class:`~nsqworker.consumer.Consumer`, a callback
  returning FINISH;
* :func:`pynsq_reader` - pynsq's ``Reader`` on tornado, ``message_handler`` returning True.

Each one times from the first message its handler sees to the ``count``-th (connect and
SUB are left out; ``wall`` includes them) and reports its own peak RSS.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.common import CHANNEL, Clock, loop_label, memory_fields, run_on

# Throughput is compared at nsqd's own output buffering (16 KiB / 250 ms), which pynsq
# and bench_reader use; nsqworker's default turns it off for latency (see latency.py).
NSQD_BUFFERING: dict[str, Any] = {"output_buffer_size": 16384, "output_buffer_timeout": 0.25}


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """The full @task path: Registry, Worker, a no-op handler (``params["mode"]``:
    "async" or "sync"), logs at warning. ``params["tracing"]`` (see
    :func:`tracing`): absent, no OpenTelemetry SDK at all."""
    loop = params.get("loop", "uvloop")
    result = run_on(loop, _worker(params))
    threads = threading.active_count()
    return {**result, **memory_fields(), "loop": loop_label(loop), "threads": threads}


def tracing(mode: str) -> Callable[[], None] | None:
    """Set up the SDK of a traced run; returns what the handler calls per message.

    "full" and "ratio" install a global SDK TracerProvider, so the worker traces: every
    message (the default ParentBased(AlwaysOn)) or 1% (ParentBased(
    TraceIdRatioBased(0.01))). "bare" installs none (the worker does not trace) and
    returns a function that makes one bare SDK span with the process span's 11
    attributes (``start_span`` + ``end``), for the handler to call: the floor the
    traced runs are compared with, paid under the same conditions. Spans go through a
    BatchSpanProcessor to an exporter that drops them.
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from opentelemetry.trace import SpanKind

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    sampler = ParentBased(TraceIdRatioBased(0.01)) if mode == "ratio" else None
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536))
    if mode != "bare":
        trace.set_tracer_provider(provider)
        return None
    start_span = provider.get_tracer("bench-bare").start_span
    name, kind = "process bench", SpanKind.CONSUMER
    attrs: dict[str, Any] = {
        "messaging.system": "nsq",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "bench",
        "messaging.consumer.group.name": CHANNEL,
        "messaging.client.id": "bench",
        "server.address": "127.0.0.1",
        "server.port": 4150,
        "messaging.message.id": "0000000000000000",
        "messaging.nsq.message.attempts": 1,
        "messaging.message.body.size": 100,
        "messaging.nsq.outcome": "fin",
    }

    def bare_span() -> None:
        start_span(name, kind=kind, attributes=attrs).end()

    return bare_span


async def _worker(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.logging import configure_logging
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    buffering = params.get("settings", NSQD_BUFFERING)
    settings = Settings(nsqd_tcp_addresses=[params["address"]], log_level="warning", **buffering)
    configure_logging(settings.log_level, "console")
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    clock = Clock(params["count"], lambda: loop.call_soon_threadsafe(done.set))
    hit = clock.hit
    registry = Registry()
    declare = registry.task(
        params["topic"], channel=CHANNEL, max_in_flight=params["max_in_flight"], name="bench"
    )
    bare_span = tracing(params["tracing"]) if params.get("tracing") else None
    if bare_span is not None:

        async def handle_with_span(msg: Any) -> None:
            bare_span()
            hit()

        declare(handle_with_span)
    elif params["mode"] == "async":

        async def handle(msg: Any) -> None:
            hit()

        declare(handle)
    else:

        def handle_sync(msg: Any) -> None:
            hit()

        declare(handle_sync)
    started = time.perf_counter()
    async with Worker(registry, settings):
        await _wait(done, params["timeout"])
        threads = threading.active_count()
    return {**clock.result(started), "threads_running": threads}


def consumer(params: dict[str, Any]) -> dict[str, Any]:
    """The raw Consumer with a callback that returns FINISH."""
    loop = params.get("loop", "uvloop")
    result = run_on(loop, _consumer(params))
    return {**result, **memory_fields(), "loop": loop_label(loop)}


async def _consumer(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.consumer import Consumer
    from nsqworker.message import FINISH, Finish, Message
    from nsqworker.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    settings = Settings(
        nsqd_tcp_addresses=[params["address"]], log_level="warning", **NSQD_BUFFERING
    )
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    clock = Clock(params["count"], lambda: loop.call_soon_threadsafe(done.set))
    hit = clock.hit

    def callback(msg: Message) -> Finish:
        hit()
        return FINISH

    consumer = Consumer(
        params["topic"], CHANNEL, callback, settings, max_in_flight=params["max_in_flight"]
    )
    started = time.perf_counter()
    await consumer.start()
    try:
        await _wait(done, params["timeout"])
    finally:
        await consumer.stop()
    return clock.result(started)


async def _wait(done: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except TimeoutError:
        pass


def pynsq_reader(params: dict[str, Any]) -> dict[str, Any]:
    """pynsq's Reader on its tornado IOLoop; the handler returns True (FIN)."""
    import nsq
    import tornado
    import tornado.ioloop

    logging.basicConfig(level=logging.WARNING)
    asyncio.set_event_loop(asyncio.new_event_loop())
    ioloop = tornado.ioloop.IOLoop.current()
    clock = Clock(params["count"], lambda: ioloop.add_callback(ioloop.stop))
    hit = clock.hit

    def handler(message: Any) -> bool:
        hit()
        return True

    started = time.perf_counter()
    reader = nsq.Reader(
        topic=params["topic"],
        channel=CHANNEL,
        message_handler=handler,
        nsqd_tcp_addresses=[params["address"]],
        max_in_flight=params["max_in_flight"],
    )
    ioloop.call_later(params["timeout"], ioloop.stop)
    ioloop.start()
    result = clock.result(started)
    reader.close()
    loop = f"tornado {tornado.version} on asyncio, pynsq {nsq.__version__}"
    return {**result, **memory_fields(), "loop": loop}
