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

import contextlib
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import httpx

from nsqworker.testing.locations import nats_install_hint
from nsqworker.testing.ports import LOOPBACK, free_ports
from nsqworker.testing.processes import find_binary
from nsqworker.testing.server import ServerProcess, ServerProcessError

__all__ = ["NATS_INSTALL_HINT", "NatsCluster", "NatsServerProcess", "find_nats_server"]

NATS_INSTALL_HINT = nats_install_hint()
READY_TIMEOUT = 20.0


def find_nats_server(bin_dir: str | None = None) -> str:
    """The nats-server executable (searched like nsqd); FileNotFoundError says how to
    install it."""
    try:
        return find_binary("nats-server", bin_dir)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{str(exc).split(';')[0]}; {nats_install_hint()}") from None


class NatsServerProcess(ServerProcess):
    """One nats-server with JetStream (without, given ``jetstream=False``: a user's
    first mistake), on loopback ports chosen at :meth:`start`."""

    stop_timeout = 10.0  # nats-server's graceful stop

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
        jetstream: bool = True,
    ) -> None:
        super().__init__()
        self.name = name
        self.jetstream = jetstream
        self.extra_args = list(extra_args)
        self.cluster_name = cluster_name
        self.routes = list(routes)
        self.cluster_port = cluster_port
        self._binary = binary
        self._owns_store = store_dir is None
        self.store_dir = Path(store_dir or tempfile.mkdtemp(prefix=f"nats-{name}-"))
        self.port = 0
        self.http_port = 0

    def __repr__(self) -> str:
        return f"<NatsServerProcess {self.name} port={self.port} running={self.running}>"

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>``."""
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def title(self) -> str:
        """``nats-server <name>``."""
        return f"nats-server {self.name}"

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.store_dir / "nats-server.log"

    def _args(self) -> list[str]:
        args = [
            "--addr", LOOPBACK, "--port", str(self.port), "--http_port", str(self.http_port),
            "--server_name", self.name,
        ]  # fmt: skip
        if self.jetstream:
            args += ["--jetstream", "--store_dir", str(self.store_dir / "js")]
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
            raise ServerProcessError(f"nats-server {self.name} is already running")
        if not self.port:
            self.port, self.http_port = free_ports(2)
        binary = self._binary or find_nats_server()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.spawn([binary, *self._args()])
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until ``/healthz?js-enabled-only=true`` (without JetStream: ``/healthz``)
        answers 200."""
        url = f"http://{LOOPBACK}:{self.http_port}/healthz"
        if self.jetstream:
            url += "?js-enabled-only=true"

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(url, timeout=0.5).status_code == 200
            return False

        self.wait_until(healthy, timeout, "become ready")

    def varz(self, endpoint: str = "varz", **params: str) -> Any:
        """The monitoring endpoint's JSON (``varz``, ``jsz``, ``connz``...)."""
        url = f"http://{LOOPBACK}:{self.http_port}/{endpoint}"
        return httpx.get(url, params=params, timeout=5).json()

    def discard_data(self) -> None:
        """Remove the store if this object made it."""
        if self._owns_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)


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
                raise ServerProcessError(
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
