"""Real nsqd and nsqlookupd processes on loopback ports, for tests and benchmarks.

Each process gets free ports (new ones when another process took them first), its own
data path and log file, and is stopped at exit if nothing stopped it. The classes work
as context managers (``with NsqlookupdProcess() as lookupd, NsqdProcess(lookupd=[lookupd])
as nsqd: ...``); in a pytest suite the fixtures of :mod:`nsqworker.testing` start them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Self

import httpx

from nsqworker.testing.locations import TOOLS_BIN_ENV, nsq_install_hint, user_bin_dir
from nsqworker.testing.ports import LOOPBACK, adjacent_free_ports
from nsqworker.testing.server import (
    ServerProcess,
    ServerProcessError,
    signal_and_wait,
)

__all__ = [
    "NsqCluster",
    "NsqHttpError",
    "NsqProcessError",
    "NsqdProcess",
    "NsqlookupdProcess",
    "find_binary",
    "signal_and_wait",
]


READY_TIMEOUT = 10.0
"""Seconds a process gets to answer ``GET /ping`` after it was started."""
PORT_ATTEMPTS = 5
"""How many times :meth:`start` picks new ports when the chosen ones were taken."""

_ADDRESS_IN_USE = "address already in use"


NsqProcessError = ServerProcessError
"""The error every test server raises when it cannot be started or stopped (its first
name, from when only nsqd and nsqlookupd had one)."""


class NsqHttpError(RuntimeError):
    """Raised when nsqd or nsqlookupd answers an HTTP request with an error status."""

    def __init__(self, method: str, url: str, status_code: int, text: str) -> None:
        super().__init__(f"{method} {url} -> {status_code} {text.strip()}")
        self.status_code = status_code
        self.text = text


class _PortInUse(NsqProcessError):
    """Raised internally when a process exits because one of its ports was taken."""


# ---------------------------------------------------------------------------- helpers


def find_binary(name: str, bin_dir: str | os.PathLike[str] | None = None) -> str:
    """Return the path of the NSQ executable ``name`` (``"nsqd"``, ``"nsqlookupd"``...).

    Looks, in order, in ``bin_dir`` (if given), in the directory named by
    ``$NSQWORKER_TOOLS_BIN``, on ``PATH``, in the user's tools directory
    (``~/.local/share/nsqworker/bin``, see :mod:`nsqworker.testing.locations`), and in
    ``.tools/bin`` of the current directory or of the nearest parent directory that has
    one (a clone of nsqworker after ``make tools``).

    Raises:
        FileNotFoundError: nowhere to be found; the message says how to install it.
    """
    candidates: list[Path] = []
    if bin_dir is not None:
        candidates.append(Path(bin_dir) / name)
    env_dir = os.environ.get(TOOLS_BIN_ENV)
    if env_dir:
        candidates.append(Path(env_dir) / name)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    on_path = shutil.which(name)
    if on_path:
        return on_path
    user = user_bin_dir() / name
    if user.is_file() and os.access(user, os.X_OK):
        return str(user)
    cwd = Path.cwd().resolve()
    for directory in (cwd, *cwd.parents):
        path = directory / ".tools" / "bin" / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    searched = ", ".join(
        [*(str(p.parent) for p in candidates), "PATH", str(user.parent), f".tools/bin above {cwd}"]
    )
    raise FileNotFoundError(f"{name} not found (searched {searched}); {nsq_install_hint()}")


def _unwrap(body: Any) -> Any:
    """Strip the ``{"status_code", "data"}`` envelope of NSQ < 1.0 if present."""
    if isinstance(body, dict) and "data" in body and "status_code" in body:
        return body["data"]
    return body


# ---------------------------------------------------------------------------- processes


class _NsqProcess(ServerProcess):
    """What nsqd and nsqlookupd share: free TCP and HTTP ports, a data path, ``/ping``."""

    def __init__(
        self,
        *,
        extra_args: Sequence[str] = (),
        data_path: str | os.PathLike[str] | None = None,
        tcp_port: int | None = None,
        http_port: int | None = None,
        binary: str | None = None,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        super().__init__()
        self.extra_args = list(extra_args)
        self.ready_timeout = ready_timeout
        self._binary = binary
        self._fixed_ports = tcp_port is not None or http_port is not None
        self._tcp_port = tcp_port
        self._http_port = http_port
        self._owns_data = data_path is None
        self._data_path = Path(data_path) if data_path is not None else None
        self._client: httpx.Client | None = None

    # -- properties ------------------------------------------------------------------

    @property
    def tcp_port(self) -> int:
        """TCP port the process listens on."""
        return self._require(self._tcp_port, "tcp_port")

    @property
    def http_port(self) -> int:
        """HTTP port the process listens on."""
        return self._require(self._http_port, "http_port")

    @property
    def tcp_address(self) -> str:
        """``"127.0.0.1:PORT"`` of the TCP listener."""
        return f"{LOOPBACK}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        """``"http://127.0.0.1:PORT"`` of the HTTP listener."""
        return f"http://{LOOPBACK}:{self.http_port}"

    @property
    def data_path(self) -> Path:
        """Working directory of the process: its log file, and nsqd's message files."""
        if self._data_path is None:
            self._data_path = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        return self._data_path

    @property
    def log_path(self) -> Path:
        """File that receives the process's stdout and stderr (appended across restarts)."""
        return self.data_path / f"{self.name}.log"

    @property
    def binary(self) -> str:
        """Path of the executable (found with :func:`find_binary` unless given)."""
        if self._binary is None:
            self._binary = find_binary(self.name)
        return self._binary

    @property
    def _http(self) -> httpx.Client:
        if self._client is None or self._client.is_closed:
            self._client = httpx.Client(
                trust_env=False,  # loopback only: never through a proxy from the environment
                timeout=5.0,
                limits=httpx.Limits(max_keepalive_connections=0),  # survives kill/restart
            )
        return self._client

    def _require(self, port: int | None, what: str) -> int:
        if port is None:
            raise NsqProcessError(f"{self.name} has no {what} before start()")
        return port

    def _args(self) -> list[str]:
        """Command line without the binary, for the current ports and data path."""
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        ports = f"tcp={self._tcp_port} http={self._http_port}"
        return f"<{type(self).__name__} {ports} {state}>"

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Self:
        """Start on free ports (or the ones given) and wait until ``/ping`` answers.

        Raises:
            NsqProcessError: it exited or did not answer within ``ready_timeout``; the
                message carries the end of its log.
        """
        if self.running:
            raise NsqProcessError(f"{self.name} is already running (pid {self.pid})")
        attempts = 1 if self._fixed_ports else PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            if not self._fixed_ports:
                self._tcp_port, self._http_port = adjacent_free_ports()
            try:
                self._spawn_and_wait()
                return self
            except _PortInUse:
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def restart(self) -> Self:
        """Start again on the same ports and data path (stopping first if it still runs).

        Retries for up to ``ready_timeout`` while the old ports are still held.
        """
        if self._tcp_port is None or self._http_port is None:
            raise NsqProcessError(f"{self.name} was never started; call start()")
        if self.running:
            self.stop()
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                self._spawn_and_wait()
                return self
            except _PortInUse:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def discard_data(self) -> None:
        """Close the HTTP client; remove the data path if this object created it."""
        if self._client is not None:
            self._client.close()
        if self._owns_data and self._data_path is not None:
            shutil.rmtree(self._data_path, ignore_errors=True)
            self._data_path = None

    def _spawn_and_wait(self) -> None:
        self.data_path.mkdir(parents=True, exist_ok=True)
        self.spawn([self.binary, *self._args()], cwd=self.data_path)
        url = f"{self.http_address}/ping"

        def answers() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return self._http.get(url, timeout=0.5).status_code == 200 and self.running
            return False

        try:
            self.wait_until(answers, self.ready_timeout, f"answer {url}")
        except BaseException:
            self.kill()
            raise

    def fail(self, what: str) -> NoReturn:
        """:class:`NsqProcessError` with the ports and the log's end (a port taken by
        another process: the internal ``_PortInUse``, so that start() picks new ones)."""
        tail = self.log_tail(since_start=True)
        error = _PortInUse if _ADDRESS_IN_USE in tail else NsqProcessError
        raise error(
            f"{self.name} (tcp {self._tcp_port}, http {self._http_port}) {what}; "
            f"log {self.log_path}:\n{tail}"
        )

    # -- HTTP ------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """``method path`` on the process's HTTP API (``request("POST", "/channel/pause",
        params={...})``); ``kwargs`` go to httpx.

        Raises:
            NsqHttpError: an error status (404, 500...).
        """
        url = f"{self.http_address}{path}"
        response = self._http.request(method, url, **kwargs)
        if response.status_code >= 400:
            raise NsqHttpError(method, str(response.url), response.status_code, response.text)
        return response

    def _get_json(self, path: str, **params: str) -> Any:
        return _unwrap(self.request("GET", path, params=params).json())


class NsqlookupdProcess(_NsqProcess):
    """An nsqlookupd on 127.0.0.1 with free TCP and HTTP ports.

    Args:
        extra_args: further command-line flags, e.g. ``["--inactive-producer-timeout=5s"]``.
        data_path: working directory for the log file; a temporary one by default
            (removed by :meth:`close`).
        tcp_port, http_port: fixed ports instead of free ones (no retry when taken).
        binary: path of the nsqlookupd executable; found with :func:`find_binary` by default.
        ready_timeout: seconds to wait for ``GET /ping`` at start.
    """

    name = "nsqlookupd"

    def _args(self) -> list[str]:
        return [
            f"--tcp-address={LOOPBACK}:{self.tcp_port}",
            f"--http-address={LOOPBACK}:{self.http_port}",
            f"--broadcast-address={LOOPBACK}",
            *self.extra_args,
        ]

    def lookup(self, topic: str) -> list[dict[str, Any]]:
        """Producers (nsqd nodes) of ``topic`` from ``GET /lookup``; empty when unknown."""
        try:
            body = self._get_json("/lookup", topic=topic)
        except NsqHttpError as exc:
            if exc.status_code == 404:
                return []
            raise
        return list(body.get("producers") or [])

    def nodes(self) -> list[dict[str, Any]]:
        """Every nsqd registered with this nsqlookupd (``GET /nodes``)."""
        return list(self._get_json("/nodes").get("producers") or [])

    def topics(self) -> list[str]:
        """Topic names known to this nsqlookupd (``GET /topics``)."""
        return list(self._get_json("/topics").get("topics") or [])


class NsqdProcess(_NsqProcess):
    """An nsqd on 127.0.0.1 with free ports, HTTP at TCP + 1 (as nsqd's defaults, so tools
    that know only its TCP address find its HTTP API), and its own data path.

    Args:
        lookupd: nsqlookupd instances (or their ``host:port`` TCP addresses) to
            register with; none by default (standalone).
        extra_args: further command-line flags, e.g. ``["--msg-timeout=2s"]``, or
            ``["--mem-queue-size=0", "--sync-every=1"]`` so that every message is on
            disk and survives :meth:`kill`.
        data_path: directory for messages and the log file; a temporary one by default
            (removed by :meth:`close`). Kept across :meth:`restart`.
        tcp_port, http_port: fixed ports instead of free ones (no retry when taken).
        binary: path of the nsqd executable; found with :func:`find_binary` by default.
        ready_timeout: seconds to wait for ``GET /ping`` at start.
    """

    name = "nsqd"

    def __init__(
        self,
        lookupd: Iterable[NsqlookupdProcess | str] = (),
        *,
        extra_args: Sequence[str] = (),
        data_path: str | os.PathLike[str] | None = None,
        tcp_port: int | None = None,
        http_port: int | None = None,
        binary: str | None = None,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        super().__init__(
            extra_args=extra_args,
            data_path=data_path,
            tcp_port=tcp_port,
            http_port=http_port,
            binary=binary,
            ready_timeout=ready_timeout,
        )
        self.lookupd = list(lookupd)

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        """``host:port`` of each nsqlookupd this nsqd registers with."""
        return [x.tcp_address if isinstance(x, NsqlookupdProcess) else x for x in self.lookupd]

    def _args(self) -> list[str]:
        return [
            f"--tcp-address={LOOPBACK}:{self.tcp_port}",
            f"--http-address={LOOPBACK}:{self.http_port}",
            f"--data-path={self.data_path}",
            f"--broadcast-address={LOOPBACK}",
            *(f"--lookupd-tcp-address={addr}" for addr in self.lookupd_tcp_addresses),
            *self.extra_args,
        ]

    def create_topic(self, topic: str) -> None:
        """Create ``topic`` (``POST /topic/create``); no error if it exists."""
        self.request("POST", "/topic/create", params={"topic": topic})

    def create_channel(self, topic: str, channel: str) -> None:
        """Create ``topic`` and its ``channel``, so messages published later are kept."""
        self.create_topic(topic)
        self.request("POST", "/channel/create", params={"topic": topic, "channel": channel})

    def publish(self, topic: str, body: bytes | str, defer_ms: int | None = None) -> None:
        """Publish one message over HTTP (``POST /pub``), deferred by ``defer_ms`` if given."""
        params: dict[str, str] = {"topic": topic}
        if defer_ms is not None:
            params["defer"] = str(defer_ms)
        self.request("POST", "/pub", params=params, content=_as_bytes(body))

    def mpublish(self, topic: str, bodies: Iterable[bytes | str], binary: bool = False) -> None:
        """Publish several messages in one ``POST /mpub``.

        The default text mode separates messages with newlines, so a body must not
        contain one; ``binary=True`` sends length-prefixed bodies that may hold any byte.
        """
        messages = [_as_bytes(b) for b in bodies]
        params = {"topic": topic}
        if binary:
            params["binary"] = "true"
            content = struct.pack(">I", len(messages)) + b"".join(
                struct.pack(">I", len(m)) + m for m in messages
            )
        else:
            if any(b"\n" in m for m in messages):
                raise ValueError("a message contains a newline; use mpublish(..., binary=True)")
            content = b"\n".join(messages)
        self.request("POST", "/mpub", params=params, content=content)

    def stats(self, topic: str | None = None, channel: str | None = None) -> dict[str, Any]:
        """``GET /stats?format=json``, optionally filtered by topic and channel.

        nsqd 1.x returns the stats object at the top level, older versions inside
        ``"data"``; either way the stats object is returned (``"topics"`` is a list).
        """
        params = {"format": "json"}
        if topic is not None:
            params["topic"] = topic
        if channel is not None:
            params["channel"] = channel
        body = self._get_json("/stats", **params)
        if body.get("topics") is None:
            body["topics"] = []
        return dict(body)

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        """Stats of ``topic`` (with its ``"channels"`` list), None if it does not exist."""
        for item in self.stats(topic=topic)["topics"]:
            if item.get("topic_name") == topic:
                return dict(item)
        return None

    def channel_stats(self, topic: str, channel: str) -> dict[str, Any] | None:
        """Stats of one channel (``depth``, ``in_flight_count``...), None if it does not exist."""
        stats = self.topic_stats(topic)
        for item in (stats or {}).get("channels") or []:
            if item.get("channel_name") == channel:
                return dict(item)
        return None

    def depth(self, topic: str, channel: str) -> int:
        """Messages waiting in ``channel`` (memory + disk, not in flight or deferred); 0 if absent."""
        stats = self.channel_stats(topic, channel)
        return 0 if stats is None else int(stats["depth"])

    def in_flight(self, topic: str, channel: str) -> int:
        """Messages of ``channel`` delivered to a client and not yet answered; 0 if absent."""
        stats = self.channel_stats(topic, channel)
        return 0 if stats is None else int(stats["in_flight_count"])

    def info(self) -> dict[str, Any]:
        """``GET /info``: version, ports and broadcast address as nsqd sees them."""
        return dict(self._get_json("/info"))


def _as_bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else body


@dataclass(frozen=True)
class NsqCluster:
    """One nsqlookupd and the nsqd processes registered with it."""

    lookupd: NsqlookupdProcess
    nsqds: list[NsqdProcess]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        """Value for ``Settings.lookupd_http_addresses``."""
        return [self.lookupd.http_address]

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        """Value for ``Settings.nsqd_tcp_addresses``."""
        return [n.tcp_address for n in self.nsqds]
