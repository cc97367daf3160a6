"""The seam between the task layer and a broker: what every transport implements.

The task layer (:mod:`nsqworker.dispatch`) owns every per-task policy: the in-flight
bound, attempts, retry delays, dead letters, consumer backoff, keep-alive and drain.
A transport owns connections, discovery and flow control (RDY for NSQ; credits or pull
batches for others) and nothing of tasks. They meet here:

* :class:`Transport` makes :class:`Subscription` objects (one per task) and
  :class:`Publisher` objects, and says what the broker can do in its
  :class:`Capabilities`, which the task layer reads instead of guessing.
* A subscription hands each delivery to its :class:`Receiver` as a
  :class:`~nsqworker.message.Message`, and settles it when told, in the task layer's
  three words: ``finish``, ``retry`` after a delay, ``reject`` (stop retrying: never
  deliver it again); and ``keep_alive``. Each transport maps them to its broker's own
  commands (NSQ: FIN, REQ, FIN, TOUCH; NATS: ``+ACK``, ``-NAK``, ``+TERM``, ``+WPI``).
* The receiver sets the subscription's :class:`Flow`: open with a window of at most
  ``window`` unanswered deliveries, a one-at-a-time probe, or paused.

Transports are found by name (``Settings.transport``) in a registry:
:func:`register_transport` adds one, :func:`create_transport` builds one from settings.
``docs/transports.md`` maps each transport's concepts and says how to add one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from nsqworker.errors import ConfigurationError
from nsqworker.message import MAX_RETRY_DELAY, Message, MessageOwner

__all__ = [
    "MAX_RETRY_DELAY",
    "Capabilities",
    "Flow",
    "Publisher",
    "Receiver",
    "Subscription",
    "SubscriptionStats",
    "Timer",
    "Transport",
    "TransportFactory",
    "capabilities_of",
    "create_transport",
    "other_producer",
    "producer_of",
    "register_transport",
    "transport_names",
    "unregister_transport",
]


class Flow(Enum):
    """What a receiver wants from its subscription as a whole."""

    OPEN = "open"
    """Deliver while fewer than ``window`` deliveries are unanswered."""
    PROBE = "probe"
    """One delivery at a time (consumer backoff testing the water)."""
    PAUSED = "paused"
    """Deliver nothing (backoff pause, or draining)."""


@dataclass(frozen=True)
class Capabilities:
    """What a broker does natively; the task layer supplies the rest or refuses."""

    name: str
    """The transport's registry name: ``nsq``, ``memory``..."""
    system: str
    """``messaging.system`` of spans and metrics (OpenTelemetry's value for the broker)."""
    attribute_prefix: str
    """Prefix of broker-specific span attributes, e.g. ``messaging.nsq``."""
    max_retry_delay: float = MAX_RETRY_DELAY
    """Longest retry delay in seconds the transport can honour; longer ones are capped.
    (Attempts and retry delays work on every transport: one whose broker does not count
    deliveries or delay a retry carries the count and emulates the delay itself.)"""
    keep_alive: bool = True
    """Deliveries have a deadline and ``keep_alive`` extends it (TOUCH, in_progress)."""
    max_hold: float | None = None
    """Longest any delivery may be held in seconds (None: no limit, or per delivery:
    see :meth:`Subscription.max_hold`)."""
    headers: bool = False
    """Messages carry headers (trace context can travel outside the body)."""
    delayed_publish: bool = False
    """A publish may ask the broker to hold the message back."""
    reply_address: bool = False
    """A request may name the broker address its reply goes to: the RPC-over-NSQ wire
    format (an nsqd host and port in the request), so NSQ's alone."""
    request_reply: bool = False
    """The broker routes replies itself (a request carries a reply subject: NATS); the
    transport has ``subscribe_requests`` for ``@rpc`` endpoints."""

    @property
    def rpc(self) -> bool:
        """Whether ``@rpc`` endpoints can run here (one of the two above)."""
        return self.reply_address or self.request_reply


