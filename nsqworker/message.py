"""A delivered message, and the three outcomes a handler's work turns into.

The same :class:`Message` class serves every transport: the transport builds it with its
own ``receipt`` (what it needs to settle the delivery, e.g. NSQ's connection) and hands
it to the task layer, which is the message's ``owner``: ``finish()``, ``retry()`` and
``touch()`` go through the owner, so the task layer's policy sees every settle.

An outcome is one of three, named the same in code, logs and docs: **finish**
(:data:`FINISH`), **retry** (:class:`Retry`) and **reject** (:class:`Reject`: stop
retrying, the dead-letter chain, then the broker's final settle). ``Retry`` and
``Reject`` are also the exceptions a handler raises: the exception is the outcome.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from dataclasses import is_dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Protocol

from nsqworker.errors import AlreadyResponded, NSQWorkerError, UndecodableBody
from nsqworker.safe_text import one_line

__all__ = [
    "FINISH",
    "MAX_RETRY_DELAY",
    "Finish",
    "Message",
    "MessageOwner",
    "Outcome",
    "Reject",
    "Retry",
    "Stage",
    "StageError",
    "Undecodable",
    "is_retry_delay",
    "to_bytes",
]


MAX_RETRY_DELAY: Final = 3600.0
"""The longest retry delay in seconds a handler (``Retry(delay)``) or a task's settings
may ask for, on every transport: nsqd's default ``--max-req-timeout``. A transport that
honours less says so in ``Capabilities.max_retry_delay`` (nsqworker.transport re-exports
this constant)."""


def is_retry_delay(value: object) -> bool:
    """Whether ``value`` is seconds a retry may wait: a number from 0 to
    :data:`MAX_RETRY_DELAY` (not a bool, not NaN)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and 0 <= value <= MAX_RETRY_DELAY
    )


