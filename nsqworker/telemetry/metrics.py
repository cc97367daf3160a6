"""OpenTelemetry metrics read from the worker's own stats and the producers' counts.

Metrics are read, never counted twice: :func:`register_worker_metrics` turns a
worker's stats into observable instruments, and every
:class:`~nsqworker.telemetry.tracing.ProducerInstrumentation` registers its sent
counts with the same hub.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from nsqworker._version import __version__

__all__ = ["SCOPE", "hub", "register_worker_metrics"]

SCOPE = "nsqworker"
"""The instrumentation scope of every tracer and meter nsqworker makes."""


# --- metrics, read from the worker's own stats -------------------------------------

# (WorkerStats.as_dict() task key, instrument, kind, unit, description)
_WORKER_INSTRUMENTS = (
    ("received", "messaging.client.consumed.messages", "counter", "{message}", "Delivered."),
    ("finished", "nsqworker.messages.finished", "counter", "{message}", "Acknowledged (NSQ: FIN)."),
    (
        "requeued",
        "nsqworker.messages.requeued",
        "counter",
        "{message}",
        "Given back to retry (NSQ: REQ).",
    ),
    (
        "dead_lettered",
        "nsqworker.messages.dead_lettered",
        "counter",
        "{message}",
        "Rejected: dead-letter chain run.",
    ),
    ("in_flight", "nsqworker.messages.in_flight", "updown", "{message}", "Not yet answered."),
    ("rdy", "nsqworker.rdy", "updown", "{message}", "Flow-control window granted (NSQ: RDY)."),
    ("connections", "nsqworker.connections", "updown", "{connection}", "Open broker connections."),
    (
        "backoff_level",
        "nsqworker.backoff.level",
        "gauge",
        "{level}",
        "Backoff level; 0 = none.",
    ),
)


class _Hub:
    """The observable instruments of one MeterProvider and the objects they read."""

    def __init__(self, provider: metrics.MeterProvider) -> None:
        self.workers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.producers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._cache: tuple[float, list[Any]] = (-1.0, [])
        meter = provider.get_meter(SCOPE, __version__)
        create = {
            "counter": meter.create_observable_counter,
            "updown": meter.create_observable_up_down_counter,
            "gauge": meter.create_observable_gauge,
        }
        for key, name, kind, unit, doc in _WORKER_INSTRUMENTS:
            create[kind](name, [self._reader(key)], unit=unit, description=doc)
        meter.create_observable_counter(
            "messaging.client.sent.messages",
            [self._read_sent],
            unit="{message}",
            description="Messages the producers attempted to send.",
        )

    def forget(self) -> None:
        """Drop the cached snapshot (the set of workers changed)."""
        self._cache = (-1.0, [])

    def _tasks(self) -> list[Any]:
        """Every registered worker's per-task stats, read once per collection."""
        now = time.monotonic()
        if now - self._cache[0] > 0.2:
            from nsqworker.health import task_totals

            tasks: list[Any] = []
            for worker in list(self.workers):
                snapshot = worker.stats()
                as_dict = getattr(snapshot, "as_dict", None)
                tasks += task_totals(as_dict() if as_dict is not None else snapshot)
            self._cache = (now, tasks)
        return self._cache[1]

    def _reader(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def read(options: CallbackOptions) -> Iterator[Observation]:
            totals: dict[tuple[str, str, str, str], int] = {}
            for t in self._tasks():
                ident = (t.task, t.topic, t.channel, t.system)
                totals[ident] = totals.get(ident, 0) + t.counters.get(key, t.gauges.get(key, 0))
            for (task, topic, channel, system), value in totals.items():
                yield Observation(value, {
                    "messaging.system": system,
                    "messaging.operation.name": "process",
                    "messaging.destination.name": topic,
                    "messaging.consumer.group.name": channel,
                    "nsqworker.task": task,
                })  # fmt: skip

        return read

    def _read_sent(self, options: CallbackOptions) -> Iterator[Observation]:
        totals: dict[tuple[str, str, str | None], int] = {}
        for producer in list(self.producers):
            system = producer.system
            for (topic, error_type), n in producer.sent_counts().items():
                key = (system, topic, error_type)
                totals[key] = totals.get(key, 0) + n
        for (system, topic, error_type), n in totals.items():
            attrs = {"messaging.system": system, "messaging.operation.name": "send"}
            attrs["messaging.destination.name"] = topic
            if error_type is not None:
                attrs["error.type"] = error_type
            yield Observation(n, attrs)


_HUBS: dict[int, tuple[metrics.MeterProvider | None, _Hub]] = {}
_HUBS_LOCK = threading.Lock()


def hub(meter_provider: metrics.MeterProvider | None) -> _Hub:
    """One hub per explicit provider, one for the global provider (key 0), whose
    instruments, made through the API's proxy, follow an SDK installed later."""
    key = 0 if meter_provider is None else id(meter_provider)
    with _HUBS_LOCK:
        entry = _HUBS.get(key)
        if entry is None or entry[0] is not meter_provider:
            provider = meter_provider or metrics.get_meter_provider()
            entry = _HUBS[key] = (meter_provider, _Hub(provider))
        return entry[1]


def register_worker_metrics(
    worker: Any, meter_provider: metrics.MeterProvider | None = None
) -> Callable[[], None]:
    """Expose ``worker.stats()`` as OpenTelemetry observable counters and gauges.

    Nothing is counted here: each collection reads the worker's ``WorkerStats``
    snapshot (``as_dict()``), the numbers ``/metrics`` serves. Returns a function that
    unregisters the worker (also dropped when it is garbage collected).
    """
    the_hub = hub(meter_provider)
    the_hub.workers.add(worker)
    the_hub.forget()

    def unregister() -> None:
        the_hub.workers.discard(worker)
        the_hub.forget()

    return unregister