@dataclass
class SubscriptionStats:
    """A transport's view of one subscription, as plain data."""

    connected: int = 0
    """Open connections subscribed for this topic and channel."""
    window: int = 0
    """Deliveries the broker may have outstanding to us now (RDY, credits, fetch size)."""
    in_flight: int = 0
    """Deliveries received and not yet settled, as the transport counts them."""
    buffered: int = 0
    """Transport-specific: NSQ's nsqd read on a buffered connection under load."""
    errors: dict[str, int] = field(default_factory=dict)
    """Connection failures and broker errors by reason."""
    connections: list[Any] = field(default_factory=list)
    """Per-connection detail, transport-specific (NSQ: ``ConnectionStats``)."""


class Timer(Protocol):
    """A scheduled callback that can be cancelled (an ``asyncio.TimerHandle``)."""

    def cancel(self) -> None: ...


class Receiver(MessageOwner, Protocol):
    """The task layer's side of a subscription (the dispatcher).

    Also the :class:`~nsqworker.message.MessageOwner` of the messages it is handed:
    ``Message.finish()`` and friends go through it, so policy sees every settle.
    """

    def deliver(self, msg: Message) -> bool:
        """A new delivery; called on the event loop, in the transport's read path.

        True: the handler already finished it and the transport finishes it now, as if
        :meth:`Subscription.finish` had been called (the hot path of a handler that
        completes inline, kept free of a call back into the transport)."""


class Subscription(Protocol):
    """One (topic, channel) on a broker, driven by one receiver."""

    topic: str
    channel: str

    async def start(self, receiver: Receiver) -> None:
        """Connect and subscribe; return after the first attempt (retrying in the
        background). Raise ``ConfigurationError`` for a setting the broker refuses."""

    def set_flow(self, flow: Flow, window: int) -> None:
        """Flow control: how many deliveries may be unanswered, or probe, or pause."""

    async def stop(self) -> None:
        """Take no more: pause the flow, stop discovery and reconnects. Deliveries
        already in our hands stay settleable until :meth:`close`."""

    async def close(self) -> None:
        """Release connections; the receiver settled (or rejected) everything first."""

    @property
    def ready(self) -> bool:
        """True when consuming works as far as the transport can tell."""

    @property
    def subscribed(self) -> bool:
        """True while at least one connection is subscribed."""

    def stats(self) -> SubscriptionStats:
        """A snapshot of the subscription."""

    def clock(self) -> float:
        """The clock of ``Message.received_at`` and of :meth:`call_later`, in seconds."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` after ``delay`` seconds of :meth:`clock`."""

    def finish(self, msg: Message) -> None:
        """The message is done (NSQ's FIN, NATS' ``+ACK``, the stream offset may pass it)."""

    def retry(self, msg: Message, delay: float) -> None:
        """Deliver the message again after ``delay`` seconds (NSQ's REQ, NATS' ``-NAK``)."""

    def reject(self, msg: Message) -> None:
        """Stop retrying (its dead-letter chain has run): never deliver it again."""

    def keep_alive(self, msg: Message) -> None:
        """Extend the message's delivery deadline (TOUCH, in_progress); no-op without one."""

    def keep_alive_interval(self, msg: Message) -> float | None:
        """Seconds between keep-alives for ``msg`` while it runs; None: none needed."""

    def max_hold(self, msg: Message) -> float | None:
        """The longest ``msg`` may be held in seconds, keep-alives included; None: no limit."""


class Publisher(Protocol):
    """Publishing on a transport (the NSQ ``Producer`` is one)."""

    async def publish(self, topic: str, body: bytes | str, delay: float | None = None) -> None: ...

    async def publish_many(self, topic: str, bodies: Iterable[bytes | str]) -> None: ...

    async def close(self) -> None: ...


