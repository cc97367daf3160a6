"""What a handler's work becomes: the exceptions it may raise and the outcome each maps to.

======================================  =================================  ========
handler does                            sent to the broker                 backoff
======================================  =================================  ========
returns                                 ack (FIN on NSQ)                   success
raises ``Retry(delay)``                 retry after delay (REQ)            failure
raises any other exception              retry, exponential delay from      failure
                                        attempts
fails its last allowed attempt          dead-letter hooks at once, then    failure
                                        reject
runs past its ``timeout``               retry (``TaskTimeout``)            failure
raises ``Reject(reason)``               dead-letter hooks, then reject     none
returns a value, with ``publish_to``    publish it, then ack               success
returns ``Publish(...)`` (or a list)    publish each, then ack             success
answered itself (``msg.finish()``...)   nothing more                       —
cancelled while the worker stops        retry at once                      none
======================================  =================================  ========
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from nsqworker.errors import UndecodableBody
from nsqworker.message import FINISH, GiveUp, Message, Outcome, Requeue
from nsqworker.transport import MAX_RETRY_DELAY as MAX_REQUEUE_DELAY

__all__ = [
    "MAX_REQUEUE_DELAY",
    "TIME_LIMIT",
    "Publish",
    "Reject",
    "Retry",
    "TaskTimeout",
    "describe_outcome",
    "outcome_of_error",
    "outcome_of_return",
]

TIME_LIMIT = "nsqworker: the handler ran past its time limit"
"""The message of the ``CancelledError`` an async handler gets at its time limit: code
that must answer before it goes (an RPC endpoint's error reply) tells it from a stop by
``exc.args == (TIME_LIMIT,)``; returning afterwards acks the message, re-raising
retries it."""


# --- what a handler raises -----------------------------------------------------------


class Retry(Exception):
    """Raise in a handler to requeue the message after ``delay`` seconds.

    ``delay=None`` lets the worker pick the exponential delay from the attempts. A
    retry counts as a failure: it uses up an attempt and moves the consumer's backoff.
    """

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not 0 <= delay <= MAX_REQUEUE_DELAY
        ):
            raise ValueError(
                f"Retry(delay={delay!r}): give seconds from 0 to {MAX_REQUEUE_DELAY:g}, or None"
            )
        self.delay = None if delay is None else float(delay)
        self.reason = reason
        text = "retry" if delay is None else f"retry in {delay:g}s"
        super().__init__(f"{text}: {reason}" if reason else text)

    def __reduce__(self) -> tuple[type[Retry], tuple[float | None, str]]:
        return Retry, (self.delay, self.reason)


class TaskTimeout(Exception):
    """Raised in place of a handler that ran past its time limit (``timeout=``): the
    message is retried like after any failure, an attempt counted."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        super().__init__(f"the handler ran past its time limit of {limit:g}s")

    def __reduce__(self) -> tuple[type[TaskTimeout], tuple[float]]:
        return TaskTimeout, (self.limit,)


class Reject(Exception):
    """Raise in a handler to give up at once: dead-letter hooks with ``reason``, then FIN."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason or "rejected")

    def __reduce__(self) -> tuple[type[Reject], tuple[str]]:
        return Reject, (self.reason,)


# --- what a handler returns ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Publish:
    """Return from a handler (or a list of them) to publish messages before the ack.

    ``body`` is what ``Producer.publish`` takes (bytes, str, a pydantic model, a
    dataclass) or any JSON value; ``delay`` seconds defer it (on transports that can).
    Published on the task's transport, in order, before the message is acknowledged; a
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
        if delay is not None and (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not 0 <= delay <= MAX_REQUEUE_DELAY
        ):
            raise ValueError(
                f"Publish(delay={delay!r}): give seconds from 0 to {MAX_REQUEUE_DELAY:g}, or None"
            )


# --- what a handler's result becomes --------------------------------------------------


def outcome_of_return(msg: Message) -> Outcome | None:
    """The outcome of a handler that returned: FIN, or None if it answered itself."""
    return None if msg.responded else FINISH


def outcome_of_error(msg: Message, exc: BaseException) -> Outcome | None:
    """The outcome of a handler that raised ``exc``; None if it had answered itself.

    ``Retry`` -> REQ its delay (a failure); ``Reject`` -> give up (dead-letter hooks,
    then FIN); ``asyncio.CancelledError`` (the worker stopping) -> REQ 0 without
    backoff; anything else -> REQ with the exponential delay (a failure).
    """
    if msg.responded:
        return None
    if isinstance(exc, Retry):
        return Requeue(exc.delay, backoff=True)
    if isinstance(exc, Reject):
        return GiveUp(exc.reason or "rejected by the handler")
    if isinstance(exc, UndecodableBody):  # msg.json() of a bad body: never a retry
        return GiveUp(exc.reason)
    if isinstance(exc, asyncio.CancelledError):
        return Requeue(0.0, backoff=False)
    return Requeue(None, backoff=True)


def describe_outcome(outcome: Outcome | None) -> str:
    """A short phrase for logs, the same on every broker: ``finished``, ``retry in 5s``,
    ``retry``, ``dead-letter`` or ``answered``."""
    if outcome is None:
        return "answered"
    if isinstance(outcome, Requeue):
        return "retry" if outcome.delay is None else f"retry in {outcome.delay:g}s"
    if isinstance(outcome, GiveUp):
        return "dead-letter"
    return "finished"
