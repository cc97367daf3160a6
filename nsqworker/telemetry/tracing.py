"""Spans around each message and each publish, through the OpenTelemetry API.

Worker side, one :class:`TaskInstrumentation` per task, built once::

    inst = TaskInstrumentation(spec, settings)
    token = inst.start(msg)   # strips a trace envelope off msg.body; None = no span
    started, error = time.perf_counter(), None
    try:
        result = await run_async(token, spec.func, msg)   # run_sync(...) for sync handlers
    except Exception as exc:
        error = exc
    ...                                                  # the worker picks the outcome
    if token is not None or inst.timed:
        inst.end(token, outcome, error, time.perf_counter() - started)

``start`` returns None when nothing is recorded (no SDK, or the message is not
sampled); otherwise a :data:`ProcessToken`, the tuple ``(span, context, msg)`` whose
``context`` is an OpenTelemetry Context holding the ``process <topic>`` span.
:func:`run_async` and :func:`run_sync` call the handler with that context attached
(``context.attach(token[1])``, then ``context.detach``), so the handler's own spans
nest under it and log lines carry its trace_id and span_id. Call ``end`` for every
token; for a None token too when ``inst.timed`` (an SDK MeterProvider is installed
and ``end`` records the duration histogram). Calling it anyway is harmless.

Producer side: :func:`producer_instrumentation` is the hook every transport's producer
loads through :func:`nsqworker.producing.instrumentation_for` (see
:class:`ProducerInstrumentation`). Metrics: :mod:`nsqworker.telemetry.metrics`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from random import getrandbits
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanKind, Status, StatusCode

from nsqworker._version import __version__
from nsqworker.message import FINISH, Message, Outcome, Reject, Retry
from nsqworker.telemetry import envelope as _envelope
from nsqworker.telemetry.envelope import ENVELOPE_MAGIC, unwrap_envelope, wrap_envelope
from nsqworker.telemetry.metrics import SCOPE, hub
from nsqworker.telemetry.sampling import _no_sdk, _PresetIds, _sampling_plan, is_proxy
from nsqworker.telemetry.shortcuts import context_with

if TYPE_CHECKING:
    from nsqworker.settings import Settings
    from nsqworker.task import TaskSpec
    from nsqworker.transport import Capabilities

__all__ = [
    "DURATION_BUCKETS",
    "ProcessToken",
    "ProducerInstrumentation",
    "TaskInstrumentation",
    "producer_instrumentation",
    "run_async",
    "run_sync",
    "unwrap_envelope",
    "wrap_envelope",
]

T = TypeVar("T")
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600)
"""Bounds (s) of ``messaging.process.duration``, 1 ms handlers to 1 h jobs; the same as
``nsqworker.stats.DURATION_BUCKETS``, which ``/metrics`` uses."""
RECHECK_EVERY = 256
"""Messages between looks at the global providers while one of them is not installed."""
_LIMIT = (1 << 64) - 1  # TraceIdRatioBased compares the low 64 bits of the trace id
_DISABLED, _GENERIC, _RATIO = 0, 1, 2
_CONSUMER = SpanKind.CONSUMER
_ROOT = otel_context.Context()
_OK = Status(StatusCode.OK)
"""The parent of a process span without a remote parent: none. Whatever span is
current where the worker runs (one around its startup, say) is not a message's parent."""


ProcessToken = tuple[Span, otel_context.Context, Message]
"""A started ``process`` span: ``(span, context to run the handler in, message)``.

A plain tuple: at a full sampling rate it is made for every message, and a class
instance costs about 1 us more here."""


def run_sync(token: ProcessToken | None, fn: Callable[[Message], T], msg: Message) -> T:
    """``fn(msg)`` with the token's span current in this thread; a plain call for None."""
    if token is None:
        return fn(msg)
    attached = otel_context.attach(token[1])
    try:
        return fn(msg)
    finally:
        otel_context.detach(attached)


async def run_async(
    token: ProcessToken | None, fn: Callable[[Message], Awaitable[T]], msg: Message
) -> T:
    """``await fn(msg)`` with the token's span current; a plain await for None."""
    if token is None:
        return await fn(msg)
    attached = otel_context.attach(token[1])
    try:
        return await fn(msg)
    finally:
        otel_context.detach(attached)


