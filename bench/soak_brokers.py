"""The brokers of ``make soak``, one class per transport: start them, publish to them,
restart one, and tell the worker where they are.

Each runs on free loopback ports with the project's own test helpers (the same
servers the suite uses) and each publish waits for the broker's acknowledgement, so a
batch counts as published only once the broker has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from typing import Any, Protocol

from nsqworker.settings import Settings
from nsqworker.testing import NsqdProcess, NsqlookupdProcess
from nsqworker.testing.nats import NatsCluster
from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

__all__ = ["BROKERS", "Brokers"]

TOPIC, CHANNEL = "soak", "worker"
# What a killed worker held comes back after this many seconds (NSQ msg_timeout, NATS
# ack_wait; on RabbitMQ Streams a new consumer re-reads from the stored offset).
HOLD = 10


class Brokers(Protocol):
    """One transport's servers for a soak."""

    name: str
    nodes: int
    """How many servers publishes can go to (one is restarted at a time)."""
    what_restarts: str
    setup: str
    """The servers, in words, for the report."""

    def start(self, stack: contextlib.ExitStack) -> None: ...
    def worker_env(self) -> dict[str, str]: ...
    async def publish(self, node: int, bodies: list[str]) -> None: ...
    async def close_publishers(self) -> None: ...
    def restart(self, node: int, down: float) -> None: ...
    def stalled(self) -> bool:
        """Whether the broker shows a backlog that no consumer may receive (NSQ: every
        connection at RDY 0 with nothing in flight); False where it cannot tell."""
        ...


class NsqBrokers:
    """Three nsqd registered with one nsqlookupd; the worker finds them through lookupd."""

    name = "nsq"
    nodes = 3
    what_restarts = "nsqd"
    setup = "3 nsqd and one nsqlookupd, an nsqd restarted with SIGTERM"

    def start(self, stack: contextlib.ExitStack) -> None:
        self.lookupd = stack.enter_context(NsqlookupdProcess())
        self.nsqds = [stack.enter_context(NsqdProcess([self.lookupd])) for _ in range(3)]
        for nsqd in self.nsqds:
            nsqd.create_channel(TOPIC, CHANNEL)

    def worker_env(self) -> dict[str, str]:
        return {
            "NSQWORKER_LOOKUPD_HTTP_ADDRESSES": self.lookupd.http_address,
            "NSQWORKER_LOOKUPD_POLL_INTERVAL": "5",
            "NSQWORKER_RECONNECT_DELAY": "0.2",
            "NSQWORKER_MAX_RECONNECT_DELAY": "2",
            "NSQWORKER_MSG_TIMEOUT": str(HOLD),
        }

    async def publish(self, node: int, bodies: list[str]) -> None:
        await asyncio.to_thread(self.nsqds[node].mpublish, TOPIC, bodies)

    async def close_publishers(self) -> None:
        pass

    def restart(self, node: int, down: float) -> None:
        nsqd = self.nsqds[node]
        nsqd.stop()
        time.sleep(down)  # down for a moment: consumers notice, producers go elsewhere
        nsqd.restart()

    def stalled(self) -> bool:
        depth = 0
        channels = []
        detail = []
        for i, nsqd in enumerate(self.nsqds):
            with contextlib.suppress(Exception):
                for topic in nsqd.stats(TOPIC, CHANNEL)["topics"]:
                    for channel in topic.get("channels") or ():
                        depth += int(channel.get("depth") or 0)
                        channels.append(channel)
                        rdy = [int(c.get("ready_count") or 0) for c in channel.get("clients") or ()]
                        detail.append(f"nsqd {i + 1}: depth {channel.get('depth')}, RDY {rdy}")
        self.detail = "; ".join(detail)
        clients = [c for ch in channels for c in ch.get("clients") or ()]
        idle = all(int(c.get("ready_count") or 0) == 0 for c in clients)
        in_flight = sum(int(ch.get("in_flight_count") or 0) for ch in channels)
        return depth > 0 and bool(clients) and idle and in_flight == 0


class _ClientBrokers:
    """A broker reached with its transport's own producer (one per node)."""

    name = ""
    nodes = 1
    what_restarts = ""
    setup = ""

    def __init__(self) -> None:
        self._producers: dict[int, Any] = {}

    def settings(self, node: int) -> Settings:
        raise NotImplementedError

    def make_producer(self, node: int) -> Any:
        raise NotImplementedError

    async def publish(self, node: int, bodies: list[str]) -> None:
        producer = self._producers.get(node)
        if producer is None:
            producer = self._producers[node] = self.make_producer(node)
        try:
            await producer.publish_many(TOPIC, [b.encode() for b in bodies])
        except BaseException:
            self._producers.pop(node, None)
            with contextlib.suppress(Exception):
                await producer.close()
            raise

    async def close_publishers(self) -> None:
        for producer in self._producers.values():
            with contextlib.suppress(Exception):
                await producer.close()
        self._producers.clear()

    def stalled(self) -> bool:
        return False


class NatsBrokers(_ClientBrokers):
    """A 3-node nats-server cluster with JetStream and the worker's streams at replicas 3;
    a node is lost with SIGKILL (a crash, under load) and started again on its store,
    where it catches up from the other two."""

    name = "nats"
    nodes = 3
    what_restarts = "nats-server node"
    setup = "a 3-node nats-server cluster, streams at replicas 3, a node killed with SIGKILL"

    def start(self, stack: contextlib.ExitStack) -> None:
        self.cluster = stack.enter_context(NatsCluster(3, name="soak"))

    def worker_env(self) -> dict[str, str]:
        return {
            "NSQWORKER_TRANSPORT": "nats",
            "NSQWORKER_NATS_SERVERS": ",".join(self.cluster.urls),
            "NSQWORKER_NATS_STREAM_REPLICAS": "3",
            "NSQWORKER_MSG_TIMEOUT": str(HOLD),
        }

    def make_producer(self, node: int) -> Any:
        from nsqworker.nats import NatsProducer

        url = self.cluster.servers[node].url
        return NatsProducer(settings=Settings(transport="nats", nats_servers=[url]))

    def restart(self, node: int, down: float) -> None:
        server = self.cluster.servers[node]
        server.kill()
        time.sleep(down)
        server.start()


class StreamBrokers(_ClientBrokers):
    """RabbitMQ 4.0 with the stream plugin, in the project's root filesystem."""

    name = "rabbitmq-stream"
    what_restarts = "RabbitMQ"
    setup = "RabbitMQ 4.0 restarted with SIGTERM"

    def start(self, stack: contextlib.ExitStack) -> None:
        self.server = stack.enter_context(RabbitMQProcess(find_rootfs()))

    def worker_env(self) -> dict[str, str]:
        return {
            "NSQWORKER_TRANSPORT": "rabbitmq-stream",
            "NSQWORKER_RABBITMQ_STREAM_URI": self.server.uri,
        }

    def make_producer(self, node: int) -> Any:
        from nsqworker.streams import StreamProducer

        settings = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=self.server.uri)
        return StreamProducer(settings=settings)

    def restart(self, node: int, down: float) -> None:
        self.server.stop()
        time.sleep(down)
        self.server.start()


BROKERS: dict[str, type[Brokers]] = {
    "nsq": NsqBrokers,
    "nats": NatsBrokers,
    "rabbitmq-stream": StreamBrokers,
}


def stalls_reported(health_port: int) -> int:
    """``nsqworker_backoff_stalls_total`` from the supervisor's /metrics (0 if absent)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0
    total = 0.0
    for line in text.splitlines():
        if line.startswith("nsqworker_backoff_stalls_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
