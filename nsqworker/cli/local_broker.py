"""What ``nsqworker dev broker`` starts, whichever broker and wherever it came from: a
:class:`LocalBroker` to print, watch and stop, or a :class:`BrokerError` saying what to do."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BrokerError", "LocalBroker"]


@dataclass
class LocalBroker:
    """A running local broker: what to print, and how to watch and stop it."""

    transport: str
    addresses: dict[str, str]
    env: dict[str, str]
    logs: list[Path]
    alive: Callable[[], bool]
    stop: Callable[[], None]
    notes: list[str] = field(default_factory=list)

    def export_line(self) -> str:
        """``export NSQWORKER_TRANSPORT=... NSQWORKER_...=...`` for a shell."""
        return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())


class BrokerError(RuntimeError):
    """Raised when a local broker cannot start; the message says what to do."""
