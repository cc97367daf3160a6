"""NATS's own client as the limit: natscli v0.5.0 (``nats bench``, nats.go inside,
``scripts/install-tools nats``), and our NatsProducer's publish shapes beside its
publishers.

* consume: ``nats bench js consume --stream S --msgs N`` reads a stream already holding
  ``N`` messages of 100 B through a durable consumer (explicit acks, ``--batch 500``
  buffered in the client, its defaults); its own figure, first to last message received.
* publish, one at a time: ``nats bench js pub sync`` (each publish waits for the stream's
  ack) against ``NatsProducer.publish`` awaited one by one.
* publish, many outstanding: ``nats bench js pub async --batch 1000`` (1,000 publishes
  out, then their acks) against 1,000 ``NatsProducer.publish`` at once
  (``asyncio.gather``) and ``NatsProducer.publish_many`` of 100.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

from bench.env import ROOT, BenchError, child_env, run_tool, tool

BODY_SIZE = 100
_STATS = re.compile(r"stats: ([\d,]+) msgs/sec")

PUBLISH_MODES = {
    "one": ("NatsProducer.publish, one at a time", "sync"),
    "concurrent": ("NatsProducer.publish, 1,000 at once", "async"),
    "batch": ("NatsProducer.publish_many of 100, one at a time", "async"),
}
"""Our shape -> (label, the natscli publisher it is shown against)."""
NATSCLI_PUBLISH = {
    "sync": "natscli `nats bench js pub sync` (one at a time)",
    "async": "natscli `nats bench js pub async --batch 1000`",
}


def _natscli(url: str, *args: str, timeout: float) -> float:
    argv = [tool("nats"), "-s", url, "bench", "js", *args, "--no-progress"]
    out = run_tool(argv, timeout=timeout)
    match = _STATS.search(out)
    if match is None:
        raise BenchError(f"no stats line from {' '.join(argv[3:])}: {out.strip()[-300:]!r}")
    return float(match.group(1).replace(",", ""))


def natscli_version() -> str:
    """``nats`` (natscli) version, e.g. ``v0.5.0``."""
    out = subprocess.run([tool("nats"), "--version"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip()


def natscli_consume(url: str, stream: str, count: int, timeout: float = 120) -> float:
    """Msgs/s of ``nats bench js consume`` draining ``stream`` (``count`` messages)."""
    return _natscli(url, "consume", "--stream", stream, "--msgs", str(count), timeout=timeout)


def natscli_publish(url: str, kind: str, stream: str, count: int, timeout: float = 120) -> float:
    """Msgs/s of natscli's ``sync`` or ``async`` (batch 1000) JetStream publisher."""
    extra = ["--batch", "1000"] if kind == "async" else []
    return _natscli(
        url, "pub", kind, f"{stream}.in", "--stream", stream, "--create", "--msgs", str(count),
        "--size", str(BODY_SIZE), *extra, timeout=timeout,
    )  # fmt: skip


OURS_PUBLISH = """
import asyncio, json, os, sys, time
from nsqworker.nats import NatsProducer
from nsqworker.settings import Settings

async def main(url, mode, subject, count):
    body = b"x" * 100
    settings = Settings(transport="nats", nats_servers=[url])
    async with NatsProducer(settings=settings) as producer:
        await producer.publish(subject, body)  # the stream is created before the clock
        start = time.perf_counter()
        sent = 0
        while sent < count:
            if mode == "one":
                await producer.publish(subject, body)
                sent += 1
            elif mode == "concurrent":
                n = min(1000, count - sent)
                await asyncio.gather(*(producer.publish(subject, body) for _ in range(n)))
                sent += n
            else:
                n = min(100, count - sent)
                await producer.publish_many(subject, [body] * n)
                sent += n
        print(json.dumps({"rate": count / (time.perf_counter() - start)}))

asyncio.run(main(*sys.argv[1:4], int(sys.argv[4])))
"""


def ours_publish(url: str, mode: str, subject: str, count: int, timeout: float = 180) -> float:
    """Msgs/s of our NatsProducer in the ``mode`` shape, in a process of its own."""
    argv = [sys.executable, "-c", OURS_PUBLISH, url, mode, subject, str(count)]
    env = child_env(ROOT)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise BenchError(f"NatsProducer {mode}: exited {out.returncode}: {out.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["rate"])