class Finish:
    """The outcome "finish": the message is done and the transport settles it (FIN on
    NSQ, ``+ACK`` on NATS, the offset may pass it on RabbitMQ Streams). One instance,
    :data:`FINISH`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "FINISH"


FINISH = Finish()


class Retry(Exception):
    """Raise in a handler to retry the message after ``delay`` seconds; it is also the
    outcome "retry" itself (what ``msg.retry()`` sends, what the worker decides after a
    failure).

    ``delay=None`` lets the worker pick the exponential delay from the attempts. A retry
    counts as a failure: it uses up an attempt and moves the consumer's backoff, unless
    ``backoff=False`` (the worker's own hand-backs while it stops). The transport carries
    it out its own way (REQ on NSQ, ``-NAK`` with a delay on NATS, a retry stream on
    RabbitMQ Streams).
    """

    def __init__(self, delay: float | None = None, reason: str = "", backoff: bool = True) -> None:
        if delay is not None and not is_retry_delay(delay):
            raise ValueError(
                f"Retry(delay={delay!r}): give seconds from 0 to {MAX_RETRY_DELAY:g}, or None"
            )
        self.delay = None if delay is None else float(delay)
        self.reason = reason
        self.backoff = backoff
        text = "retry" if delay is None else f"retry in {delay:g}s"
        super().__init__(f"{text}: {reason}" if reason else text)

    def __repr__(self) -> str:
        return f"Retry(delay={self.delay!r}, reason={self.reason!r}, backoff={self.backoff!r})"

    def __reduce__(self) -> tuple[type[Retry], tuple[float | None, str, bool]]:
        return Retry, (self.delay, self.reason, self.backoff)


class Reject(Exception):
    """Raise in a handler to stop retrying at once; it is also the outcome "reject"
    itself: the dead-letter chain runs with ``reason`` (``dead_letter_topic``,
    ``on_dead_letter``, dead-letter hooks), then the transport settles the message for
    good (FIN on NSQ, ``+TERM`` on NATS, the offset may pass it on RabbitMQ Streams)."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason or "rejected")

    def __repr__(self) -> str:
        return f"Reject({self.reason!r})"

    def __reduce__(self) -> tuple[type[Reject], tuple[str]]:
        return Reject, (self.reason,)


Outcome = Finish | Retry | Reject
"""What becomes of a delivery: finish, retry or reject (the only three words for it)."""


# --- one delivery's life: the stages and the moves allowed (h11's _state.py is the model)


class _StageType(type):
    def __iter__(cls) -> Iterator[Stage]:
        return iter(_ALL_STAGES)


class Stage(metaclass=_StageType):
    """Where one delivery is in its life; only the moves in :data:`MOVES` happen.

    Five values, compared by identity (``msg.stage is Stage.RUNNING``); iterating
    ``Stage`` gives them in order. Not an ``Enum``: on the hot path an enum member's
    class lookup and its Python-level ``__hash__`` cost more than the rest of a
    message's bookkeeping.

    * ``NEW``: handed to the task layer, not answered. A handler that finishes in its
      first step on the hot path (run at once: nsqworker.eager) runs in it and goes
      straight to SETTLED: one write per message.
    * ``WAITING``: over the task's in-flight bound, waiting in order for a slot.
    * ``RUNNING``: its handler runs: in its Task past its first step, in a thread,
      or started off the hot path (from the waiting line).
    * ``ANSWERED``: its outcome is decided and being carried out (a handler's own
      answer on its way to the loop, a reject's dead-letter chain). No other answer.
    * ``SETTLED``: its transport was told: finish, retry or reject. The end.
    """

    __slots__ = ("value",)
    NEW: ClassVar[Stage]
    WAITING: ClassVar[Stage]
    RUNNING: ClassVar[Stage]
    ANSWERED: ClassVar[Stage]
    SETTLED: ClassVar[Stage]

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Stage.{self.value.upper()}"

    def __reduce__(self) -> tuple[Any, tuple[Any, str]]:
        return getattr, (Stage, self.value.upper())  # copies and pickles stay the one value


_NEW, _WAITING, _RUNNING, _ANSWERED, _SETTLED = _ALL_STAGES = tuple(
    Stage(v) for v in ("new", "waiting", "running", "answered", "settled")
)
Stage.NEW, Stage.WAITING, Stage.RUNNING, Stage.ANSWERED, Stage.SETTLED = _ALL_STAGES


MOVES: dict[Stage, frozenset[Stage]] = {
    Stage.NEW: frozenset({Stage.WAITING, Stage.RUNNING, Stage.ANSWERED, Stage.SETTLED}),
    Stage.WAITING: frozenset({Stage.RUNNING, Stage.ANSWERED}),
    Stage.RUNNING: frozenset({Stage.ANSWERED}),
    Stage.ANSWERED: frozenset({Stage.SETTLED}),
    Stage.SETTLED: frozenset(),
}
"""Stage -> the stages a delivery may move to from it (NEW -> SETTLED: finished inline)."""


class StageError(NSQWorkerError, RuntimeError):
    """Raised when a delivery is moved between stages :data:`MOVES` does not allow (a
    bug in the task layer, never a user's doing: answering twice is AlreadyResponded)."""


class MessageOwner(Protocol):
    """What a message needs from whoever delivered it (the task layer's dispatcher)."""

    def settle(self, message: Message, outcome: Outcome) -> None: ...

    def touch(self, message: Message) -> None: ...

    def max_hold(self, message: Message) -> float | None: ...

    @property
    def draining(self) -> asyncio.Event: ...


class Message:
    """One delivery of a message.

    ``id`` is the broker's message id (NSQ: the 16 hex characters nsqd sent),
    ``attempts`` is 1 on the first delivery, ``timestamp`` is nanoseconds since the
    epoch when the broker first accepted it, ``address`` the broker that delivered it
    (``host:port``; ``nsqd_address`` is the same), ``headers`` the message's headers
    where the broker has them (None on NSQ).
    Handlers normally just return or raise; the methods ``finish``, ``retry`` and
    ``touch`` are for handlers that answer themselves. Answering twice raises
    :class:`~nsqworker.errors.AlreadyResponded` and sends nothing. ``stage`` says where
    the delivery is in its life (:class:`Stage`), moved only as :data:`MOVES` allows.
    """

    __slots__ = (
        "_owner",
        "address",
        "attempts",
        "body",
        "channel",
        "headers",
        "id_bytes",
        "origin",
        "receipt",
        "received_at",
        "stage",
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
        address: str,
        owner: MessageOwner | None = None,
        receipt: Any = None,
        received_at: float = 0.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.id_bytes = id_bytes
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.topic = topic
        self.channel = channel
        self.address = address
        self._owner = owner
        #: The transport's own handle for settling this delivery; only it reads this.
        self.receipt = receipt
        #: Where the delivery is in its life (:class:`Stage`); the task layer moves it,
        #: the handler's own ``finish()``... moves it to ANSWERED.
        self.stage = _NEW
        #: When the transport received it, on the subscription's clock.
        self.received_at = received_at
        #: Keep-alives sent for it (TOUCH on NSQ).
        self.touch_count = 0
        self.headers = headers
        #: Where the broker keeps it, ``(stream, offset)``: the JetStream stream and
        #: sequence, or the RabbitMQ stream and offset it was first published at (a
        #: retry's too); None on NSQ. Dead letters carry it.
        self.origin: tuple[str, int] | None = None

    @property
    def id(self) -> str:
        """The message id as text (NSQ: the 16 hex characters nsqd sent). Never raises:
        bytes that are not ASCII show as ``\\xff``, control characters escaped; each
        transport checks its ids on arrival (docs/security.md)."""
        text = self.id_bytes.decode("ascii", "backslashreplace")
        return text if text.isprintable() else one_line(text)

    @property
    def datetime(self) -> datetime:
        """When the broker first accepted the message, as an aware UTC datetime."""
        return datetime.fromtimestamp(self.timestamp / 1e9, tz=UTC)

    @property
    def answered(self) -> bool:
        """True once an outcome is decided (finish, retry or reject), by the handler or
        the task layer; nothing more may be sent for it."""
        stage = self.stage
        return stage is _ANSWERED or stage is _SETTLED

    @property
    def responded(self) -> bool:
        """Same as :attr:`answered`."""
        stage = self.stage
        return stage is _ANSWERED or stage is _SETTLED

    def move(self, stage: Stage) -> None:
        """Move the delivery to ``stage`` (the task layer's call); a move :data:`MOVES`
        does not allow raises :class:`StageError`."""
        if stage not in MOVES[self.stage]:
            raise StageError(
                f"message {self.id}: {self.stage.value} -> {stage.value} is not a move a "
                "delivery makes"
            )
        self.stage = stage

    @property
    def nsqd_address(self) -> str:
        """The broker that delivered the message (the name from NSQ days of ``address``)."""
        return self.address

    @property
    def max_hold(self) -> float | None:
        """The longest this delivery may be held, in seconds, keep-alives included
        (NSQ: nsqd's ``--max-msg-timeout`` from the connection's IDENTIFY answer); None
        when there is no limit or it is not known."""
        return None if self._owner is None else self._owner.max_hold(self)

    @property
    def max_msg_timeout(self) -> float | None:
        """Same as :attr:`max_hold` (NSQ's name for it)."""
        return self.max_hold

    @property
    def draining(self) -> asyncio.Event | None:
        """Set when the worker that delivered this message starts to stop; None when
        it was not delivered by a worker (a test building a Message)."""
        return None if self._owner is None else self._owner.draining

    def json(self) -> Any:
        """The body parsed as JSON; a body that is not JSON raises UndecodableBody (a
        Reject and a ValueError): uncaught, the message is dead-lettered at once."""
        try:  # security (issue 29): a bad body is rejected, never retried with backoff
            return json.loads(self.body)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int too long
            raise UndecodableBody(f"body is not JSON: {exc} ({self.body[:60]!r})") from None
        except RecursionError:  # [[[[... deeper than the interpreter's stack
            raise UndecodableBody(f"body is JSON nested too deeply ({self.body[:60]!r})") from None

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text."""
        return self.body.decode(encoding)

    def finish(self) -> None:
        """Tell the broker the message is done (FIN on NSQ)."""
        self._settle(FINISH)

    def retry(self, delay: float | None = None, backoff: bool = True) -> None:
        """Deliver it again after ``delay`` seconds (0 to 3600), or after the policy's
        exponential delay when None. ``backoff=False``: not a failure for the consumer's
        backoff. The transport's own retry: REQ on NSQ, ``-NAK`` on NATS."""
        self._settle(Retry(delay, backoff=backoff))

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """Deprecated: the old name of :meth:`retry`. As it always did, it takes any
        delay: one out of 0 to 3600 seconds is brought within them."""
        if delay is not None:
            delay = min(max(float(delay), 0.0), MAX_RETRY_DELAY)
        self._settle(Retry(delay, backoff=backoff))

    def touch(self) -> None:
        """Extend the broker's deadline for this message (TOUCH on NSQ). The worker
        does this itself for handlers that run long; call it only when answering yourself."""
        if self.answered:
            raise AlreadyResponded(f"message {self.id} was already answered; cannot touch it")
        if self._owner is not None:
            self._owner.touch(self)

    def _settle(self, outcome: Outcome) -> None:
        stage = self.stage
        if stage is _ANSWERED or stage is _SETTLED:
            raise AlreadyResponded(
                f"message {self.id} was already answered; not sending {outcome!r}"
            )
        self.stage = _ANSWERED  # allowed from every other stage
        if self._owner is not None:
            self._owner.settle(self, outcome)

    def __repr__(self) -> str:
        return (
            f"<Message {self.id} topic={self.topic!r} channel={self.channel!r} "
            f"attempts={self.attempts} size={len(self.body)}>"
        )


class Undecodable(Message):
    """A delivery its transport could not read (a malformed message of another
    publisher): ``body`` is its raw bytes and ``reason`` says what is wrong. The task
    layer never hands it to a handler: it is rejected at once (dead-letter hooks, then
    the dead-letter topic) with ``reason``, so the broker's other messages go on."""

    __slots__ = ("reason",)

    def __init__(self, *args: Any, reason: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reason = reason


def to_bytes(body: object) -> bytes:
    """A message body as bytes: bytes-like as is, str encoded as UTF-8, a pydantic model
    or a dataclass instance as its JSON (what a handler typed with that type reads back).

    A ``TypedDict``, a list or any other JSON value is plain data: ``publish_json()``.

    Raises:
        TypeError: anything else (name the type; encode it, or use ``publish_json``).
    """
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    dump = getattr(body, "model_dump_json", None)
    if callable(dump):
        return str(dump()).encode("utf-8")
    if is_dataclass(body) and not isinstance(body, type):
        return _dataclass_json(type(body), body)
    raise TypeError(
        f"message body must be bytes, str, a pydantic model or a dataclass instance, got "
        f"{type(body).__name__}; encode it first or use publish_json()"
    )


_ADAPTERS: dict[type, Any] = {}


def _dataclass_json(cls: type, body: object) -> bytes:
    """A dataclass instance as pydantic dumps it (the adapter made once per class)."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        from pydantic import TypeAdapter  # not at import: `import nsqworker` stays light

        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return bytes(adapter.dump_json(body))
