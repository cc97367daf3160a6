"""A network namespace of the test's own, and what crosses into it (Linux, as root).

:class:`NetNamespace` makes a named namespace (``ip netns add``) holding only ``lo``
with 127.0.0.1 and one more address (a node address: the kubelet refuses a loopback
one). It has no link to the host's network: nothing started inside can reach beyond it.
Processes run in it with :meth:`NetNamespace.command` (``nsenter --net``, which execs
the program: its PID is the program's), and the test's own process reaches a port
inside through :meth:`NetNamespace.forward`, a relay from a port of the host's
loopback (threads of this process; a socket belongs to the namespace it was made in).

:class:`HostState` records what the kubelet changes on the host (sysctls, directories
it creates at fixed paths) and puts it back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import socket
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

from nsqworker.testing.ports import LOOPBACK, free_port

__all__ = ["HostState", "NetNamespace", "NetNamespaceError", "netns_pids"]

ONLY_LINK = "lo"
"""The one network link a :class:`NetNamespace` may hold: no bridge, veth or other."""

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")


class NetNamespaceError(RuntimeError):
    """The namespace cannot be made, entered or deleted."""


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise NetNamespaceError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def netns_pids(path: str | os.PathLike[str]) -> list[int]:
    """PIDs of the live (not zombie) processes whose network namespace is ``path``'s."""
    try:
        wanted = os.stat(path).st_ino
    except FileNotFoundError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry / "ns" / "net").st_ino != wanted:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":  # PID 1 here reaps orphans late: a zombie has ended
            found.append(int(entry.name))
    return found


class NetNamespace:
    """A named network namespace with only ``lo`` (127.0.0.1 and ``address``).

    Args:
        name: the name under /run/netns; one that exists already is refused (another
            session's, or a leftover: ``ip netns del NAME``).
        address: a second address on ``lo`` (``/32``), inside the namespace only.
        more: further ``/32`` addresses on ``lo`` (one per node of a cluster).
    """

    def __init__(self, name: str, address: str, more: Iterable[str] = ()) -> None:
        self.name = name
        self.address = address
        self.more = list(more)
        self.path = NETNS_DIR / name
        self._forwards: list[socket.socket] = []
        self._closing = threading.Event()

    def create(self) -> None:
        """``ip netns add``, ``lo`` up with ``address``."""
        if self.path.exists():
            raise NetNamespaceError(
                f"network namespace {self.name} exists already (another test session's,"
                f" or left over: `ip netns del {self.name}`)"
            )
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")
        for address in (self.address, *self.more):
            _ip("-n", self.name, "addr", "add", f"{address}/32", "dev", "lo")

    def links(self) -> list[str]:
        """Names of the namespace's links (``ip -n NAME -o link``); ``["lo"]`` by design."""
        out = _ip("-n", self.name, "-o", "link")
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line]

    def check_lo_only(self) -> None:
        """Raise unless ``lo`` is the namespace's one link (nothing may lead out of it).

        Raises:
            NetNamespaceError: another link is there; the message names them all.
        """
        links = self.links()
        if links != [ONLY_LINK]:
            raise NetNamespaceError(
                f"network namespace {self.name} must hold only {ONLY_LINK}; it holds {links}"
            )

    def command(self, argv: Iterable[str]) -> list[str]:
        """``argv`` run inside the namespace (the host's mount namespace is kept)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def pids(self) -> list[int]:
        """Live processes inside the namespace."""
        return netns_pids(self.path)

    def forward(self, port: int, host_port: int | None = None) -> int:
        """Relay ``127.0.0.1:host_port`` of the host to ``127.0.0.1:port`` inside.

        ``host_port`` None takes a free one. Returns the host's port. A connection made
        before anything listens inside is closed at once (the caller sees a reset).
        """
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, host_port if host_port is not None else free_port()))
        listener.listen(64)
        self._forwards.append(listener)
        ready = threading.Event()
        errors: list[BaseException] = []
        thread = threading.Thread(
            target=self._accept_loop,
            args=(listener, port, ready, errors),
            name=f"netns-forward-{port}",
            daemon=True,
        )
        thread.start()
        ready.wait(10)
        if errors:
            raise NetNamespaceError(f"cannot enter {self.name}: {errors[0]}")
        return int(listener.getsockname()[1])

    def _accept_loop(
        self,
        listener: socket.socket,
        port: int,
        ready: threading.Event,
        errors: list[BaseException],
    ) -> None:
        # this thread alone moves into the namespace: the sockets it makes from now on
        # are the namespace's; the listener (made before) stays the host's
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            finally:
                os.close(fd)
        except OSError as exc:
            errors.append(exc)
            ready.set()
            return
        ready.set()
        while not self._closing.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((LOOPBACK, port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            threading.Thread(target=_relay, args=(client, upstream), daemon=True).start()

    def close_forwards(self) -> None:
        """Stop relaying (connections already relayed end with their peers)."""
        self._closing.set()
        for listener in self._forwards:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        self._forwards.clear()

    def delete(self) -> None:
        """``ip netns del`` (after every process in it has ended)."""
        self.close_forwards()
        if self.path.exists():
            _ip("netns", "del", self.name)


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    pair = {a: b, b: a}
    try:
        while True:
            readable, _, _ = select.select(list(pair), [], [], 60)
            for src in readable:
                data = src.recv(65536)
                if not data:
                    return
                pair[src].sendall(data)
    except OSError:
        return
    finally:
        a.close()
        b.close()


class HostState:
    """Host sysctls and fixed directories the kubelet and containerd change, restored.

    Args:
        sysctls: the keys (``vm.overcommit_memory``) to save now and write back.
        paths: directories to remove at :meth:`restore` if they do not exist now.
    """

    def __init__(self, sysctls: Iterable[str], paths: Iterable[str | os.PathLike[str]]) -> None:
        self.sysctls = {key: self._read(key) for key in sysctls}
        self.new_paths = [Path(p) for p in paths if not Path(p).exists()]

    @staticmethod
    def _read(key: str) -> str:
        return (Path("/proc/sys") / key.replace(".", "/")).read_text().strip()

    def changed(self) -> dict[str, tuple[str, str]]:
        """``{key: (saved, now)}`` for each sysctl that differs from what was saved."""
        now = {key: self._read(key) for key in self.sysctls}
        return {k: (v, now[k]) for k, v in self.sysctls.items() if now[k] != v}

    def restore(self) -> None:
        """Write back each changed sysctl; remove the directories made since."""
        for key, (saved, _) in self.changed().items():
            (Path("/proc/sys") / key.replace(".", "/")).write_text(saved)
        for path in self.new_paths:
            subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)
