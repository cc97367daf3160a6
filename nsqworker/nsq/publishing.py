"""What publishing to nsqd needs besides connections: pure helpers for bodies, delays,
MPUB batches and size limits. The telemetry seam of a publish call (:class:`PublishCall`)
is every producer's: :mod:`nsqworker.producing`."""

from __future__ import annotations

import math
import re
import struct
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from nsqworker.errors import ConfigurationError, LocalProtocolError
from nsqworker.message import to_bytes
from nsqworker.nsq import protocol
from nsqworker.producing import NO_HOOK, Instrumentation, Operation, PublishCall

if TYPE_CHECKING:
    from nsqworker.settings.nsq import NsqSettings as Settings

__all__ = [
    "NO_HOOK",
    "Body",
    "Instrumentation",
    "Operation",
    "PublishCall",
    "delay_to_ms",
    "nsqd_addresses",
    "parse_size_limit",
    "split_batches",
    "to_bytes",
]

Body = bytes | bytearray | memoryview | str | Any
"""bytes, str, a pydantic model or a dataclass instance (published as its JSON)."""

MAX_DELAY: Final = protocol.DEFAULT_MAX_REQ_TIMEOUT_MS / 1000
"""Longest DPUB delay in seconds (nsqd's default ``--max-req-timeout``)."""

# nsqd 1.3.0: "PUB message too big 1048577 > 1048576" (also DPUB, MPUB: E_BAD_MESSAGE)
# and "MPUB body too big 5242881 > 5242880" (E_BAD_BODY).
TOO_BIG: Final = re.compile(r"\b(message|body) too big (\d+) > (\d+)")
# nsqd failed to store the message (exiting, disk); nothing was kept, another nsqd may take it.
RETRYABLE: Final = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})
SIZE: Final = struct.Struct(">I")
# Topics a producer validated, with their "PUB topic\n" line; emptied when this full.
TOPIC_CACHE_SIZE: Final = 1024


# --- pure helpers -------------------------------------------------------------------


def delay_to_ms(delay: float) -> int:
    """A DPUB delay in seconds as whole milliseconds, checked against 0..3600 s."""
    if isinstance(delay, bool) or not isinstance(delay, int | float) or math.isnan(delay):
        raise LocalProtocolError(f"delay must be a number of seconds, got {delay!r}")
    if not 0 <= delay <= MAX_DELAY:
        raise LocalProtocolError(
            f"delay must be within 0..{MAX_DELAY:g} seconds (nsqd --max-req-timeout), got {delay:g}"
        )
    return round(delay * 1000)


def split_batches(bodies: list[bytes], max_body_size: int) -> list[list[bytes]]:
    """Split ``bodies`` into consecutive MPUB batches that each fit ``max_body_size``.

    Order is kept and batches are filled greedily. A body too large to fit even alone
    gets a batch of its own (the encoder or nsqd refuses it). Staying within the body
    size also keeps the count within nsqd's ``(max_body_size - 4) / 5``.
    """
    batches: list[list[bytes]] = []
    current: list[bytes] = []
    size = 4
    for body in bodies:
        cost = 4 + len(body)
        if current and size + cost > max_body_size:
            batches.append(current)
            current, size = [], 4
        current.append(body)
        size += cost
    if current:
        batches.append(current)
    return batches


def parse_size_limit(message: str) -> tuple[Literal["message", "body"], int] | None:
    """Read nsqd's limit from a "too big" error text: ``("message", 1048576)``, or None."""
    match = TOO_BIG.search(message)
    if match is None:
        return None
    kind = cast(Literal["message", "body"], match.group(1))
    return kind, int(match.group(3))


def nsqd_addresses(given: list[str] | str | None, settings: Settings | None) -> list[str]:
    if given is None:
        given = [] if settings is None else list(settings.nsqd_tcp_addresses)
    items = given.split(",") if isinstance(given, str) else list(given)
    addresses = list(dict.fromkeys(a.strip() for a in items if a.strip()))
    if not addresses:
        raise ConfigurationError(
            "no nsqd address: pass Producer(['127.0.0.1:4150']) or set NSQWORKER_NSQD_TCP_ADDRESSES"
        )
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(f"nsqd address {address!r} must be host:port")
    return addresses
