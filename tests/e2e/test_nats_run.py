"""``nsqworker run --transport nats`` as a user runs it: ready only when bound, metrics
and spans say NATS, SIGTERM drains with nothing lost, a refused login exits 2 once."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsqworker.nats import NatsProducer
from nsqworker.settings import Settings
from nsqworker.testing import wait_for
from nsqworker.testing.nats import NatsServerProcess

TASKS = """
import asyncio
import os

from nsqworker.task import task


@task("e2e.nats", channel="c", max_in_flight=10)
async def slow(msg):
    await asyncio.sleep(float(os.environ.get("HANDLER_SLEEP", "0.2")))
    fd = os.open(os.environ["HANDLED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, msg.body + b"\\n")
    finally:
        os.close(fd)
"""
Start = Callable[..., Any]
Write = Callable[[str, str], str]


def publish(url: str, bodies: list[bytes]) -> None:
    async def send() -> None:
        settings = Settings(transport="nats", nats_servers=[url])
        async with NatsProducer(settings=settings) as producer:
            await producer.publish_many("e2e.nats", bodies)

    asyncio.run(send())


def handled(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_sigterm_drains_and_a_second_run_handles_the_rest(
    supervise: Start, write_module: Write, nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    module = write_module("nats_tasks", TASKS)
    env = {"NSQWORKER_DRAIN_TIMEOUT": "5", "HANDLER_SLEEP": "0.2"}
    args = (module, "--transport", "nats", "--nats", nats_server.url)
    run = supervise(*args, "--workers", "2", env=env)
    body = run.wait_ready()
    assert body["transport"] == "nats", body
    publish(nats_server.url, [f"m{i}".encode() for i in range(300)])
    path = tmp_path / "handled.txt"
    wait_for(lambda: len(handled(path)) >= 40, 30, message=run.output)
    status, metrics = run.get("/metrics")
    assert status == 200 and 'messaging_system="nats"' in metrics, metrics[-2000:]

    started = time.monotonic()
    run.signal(signal.SIGTERM)
    assert run.wait(15) == 0, run.output()
    assert time.monotonic() - started < 10
    first = handled(path)
    assert 40 <= len(first) < 300

    rest = supervise(*args, env=env)
    rest.wait_ready()
    wait_for(lambda: len(set(handled(path))) == 300, 60, message=rest.output)
    rest.signal(signal.SIGTERM)
    assert rest.wait(15) == 0, rest.output()
    counts = Counter(handled(path))
    assert set(counts) == {f"m{i}" for i in range(300)}
    assert max(counts.values()) == 1, [m for m, n in counts.items() if n > 1]


def test_readyz_is_503_until_the_server_is_up(
    supervise: Start, write_module: Write, nats_server_binary: str
) -> None:
    module = write_module("nats_tasks", TASKS)
    server = NatsServerProcess(binary=nats_server_binary)
    from nsqworker.testing import free_ports

    server.port, server.http_port = free_ports(2)
    run = supervise(module, "--transport", "nats", "--nats", server.url)
    try:
        wait_for(lambda: run.readyz()[0] == 503, 30, message=run.output)
        time.sleep(1.0)
        assert run.readyz()[0] == 503
        server.start()
        run.wait_ready()
        run.signal(signal.SIGTERM)
        assert run.wait(15) == 0, run.output()
    finally:
        server.close()


def test_a_refused_login_exits_2_once(
    supervise: Start, write_module: Write, nats_server_binary: str
) -> None:
    module = write_module("nats_tasks", TASKS)
    with NatsServerProcess(
        binary=nats_server_binary, extra_args=["--user", "app", "--pass", "right"]
    ) as server:
        env = {"NSQWORKER_NATS_USER": "app", "NSQWORKER_NATS_PASSWORD": "s3cret-wrong"}
        run = supervise(module, "--transport", "nats", "--nats", server.url, env=env)
        assert run.wait(30) == 2, run.output()
        out = run.output()
        assert "refused the login" in out and "s3cret-wrong" not in out, out
        lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        assert sum("refused the login" in x.get("event", "") for x in lines) == 1, out


JS_OFF_TASKS = """
from nsqworker.task import task


@task("orders", channel="c")
async def handle(msg):
    pass
"""


def test_run_without_jetstream_exits_2_saying_so_once(
    supervise: Start, write_module: Write, nats_server_binary: str
) -> None:
    """Issue 40: nats-server without -js was retried for ever ("NATS not ready
    (ServiceUnavailableError: code=None ...)"); it is one error naming -js, exit 2."""
    module = write_module("js_off_tasks", JS_OFF_TASKS)
    with NatsServerProcess(binary=nats_server_binary, jetstream=False) as server:
        run = supervise(module, "--transport", "nats", "--nats", server.url)
        assert run.wait(30) == 2, run.output()
    lines = [json.loads(x) for x in run.output().splitlines() if x.startswith("{")]
    errors = [x["event"] for x in lines if x.get("level") == "error"]
    off = (
        f"JetStream is not enabled on the NATS server at {server.url}: start nats-server"
        " with -js (--jetstream), or add `jetstream {}` to its configuration file"
    )
    assert errors[0] == f"worker 1 cannot start: {off}", errors
    assert sum("JetStream is not enabled" in e for e in errors) == 1, errors


def test_run_on_a_stream_and_consumer_made_beforehand(
    supervise: Start, write_module: Write, nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    """Issue 40: an operator's stream (interest retention, a subject list including the
    topic) and durable consumer (ack_wait 9 s, max_deliver 50) are used as they are."""
    from nats.js.api import ConsumerConfig, RetentionPolicy, StreamConfig

    async def prepare() -> None:
        import nats

        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="E2E", subjects=["e2e.nats", "e2e.other"],
                                         retention=RetentionPolicy.INTEREST))  # fmt: skip
        await js.add_consumer("E2E", ConsumerConfig(
            durable_name="c_e2e_nats", filter_subject="e2e.nats", ack_wait=9.0,
            max_deliver=50))  # fmt: skip
        await nc.close()

    async def consumer() -> ConsumerConfig:
        import nats

        nc = await nats.connect(nats_server.url)
        info = await nc.jetstream().consumer_info("E2E", "c_e2e_nats")
        await nc.close()
        return info.config

    asyncio.run(prepare())
    module = write_module("nats_tasks", TASKS)
    run = supervise(module, "--transport", "nats", "--nats", nats_server.url,
                    env={"HANDLER_SLEEP": "0"})  # fmt: skip
    run.wait_ready()
    publish(nats_server.url, [f"m{i}".encode() for i in range(20)])
    path = tmp_path / "handled.txt"
    wait_for(lambda: len(set(handled(path))) == 20, 30, message=run.output)
    run.signal(signal.SIGTERM)
    assert run.wait(15) == 0, run.output()
    config = asyncio.run(consumer())
    assert config.ack_wait == 9.0 and config.max_deliver == 50
    assert "exists with ack_wait=9 (the worker's: 30)" in run.output(), run.output()
