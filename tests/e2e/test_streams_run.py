"""``nsqworker run --transport rabbitmq-stream`` as a user runs it: ready when subscribed,
metrics say rabbitmq, SIGTERM drains with nothing lost, a refused login exits 2."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsqworker.settings import Settings
from nsqworker.streams import StreamProducer
from nsqworker.testing import wait_for
from nsqworker.testing.rabbitmq import RabbitMQProcess

TASKS = """
import asyncio
import os

from nsqworker.task import task


@task(os.environ["STREAM"], channel="c", max_in_flight=10)
async def slow(msg):
    await asyncio.sleep(0.05)
    fd = os.open(os.environ["HANDLED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, msg.body + b"\\n")
    finally:
        os.close(fd)
"""
Start = Callable[..., Any]
Write = Callable[[str, str], str]


def handled(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_sigterm_drains_and_a_second_run_handles_the_rest(
    supervise: Start, write_module: Write, rabbitmq: str, tmp_path: Path
) -> None:
    stream = f"e2e_{uuid.uuid4().hex[:8]}"
    module = write_module("stream_tasks", TASKS)
    env = {"STREAM": stream, "NSQWORKER_DRAIN_TIMEOUT": "5"}
    args = (module, "--transport", "rabbitmq-stream", "--rabbitmq", rabbitmq)
    run = supervise(*args, env=env)
    body = run.wait_ready()
    assert body["transport"] == "rabbitmq-stream", body

    async def publish() -> None:
        settings = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=rabbitmq)
        async with StreamProducer(settings=settings) as producer:
            await producer.publish_many(stream, [f"m{i}".encode() for i in range(300)])

    asyncio.run(publish())
    path = tmp_path / "handled.txt"
    wait_for(lambda: len(handled(path)) >= 40, 30, message=run.output)
    status, metrics = run.get("/metrics")
    assert status == 200 and 'messaging_system="rabbitmq"' in metrics, metrics[-1500:]
    run.signal(signal.SIGTERM)
    assert run.wait(20) == 0, run.output()
    first = handled(path)
    assert 40 <= len(first) < 300

    rest = supervise(*args, env=env)
    rest.wait_ready()
    wait_for(lambda: len(set(handled(path))) == 300, 60, message=rest.output)
    rest.signal(signal.SIGTERM)
    assert rest.wait(20) == 0, rest.output()
    counts = Counter(handled(path))
    assert set(counts) == {f"m{i}" for i in range(300)}
    assert max(counts.values()) == 1, [m for m, n in counts.items() if n > 1]


def test_a_refused_login_exits_2_without_printing_the_password(
    supervise: Start, write_module: Write, rabbitmq: str
) -> None:
    module = write_module("stream_tasks", TASKS)
    host = rabbitmq.split("@", 1)[1]
    wrong = f"rabbitmq-stream://guest:s3cret-wrong@{host}"
    run = supervise(module, "--transport", "rabbitmq-stream", "--rabbitmq", wrong,
                    env={"STREAM": "e2e_refused"})  # fmt: skip
    assert run.wait(30) == 2, run.output()
    out = run.output()
    assert "refused the login of user 'guest'" in out and "s3cret-wrong" not in out, out


async def operator_creates(uri: str, stream: str, arguments: dict[str, Any]) -> None:
    """Create ``stream`` as another client (an operator's script) does."""
    from rstream import Producer as RProducer

    from nsqworker.streams.client import Endpoint

    e = Endpoint.from_settings(Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=uri))
    producer = RProducer(host=e.host, port=e.port, vhost=e.vhost, username=e.username,
                         password=e.password)  # fmt: skip
    await producer.start()
    try:
        await producer.create_stream(stream, arguments)
    finally:
        await producer.close()


def test_run_on_a_stream_made_beforehand_with_rabbitmqs_defaults(
    supervise: Start, write_module: Write, rabbitmq: str, tmp_path: Path
) -> None:
    """Issue 40: a stream an operator made (RabbitMQ's defaults, no max-age) is used as it
    is; before, run stopped with ``cannot create stream '...': `` (an empty reason)."""
    stream = f"e2e_{uuid.uuid4().hex[:8]}"
    asyncio.run(operator_creates(rabbitmq, stream, {}))
    module = write_module("stream_tasks", TASKS)
    run = supervise(module, "--transport", "rabbitmq-stream", "--rabbitmq", rabbitmq,
                    env={"STREAM": stream})  # fmt: skip
    run.wait_ready()

    async def publish() -> None:
        settings = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=rabbitmq)
        async with StreamProducer(settings=settings) as producer:
            await producer.publish_many(stream, [f"m{i}".encode() for i in range(20)])

    asyncio.run(publish())
    path = tmp_path / "handled.txt"
    wait_for(lambda: len(set(handled(path))) == 20, 30, message=run.output)
    run.signal(signal.SIGTERM)
    assert run.wait(20) == 0, run.output()
    assert "exists with arguments other than the worker's" in run.output()


def test_an_advertised_host_that_does_not_resolve_is_one_line_and_exit_2(
    supervise: Start, write_module: Write, rabbitmq_server: Any
) -> None:
    """The usual container mistake: RabbitMQ advertises a host name clients cannot
    resolve. Before, run crash-looped on ``socket.gaierror`` and publish said ``Name or
    service not known``; both now name the host and advertised_host, and exit 2."""
    import io

    from rich.console import Console

    from nsqworker.cli.publish import publish_command

    if rabbitmq_server is None:
        pytest.skip("an advertised host of its own needs .tools/rabbitmq")
    server = RabbitMQProcess(rabbitmq_server.rootfs, advertised_host="rabbitmq.invalid").start()
    try:
        out = io.StringIO()
        code = publish_command(
            "e2e_advertised", "x", nsqd=[], delay=None, console=Console(file=out, width=500),
            transport="rabbitmq-stream", rabbitmq=server.uri,
        )  # fmt: skip
        line = (
            f"RabbitMQ at 127.0.0.1:{server.stream_port} advertises its stream listener as"
            " host 'rabbitmq.invalid', which does not resolve here; set"
            " stream.advertised_host (advertised_host) in rabbitmq.conf to a name or"
            " address clients can reach"
        )
        assert code == 2
        assert out.getvalue().splitlines() == [f"error: {line}"]
        module = write_module("stream_tasks", TASKS)
        run = supervise(module, "--transport", "rabbitmq-stream", "--rabbitmq", server.uri,
                        env={"STREAM": "e2e_advertised"})  # fmt: skip
        assert run.wait(60) == 2, run.output()
        lines = [json.loads(x) for x in run.output().splitlines() if x.startswith("{")]
        errors = [x["event"] for x in lines if x.get("level") == "error"]
        assert errors[0] == f"worker 1 cannot start: {line}", errors
    finally:
        server.close()
