"""A real RabbitMQ 4.0 with the stream plugin, on loopback, for tests.

The server runs from a Debian trixie root filesystem with ``chroot`` (so as root), found
where :mod:`nsqworker.testing.locations` says (``$NSQWORKER_RABBITMQ_ROOTFS``,
``~/.local/share/nsqworker/rabbitmq/rootfs``, ``.tools/rabbitmq/rootfs`` of a clone after
``scripts/install-tools rabbitmq``; debootstrap builds one in about a minute): every listener (AMQP, streams, Erlang distribution, epmd) on 127.0.0.1 and
free ports, its data in a directory of its own inside the root filesystem. It starts in
10-25 s, so the pytest fixture ``rabbitmq`` is session-scoped.

``RABBITMQ_STREAM_TEST_URI=rabbitmq-stream://user:password@host:5552/vhost`` points the
fixture at a RabbitMQ you already run instead (its stream plugin enabled).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Self

from nsqworker.testing.locations import (
    ROOTFS_ENV,
    TOOLS_BIN_ENV,
    rabbitmq_install_hint,
    user_tools_dir,
)
from nsqworker.testing.ports import LOOPBACK, free_ports
from nsqworker.testing.server import ServerProcess, ServerProcessError

__all__ = ["RABBITMQ_HINT", "RabbitMQProcess", "find_rootfs"]

RABBITMQ_HINT = rabbitmq_install_hint()
READY_TIMEOUT = 90.0
_MARK = "NSQWORKER_RABBITMQ_INSTANCE"


def _is_rootfs(path: Path) -> bool:
    return (path / "usr/lib/rabbitmq/bin/rabbitmq-server").exists()


def find_rootfs(start: Path | None = None) -> Path:
    """A RabbitMQ root filesystem: ``$NSQWORKER_RABBITMQ_ROOTFS``, ``../rabbitmq/rootfs``
    next to ``$NSQWORKER_TOOLS_BIN``, ``~/.local/share/nsqworker/rabbitmq/rootfs``, then
    ``.tools/rabbitmq/rootfs`` above ``start`` (the current directory by default).

    Raises:
        FileNotFoundError: none found; the message says how to build one.
    """
    here = (start or Path.cwd()).resolve()
    places: list[Path] = []
    if os.environ.get(ROOTFS_ENV):
        places.append(Path(os.environ[ROOTFS_ENV]))
    if os.environ.get(TOOLS_BIN_ENV):
        places.append(Path(os.environ[TOOLS_BIN_ENV]).parent / "rabbitmq" / "rootfs")
    places.append(user_tools_dir() / "rabbitmq" / "rootfs")
    for place in places:
        if _is_rootfs(place):
            return place
    for directory in (here, *here.parents):
        rootfs = directory / ".tools" / "rabbitmq" / "rootfs"
        if _is_rootfs(rootfs):
            return rootfs
    searched = ", ".join([*map(str, places), f".tools/rabbitmq/rootfs above {here}"])
    raise FileNotFoundError(
        f"no RabbitMQ root filesystem (searched {searched}); {rabbitmq_install_hint()}"
    )


class RabbitMQProcess(ServerProcess):
    """RabbitMQ in ``rootfs`` via chroot, on free loopback ports; ``uri`` reaches its
    stream listener as guest."""

    name = "RabbitMQ"
    stop_timeout = 30.0

    def __init__(self, rootfs: Path, advertised_host: str = LOOPBACK) -> None:
        super().__init__()
        self.rootfs = rootfs
        self.advertised_host = advertised_host
        """What the stream listener tells clients to connect to (``stream.advertised_host``);
        a name that does not resolve reproduces the usual container mistake."""
        self.instance = uuid.uuid4().hex[:8]
        self.home = Path("/nsqw") / self.instance  # inside the root filesystem
        self.amqp_port = self.stream_port = self.dist_port = self.epmd_port = 0

    @property
    def uri(self) -> str:
        """``rabbitmq-stream://guest:guest@127.0.0.1:<port>/``."""
        return f"rabbitmq-stream://guest:guest@{LOOPBACK}:{self.stream_port}/"

    @property
    def host_home(self) -> Path:
        """The instance's directory, seen from outside the chroot."""
        return self.rootfs / str(self.home).lstrip("/")

    @property
    def log_path(self) -> Path:
        """The server's console output."""
        return self.host_home / "console.log"

    def _write_config(self) -> None:
        home = self.host_home
        for sub in ("mnesia", "log"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        (home / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = {LOOPBACK}:{self.amqp_port}\n"
            f"stream.listeners.tcp.1 = {LOOPBACK}:{self.stream_port}\n"
            f"stream.advertised_host = {self.advertised_host}\n"
            f"stream.advertised_port = {self.stream_port}\n"
            "loopback_users = none\n"
            "log.console = true\nlog.console.level = warning\nlog.file = false\n"
        )
        (home / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        hosts = self.rootfs / "etc" / "hosts"
        if "localhost" not in (hosts.read_text() if hosts.exists() else ""):
            hosts.write_text("127.0.0.1 localhost\n::1 localhost\n")

    def start(self) -> Self:
        """Start and wait until the stream port accepts connections.

        Raises:
            NsqProcessError: not root (chroot needs it), or the server did not start.
        """
        if os.geteuid() != 0:
            raise ServerProcessError(
                f"RabbitMQ in {self.rootfs} runs with chroot, which needs root: run this as"
                " root (sudo), or use a RabbitMQ you run with"
                " RABBITMQ_STREAM_TEST_URI=rabbitmq-stream://guest:guest@127.0.0.1:5552/"
            )
        if not self.stream_port:
            ports = free_ports(4)
            self.amqp_port, self.stream_port, self.dist_port, self.epmd_port = ports
        self._write_config()
        self.spawn(
            ["chroot", str(self.rootfs), "/usr/lib/rabbitmq/bin/rabbitmq-server"], env=self._env()
        )
        self.wait_ready()
        return self

    def _env(self) -> dict[str, str]:
        """The environment of the server and of its ``rabbitmqctl``."""
        home = str(self.home)
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": home,
            "LANG": "C.UTF-8",
            _MARK: self.instance,
            "RABBITMQ_CONFIG_FILE": f"{home}/rabbitmq.conf",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{home}/enabled_plugins",
            "RABBITMQ_MNESIA_BASE": f"{home}/mnesia",
            "RABBITMQ_LOG_BASE": f"{home}/log",
            "RABBITMQ_NODENAME": f"rabbit{self.instance}@localhost",
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": LOOPBACK,
        }

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl`` against this node and return what it printed, e.g.
        ``server.ctl("eval", "sys:suspend(whereis(rabbit_stream_coordinator)).")``.

        Raises:
            ServerProcessError: it exited with an error (its output is in the message).
        """
        env = self._env()
        command = ["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", env["RABBITMQ_NODENAME"], *args]
        done = subprocess.run(
            ["chroot", str(self.rootfs), *command],
            env={k: v for k, v in env.items() if k != _MARK},  # not one of the node's own
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ServerProcessError(
                f"rabbitmqctl {' '.join(args)} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return done.stdout.strip()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until the stream listener answers a PeerProperties exchange."""
        self.wait_until(lambda: _stream_answers(self.stream_port), timeout, "become ready")

    def _pids(self) -> list[int]:
        """Every process of this instance (the server, its Erlang VM, its epmd)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if f"{_MARK}={self.instance}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
        return found

    @property
    def running(self) -> bool:
        """True while any process of this instance runs (the server, its Erlang VM, its
        epmd: they outlive the chroot that started them)."""
        return bool(self._pids())

    def terminate(self, sig: signal.Signals, timeout: float) -> int | None:
        """Send ``sig`` to every process of the instance (SIGKILL after ``timeout``);
        the data stays, so :meth:`start` again resumes the same streams."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while (left := self._pids()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        return super().terminate(sig, 5.0)  # the chroot's own process, already ended

    def discard_data(self) -> None:
        """Remove the instance's data."""
        shutil.rmtree(self.host_home, ignore_errors=True)


def _stream_answers(port: int) -> bool:
    """True when a PeerProperties request on ``port`` gets its response."""
    request = b"\x00\x11\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00"  # key 17, v1, corr 1, {}
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1.0) as sock:
            sock.sendall(len(request).to_bytes(4, "big") + request)
            head = sock.recv(8)
            return len(head) == 8 and head[4:6] == b"\x80\x11"
    except OSError:
        return False
