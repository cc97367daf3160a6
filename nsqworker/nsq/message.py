"""A delivered message, and the outcomes a handler's work turns into."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any, Protocol

from nsqworker.errors import AlreadyResponded, UndecodableBody

__all__ = ["FINISH", "Finish", "GiveUp", "Message", "Outcome", "Requeue"]


class Finish:
    """The message is done: FIN."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "FINISH"


FINISH = Finish()


class Requeue:
    """Put the message back: REQ.

    ``delay`` in seconds, or None to let the consumer's requeue policy pick one from the
    attempts. ``backoff`` tells whether this counts as a failure for consumer backoff.
    """

    __slots__ = ("backoff", "delay")

    def __init__(self, delay: float | None = None, backoff: bool = True) -> None:
        self.delay = delay
        self.backoff = backoff

    def __repr__(self) -> str:
        return f"Requeue(delay={self.delay!r}, backoff={self.backoff!r})"


class GiveUp:
    """Stop retrying: run the give-up (dead-letter) hook, then FIN."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"GiveUp({self.reason!r})"


Outcome = Finish | Requeue | GiveUp


class MessageOwner(Protocol):
    """What a message needs from whoever delivered it (the consumer)."""

    def settle(self, message: Message, outcome: Outcome) -> None: ...

    def touch(self, message: Message) -> None: ...


class Message:
    """One delivery of an NSQ message.

    ``id`` is the 16 hex characters nsqd sent, ``attempts`` is 1 on the first delivery,
    ``timestamp`` is nanoseconds since the epoch when nsqd first accepted it.
    Handlers normally just return or raise; the methods ``finish``, ``requeue`` and
    ``touch`` are for handlers that answer themselves. Answering twice raises
    :class:`~nsqworker.errors.AlreadyResponded` and sends nothing.
    """

    __slots__ = (
        "_conn",
        "_owner",
        "_responded",
        "attempts",
        "body",
        "channel",
        "id_bytes",
        "nsqd_address",
        "received_at",
        "timestamp",
        "topic",
        "touch_count",
    )

    def __init__(
        self,
        id_bytes: bytes,
        body: bytes,
        timestamp: int,
        attempts: int,
        topic: str,
        channel: str,
        nsqd_address: str,
        owner: MessageOwner | None = None,
        conn: Any = None,
        received_at: float = 0.0,
    ) -> None:
        self.id_bytes = id_bytes
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.topic = topic
        self.channel = channel
        self.nsqd_address = nsqd_address
        self._owner = owner
        self._conn = conn
        self._responded = False
        self.received_at = received_at
        self.touch_count = 0

    @property
    def id(self) -> str:
        """The message id as sent by nsqd: 16 hex characters."""
        return self.id_bytes.decode("ascii")

    @property
    def datetime(self) -> datetime:
        """When nsqd first accepted the message, as an aware UTC datetime."""
        return datetime.fromtimestamp(self.timestamp / 1e9, tz=UTC)

    @property
    def responded(self) -> bool:
        """True once the message was finished or requeued."""
        return self._responded

    @property
    def max_msg_timeout(self) -> float | None:
        """nsqd's ``--max-msg-timeout`` in seconds, from its IDENTIFY answer on the
        connection that delivered this message; None when not known. TOUCH cannot keep
        the message past it."""
        value = getattr(self._conn, "max_msg_timeout", None)
        return float(value) if isinstance(value, int | float) else None

    @property
    def draining(self) -> asyncio.Event | None:
        """Set when the consumer that delivered this message starts to stop; None
        when it was not delivered by a consumer (a test building a Message)."""
        event = getattr(self._owner, "draining", None)
        return event if isinstance(event, asyncio.Event) else None

    def json(self) -> Any:
        """The body parsed as JSON; a body that is not JSON raises UndecodableBody (a
        Reject and a ValueError): uncaught, the message is dead-lettered at once."""
        try:  # security (issue 29): a bad body is given up, never retried with backoff
            return json.loads(self.body)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int too long
            raise UndecodableBody(f"body is not JSON: {exc} ({self.body[:60]!r})") from None
        except RecursionError:  # [[[[... deeper than the interpreter's stack
            raise UndecodableBody(f"body is JSON nested too deeply ({self.body[:60]!r})") from None

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text."""
        return self.body.decode(encoding)

    def finish(self) -> None:
        """Tell nsqd the message is done (FIN)."""
        self._settle(FINISH)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """Put the message back (REQ), after ``delay`` seconds or the policy's delay."""
        self._settle(Requeue(delay, backoff))

    def touch(self) -> None:
        """Reset nsqd's timeout for this message (TOUCH). The worker does this itself
        for handlers that run long; call it only when answering yourself."""
        if self._responded:
            raise AlreadyResponded(f"message {self.id} was already answered; cannot TOUCH")
        if self._owner is not None:
            self._owner.touch(self)

    def _settle(self, outcome: Outcome) -> None:
        if self._responded:
            raise AlreadyResponded(
                f"message {self.id} was already answered; not sending {outcome!r}"
            )
        self._responded = True
        if self._owner is not None:
            self._owner.settle(self, outcome)

    def __repr__(self) -> str:
        return (
            f"<Message {self.id} topic={self.topic!r} channel={self.channel!r} "
            f"attempts={self.attempts} size={len(self.body)}>"
        )
