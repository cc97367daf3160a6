"""Latency: a paced publisher and a Worker that notes how old each message is.

``publisher`` sends ``rate`` PUBs per second for ``seconds`` on a bare connection,
pipelined (never waiting for an ack), each body carrying ``time.time_ns()`` of its
send. ``worker`` runs the full @task path with an
async handler computing ``time.time_ns() - sent``; both processes read the same
system clock.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from bench.common import BODY_SIZE, CHANNEL, emit_event, loop_label, run_on

TICK = 0.001
WARMUP_FRACTION = 0.1
"""Latencies of the first 10% of messages (connections warming up) are left out."""


def stamp() -> bytes:
    """A body of BODY_SIZE bytes starting with the send time in ns."""
    return b"%d " % time.time_ns() + b"x" * (BODY_SIZE - 20)


def publisher(params: dict[str, Any]) -> dict[str, Any]:
    loop = params.get("loop", "uvloop")
    return {**run_on(loop, _publisher(params)), "loop": loop_label(loop)}


async def _publisher(params: dict[str, Any]) -> dict[str, Any]:
    """Every TICK, write the PUBs now due in one go, each stamped as it is encoded.

    A bare connection (no IDENTIFY: nsqd does not need one to publish) with acks
    counted as they come, so the publisher never limits the offered rate; the
    Producer's own speed is what the publish case measures.
    """
    from nsqworker.nsq import protocol

    rate, total, topic = params["rate"], params["count"], params["topic"]
    host, _, port = params["address"].rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(protocol.MAGIC_V2)
    acks = asyncio.ensure_future(_count_acks(reader, writer, total))
    started = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(int((time.perf_counter() - started) * rate) + 1, total)
        writer.write(b"".join(protocol.pub(topic, stamp()) for _ in range(due - sent)))
        sent = due
        await asyncio.sleep(TICK)
    elapsed = time.perf_counter() - started
    errors = await asyncio.wait_for(acks, 30)
    writer.close()
    return {"sent": sent, "offered_rate": sent / elapsed, "errors": errors}


async def _count_acks(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, total: int
) -> int:
    """Read nsqd's answers until ``total`` PUBs were answered; return the errors."""
    from nsqworker.nsq import protocol

    decoder = protocol.Decoder()
    answered = errors = 0
    while answered < total:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("nsqd closed the publishing connection")
        for frame in decoder.feed(data):
            if isinstance(frame, protocol.Response) and frame.data == protocol.HEARTBEAT:
                writer.write(protocol.nop())
                continue
            answered += 1
            errors += isinstance(frame, protocol.ErrorFrame)
    return errors


def worker(params: dict[str, Any]) -> dict[str, Any]:
    loop = params.get("loop", "uvloop")
    return {**run_on(loop, _worker(params)), "loop": loop_label(loop)}


async def _worker(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.logging import configure_logging
    from nsqworker.message import Message
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    settings = Settings(
        nsqd_tcp_addresses=[params["address"]], log_level="warning", **params["settings"]
    )
    configure_logging(settings.log_level, "console")
    total = params["count"]
    latencies: list[int] = []
    done = asyncio.Event()
    registry = Registry()

    @registry.task(params["topic"], channel=CHANNEL, max_in_flight=params["max_in_flight"])
    async def handle(msg: Message) -> None:
        now = time.time_ns()
        latencies.append(now - int(msg.body.split(b" ", 1)[0]))
        if len(latencies) >= total:
            done.set()

    async with Worker(registry, settings) as worker:
        while not worker.ready:
            await asyncio.sleep(0.01)
        emit_event("ready")
        try:
            await asyncio.wait_for(done.wait(), params["timeout"])
        except TimeoutError:
            pass
    return summarize(latencies, total)


def summarize(latencies_ns: list[int], expected: int) -> dict[str, Any]:
    """p50/p99/p99.9/max in ms, leaving out the warm-up."""
    if len(latencies_ns) < expected:
        return {"error": f"received {len(latencies_ns)} of {expected} messages"}
    kept = sorted(latencies_ns[int(len(latencies_ns) * WARMUP_FRACTION) :])
    cuts = statistics.quantiles(kept, n=1000, method="inclusive")
    return {
        "received": len(latencies_ns),
        "p50_ms": statistics.median(kept) / 1e6,
        "p99_ms": cuts[989] / 1e6,
        "p999_ms": cuts[998] / 1e6,
        "max_ms": kept[-1] / 1e6,
    }