class Transport(Protocol):
    """A broker, as the worker sees it: subscriptions, publishers, capabilities.

    Optional: ``async retain(topic, near=None)``, making the broker keep what is
    published to ``topic`` for a reader that comes later (NSQ: a durable channel made
    first); the dead-letter chain calls it for each task's dead-letter topic when present.
    """

    capabilities: Capabilities

    def check_topic(self, topic: str) -> str:
        """``topic`` if the broker accepts it as a topic name, else ``InvalidName``."""

    def check_channel(self, channel: str) -> str:
        """``channel`` if the broker accepts it as a channel name, else ``InvalidName``."""

    def subscribe(self, topic: str, channel: str, *, name: str, max_in_flight: int) -> Subscription:
        """A subscription for ``topic`` and ``channel`` (not started)."""

    def publisher(self, near: Message | None = None) -> Publisher:
        """A publisher owned by the transport (closed by :meth:`close`); ``near``: the
        message whose broker to prefer when the settings name none."""

    def describe(self) -> dict[str, str]:
        """Where the transport connects, for ``nsqworker tasks`` and logs (no secrets)."""

    async def close(self) -> None:
        """Close the publishers the transport made."""


TransportFactory = Callable[[Any], Transport]
"""``factory(settings)``: a transport from ``nsqworker.Settings`` (typed Any here, so that
the settings, which check the name against this registry, need not import it back)."""

# name -> "module:attribute" of a factory, imported on first use (so `import nsqworker`
# pays for no broker client), or the factory itself once registered or imported.
_REGISTRY: dict[str, str | TransportFactory] = {
    "nsq": "nsqworker.nsq.transport:NsqTransport",
    "memory": "nsqworker.memory:MemoryTransport",
    "nats": "nsqworker.nats.transport:NatsTransport",
    "rabbitmq-stream": "nsqworker.streams.transport:StreamTransport",
}


def producer_of(settings: Any, timeout: float) -> Any:
    """The producer of the transport ``settings`` name, built as its factory's
    ``producer_class(settings=settings, timeout=timeout)`` (the public way:
    :func:`nsqworker.producer_for`).

    Raises:
        ConfigurationError: the transport has no producer of its own (``memory``: its
            transport object publishes), or is not registered.
    """
    name = getattr(settings, "transport", "nsq")
    cls = getattr(_factory(name), "producer_class", None)
    if cls is None:
        raise ConfigurationError(
            f"transport {name!r} has no producer of its own: publish through the Worker's "
            "transport, or with NSQ"
        )
    return cls(settings=settings, timeout=timeout)


def other_producer(settings: Any, timeout: float) -> Any | None:
    """:func:`producer_of` when ``settings`` name a transport other than NSQ; None for NSQ."""
    if getattr(settings, "transport", "nsq") == "nsq":
        return None
    return producer_of(settings, timeout)


def capabilities_of(name: str) -> Capabilities:
    """What the transport registered as ``name`` declares (its factory's
    ``capabilities``), without building one."""
    caps = getattr(_factory(name), "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise ConfigurationError(f"transport {name!r} declares no Capabilities")
    return caps


def register_transport(name: str, factory: str | TransportFactory) -> None:
    """Make ``Settings(transport=name)`` build transports with ``factory(settings)``.

    ``factory`` may be a ``"module:attribute"`` string, imported on first use. A class
    with a ``capabilities`` attribute lets telemetry and checks read them without an
    instance; one with ``producer_class`` (built as ``cls(settings=..., timeout=...)``)
    is what :func:`nsqworker.producer_for` gives for this transport.
    """
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigurationError(f"transport name {name!r}: use letters, digits, - and _")
    _REGISTRY[name] = factory


def unregister_transport(name: str) -> None:
    """Forget the transport registered as ``name`` (a test's own, say); no error if none is."""
    _REGISTRY.pop(name, None)


def transport_names() -> list[str]:
    """The registered transport names, sorted."""
    return sorted(_REGISTRY)


def _factory(name: str) -> TransportFactory:
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ConfigurationError(
            f"unknown transport {name!r}; the transports are {', '.join(transport_names())}"
        )
    if isinstance(entry, str):
        module, _, attribute = entry.partition(":")
        factory: TransportFactory = getattr(importlib.import_module(module), attribute)
        _REGISTRY[name] = entry = factory
    return entry


def create_transport(settings: Any) -> Transport:
    """The transport ``settings.transport`` names, built from ``settings``."""
    return _factory(settings.transport)(settings)
