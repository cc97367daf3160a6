"""Health and metrics over HTTP: ``/livez``, ``/readyz`` and ``/metrics``.

Two parts, both usable without worker processes:

* :class:`WorkerMetrics` keeps the latest stats snapshot of every worker process
  (``WorkerStats.as_dict()``, sent by each child with its heartbeat) and is a
  ``prometheus_client`` collector over them. Counters and the duration histogram are
  summed over processes, and a process that dies has its last snapshot added to a
  *retired* total, so counters never go down when a child is replaced.
* :class:`HealthServer` serves the three endpoints from a daemon thread with the
  standard library's WSGI server.

Metric names follow the OpenTelemetry messaging conventions where one exists, as an
OpenTelemetry-to-Prometheus exporter would write them (dots become underscores, the unit
is suffixed); the rest are ``nsqworker_*``. ``docs/running.md`` lists them all.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = [
    "HealthServer",
    "ReadyCheck",
    "TaskTotals",
    "WorkerMetrics",
    "status_tasks",
    "task_totals",
]

#: ``is_ready()`` answers ``(ready, details)``; details become the JSON body of /readyz.
ReadyCheck = Callable[[], tuple[bool, Mapping[str, Any]]]

TASK_LABELS = ("task", "topic", "channel")
OTEL_LABELS = (
    "task",
    "messaging_system",
    "messaging_operation_name",
    "messaging_destination_name",
    "messaging_consumer_group_name",
)

# (snapshot key, metric name without _total, help): summed over processes, retired kept.
COUNTERS = (
    ("received", "nsqworker_messages_received", "Messages the broker delivered to the task."),
    ("finished", "nsqworker_messages_finished", "Messages acknowledged after success (NSQ: FIN)."),
    ("requeued", "nsqworker_messages_requeued", "Messages given back to retry later (NSQ: REQ)."),
    (
        "dead_lettered",
        "nsqworker_messages_dead_lettered",
        "Messages rejected (by the handler or out of attempts), dead-letter hooks called.",
    ),
    (
        "backoff_stalls",
        "nsqworker_backoff_stalls",
        "Times a paused or probing flow outlived its deadline and was reopened (a bug: report it).",
    ),
)
# (snapshot key, metric name, help, how processes combine): live processes only.
GAUGES = (
    ("in_flight", "nsqworker_messages_in_flight", "Messages received and not yet answered.", sum),
    (
        "rdy",
        "nsqworker_rdy",
        "Deliveries the broker may have outstanding (NSQ RDY, credits, pulls), summed.",
        sum,
    ),
    ("connections", "nsqworker_connections", "Open broker connections of the task.", sum),
    (
        "buffered",
        "nsqworker_nsqd_buffered",
        "nsqd whose messages come on the buffered connection opened under load.",
        sum,
    ),
    ("backoff_level", "nsqworker_backoff_level", "Consumer backoff level; 0 = none.", max),
)


@dataclass
class TaskTotals:
    """One task's numbers in one snapshot (read from a ``stats.TaskStats`` as a dict),
    or summed over several processes."""

    task: str
    topic: str
    channel: str
    system: str = "nsq"
    """The transport's ``messaging.system``."""
    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, int] = field(default_factory=dict)
    subscribed: bool = False
    #: handler duration histogram: upper bound (``inf`` last) -> count in that bucket
    buckets: dict[float, int] = field(default_factory=dict)
    duration_sum: float = 0.0
    #: connection failures and non-fatal nsqd errors by reason
    errors: dict[str, int] = field(default_factory=dict)

    def add_totals(self, other: TaskTotals) -> None:
        """Add ``other``'s counters and histogram to this one's (gauges are not added)."""
        for key, value in other.counters.items():
            self.counters[key] = self.counters.get(key, 0) + value
        for bound, count in other.buckets.items():
            self.buckets[bound] = self.buckets.get(bound, 0) + count
        self.duration_sum += other.duration_sum
        for reason, count in other.errors.items():
            self.errors[reason] = self.errors.get(reason, 0) + count


