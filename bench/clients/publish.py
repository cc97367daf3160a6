"""Publish: the measuring processes (``bench.child publish:ours`` / ``publish:pynsq``).

Each publishes 100-byte bodies for ``seconds`` and counts what nsqd acknowledged, in
one of three shapes (``params["mode"]``):

* ``pub`` - PUB, each awaited before the next;
* ``concurrent`` - ``batch`` publishes at once (``asyncio.gather``, which our Producer
  sends as one MPUB per loop turn; for pynsq, ``batch`` ``Writer.pub`` calls with
  callbacks, a PUB each; ``raw``: ``batch`` PUBs in one write on a bare socket, the
  limit of a PUB each), then the next ``batch`` once all are acked;
* ``mpub`` - MPUB of ``batch`` bodies, each awaited before the next;
* ``mpub4`` - the same MPUBs, ``pipeline`` (4) sent at once and awaited together (ours).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import BODY_SIZE, loop_label, memory_fields, run_on

BODY = b"x" * BODY_SIZE
WARMUP = 0.2


def _report(count: int, started: float, cpu: float) -> dict[str, Any]:
    elapsed = time.perf_counter() - started
    return {
        "count": count,
        "elapsed": elapsed,
        "rate": count / elapsed,
        "cpu": (time.process_time() - cpu) / elapsed,
    }


# --- ours ---------------------------------------------------------------------------


def ours(params: dict[str, Any]) -> dict[str, Any]:
    """nsqworker's Producer (one connection, pipelined)."""
    loop = params.get("loop", "uvloop")
    result = run_on(loop, _ours(params))
    return {**result, **memory_fields(), "loop": loop_label(loop)}


async def _ours(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.nsq.producer import Producer

    logging.basicConfig(level=logging.WARNING)
    topic, mode = params["topic"], params["mode"]
    batch: int = params["batch"]
    bodies = [BODY] * batch
    async with Producer([params["address"]], envelope=False, timeout=30) as producer:

        async def pub() -> int:
            await producer.publish(topic, BODY)
            return 1

        async def concurrent() -> int:
            await asyncio.gather(*(producer.publish(topic, BODY) for _ in range(batch)))
            return batch

        async def mpub() -> int:
            await producer.publish_many(topic, bodies)
            return batch

        pipeline: int = params.get("pipeline", 4)

        async def mpub4() -> int:
            # Up to `pipeline` MPUBs outstanding on the one connection.
            await asyncio.gather(*(producer.publish_many(topic, bodies) for _ in range(pipeline)))
            return batch * pipeline

        step = {"pub": pub, "concurrent": concurrent, "mpub": mpub, "mpub4": mpub4}[mode]
        await _repeat(step, WARMUP)
        started, cpu = time.perf_counter(), time.process_time()
        count = await _repeat(step, params["seconds"])
        return _report(count, started, cpu)


async def _repeat(step: Callable[[], Awaitable[int]], seconds: float) -> int:
    count = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        count += await step()
    return count


# --- a bare socket: the limit of a PUB each -----------------------------------------


def raw(params: dict[str, Any]) -> dict[str, Any]:
    """``batch`` PUBs written at once on a bare socket, then their answers read and
    checked, then the next ``batch``: what one connection carries when nsqd answers
    every PUB with a write of its own (the ``concurrent`` shape's limit)."""
    loop = params.get("loop", "uvloop")
    result = run_on(loop, _raw(params))
    return {**result, **memory_fields(), "loop": loop_label(loop)}


async def _raw(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.nsq import protocol

    host, _, port = params["address"].rpartition(":")
    batch: int = params["batch"]
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(protocol.MAGIC_V2)
    burst = protocol.pub(params["topic"], BODY) * batch
    answers = protocol.encode_frame(protocol.Response(protocol.OK)) * batch

    async def step() -> int:
        writer.write(burst)
        got = await reader.readexactly(len(answers))
        if got != answers:
            raise RuntimeError(f"nsqd did not answer every PUB with OK: {got[:64]!r}")
        return batch

    try:
        await _repeat(step, WARMUP)
        started, cpu = time.perf_counter(), time.process_time()
        count = await _repeat(step, params["seconds"])
        return _report(count, started, cpu)
    finally:
        writer.close()


# --- pynsq --------------------------------------------------------------------------


def pynsq(params: dict[str, Any]) -> dict[str, Any]:
    """pynsq's Writer on tornado: the next command is sent from the ack callback."""
    import nsq
    import tornado
    import tornado.ioloop

    logging.basicConfig(level=logging.WARNING)
    asyncio.set_event_loop(asyncio.new_event_loop())
    ioloop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([params["address"]])
    bench = _PynsqBench(writer, params, ioloop.stop)

    def wait_connected() -> None:
        if writer.conns:
            bench.start(WARMUP, measure=False)
        else:
            ioloop.call_later(0.01, wait_connected)

    ioloop.add_callback(wait_connected)
    ioloop.call_later(params["seconds"] + WARMUP + 30, ioloop.stop)
    ioloop.start()
    if bench.error:
        raise RuntimeError(bench.error)
    if not bench.result:
        raise RuntimeError("pynsq Writer did not finish in time")
    loop = f"tornado {tornado.version} on asyncio, pynsq {nsq.__version__}"
    return {**bench.result, **memory_fields(), "loop": loop}


class _PynsqBench:
    """Drives a pynsq Writer in one of the three shapes, from its ack callbacks."""

    def __init__(self, writer: Any, params: dict[str, Any], stop: Callable[[], None]) -> None:
        self.writer = writer
        self.topic, self.mode, self.batch = params["topic"], params["mode"], params["batch"]
        self.seconds = params["seconds"]
        self.stop = stop
        self.bodies = [BODY] * self.batch
        self.measure = False
        self.count = self.pending = 0
        self.deadline = self.started = self.cpu = 0.0
        self.error = ""
        self.result: dict[str, Any] = {}

    def start(self, seconds: float, measure: bool) -> None:
        self.measure = measure
        self.count = 0
        self.started, self.cpu = time.perf_counter(), time.process_time()
        self.deadline = self.started + seconds
        self.send()

    def send(self) -> None:
        if self.mode == "pub":
            self.pending = 1
            self.writer.pub(self.topic, BODY, self.acked)
        elif self.mode == "concurrent":
            self.pending = self.batch
            for _ in range(self.batch):
                self.writer.pub(self.topic, BODY, self.acked)
        else:
            self.pending = 1
            self.writer.mpub(self.topic, self.bodies, self.acked)

    def acked(self, conn: Any, data: Any) -> None:
        import nsq

        if isinstance(data, nsq.Error):
            self.error = f"pynsq publish failed: {data}"
            self.stop()
            return
        self.pending -= 1
        if self.pending:
            return
        self.count += 1 if self.mode == "pub" else self.batch
        if time.perf_counter() < self.deadline:
            self.send()
        elif not self.measure:
            self.start(self.seconds, measure=True)
        else:
            self.result = _report(self.count, self.started, self.cpu)
            self.stop()