def _server(attrs: dict[str, Any], address: str) -> dict[str, Any]:
    """``attrs`` plus ``server.address`` and ``server.port`` of a ``host:port``."""
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit():
        attrs["server.address"], attrs["server.port"] = host.strip("[]"), int(port)
    else:
        attrs["server.address"] = address
    return attrs


class TaskInstrumentation:
    """The ``process <topic>`` spans and the duration histogram of one task.

    Args:
        spec: the task; ``spec.envelope`` False never looks for an envelope, True or
            None strip any valid one (raw bodies are never touched either way).
        settings: ``trace_parent_mode`` and ``client_id`` are read from it.
        tracer_provider, meter_provider: instead of the global ones (tests).
        parent_mode: ``"link"`` or ``"parent"``, instead of the settings' value.
        client_id: ``messaging.client.id``, instead of the settings' value.
        capabilities: the transport's, for ``messaging.system`` and the prefix of
            broker-specific attributes (default: NSQ's).
    """

    def __init__(
        self,
        spec: TaskSpec,
        settings: Settings | None = None,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        parent_mode: str | None = None,
        client_id: str | None = None,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.spec = spec
        system, prefix = _system_of(capabilities)
        self._attempts_key = f"{prefix}.message.attempts"
        self._touches_key = f"{prefix}.message.touches"
        self._outcome_key = f"{prefix}.outcome"
        self._prefix = prefix
        self._fin = {self._outcome_key: "fin"}
        self.timed = False
        """True when ``end`` records the duration histogram (an SDK MeterProvider is
        installed), so it must be called for messages ``start`` did not trace too."""
        # Security (issue 29): strip only when opted in; trust sampled flag and baggage
        opted = getattr(spec, "envelope", None)
        self._unwrap = bool(
            getattr(settings, "tracing_envelope", False) if opted is None else opted
        )
        self._trust_remote = bool(getattr(settings, "trace_trust_remote", False))
        mode = parent_mode or getattr(settings, "trace_parent_mode", "link")
        if mode not in ("link", "parent"):
            raise ValueError(f"parent_mode must be 'link' or 'parent', got {mode!r}")
        self._parent_mode = mode == "parent"
        self.span_name = f"process {spec.topic}"
        self._constant: dict[str, Any] = {
            "messaging.system": system,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": spec.topic,
            "messaging.consumer.group.name": spec.channel,
        }
        self._metric_base = dict(self._constant)
        del self._metric_base["messaging.operation.type"]
        client_id = client_id or getattr(settings, "client_id", None)
        if client_id:
            self._constant["messaging.client.id"] = client_id
        self._metric_attrs: dict[str | None, dict[str, Any]] = {None: self._metric_base}
        self._by_address: dict[str, dict[str, Any]] = {}
        self._providers = (tracer_provider, meter_provider)
        self._tracer: trace.Tracer = trace.NoOpTracer()
        self._sdk = False
        self._histogram: metrics.Histogram | None = None
        self._preset: _PresetIds | None = None
        self._mode, self._bound, self._parent_based = _DISABLED, 0, False
        self._recheck, self._countdown = False, 0
        self.refresh()

    def refresh(self) -> None:
        """Look at the providers again; ``start`` does it every 256 messages while a
        global provider is not installed, so one installed later is picked up."""
        fixed_tp, fixed_mp = self._providers
        tp = fixed_tp or trace.get_tracer_provider()
        mp = fixed_mp or metrics.get_meter_provider()
        self._recheck = (not fixed_tp and is_proxy(tp)) or (not fixed_mp and is_proxy(mp))
        self._countdown = RECHECK_EVERY
        self._tracer = tp.get_tracer(SCOPE, __version__)
        # The SDK copies a span's attributes (into BoundedAttributes) and keeps no
        # reference to the dict, so one dict per address is refilled per message; any
        # other tracer gets a copy.
        self._sdk = isinstance(self._tracer, SdkTracer)
        plan = _sampling_plan(tp, self._tracer)
        self._mode, self._bound, self._parent_based, self._preset = plan
        if self._histogram is None and isinstance(mp, SdkMeterProvider):
            self._histogram = mp.get_meter(SCOPE, __version__).create_histogram(
                "messaging.process.duration",
                unit="s",
                description="Duration of processing one message (the handler's run time).",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )
        self.timed = self._histogram is not None

    @property
    def presampled(self) -> bool:
        """True when the sampler's decision is made from a fresh trace id before any span
        is built (a ratio sampler): a message it leaves out costs no span object."""
        return self._preset is not None

    def start(self, msg: Message) -> ProcessToken | None:
        """Strip a trace envelope off ``msg.body``; start the span if it is sampled.

        Called on one thread only (the worker's event loop): it refills one
        attribute dict per nsqd address.
        """
        carrier = None
        if self._unwrap and msg.body.startswith(ENVELOPE_MAGIC):
            msg.body, carrier = unwrap_envelope(msg.body)
        if self._recheck:
            self._countdown -= 1
            if self._countdown <= 0:
                self.refresh()
        mode = self._mode
        if not mode:  # _DISABLED
            return None
        parent, links = _ROOT, ()
        if carrier is not None:
            parent, links = self._remote(carrier)
        if mode == _RATIO:
            preset = self._preset
            if carrier is None and preset is not None:  # _presample's usual case, inlined
                low = getrandbits(64)
                if low >= self._bound:
                    return None
                preset.local.trace_id = (getrandbits(64) << 64 | low) or 1
            elif not self._presample(parent):
                return None
        address = msg.address
        attrs = self._by_address.get(address) or self._address_attrs(address)
        if not self._sdk:
            attrs = attrs.copy()
        attrs["messaging.message.id"] = msg.id_bytes.decode()
        attrs[self._attempts_key] = msg.attempts
        attrs["messaging.message.body.size"] = len(msg.body)
        span = self._tracer.start_span(self.span_name, parent, _CONSUMER, attrs, links)
        if self._preset is not None:
            self._preset.local.trace_id = 0  # left over if the tracer is disabled
        if type(span) is NonRecordingSpan or not (self._sdk or span.is_recording()):
            return None  # the SDK's sampler dropped it (an SDK span is recording when new)
        return span, context_with(span, parent), msg

    def _remote(self, carrier: dict[str, str]) -> tuple[otel_context.Context, Any]:
        """``(parent, links)`` for an envelope's trace headers, as ``parent_mode`` says."""
        if not self._trust_remote:  # security: a publisher's baggage is not ours to carry
            carrier = {k: v for k, v in carrier.items() if k.lower() != "baggage"}
        remote = propagate.extract(carrier)
        if self._parent_mode:
            if self._trust_remote:
                return remote, ()
            ours = self._mode != _RATIO or getrandbits(64) < self._bound  # not their flag
            return _envelope.with_sampled_flag(remote, ours), ()
        span_context = trace.get_current_span(remote).get_span_context()
        return _ROOT, (Link(span_context),) if span_context.is_valid else ()

    def _presample(self, parent: otel_context.Context) -> bool:
        """Decide as the SDK's sampler will, before paying for attributes and a span."""
        if parent:  # an empty Context holds no parent span: skip the lookup
            span_ctx = trace.get_current_span(parent).get_span_context()
            if span_ctx.is_valid:
                if self._parent_based:
                    return span_ctx.trace_flags.sampled
                return (span_ctx.trace_id & _LIMIT) < self._bound
        if self._preset is None:  # AlwaysOff
            return False
        low = getrandbits(64)  # the half the sampler compares; the rest only if sampled
        if low >= self._bound:
            return False
        self._preset.local.trace_id = (getrandbits(64) << 64 | low) or 1
        return True

    def _address_attrs(self, address: str) -> dict[str, Any]:
        attrs = _server(dict(self._constant), address)
        if len(self._by_address) < 1024:
            self._by_address[address] = attrs
        return attrs

    def end(
        self,
        token: ProcessToken | None,
        outcome: Outcome | None,
        error: BaseException | None,
        duration: float,
    ) -> None:
        """Record ``duration`` (seconds); end the token's span with the outcome.

        ``outcome`` is what was sent to nsqd (None: the handler answered itself),
        ``error`` the exception the handler raised, if any.
        """
        error_type = None if error is None else type(error).__qualname__
        if self._histogram is not None:
            attrs = self._metric_attrs.get(error_type)
            if attrs is None:
                attrs = {**self._metric_base, "error.type": error_type}
                self._metric_attrs[error_type] = attrs
            self._histogram.record(duration, attrs)
        if token is None:
            return
        span, _, msg = token
        touches = msg.touch_count
        if touches:  # absent means none: an attribute set after start costs a few us
            span.set_attribute(self._touches_key, touches)
        if outcome is FINISH and error is None:
            # The common case, kept to two cheap calls: no event, status OK.
            span.set_attributes(self._fin)
            span.set_status(_OK)
            span.end()
            return
        failed = error is not None
        prefix, outcome_key = self._prefix, self._outcome_key
        if outcome is FINISH:
            span.set_attribute(outcome_key, "fin")
        elif isinstance(outcome, Retry):
            event: dict[str, Any] = {f"{prefix}.requeue.backoff": outcome.backoff}
            if outcome.delay is not None:
                event[f"{prefix}.requeue.delay"] = float(outcome.delay)
            span.set_attribute(outcome_key, "req")
            span.add_event("req", event)
            failed = failed or outcome.backoff
        elif isinstance(outcome, Reject):
            span.set_attribute(outcome_key, "dead_letter")
            span.add_event("dead_letter", {f"{prefix}.dead_letter.reason": outcome.reason})
            failed = True
        if error is not None:
            span.set_attribute("error.type", error_type or "")
            span.record_exception(error)
        if failed:
            span.set_status(Status(StatusCode.ERROR, str(error or outcome)[:200]))
        span.end()


# --- producer ------------------------------------------------------------------------


class ProducerInstrumentation:
    """``send <topic>`` spans, the trace envelope and the sent-messages count.

    A producer runs each publish inside ``with inst(call):``. By hand:
    ``span = inst.start_send(topic, n)``; ``bodies = inst.wrap(bodies, span)`` when
    ``envelope``; send; ``inst.end_send(span, error, topic=topic, sent=n)``.
    ``capabilities``: the producer's transport, for ``messaging.system`` (default NSQ's).
    """

    def __init__(
        self,
        *,
        envelope: bool = False,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.envelope = envelope
        self.system, self.prefix = _system_of(capabilities)
        self._system_attrs = {"messaging.system": self.system}
        self._fixed = tracer_provider
        self._provider: trace.TracerProvider | None = None
        self._tracer: trace.Tracer = trace.NoOpTracer()
        self._tracing = False
        self._countdown = 0
        self._sent: dict[tuple[str, str | None], int] = {}
        hub(meter_provider).producers.add(self)

    def _refresh(self) -> None:
        # Looking the global provider up costs microseconds, so with no SDK it is
        # looked at again only every RECHECK_EVERY publishes.
        self._countdown = RECHECK_EVERY
        provider = self._fixed or trace.get_tracer_provider()
        if provider is not self._provider:
            self._provider, self._tracer = provider, provider.get_tracer(SCOPE, __version__)
        self._tracing = not (_no_sdk(provider) or isinstance(self._tracer, trace.NoOpTracer))

    def _tracing_now(self) -> bool:
        """Is a tracing SDK installed? Without one, looked at again every 256 calls."""
        if self._tracing:
            return True
        self._countdown -= 1
        if self._countdown > 0:
            return False
        self._refresh()
        return self._tracing

    def start_send(
        self, topic: str, count: int = 1, address: str | None = None, *, batch: bool = False
    ) -> Span | None:
        """Start the PRODUCER span of one publish (``batch``: one MPUB of ``count``)."""
        if not self._tracing_now():
            return None
        attrs: dict[str, Any] = {
            **self._system_attrs,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
        }
        if batch:
            attrs["messaging.batch.message_count"] = count
        if address:
            _server(attrs, address)
        span = self._tracer.start_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes=attrs)
        return span if span.is_recording() else None

    def wrap(
        self, bodies: list[bytes], span: Span | None, content_type: str | None = None
    ) -> list[bytes]:
        """``bodies`` in envelopes carrying the send span's context (else the current)."""
        headers: dict[str, str] = {}
        propagate.inject(headers, None if span is None else trace.set_span_in_context(span))
        if content_type:
            headers["content-type"] = content_type
        return [wrap_envelope(body, headers) for body in bodies]

    def end_send(
        self,
        span: Span | None,
        error: BaseException | None = None,
        *,
        topic: str | None = None,
        address: str | None = None,
        sent: int = 0,
        failed: int = 0,
    ) -> None:
        """End the span; count ``sent`` and ``failed`` messages of ``topic``."""
        if topic is not None:
            self.count(topic, sent, failed, error)
        if span is None:
            return
        if address:
            span.set_attributes(_server({}, address))
        if error is not None:
            span.set_attribute("error.type", type(error).__qualname__)
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        span.end()

    def quiet(self) -> bool:
        """True when a publish needs neither a span nor an envelope (no SDK installed;
        looked at again every 256 calls). The producer then skips the context manager
        and reports the outcome with :meth:`count`."""
        return not self.envelope and not self._tracing_now()

    def count(self, topic: str, sent: int, failed: int, error: BaseException | None) -> None:
        """Count ``sent`` and ``failed`` (by ``error``'s type) messages of ``topic``."""
        counts = self._sent
        if sent:
            ok: tuple[str, str | None] = (topic, None)
            counts[ok] = counts.get(ok, 0) + sent
        if failed:
            bad = (topic, None if error is None else type(error).__qualname__)
            counts[bad] = counts.get(bad, 0) + failed

    def sent_counts(self) -> dict[tuple[str, str | None], int]:
        """Messages sent so far by ``(topic, error type or None)``."""
        return dict(self._sent)

    def __call__(self, call: _Call) -> _SendScope:
        """The producers' seam (:mod:`nsqworker.producing`): span, envelope and count of
        one call.

        A context manager; entering it gives the span (or None).
        """
        return _SendScope(self, call)


class _Call(Protocol):
    """What a send scope reads and writes of :class:`nsqworker.producing.PublishCall`
    (described here, not imported: the producers import this module lazily)."""

    bodies: list[bytes]

    @property
    def topic(self) -> str: ...
    @property
    def operation(self) -> str: ...
    @property
    def delay_ms(self) -> int | None: ...
    @property
    def envelope(self) -> bool: ...
    @property
    def nsqd_address(self) -> str | None: ...
    @property
    def published(self) -> int: ...


class _SendScope:
    """One publish call in :class:`ProducerInstrumentation`; a class rather than a
    ``@contextmanager`` generator, which cost microseconds per publish. (A PUB with no
    SDK installed skips it: see :meth:`ProducerInstrumentation.quiet`.)"""

    __slots__ = ("_call", "_inst", "_span")

    def __init__(self, inst: ProducerInstrumentation, call: _Call) -> None:
        self._inst = inst
        self._call = call
        self._span: Span | None = None

    def __enter__(self) -> Span | None:
        inst, call = self._inst, self._call
        batch = call.operation == "MPUB"
        span = inst.start_send(call.topic, len(call.bodies), call.nsqd_address, batch=batch)
        if span is not None and call.delay_ms is not None:
            span.set_attribute(f"{inst.prefix}.message.delay", call.delay_ms / 1000)
        if call.envelope:
            call.bodies = inst.wrap(call.bodies, span, getattr(call, "content_type", None))
        self._span = span
        return span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        call = self._call
        unsent = 0 if exc is None else len(call.bodies) - call.published
        self._inst.end_send(self._span, exc, topic=call.topic, address=call.nsqd_address,
                            sent=call.published, failed=unsent)  # fmt: skip


def producer_instrumentation(
    envelope: bool = False, capabilities: Capabilities | None = None
) -> ProducerInstrumentation:
    """The hook a producer of the transport ``capabilities`` names asks for once (see
    :func:`nsqworker.producing.instrumentation_for`); NSQ's by default."""
    return ProducerInstrumentation(envelope=envelope, capabilities=capabilities)


def _system_of(capabilities: Capabilities | None) -> tuple[str, str]:
    """``messaging.system`` and the prefix of broker-specific attributes."""
    if capabilities is None:
        from nsqworker.transport import capabilities_of

        capabilities = capabilities_of("nsq")  # the default transport
    return capabilities.system, capabilities.attribute_prefix