def task_totals(snapshot: Mapping[str, Any]) -> list[TaskTotals]:
    """Read the per-task numbers of one ``WorkerStats.as_dict()`` snapshot.

    Tolerant of missing keys (a number that is absent counts as 0), so the health
    layer never fails because a snapshot is older or newer than this code.
    """
    tasks = snapshot.get("tasks") or {}
    items = tasks.items() if isinstance(tasks, Mapping) else ((t.get("name"), t) for t in tasks)
    result = []
    for name, raw in items:
        stats = TaskTotals(
            task=str(raw.get("name", name)),
            topic=str(raw.get("topic", "")),
            channel=str(raw.get("channel", "")),
            system=str(raw.get("system") or "nsq"),
            counters={key: int(raw.get(key) or 0) for key, _, _ in COUNTERS},
            gauges={key: int(raw.get(key) or 0) for key, _, _, _ in GAUGES},
            subscribed=bool(raw.get("subscribed", False)),
        )
        stats.buckets, stats.duration_sum = _histogram(raw.get("duration") or {})
        errors = raw.get("connection_errors") or {}
        stats.errors = (
            {str(k): int(v) for k, v in errors.items()} if isinstance(errors, Mapping) else {}
        )
        result.append(stats)
    return result


def _histogram(raw: Mapping[str, Any]) -> tuple[dict[float, int], float]:
    """``{"buckets": [bounds], "counts": [per bucket, +Inf last], "sum": s}`` as a dict."""
    bounds = [float(b) for b in raw.get("buckets") or ()]
    counts = [int(c) for c in raw.get("counts") or ()]
    if not bounds or not math.isinf(bounds[-1]):
        bounds.append(math.inf)
    return dict(zip(bounds, counts, strict=False)), float(raw.get("sum") or 0.0)


def status_tasks(
    totals: Iterable[TaskTotals], snapshots: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per task, for ``/status``: the totals (counters over live and retired processes,
    gauges over live ones) with what only the live snapshots say: the dead-letter topic,
    ``max_in_flight`` summed, and the latest ``last_error`` of any process."""
    extra: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        tasks = snapshot.get("tasks") or {}
        for name, raw in tasks.items() if isinstance(tasks, Mapping) else ():
            row = extra.setdefault(
                str(name), {"dead_letter_topic": None, "max_in_flight": 0, "last_error": None}
            )
            row["dead_letter_topic"] = raw.get("dead_letter_topic") or row["dead_letter_topic"]
            row["max_in_flight"] += int(raw.get("max_in_flight") or 0)
            error, latest = raw.get("last_error"), row["last_error"]
            if isinstance(error, Mapping) and (
                latest is None or float(error.get("at") or 0) > float(latest.get("at") or 0)
            ):
                row["last_error"] = dict(error)
    rows = []
    for t in totals:
        row = {"task": t.task, "topic": t.topic, "channel": t.channel, "system": t.system}
        row.update(t.counters, **t.gauges, subscribed=t.subscribed)
        row.update(extra.get(t.task) or {"dead_letter_topic": None, "last_error": None})
        rows.append(row)
    return rows


class WorkerMetrics(Collector):
    """The latest stats of every live worker process, plus the totals of dead ones.

    Thread-safe: the supervisor loop calls :meth:`update` and :meth:`retire`, the HTTP
    thread calls :meth:`collect`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, list[TaskTotals]] = {}
        self._retired: dict[str, TaskTotals] = {}
        self.restarts = 0
        """Processes started to replace one that died."""
        self.alive = 0
        """Processes running now (set by the supervisor)."""
        self.extra: list[Callable[[], Iterable[Metric]]] = []
        """More metric families, collected with these (the schedules' candidate)."""

    def update(self, key: int, snapshot: Mapping[str, Any]) -> None:
        """Store process ``key``'s latest snapshot."""
        tasks = task_totals(snapshot)
        with self._lock:
            self._live[key] = tasks

    def retire(self, key: int) -> None:
        """Process ``key`` is gone: keep its counters in the retired totals."""
        with self._lock:
            for stats in self._live.pop(key, []):
                total = self._retired.setdefault(
                    stats.task, TaskTotals(stats.task, stats.topic, stats.channel, stats.system)
                )
                total.add_totals(stats)

    def snapshots(self) -> dict[int, list[TaskTotals]]:
        """A copy of the live processes' latest per-task stats, by process key."""
        with self._lock:
            return {key: list(tasks) for key, tasks in self._live.items()}

    def totals(self) -> list[TaskTotals]:
        """Per task: counters and histogram summed over live and retired processes,
        gauges combined over live processes (summed, backoff level the maximum)."""
        with self._lock:
            live = [stats for tasks in self._live.values() for stats in tasks]
            retired = list(self._retired.values())
        merged: dict[str, TaskTotals] = {}
        for stats in [*retired, *live]:
            total = merged.setdefault(
                stats.task, TaskTotals(stats.task, stats.topic, stats.channel, stats.system)
            )
            total.add_totals(stats)
        for key, _, _, combine in GAUGES:
            for name, total in merged.items():
                values = [s.gauges.get(key, 0) for s in live if s.task == name]
                total.gauges[key] = combine(values) if values else 0
        for name, total in merged.items():
            total.subscribed = any(s.subscribed for s in live if s.task == name)
        return [merged[name] for name in sorted(merged)]

    def describe(self) -> Iterable[Metric]:
        """No fixed description: the metrics depend on the tasks seen."""
        return []

    def collect(self) -> Iterable[Metric]:
        """Yield every metric family, built from the current snapshots."""
        totals = self.totals()
        yield from self._counter_families(totals)
        yield from self._gauge_families(totals)
        yield self._duration_family(totals)
        errors = CounterMetricFamily(
            "nsqworker_connection_errors",
            "Broker connection failures and non-fatal broker errors, by reason"
            " (docs/reliability.md lists the reasons).",
            labels=(*TASK_LABELS, "reason"),
        )
        for t in totals:
            for reason, count in sorted(t.errors.items()):
                errors.add_metric([t.task, t.topic, t.channel, reason], count)
        yield errors
        yield GaugeMetricFamily(
            "nsqworker_workers_alive", "Worker processes running now.", value=self.alive
        )
        yield CounterMetricFamily(
            "nsqworker_worker_restarts",
            "Worker processes started to replace one that died.",
            value=self.restarts,
        )
        for families in self.extra:
            yield from families()

    @staticmethod
    def _counter_families(totals: list[TaskTotals]) -> Iterator[Metric]:
        consumed = CounterMetricFamily(
            "messaging_client_consumed_messages",
            "Messages delivered to a consumer (OpenTelemetry messaging.client.consumed.messages).",
            labels=OTEL_LABELS,
        )
        for t in totals:
            consumed.add_metric(_otel_labels(t), t.counters.get("received", 0))
        yield consumed
        for key, name, doc in COUNTERS:
            family = CounterMetricFamily(name, doc, labels=TASK_LABELS)
            for t in totals:
                family.add_metric([t.task, t.topic, t.channel], t.counters.get(key, 0))
            yield family

    @staticmethod
    def _gauge_families(totals: list[TaskTotals]) -> Iterator[Metric]:
        for key, name, doc, _ in GAUGES:
            family = GaugeMetricFamily(name, doc, labels=TASK_LABELS)
            for t in totals:
                family.add_metric([t.task, t.topic, t.channel], t.gauges.get(key, 0))
            yield family

    @staticmethod
    def _duration_family(totals: list[TaskTotals]) -> Metric:
        family = HistogramMetricFamily(
            "messaging_process_duration",
            "Handler run time (OpenTelemetry messaging.process.duration).",
            labels=OTEL_LABELS,
            unit="seconds",
        )
        for t in totals:
            cumulative, running = [], 0
            buckets = t.buckets or {math.inf: 0}
            for bound in sorted(buckets):
                running += buckets[bound]
                cumulative.append((_bound_text(bound), float(running)))
            if not math.isinf(max(buckets)):
                cumulative.append(("+Inf", float(running)))
            family.add_metric(_otel_labels(t), cumulative, sum_value=t.duration_sum)
        return family


