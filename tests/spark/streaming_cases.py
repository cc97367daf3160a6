"""What the broker sources' tests share: a streaming query driver in a process group of
its own (kill -9 mid-batch, restart from its checkpoint), and the output as a reader
honouring the file sink's ``_spark_metadata`` sees it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq

from tests.spark import session_cases as cases

APP = Path(__file__).parent / "apps" / "stream_query.py"


def driver_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    env.update(extra)
    return env


class Driver:
    """``apps/stream_query.py`` for one format, output and checkpoint."""

    def __init__(self, tmp: Path, sources: list[tuple[str, Mapping[str, Any]]],
                 env: Mapping[str, str], remote: str | None = None) -> None:  # fmt: skip
        cases.need_java()
        self.output, self.checkpoint = tmp / "out", tmp / "checkpoint"
        self.log = tmp / "driver.log"
        self.args = [sys.executable, str(APP), json.dumps(sources), str(self.output),
                     str(self.checkpoint)] + (["connect", remote] if remote else [])  # fmt: skip
        self.env = driver_env(env)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.args, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def signal(self, sig: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """kill -9 the driver and its JVM (the whole process group)."""
        if self.process is not None:
            self.signal(signal.SIGKILL)
            self.process.wait(30)

    def check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-4000:]
            raise AssertionError(f"the driver exited ({self.process.returncode}):\n{tail}")

    def batches(self, log: str) -> set[int]:
        folder = self.checkpoint / log
        if not folder.is_dir():
            return set()
        return {int(p.name) for p in folder.iterdir() if p.name.isdigit()}

    def kill_mid_batch(self, timeout: float = 180) -> int:
        """Wait for a batch that is planned (in the offset log) and not committed, freeze the process group (SIGSTOP) to check it still is, then kill -9
        it; returns that batch's id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            planned, committed = self.batches("offsets"), self.batches("commits")
            running = sorted(planned - committed)
            if running:
                self.signal(signal.SIGSTOP)
                if running[0] not in self.batches("commits"):
                    self.kill()
                    return running[0]
                self.signal(signal.SIGCONT)
            time.sleep(0.01)
        raise AssertionError(
            f"no batch in flight within {timeout:g}s:\n{self.log.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()


def committed_rows(output: Path) -> list[dict[str, Any]]:
    """The rows of the Parquet files the sink's ``_spark_metadata`` lists (an orphan
    file from a killed batch is not among them)."""
    meta = output / "_spark_metadata"
    if not meta.is_dir():
        return []
    paths: set[str] = set()
    for log in meta.iterdir():
        if log.name.startswith("."):
            continue
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry.get("action", "add") == "add":
                paths.add(unquote(urlsplit(entry["path"]).path))
    rows: list[dict[str, Any]] = []
    for path in sorted(paths):
        rows += pq.read_table(path).to_pylist()
    return rows


def wait_for_rows(driver: Driver, count: int, timeout: float = 180) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        driver.check_alive()
        rows = committed_rows(driver.output)
        if len(rows) >= count:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"{len(rows)} of {count} rows within {timeout:g}s")


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g}s")
        time.sleep(0.1)


def bodies(start: int, stop: int) -> list[bytes]:
    return [b"click-%05d" % i for i in range(start, stop)]


async def publish_rabbitmq(
    uri: str, stream: str, bodies: list[bytes], create: bool = False
) -> None:
    from rstream import AMQPMessage, Producer

    from nsqworker.settings import Settings
    from nsqworker.streams.client import Endpoint

    e = Endpoint.from_settings(Settings(rabbitmq_stream_uri=uri))
    async with Producer(host=e.host, port=e.port, vhost=e.vhost, username=e.username,
                        password=e.password) as producer:  # fmt: skip
        if create:
            await producer.create_stream(stream)
        for at in range(0, len(bodies), 500):
            await producer.send_batch(stream, [AMQPMessage(body=b) for b in bodies[at : at + 500]])


async def publish_nats(url: str, stream: str, bodies: list[bytes], create: bool = False) -> None:
    import asyncio

    import nats

    client = await nats.connect(url)
    try:
        js = client.jetstream()
        if create:
            await js.add_stream(name=stream, subjects=[f"{stream}.*"])
        for at in range(0, len(bodies), 1000):
            futures = [await js.publish_async(f"{stream}.click", b) for b in bodies[at : at + 1000]]
            await asyncio.gather(*futures)
    finally:
        await client.close()


def check_exactly_once(rows: list[dict[str, Any]], topic: str, count: int) -> None:
    """``count`` rows of ``topic``, bodies ``click-00000``..., each offset once, in
    publish order by offset."""
    rows = [r for r in rows if r["topic"] == topic]
    assert len(rows) == count, f"{topic}: {len(rows)} rows, not {count}"
    by_offset = sorted(rows, key=lambda r: r["offset"])
    assert len({r["offset"] for r in rows}) == count, f"{topic}: an offset twice"
    assert [r["body"] for r in by_offset] == bodies(0, count)
    assert all(r["attempts"] == 1 and r["timestamp"] is not None for r in rows)
