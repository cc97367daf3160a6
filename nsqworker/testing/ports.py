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


def adjacent_free_ports(host: str = LOOPBACK, tries: int = 50) -> tuple[int, int]:
    """Two free TCP ports ``(p, p + 1)`` on ``host``, as nsqd's defaults (4150 and 4151)
    and nsqlookupd's are: tools that know only an nsqd's TCP address find its HTTP API
    at the next port. Raises OSError when none were found in ``tries``."""
    for _ in range(tries):
        port = free_port(host)
        if port < 65535 and port_is_free(port + 1, host):
            return port, port + 1
    raise OSError(f"no two adjacent free ports on {host} in {tries} tries")


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Return True when a TCP listener could bind ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
