"""Topic and channel names every transport accepts, checked when a task is declared.

The rule is NSQ's: 1 to 64 characters from ``[.a-zA-Z0-9_-]``, optionally ending in
``#ephemeral``. ``@task`` checks it at import, whatever the transport, so a tasks module
stays portable; each transport checks its own, stricter rules when a worker subscribes
(a NATS subject may not have empty tokens, say).
"""

from __future__ import annotations

import re
from typing import Final

from nsqworker.errors import InvalidName

__all__ = ["MAX_NAME_LENGTH", "check_channel", "check_topic", "is_valid_name"]

# \Z, not $: "$" also matches before a trailing newline, which would end an NSQ command.
_NAME_RE: Final = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?\Z")
MAX_NAME_LENGTH: Final = 64


def check_topic(name: str) -> str:
    """Return ``name`` if it is a valid topic name, else raise :class:`InvalidName`."""
    return _check_name(name, "topic")


def check_channel(name: str) -> str:
    """Return ``name`` if it is a valid channel name, else raise :class:`InvalidName`."""
    return _check_name(name, "channel")


def is_valid_name(name: str) -> bool:
    """Tell whether ``name`` is a valid topic or channel name."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _NAME_RE.match(name) is not None


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str):
        raise InvalidName(f"{what} name must be a str, got {type(name).__name__}")
    if not is_valid_name(name):
        raise InvalidName(
            f"invalid {what} name {name!r}: use 1 to {MAX_NAME_LENGTH} characters from "
            "[.a-zA-Z0-9_-], optionally ending in '#ephemeral'"
        )
    return name