def _otel_labels(t: TaskTotals) -> list[str]:
    return [t.task, t.system, "process", t.topic, t.channel]


def _bound_text(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


#: Seconds a connection may last from its accept to its close: sending the request,
#: and reading the answer. Past it the server hangs up, so a client that trickles a
#: byte at a time cannot hold a thread for longer (also the timeout of each read).
REQUEST_TIMEOUT = 5.0
#: Connections served at once; more are closed at once (each one is a thread).
MAX_CONNECTIONS = 64
#: Connections one peer address may hold open at once.
MAX_PER_PEER = 8
#: Of :data:`MAX_CONNECTIONS`, the slots kept for a peer that has no connection open
#: (the kubelet's probe, a scrape), so peers with many connections cannot take them all.
RESERVED_SLOTS = 8


class _QuietHandler(WSGIRequestHandler):
    """Probes every few seconds should not fill the log with access lines."""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(REQUEST_TIMEOUT)  # each read's; read now, as the server's

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request, so a slow scrape never blocks a probe; at most
    :data:`MAX_CONNECTIONS` of them, :data:`MAX_PER_PEER` per peer address, the last
    :data:`RESERVED_SLOTS` only for a peer with none open, and each connection closed
    :data:`REQUEST_TIMEOUT` after its accept (docs/security.md)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog: accepted (or refused) at once anyway

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is not worth a traceback on stderr."""

    def server_activate(self) -> None:
        self._guard = threading.Lock()
        #: open connection -> (peer address, monotonic deadline)
        self._open: dict[socket.socket, tuple[str, float]] = {}
        self._per_peer: dict[str, int] = {}
        super().server_activate()

    def _admit(self, request: socket.socket, peer: str) -> bool:
        with self._guard:
            mine, total = self._per_peer.get(peer, 0), len(self._open)
            limit = MAX_CONNECTIONS if mine == 0 else MAX_CONNECTIONS - RESERVED_SLOTS
            if mine >= MAX_PER_PEER or total >= limit:
                return False
            self._per_peer[peer] = mine + 1
            self._open[request] = (peer, time.monotonic() + REQUEST_TIMEOUT)
            return True

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0]) if isinstance(client_address, tuple) else ""
        if not self._admit(request, peer):
            self.shutdown_request(request)  # full: close rather than queue a thread
            return
        super().process_request(request, client_address)  # on error: shutdown_request

    def shutdown_request(self, request: Any) -> None:
        # Forgotten before the close, under the lock the deadline check holds: that
        # check never shuts down a descriptor the kernel has given to a new socket.
        with self._guard:
            entry = self._open.pop(request, None)
            if entry is not None:
                left = self._per_peer.pop(entry[0]) - 1
                if left:
                    self._per_peer[entry[0]] = left
            super().shutdown_request(request)

    def service_actions(self) -> None:
        """Each turn of ``serve_forever`` (every 0.1 s): hang up on connections past
        their deadline; the thread blocked reading one sees the end and returns."""
        now = time.monotonic()
        with self._guard:
            for request, (_, deadline) in self._open.items():
                if deadline <= now:
                    try:
                        request.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # already gone


class _IPv6Server(_ThreadingServer):
    address_family = socket.AF_INET6


class HealthServer:
    """Serve ``/livez``, ``/readyz``, ``/metrics``, ``/inflight`` and ``/status`` from a
    daemon thread.

    ``/livez`` (also ``/healthz``) is 200 while ``is_live()`` is true, else 503.
    ``/readyz`` is 200 when ``is_ready()`` says so, else 503; both bodies are the JSON
    details ``is_ready()`` returns. ``/metrics`` is the Prometheus text (or OpenMetrics,
    by the Accept header) of ``collector``. ``/inflight`` is the JSON ``inflight()``
    returns: what every worker process runs beyond the hot path, oldest first.
    ``/status`` is the JSON ``status()`` returns: the processes (pid, memory, uptime) and
    the tasks (transport, topic, channel, counters, last error) that ``nsqworker console``
    shows. All are read-only: anything but GET and HEAD is refused.
    """

    def __init__(
        self,
        host: str,
        port: int,
        is_live: Callable[[], bool],
        is_ready: ReadyCheck,
        collector: Collector,
        inflight: Callable[[], Mapping[str, Any]] | None = None,
        status: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.host = host
        self._requested_port = port
        self._is_live = is_live
        self._is_ready = is_ready
        self._inflight = inflight
        self._status = status
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        self._metrics_app = make_wsgi_app(registry)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one chosen for port 0)."""
        if self._server is None:
            return self._requested_port
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Bind and start serving; raises ``OSError`` when the port cannot be bound."""
        server_class = _IPv6Server if ":" in self.host else _ThreadingServer
        host = self.host.strip("[]")
        self._server = make_server(
            host, self._requested_port, self._app, server_class, _QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="nsqworker-health",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _app(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/").rstrip("/") or "/"
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _reply(start_response, 405, {"error": "use GET"})
        if path in ("/livez", "/healthz"):
            live = self._is_live()
            return _reply(start_response, 200 if live else 503, {"live": live})
        if path == "/readyz":
            ready, details = self._is_ready()
            return _reply(start_response, 200 if ready else 503, {"ready": ready, **details})
        if path == "/metrics":
            body: Iterable[bytes] = self._metrics_app(environ, start_response)
            return body
        if path == "/inflight" and self._inflight is not None:
            return _reply(start_response, 200, self._inflight())
        if path == "/status" and self._status is not None:
            return _reply(start_response, 200, self._status())
        return _reply(
            start_response, 404, {"error": "try /livez, /readyz, /metrics, /inflight or /status"}
        )


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def _reply(start_response: StartResponse, status: int, body: Mapping[str, Any]) -> list[bytes]:
    data = (json.dumps(body, separators=(",", ":"), default=str) + "\n").encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    start_response(f"{status} {_REASONS[status]}", headers)
    return [data]
