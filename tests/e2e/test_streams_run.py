"""``nsqworker run --transport rabbitmq-stream`` as a user runs it: ready when subscribed,
metrics say rabbitmq, SIGTERM drains with nothing lost, a refused login exits 2."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsqworker.settings import Settings
from nsqworker.streams import StreamProducer
from nsqworker.testing import wait_for

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
