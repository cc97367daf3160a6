"""A real broker per transport for the dead-letter tools' tests: settings that reach it,
the environment that points the ``nsqworker`` command at it, raw publishing (a foreign
message, envelopes in bulk) and a watcher of what reaches a topic."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from nsqworker.admin.nsq_store import CHANNEL
from nsqworker.consumer import Consumer
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory
from nsqworker.testing.ci import in_ci

TRANSPORTS = ["nsq", "nats", "rabbitmq-stream"]
ROOT = Path(__file__).resolve().parents[2]


class Broker:
    """One transport under test; ``topic`` is the task's, ``dead`` its dead-letter topic."""

    name: str

    def __init__(self, topic: str, dead: str) -> None:
        self.topic, self.dead = topic, dead
        self.target = topic + "_target"
        self._consumers: list[Consumer] = []
        self._producers: list[Any] = []

    def broker_settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """``NSQWORKER_*`` variables reaching the broker (for the command)."""
        raise NotImplementedError

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "retry_delay": 0.05, "backoff_multiplier": 0.0, "drain_timeout": 5.0,
            "log_level": "warning", "health_port": 0, "reconnect_delay": 0.05,
            "max_reconnect_delay": 0.5, "dial_timeout": 2.0,
        }  # fmt: skip
        return Settings(**(values | self.broker_settings() | overrides))

    def command_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
        return env | {"PYTHONPATH": str(ROOT)} | self.env() | extra

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "nsqworker", "dead-letters", *args]

    def make_producer(self) -> Any:
        from nsqworker import Producer

        return Producer(settings=self.settings())

    async def publish(self, topic: str, bodies: list[bytes]) -> None:
        if not self._producers:
            self._producers.append(self.make_producer())
        await self._producers[0].publish_many(topic, bodies)

    async def watch(self, topic: str) -> Callable[[], list[bytes]]:
        """The bodies that reach ``topic`` from now on (a consumer of its own)."""
        seen: list[bytes] = []

        def record(msg: Message) -> Outcome:
            seen.append(msg.body)
            return FINISH

        consumer = Consumer(topic, "watch", record, self.settings())
        await consumer.start()
        self._consumers.append(consumer)
        return lambda: list(seen)

    async def close(self) -> None:
        for consumer in self._consumers:
            await consumer.stop(0)
        for producer in self._producers:
            await producer.close()


class NsqBroker(Broker):
    """An nsqd (its HTTP port at TCP + 1, where the tools check the topic) on which a
    worker with this task already ran: the dead-letter topic has the tools' channel."""

    name = "nsq"

    def __init__(self, nsqd: Any) -> None:
        suffix = uuid.uuid4().hex[:8]
        super().__init__(f"dl_{suffix}", f"dl_{suffix}.dead")
        self.nsqd = nsqd
        nsqd.create_channel(self.dead, CHANNEL)  # as a worker starting with the task does

    def broker_settings(self) -> dict[str, Any]:
        return {"nsqd_tcp_addresses": [self.nsqd.tcp_address]}

    def env(self) -> dict[str, str]:
        return {"NSQWORKER_NSQD_TCP_ADDRESSES": self.nsqd.tcp_address}

    def make_producer(self) -> Any:
        from nsqworker.nsq.producer import Producer

        return Producer([self.nsqd.tcp_address])

    async def watch(self, topic: str) -> Callable[[], list[bytes]]:
        self.nsqd.create_channel(topic, "watch")
        return await super().watch(topic)


class NatsBroker(Broker):
    name = "nats"

    def __init__(self, server: Any) -> None:
        suffix = uuid.uuid4().hex[:8]
        super().__init__(f"dl.{suffix}", f"dl.{suffix}.dead")
        self.server = server

    def broker_settings(self) -> dict[str, Any]:
        return {"transport": "nats", "nats_servers": [self.server.url]}

    def env(self) -> dict[str, str]:
        return {"NSQWORKER_TRANSPORT": "nats", "NSQWORKER_NATS_SERVERS": self.server.url}


class StreamBroker(Broker):
    name = "rabbitmq-stream"

    def __init__(self, uri: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        super().__init__(f"dl_{suffix}", f"dl_{suffix}.dead")
        self.uri = uri

    def broker_settings(self) -> dict[str, Any]:
        return {"transport": "rabbitmq-stream", "rabbitmq_stream_uri": self.uri}

    def env(self) -> dict[str, str]:
        return {"NSQWORKER_TRANSPORT": "rabbitmq-stream", "NSQWORKER_RABBITMQ_STREAM_URI": self.uri}


@pytest.fixture(params=TRANSPORTS)
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    """Each transport in turn, on a real broker (started for the test, or the session's
    RabbitMQ)."""
    made: Broker
    if request.param == "nsq":
        factory: NsqdFactory = request.getfixturevalue("nsqd_factory")
        made = NsqBroker(factory())
    elif request.param == "nats":
        made = NatsBroker(request.getfixturevalue("nats_server"))
    else:
        made = StreamBroker(request.getfixturevalue("rabbitmq"))
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
def default_ports_nsqd(nsqd_factory: NsqdFactory) -> NsqdFactory:
    """Starts nsqd whose HTTP port is its TCP port + 1 (nsqd's own defaults, 4150 and
    4151), where the dead-letter tools look for the HTTP API of an nsqd given in
    ``nsqd_tcp_addresses``: every nsqd of the testing plugin is started so."""
    return nsqd_factory


@pytest.fixture(params=["nats", "rabbitmq-stream"])
async def client_broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    """NATS and RabbitMQ Streams, whose official clients the tests read with."""
    made: Broker
    if request.param == "nats":
        made = NatsBroker(request.getfixturevalue("nats_server"))
    else:
        made = StreamBroker(request.getfixturevalue("rabbitmq"))
    try:
        yield made
    finally:
        await made.close()


def official_tool(path: Path, what: str) -> Path:
    """``path`` under this checkout; a missing tool skips, or fails under CI (it is
    installed by scripts/install-tools)."""
    if path.exists():
        return path
    message = f"{what} is missing at {path}: run scripts/install-tools"
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def read_with_official_client() -> Callable[[Broker, str, int], Any]:
    """:func:`official_read`, for the tests (a conftest is not importable from them)."""
    return official_read


async def official_read(broker: Broker, topic: str, count: int) -> list[str]:
    """The bodies on ``topic`` as the broker's official client reads them: the ``nats``
    CLI (natscli), or the Java ``com.rabbitmq:stream-client``."""
    import asyncio
    import shutil
    import subprocess

    if isinstance(broker, NatsBroker):
        nats = official_tool(ROOT / ".tools" / "bin" / "nats", "the nats CLI")
        command = [str(nats), "--server", broker.server.url, "sub", topic, "--all", "--raw",
                   "--count", str(count), "--wait", "30s"]  # fmt: skip
    else:
        from nsqworker.streams.client import Endpoint

        lib = ROOT / ".tools" / "java" / "lib"
        official_tool(lib / "stream-client-1.11.0.jar", "com.rabbitmq:stream-client")
        java = shutil.which("java") or str(official_tool(Path("/usr/bin/java"), "java"))
        e = Endpoint.from_settings(broker.settings())
        source = Path(__file__).with_name("StreamRead.java")
        command = [java, "-cp", f"{lib}/*", str(source), e.host, str(e.port), e.vhost,
                   e.username, e.password, topic, str(count), "60"]  # fmt: skip

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    done = await asyncio.to_thread(run)
    assert done.returncode == 0, f"{command[0]} failed: {done.stderr[-2000:]}"
    return [line for line in done.stdout.splitlines() if line.strip()]
