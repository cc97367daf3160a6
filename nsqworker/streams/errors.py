"""The broker's reason, in words, for every error that reaches a user.

rstream raises its ``ServerError`` subclasses without a message (``str(exc) == ""``), so
an error built from ``f"...: {exc}"`` ended in nothing. :func:`reason` names the stream
protocol's response code (the table of shared/protocol/rabbitmq-stream-protocol.md), and
:func:`unresolved_host` recognises the usual container mistake: RabbitMQ advertising a
host name for its stream listener that the client cannot resolve.
"""

from __future__ import annotations

import socket
from typing import Final

__all__ = ["RESPONSE_CODES", "reason", "unresolved_host"]

RESPONSE_CODES: Final = {
    1: "OK",
    2: "stream does not exist",
    3: "subscription ID already exists",
    4: "subscription ID does not exist",
    5: "stream already exists",
    6: "stream not available",
    7: "SASL mechanism not supported",
    8: "authentication failure",
    9: "SASL error",
    10: "SASL challenge",
    11: "SASL authentication failure loopback",
    12: "virtual host access failure",
    13: "unknown frame",
    14: "frame too large",
    15: "internal error",
    16: "access refused",
    17: "precondition failed",
    18: "publisher does not exist",
    19: "no offset",
}
"""The stream protocol's response codes, as RabbitMQ's documentation names them."""


def reason(exc: BaseException) -> str:
    """What went wrong, never empty: the response code's name and number for a server
    error (``precondition failed (response code 17)``), else the exception's text, else
    its type's name."""
    code = getattr(type(exc), "code", None)
    if isinstance(code, int) and code in RESPONSE_CODES:
        text = str(exc).strip()
        named = f"{RESPONSE_CODES[code]} (response code {code})"
        return f"{named}: {text}" if text else named
    return " ".join(str(exc).split()) or type(exc).__name__


def unresolved_host(exc: BaseException) -> bool:
    """True for a host name that does not resolve (``socket.gaierror``), also when
    wrapped by a library in an exception of its own."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, socket.gaierror):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
