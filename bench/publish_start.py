"""How long a first publish takes after connecting, on RabbitMQ Streams and on NATS.

    python -m bench.publish_start [--runs 5]

What ``nsqworker publish`` does once, split into its phases (each run a fresh producer on
a stream or subject of its own, in one process, so imports are not counted): connect,
the first publish until it is confirmed (the stream or JetStream stream created on the
way), and close. One RabbitMQ 4.0 (``scripts/install-tools rabbitmq``) and one
nats-server are started here. Goal (issue 40): the first publish under 0.1 s after
connect on both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from nsqworker.nats import NatsProducer
from nsqworker.settings import Settings
from nsqworker.streams import StreamProducer
from nsqworker.testing.nats import NatsServerProcess
from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

PHASES = ("connect", "first publish", "close")


async def phases(producer: Any, topic: str) -> dict[str, float]:
    """Seconds of each phase for one fresh producer."""
    started = time.perf_counter()
    await producer.connect()
    connected = time.perf_counter()
    await producer.publish(topic, b"x")
    published = time.perf_counter()
    await producer.close()
    closed = time.perf_counter()
    return {"connect": connected - started, "first publish": published - connected,
            "close": closed - published}  # fmt: skip


async def measure(make: Any, runs: int) -> dict[str, float]:
    """Median seconds of each phase over ``runs`` fresh producers."""
    samples = [await phases(make(), f"start_{uuid.uuid4().hex[:8]}") for _ in range(runs)]
    return {p: statistics.median(s[p] for s in samples) for p in PHASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    with RabbitMQProcess(find_rootfs(Path.cwd())) as rabbit, NatsServerProcess() as nats:
        streams = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=rabbit.uri)
        jetstream = Settings(transport="nats", nats_servers=[nats.url])
        results = {
            "rabbitmq-stream": asyncio.run(measure(lambda: StreamProducer(settings=streams), runs)),
            "nats": asyncio.run(measure(lambda: NatsProducer(settings=jetstream), runs)),
        }
    print(f"| transport | {' | '.join(PHASES)} |")
    print(f"|---|{'---|' * len(PHASES)}")
    for name, median in results.items():
        print(f"| {name} | " + " | ".join(f"{median[p] * 1000:.1f} ms" for p in PHASES) + " |")


if __name__ == "__main__":
    main()
