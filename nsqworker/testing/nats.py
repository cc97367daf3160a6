"""Real nats-server processes with JetStream on loopback: one server, or a cluster.

:class:`NatsServerProcess` runs one ``nats-server -js`` on free ports with its own store
directory; :class:`NatsCluster` runs three (or more) routed to each other, so streams
with replicas 3 work. Both are stopped at exit if nothing stopped them::

    with NatsServerProcess() as server:
        print(server.url)  # nats://127.0.0.1:<port>

The pytest fixtures ``nats_server`` and ``nats_cluster`` (:mod:`nsqworker.testing`)
start them for a test.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Self

import httpx

from nsqworker.testing.locations import nats_install_hint
from nsqworker.testing.ports import LOOPBACK, free_ports
from nsqworker.testing.processes import NsqProcessError, find_binary, signal_and_wait

__all__ = ["NATS_INSTALL_HINT", "NatsCluster", "NatsServerProcess", "find_nats_server"]

NATS_INSTALL_HINT = nats_install_hint()
READY_TIMEOUT = 20.0
_LIVE: set[NatsServerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            proc.kill()


def find_nats_server(bin_dir: str | None = None) -> str:
    """The nats-server executable (searched like nsqd); FileNotFoundError says how to
    install it."""
    try:
        return find_binary("nats-server", bin_dir)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{str(exc).split(';')[0]}; {nats_install_hint()}") from None


class NatsServerProcess:
    """One nats-server with JetStream, on loopback ports chosen at :meth:`start`."""

    def __init__(
        self,
        *,
        name: str = "n1",
        binary: str | None = None,
        store_dir: str | Path | None = None,
        extra_args: Sequence[str] = (),
        cluster_name: str | None = None,
        routes: Sequence[int] = (),
        cluster_port: int | None = None,
    ) -> None:
        self.name = name
        self.extra_args = list(extra_args)
        self.cluster_name = cluster_name
        self.routes = list(routes)
        self.cluster_port = cluster_port
        self._binary = binary
        self._owns_store = store_dir is None
        self.store_dir = Path(store_dir or tempfile.mkdtemp(prefix=f"nats-{name}-"))
        self.port = 0
        self.http_port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __repr__(self) -> str:
        return f"<NatsServerProcess {self.name} port={self.port} running={self.running}>"

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>``."""
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the process runs."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The process id."""
        if self._proc is None:
            raise NsqProcessError("nats-server was never started")
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.store_dir / "nats-server.log"

    def _args(self) -> list[str]:
        args = [
            "--addr", LOOPBACK, "--port", str(self.port), "--http_port", str(self.http_port),
            "--jetstream", "--store_dir", str(self.store_dir / "js"), "--server_name", self.name,
        ]  # fmt: skip
        if self.cluster_name is not None:
            routes = ",".join(f"nats://{LOOPBACK}:{p}" for p in self.routes)
            args += [
                "--cluster_name", self.cluster_name,
                "--cluster", f"nats://{LOOPBACK}:{self.cluster_port}", "--routes", routes,
            ]  # fmt: skip
        return args + self.extra_args

    def start(self, wait: bool = True) -> Self:
        """Start on free ports (the same ones again after a :meth:`kill`); wait until
        ``/healthz`` says JetStream is up unless ``wait`` is False (a cluster waits for
        all its nodes at once)."""
        if self.running:
            raise NsqProcessError(f"nats-server {self.name} is already running")
        if not self.port:
            self.port, self.http_port = free_ports(2)
        binary = self._binary or find_nats_server()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [binary, *self._args()], stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        _LIVE.add(self)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until ``/healthz?js-enabled-only=true`` answers 200."""
        deadline = time.monotonic() + timeout
        url = f"http://{LOOPBACK}:{self.http_port}/healthz?js-enabled-only=true"
        while True:
            if self._proc is None or self._proc.poll() is not None:
                raise NsqProcessError(f"nats-server {self.name} exited:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=0.5).status_code == 200:
                    return
            if time.monotonic() > deadline:
                self.kill()
                raise NsqProcessError(
                    f"nats-server {self.name} not ready within {timeout:g}s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def varz(self, endpoint: str = "varz", **params: str) -> Any:
        """The monitoring endpoint's JSON (``varz``, ``jsz``, ``connz``...)."""
        url = f"http://{LOOPBACK}:{self.http_port}/{endpoint}"
        return httpx.get(url, params=params, timeout=5).json()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (nats-server's graceful stop), SIGKILL after ``timeout``."""
        return self._terminate(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """SIGKILL, like a crash."""
        return self._terminate(signal.SIGKILL, 5.0)

    def _terminate(self, sig: signal.Signals, timeout: float) -> int | None:
        proc = self._proc
        try:
            return None if proc is None else signal_and_wait(proc, sig, timeout)
        finally:
            _LIVE.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None

    def close(self) -> None:
        """Stop, and remove the store if this object made it."""
        try:
            self.stop()
        finally:
            if self._owns_store:
                shutil.rmtree(self.store_dir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Self:
        return self if self.running else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NatsCluster:
    """``size`` nats-servers routed to each other on loopback, JetStream on each."""

    def __init__(self, size: int = 3, *, binary: str | None = None, name: str = "c1") -> None:
        cluster_ports = free_ports(size)
        self.servers = [
            NatsServerProcess(
                name=f"{name}-n{i + 1}",
                binary=binary,
                cluster_name=name,
                cluster_port=port,
                routes=[p for p in cluster_ports if p != port],
            )
            for i, port in enumerate(cluster_ports)
        ]

    @property
    def urls(self) -> list[str]:
        """Every server's client URL."""
        return [s.url for s in self.servers]

    def start(self, timeout: float = READY_TIMEOUT) -> Self:
        """Start every node, then wait until each reports JetStream up and the cluster
        has elected its JetStream meta leader (until then no stream can be created)."""
        for server in self.servers:
            server.start(wait=False)
        for server in self.servers:
            server.wait_ready()
        deadline = time.monotonic() + timeout
        while not all(self._has_leader(s) for s in self.servers):
            if time.monotonic() > deadline:
                self.close()
                raise NsqProcessError(
                    f"the NATS cluster elected no JetStream leader in {timeout:g}s"
                )
            time.sleep(0.05)
        return self

    @staticmethod
    def _has_leader(server: NatsServerProcess) -> bool:
        try:
            meta = server.varz("jsz").get("meta_cluster") or {}
        except (httpx.HTTPError, ValueError):
            return False
        return bool(meta.get("leader"))

    def close(self) -> None:
        """Stop every node."""
        for server in reversed(self.servers):
            with contextlib.suppress(Exception):
                server.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
