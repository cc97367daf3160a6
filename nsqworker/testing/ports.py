"""Free TCP ports on loopback, for the processes a test starts."""

from __future__ import annotations

import contextlib
import socket

__all__ = ["LOOPBACK", "free_port", "free_ports", "port_is_free"]

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that was free a moment ago.

    Another process may still take it before it is used; :meth:`NsqdProcess.start`
    therefore retries with new ports when nsqd reports the address in use.
    """
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Return ``count`` distinct TCP ports on ``host`` that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Return True when a TCP listener could bind ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
