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
from typing import Any

from bench.common import CHANNEL, Clock, loop_label, memory_fields, run_on

# Throughput is compared at nsqd's own output buffering (16 KiB / 250 ms), which pynsq
# and bench_reader use; nsqworker's default turns it off for latency (see latency.py).
NSQD_BUFFERING: dict[str, Any] = {"output_buffer_size": 16384, "output_buffer_timeout": 0.25}


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """The full @task path: Registry, Worker, a no-op handler (``params["mode"]``:
    "async" or "sync"), tracing off, logs at warning."""
    loop = params.get("loop", "uvloop")
    result = run_on(loop, _worker(params))
    threads = threading.active_count()
    return {**result, **memory_fields(), "loop": loop_label(loop), "threads": threads}


async def _worker(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.logging import configure_logging
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    settings = Settings(
        nsqd_tcp_addresses=[params["address"]], log_level="warning", **NSQD_BUFFERING
    )
    configure_logging(settings.log_level, "console")
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    clock = Clock(params["count"], lambda: loop.call_soon_threadsafe(done.set))
    hit = clock.hit
    registry = Registry()
    declare = registry.task(
        params["topic"], channel=CHANNEL, max_in_flight=params["max_in_flight"], name="bench"
    )
    if params["mode"] == "async":

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
