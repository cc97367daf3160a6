"""Running ``python -m nsqworker run`` as a user would, against a real nsqd."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from nsqworker.testing import free_port, wait_for

#: Seconds a worker process gets to start (spawn, imports) and subscribe.
BOOT = 30.0  # keep in step with test_supervisor.BOOT


class Supervised:
    """One ``nsqworker`` command running in its own session, with its output in a file."""

    def __init__(self, args: list[str], env: Mapping[str, str], cwd: Path, health_port: int):
        self.health_port = health_port
        self.log_path = cwd / f"nsqworker-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqworker", *args],
            env=dict(env),
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # teardown can kill the supervisor and its children
        )

    def output(self) -> str:
        """Everything the supervisor and its workers printed so far."""
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        """``(status, body)`` of a GET on the health server; ``(0, error)`` if unreachable."""
        url = f"http://127.0.0.1:{self.health_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def readyz(self) -> tuple[int, dict[str, Any]]:
        status, body = self.get("/readyz")
        return status, (json.loads(body) if status else {})

    def wait_ready(self, timeout: float = BOOT) -> dict[str, Any]:
        """Wait for ``/readyz`` 200; returns its body."""
        wait_for(
            lambda: self.readyz()[0] == 200 or self.proc.poll() is not None,
            timeout,
            message=lambda: f"/readyz never 200: {self.readyz()}\n{self.output()}",
        )
        assert self.proc.poll() is None, f"nsqworker exited early:\n{self.output()}"
        return self.readyz()[1]

    def pids(self) -> list[int]:
        return [int(w["pid"]) for w in self.readyz()[1].get("workers", [])]

    def metric(self, name: str) -> float:
        """The sum of every sample called ``name`` on ``/metrics``."""
        status, body = self.get("/metrics")
        assert status == 200, body
        total = 0.0
        for line in body.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """Wait for the exit code; fails the test (with the output) after ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"nsqworker still running after {timeout:g}s:\n{self.output()}"
            ) from None

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()


@pytest.fixture
def write_module(tmp_path: Path) -> Callable[[str, str], str]:
    """``write_module(name, source)`` puts a module in tmp_path (on the children's path)."""

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    """The environment for the command: no stray NSQWORKER_* settings, tmp_path importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env["HANDLED_FILE"] = str(tmp_path / "handled.txt")
    env["NSQWORKER_RECONNECT_DELAY"] = "0.2"
    env["NSQWORKER_MAX_RECONNECT_DELAY"] = "0.5"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def supervise(tmp_path: Path, base_env: dict[str, str]) -> Iterator[Callable[..., Supervised]]:
    """``supervise(*args, env={...})`` starts ``python -m nsqworker run *args``.

    A free health port is added; logs are left on ``auto``, which is JSON here (output
    goes to a file), as in a container. Every process it started is killed at teardown.
    """
    started: list[Supervised] = []

    def start(
        *args: str, env: Mapping[str, str] | None = None, health_port: int | None = None
    ) -> Supervised:
        """``health_port``: the port for ``--health-port`` (default a free one); 0 leaves
        the flag out, so the default port applies."""
        port = free_port() if health_port is None else health_port
        flag = ["--health-port", str(port)] if port else []
        full = ["run", *args, *flag]  # logs: auto, JSON into the file
        run = Supervised(full, {**base_env, **(env or {})}, tmp_path, port)
        started.append(run)
        return run

    try:
        yield start
    finally:
        for run in started:
            run.close()
