"""What every transport's producer shares: the telemetry seam of a publish call
(:class:`PublishCall`, :func:`instrumentation_for`), and :class:`ProducerBase`: ``async
with``, JSON bodies and the checks of their arguments.

Telemetry seam: a producer asks :func:`instrumentation_for` once, with its transport's
:class:`~nsqworker.transport.Capabilities`, for a hook, and runs each public publish
call inside ``hook(PublishCall(...))``: a context manager that may start a ``send
<topic>`` span (``messaging.system`` from the capabilities) and replace ``call.bodies``
(the trace envelope). A hook may also offer ``quiet() -> bool`` and ``count(topic, sent,
failed, error)``: when ``quiet()`` says no span or envelope is needed, a producer may skip
the context manager and only report the outcome to ``count`` (NSQ's PUB does).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Self

from nsqworker.errors import ConfigurationError
from nsqworker.transport import other_producer, producer_of

if TYPE_CHECKING:
    from nsqworker.settings import Settings
    from nsqworker.transport import Capabilities

__all__ = [
    "NO_HOOK",
    "Instrumentation",
    "ProducerBase",
    "PublishCall",
    "deprecated_other_producer",
    "instrumentation_for",
    "producer_for",
]

Operation = Literal["PUB", "MPUB", "DPUB"]
"""One message, a batch, one message held back (NSQ's command names, on every broker)."""


@dataclass(slots=True)
class PublishCall:
    """One public publish call, as the telemetry hook sees it.

    The hook may replace ``bodies`` (e.g. wrap them in the trace envelope) when it is
    entered; the producer fills ``nsqd_address`` with the broker address that
    acknowledged the last command (when it knows one) and ``published`` with how many
    messages were acknowledged.
    """

    topic: str
    bodies: list[bytes]
    operation: Operation
    delay_ms: int | None = None
    envelope: bool = False
    nsqd_address: str | None = None
    published: int = 0


Instrumentation = Callable[[PublishCall], AbstractContextManager[object]]
NO_HOOK: Final[AbstractContextManager[object]] = nullcontext()


def instrumentation_for(capabilities: Capabilities, envelope: bool) -> Instrumentation:
    """The telemetry hook of one new producer of the transport ``capabilities`` names:
    ``send`` spans, the trace envelope when ``envelope``, the sent-messages count."""
    # Imported on the first producer, not with the package: the SDK costs ~0.3 s.
    from nsqworker.telemetry.tracing import producer_instrumentation

    return producer_instrumentation(envelope=envelope, capabilities=capabilities)


class ProducerBase:
    """``async with producer:`` connects and closes; :meth:`publish_json` encodes.

    Subclasses set ``capabilities`` (their transport's) and implement ``connect``,
    ``close`` and ``publish``, running each public publish inside
    ``self.instrumentation(PublishCall(...))``."""

    timeout: float
    capabilities: ClassVar[Capabilities]

    def __init__(self, timeout: float, envelope: bool = False) -> None:
        if not timeout > 0:
            raise ConfigurationError(f"timeout must be positive seconds, got {timeout!r}")
        self.timeout = timeout
        self.instrumentation = instrumentation_for(self.capabilities, envelope=envelope)
        """Send spans and the sent count, and the trace envelope when ``envelope`` (NSQ's
        producer asks for it: NSQ has no headers)."""

    def start(self) -> None:
        """Begin connecting in the background, if the producer can (the first publish
        connects anyway): nothing here; NSQ's Producer dials each nsqd."""

    async def connect(self, timeout: float | None = None) -> None:
        """Connect now (optional: the first publish connects)."""
        raise NotImplementedError

    async def close(self, timeout: float = 5.0) -> None:
        """Release the connections the producer made."""
        raise NotImplementedError

    async def publish(
        self, topic: str, body: Any, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish one message; see the subclass."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def publish_json(
        self, topic: str, obj: Any, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish ``obj`` serialised as compact UTF-8 JSON; see :meth:`publish`."""
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        await self.publish(topic, body, delay=delay, timeout=timeout)


def producer_for(settings: Settings | None = None, timeout: float = 5.0) -> Any:
    """The producer of the transport ``settings`` name (``Settings()`` from the
    environment by default): NSQ's :class:`~nsqworker.Producer` to
    ``settings.nsqd_tcp_addresses``, a ``NatsProducer``, a ``StreamProducer``... each with
    the same methods (``publish``, ``publish_json``, ``publish_many``, ``async with``).

    Raises:
        ConfigurationError: the transport has no producer of its own (``memory``: its
            transport object publishes), or is not registered.
    """
    if settings is None:
        from nsqworker.settings import Settings

        settings = Settings()  # from the environment and .env
    return producer_of(settings, timeout)


def deprecated_other_producer(settings: Settings | None, timeout: float) -> Any | None:
    """What ``Producer(settings=...)`` without nsqd addresses gave before
    :func:`producer_for`: another transport's producer (with a DeprecationWarning), or
    None for NSQ."""
    if settings is None:
        from nsqworker.settings import Settings

        settings = Settings()
    other = other_producer(settings, timeout)
    if other is not None:
        warnings.warn(
            f"Producer(settings=...) with transport={settings.transport!r} returns a "
            f"{type(other).__name__}; call nsqworker.producer_for(settings) instead "
            "(Producer is NSQ's)",
            DeprecationWarning,
            stacklevel=3,
        )
    return other
