"""The runner's side of a benchmark run: nsqd processes, measuring processes, cleanup.

Everything started here is tracked and stopped by :func:`cleanup` (also at interpreter
exit), by process id. nsqd listens on 127.0.0.1 only, and every client is pointed at it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from bench.common import BODY_SIZE, CHANNEL, EVENT_MARK, RESULT_MARK
from nsqworker.testing import NsqdProcess, find_binary

ROOT = Path(__file__).resolve().parent.parent
MEM_QUEUE_SIZE = 10_000_000
"""nsqd --mem-queue-size: every pre-loaded message stays in memory, none on disk."""
LOAD_BATCH = 1000
LOAD_CONCURRENCY = 4

_LIVE: dict[int, Proc] = {}
_BROKERS: list[Broker] = []


class BenchError(RuntimeError):
    """A measuring process failed or timed out; the message carries its stderr tail."""


# --- processes ----------------------------------------------------------------------


def child_env(tree: Path = ROOT) -> dict[str, str]:
    """The environment of measuring processes: ours, minus any NSQWORKER_* overrides,
    importing nsqworker and bench from ``tree`` (this checkout, or an older commit's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    env["PYTHONPATH"] = str(tree)
    return env


@dataclass
class Proc:
    """A tracked process and the temp file holding its stderr."""

    popen: subprocess.Popen[str]
    stderr: IO[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid


def spawn(argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> Proc:
    """Start a tracked process in its own session (stdout piped, stderr to a temp file)."""
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by reap()
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=cwd,
        env=env if env is not None else child_env(),
        text=True,
        start_new_session=True,
    )
    proc = _LIVE[popen.pid] = Proc(popen, stderr)
    return proc


def stderr_tail(proc: Proc, lines: int = 15) -> str:
    """The end of what a tracked process wrote to stderr."""
    proc.stderr.seek(0)
    text = proc.stderr.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


def reap(proc: Proc, timeout: float = 5.0) -> None:
    """SIGTERM the process if it still runs, SIGKILL if it lingers; then forget it.

    Signals go to the pid only while it is not yet reaped, so never to a reused pid.
    """
    popen = proc.popen
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            popen.terminate()
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            popen.wait()
    _LIVE.pop(popen.pid, None)
    if popen.stdout is not None:
        popen.stdout.close()
    proc.stderr.close()


def cleanup() -> None:
    """Stop every process this run started: measuring processes first, then nsqd."""
    for proc in list(_LIVE.values()):
        reap(proc, timeout=2.0)
    for broker in list(_BROKERS):
        broker.close()


atexit.register(cleanup)


class Child:
    """One measuring process: ``python -m bench.child target params``.

    It prints events while it runs (:meth:`wait_event`) and its result dict last
    (:meth:`result`).
    """

    def __init__(self, target: str, params: dict[str, Any], tree: Path = ROOT) -> None:
        self.target = target
        argv = [sys.executable, "-m", "bench.child", target, json.dumps(params)]
        self.proc = spawn(argv, env=child_env(tree), cwd=tree)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        stdout = self.proc.popen.stdout
        assert stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in stdout:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _next(self, deadline: float) -> tuple[str, dict[str, Any]]:
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise BenchError(f"{self.target}: timed out\n{self._tail()}") from None
            if line is None:
                raise BenchError(f"{self.target}: exited without a result\n{self._tail()}")
            for mark in (RESULT_MARK, EVENT_MARK):
                if line.startswith(mark):
                    return mark, json.loads(line[len(mark) :])

    def _tail(self) -> str:
        time.sleep(0.05)
        return stderr_tail(self.proc)

    def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        """Block until the process emits event ``name``; return its fields."""
        deadline = time.monotonic() + timeout
        while True:
            mark, data = self._next(deadline)
            if mark == RESULT_MARK:
                raise BenchError(f"{self.target}: ended before {name!r}: {data}\n{self._tail()}")
            if data.get("event") == name:
                return data

    def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the result line (events before it are skipped), then reap."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                mark, data = self._next(deadline)
                if mark == RESULT_MARK:
                    if "error" in data:
                        raise BenchError(f"{self.target}: {data['error']}\n{self._tail()}")
                    return data
        finally:
            self.close()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process (if it still runs)."""
        if self.proc.popen.poll() is None:
            self.proc.popen.send_signal(sig)

    def close(self) -> None:
        reap(self.proc)


def run_child(
    target: str, params: dict[str, Any], timeout: float, tree: Path = ROOT
) -> dict[str, Any]:
    """Run one measuring process (from ``tree``) to its end and return its result."""
    return Child(target, params, tree).result(timeout)


def run_tool(argv: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run a tracked command (a Go tool) to its end; return stdout + stderr."""
    proc = spawn(argv, env=env)
    try:
        out, _ = proc.popen.communicate(timeout=timeout)
        err = stderr_tail(proc, lines=1000)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{argv[0]}: timed out after {timeout:g}s") from None
    finally:
        reap(proc)
    if proc.popen.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited with {proc.popen.returncode}:\n{out}{err}")
    return out + err


# --- nsqd ---------------------------------------------------------------------------


class Broker:
    """An nsqd on 127.0.0.1 for the run, with fresh topics and fast pre-loading."""

    _names = itertools.count(1)

    def __init__(self, extra_args: Sequence[str] = ()) -> None:
        args = [f"--mem-queue-size={MEM_QUEUE_SIZE}", "--log-level=warn", *extra_args]
        self.nsqd = NsqdProcess(extra_args=args, binary=tool("nsqd"))
        self.nsqd.start()
        _BROKERS.append(self)
        self._http = httpx.Client(base_url=self.nsqd.http_address, trust_env=False, timeout=30)

    @property
    def tcp_address(self) -> str:
        return self.nsqd.tcp_address

    @property
    def pid(self) -> int:
        return self.nsqd.pid

    def close(self) -> None:
        if self in _BROKERS:
            _BROKERS.remove(self)
            self._http.close()
            self.nsqd.close()

    def fresh_topic(self, prefix: str) -> str:
        """A topic name never used before in this run."""
        return f"{prefix}-{next(self._names)}"

    def post(self, path: str, **params: str) -> None:
        self._http.post(path, params=params).raise_for_status()

    def delete_topic(self, topic: str) -> None:
        """Drop a topic and everything still queued on it (frees nsqd's memory)."""
        with contextlib.suppress(httpx.HTTPError):
            self.post("/topic/delete", topic=topic)

    def channel_stats(self, topic: str, channel: str = CHANNEL) -> dict[str, Any]:
        return self.nsqd.channel_stats(topic, channel) or {}

    def depth(self, topic: str, channel: str = CHANNEL) -> int:
        return int(self.channel_stats(topic, channel).get("depth", 0))

    def preload(self, topic: str, count: int, channel: str = CHANNEL) -> None:
        """Create ``topic/channel`` and queue ``count`` bodies of BODY_SIZE bytes."""
        self.preload_many([topic], count, channel)

    def preload_many(self, topics: Sequence[str], count: int, channel: str = CHANNEL) -> None:
        """Create each ``topic/channel`` and queue ``count`` bodies of BODY_SIZE bytes in
        each (MPUB batches over TCP with our Producer); wait until nsqd holds them."""
        for topic in topics:
            for attempt in range(3):  # nsqd may be busy deleting the last case's topics
                try:
                    self.nsqd.create_channel(topic, channel)
                    break
                except httpx.TimeoutException:
                    if attempt == 2:
                        raise
        asyncio.run(mpub_load(self.tcp_address, topics, count))
        deadline = time.monotonic() + 60
        for topic in topics:
            while self.depth(topic, channel) < count:
                if time.monotonic() > deadline:
                    raise BenchError(f"nsqd did not queue {count} messages on {topic}")
                time.sleep(0.02)


async def mpub_load(address: str, topics: Sequence[str], count: int) -> None:
    """Publish ``count`` messages to each topic with a few MPUBs in flight at once."""
    from nsqworker.nsq.producer import Producer

    body = b"x" * BODY_SIZE
    sizes = [LOAD_BATCH] * (count // LOAD_BATCH)
    if count % LOAD_BATCH:
        sizes.append(count % LOAD_BATCH)
    batches = iter([(topic, n) for topic in topics for n in sizes])

    async def pump(producer: Producer) -> None:
        for topic, n in batches:
            await producer.publish_many(topic, [body] * n, timeout=30)

    async with Producer([address], envelope=False, timeout=30) as producer:
        await asyncio.gather(*(pump(producer) for _ in range(LOAD_CONCURRENCY)))


def tool(name: str) -> str:
    """Absolute path of an NSQ executable (nsqd, bench_reader...)."""
    return str(Path(find_binary(name)).resolve())


def nsqd_version() -> str:
    """``nsqd v1.3.0 (built w/go1.x)``."""
    out = subprocess.run([tool("nsqd"), "--version"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip()
