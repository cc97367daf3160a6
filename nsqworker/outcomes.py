"""What a handler's work becomes: the exceptions it may raise and the outcome each maps to.

Three outcomes, and only these words for them: **finish**, **retry**, **reject**
(:mod:`nsqworker.message`: ``FINISH``, ``Retry``, ``Reject``; the exceptions a handler
raises are the outcomes themselves).

======================================  =================================  ========
handler does                            outcome (NSQ's command)            backoff
======================================  =================================  ========
returns                                 finish (FIN)                       success
raises ``Retry(delay)``                 retry after delay (REQ)            failure
raises any other exception              retry, exponential delay from      failure
                                        attempts
fails its last allowed attempt          reject: dead-letter chain at       failure
                                        once, then the final settle (FIN)
runs past its ``timeout``               retry (``TaskTimeout``); reject    failure
                                        with ``timeout_action``
                                        ``dead_letter`` (time_limits)
raises ``Reject(reason)``               reject: dead-letter chain, then    none
                                        the final settle (FIN)
returns a value, with ``publish_to``    publish it, then finish            success
returns ``Publish(...)`` (or a list)    publish each, then finish          success
answered itself (``msg.finish()``...)   nothing more                       —
cancelled while the worker stops        retry at once                      none
======================================  =================================  ========
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsqworker.errors import UndecodableBody
from nsqworker.message import FINISH, MAX_RETRY_DELAY, Outcome, Reject, Retry, is_retry_delay

if TYPE_CHECKING:
    from nsqworker.message import Message

__all__ = [
    "MAX_RETRY_DELAY",
    "TIME_LIMIT",
    "Publish",
    "Reject",
    "Retry",
    "TaskTimeout",
    "describe_outcome",
    "last_error",
    "outcome_of_error",
    "outcome_of_return",
]

TIME_LIMIT = "nsqworker: the handler ran past its time limit"
"""The message of the ``CancelledError`` an async handler gets at its time limit: code
that must answer before it goes (an RPC endpoint's error reply) tells it from a stop by
``exc.args == (TIME_LIMIT,)``; returning afterwards finishes the message, re-raising
retries it."""
REJECTED_BY_HANDLER = "rejected by the handler"
"""The dead-letter reason of a ``Reject()`` raised without one."""
_FAILED = Retry(None)
_STOPPING = Retry(0.0, backoff=False)


# --- what a handler raises besides Retry and Reject ------------------------------------


class TaskTimeout(Exception):
    """Raised in place of a handler that ran past its time limit (``timeout=``): the
    message is retried like after any failure, an attempt counted."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        super().__init__(f"the handler ran past its time limit of {limit:g}s")

    def __reduce__(self) -> tuple[type[TaskTimeout], tuple[float]]:
        return TaskTimeout, (self.limit,)


# --- what a handler returns ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Publish:
    """Return from a handler (or a list of them) to publish messages before it finishes.

    ``body`` is what ``Producer.publish`` takes (bytes, str, a pydantic model, a
    dataclass) or any JSON value; ``delay`` seconds defer it (on transports that can).
    Published on the task's transport, in order, before the message is finished; a
    publish that fails fails the attempt (retried, then dead-lettered), so at worst a
    retried message publishes its result twice. See ``@task(publish_to=...)``.
    """

    topic: str
    body: Any
    delay: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise TypeError(f"Publish(topic=...) must be a topic name, got {self.topic!r}")
        delay = self.delay
        if delay is not None and not is_retry_delay(delay):
            raise ValueError(
                f"Publish(delay={delay!r}): give seconds from 0 to {MAX_RETRY_DELAY:g}, or None"
            )


# --- what a handler's result becomes --------------------------------------------------


def outcome_of_return(msg: Message) -> Outcome | None:
    """The outcome of a handler that returned: finish, or None if it answered itself."""
    return None if msg.responded else FINISH


def outcome_of_error(msg: Message, exc: BaseException) -> Outcome | None:
    """The outcome of a handler that raised ``exc``; None if it had answered itself.

    A ``Retry`` or a ``Reject`` is its own outcome (a ``Reject()`` without a reason
    gets one); ``UndecodableBody`` -> reject; ``asyncio.CancelledError`` (the worker
    stopping) -> retry at once without backoff; anything else -> retry with the
    exponential delay (a failure).
    """
    if msg.responded:
        return None
    if isinstance(exc, Retry):
        return exc
    if isinstance(exc, Reject):
        return exc if exc.reason else Reject(REJECTED_BY_HANDLER)
    if isinstance(exc, UndecodableBody):  # msg.json() of a bad body: never a retry
        return Reject(exc.reason)
    if isinstance(exc, asyncio.CancelledError):
        return _STOPPING
    return _FAILED


def describe_outcome(outcome: Outcome | None) -> str:
    """A short phrase for logs, the same on every broker: ``finished``, ``retry in 5s``,
    ``retry``, ``rejected`` or ``answered``."""
    if outcome is None:
        return "answered"
    if isinstance(outcome, Retry):
        return "retry" if outcome.delay is None else f"retry in {outcome.delay:g}s"
    if isinstance(outcome, Reject):
        return "rejected"
    return "finished"


#: Characters of a failure's message kept for /status (a handler's free text).
MAX_ERROR_TEXT = 300


def last_error(msg: Message, exc: BaseException, outcome: Outcome | None) -> dict[str, Any]:
    """A handler failure as plain data: what the console shows as a task's last error."""
    text = str(exc)
    if len(text) > MAX_ERROR_TEXT:
        text = text[:MAX_ERROR_TEXT] + "..."
    kind = "retry" if isinstance(outcome, Retry) else "reject" if outcome else "late"
    return {
        "error": f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
        "id": msg.id, "attempts": msg.attempts, "at": round(time.time(), 3), "outcome": kind,
    }  # fmt: skip
