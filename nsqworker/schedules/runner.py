"""Schedules in ``nsqworker run``: the supervisor's candidate, on a thread of its own.

Every supervisor with scheduled tasks runs one :class:`ScheduleRunner`: a thread with
its own event loop holding the elector (:mod:`.lease`) on the backend
``schedule_leader`` names, and the firing loop (:mod:`.firing`) that publishes through
the settings' transport. Worker processes never fire: a supervisor is one candidate
however many workers it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger
from nsqworker.schedules.firing import Scheduled, Scheduler, tick_body, tick_id
from nsqworker.schedules.lease import Elector, LeaseStore, LocalStore, Timings

if TYPE_CHECKING:
    from nsqworker.settings import Settings
    from nsqworker.task import Registry

__all__ = ["ScheduleRunner", "choose_leader", "lease_name", "scheduled_tasks"]

log = get_logger("nsqworker.schedules")

STOP_TIMEOUT = 10.0
"""Seconds :meth:`ScheduleRunner.stop` waits for the thread (releasing the lease)."""


def scheduled_tasks(registry: Registry) -> list[Scheduled]:
    """The tasks of ``registry`` that have a schedule."""
    return [
        Scheduled(spec.name, spec.topic, spec.schedule)
        for spec in registry
        if spec.schedule is not None
    ]


def lease_name(target: str, settings: Settings) -> str:
    """``schedule_lease_name``, else ``nsqworker-schedules-<module of target>``."""
    if settings.schedule_lease_name:
        return settings.schedule_lease_name
    module = target.partition(":")[0].strip().lower()
    name = "nsqworker-schedules-" + re.sub(r"[^a-z0-9.-]+", "-", module)
    return name[:253].strip("-.")


NO_LEADER = (
    "schedules: no leader (schedule_leader none): every process running these tasks"
    " fires each tick, so two replicas fire it twice; set NSQWORKER_SCHEDULE_LEADER"
    " (kubernetes, nats or postgres) when more than one runs"
)
"""Said at WARNING when schedules start with no leader, and by ``nsqworker tasks``."""


def choose_leader(settings: Settings) -> tuple[str, str]:
    """``(leader, why)``: the setting's, else kubernetes in a pod, else none."""
    if settings.schedule_leader:
        return settings.schedule_leader, f"{settings.env_name('schedule_leader')}"
    from nsqworker.schedules.kube import in_pod

    if in_pod():
        return "kubernetes", "running in a pod with a service account"
    return "none", "not in a Kubernetes pod; set NSQWORKER_SCHEDULE_LEADER for replicas"


def make_store(leader: str, settings: Settings, name: str) -> LeaseStore:
    """The lease store of ``leader``; ``ConfigurationError`` says what is missing."""
    if leader == "kubernetes":
        from nsqworker.schedules.kube import KubeLeaseStore

        return KubeLeaseStore.from_settings(settings, name)
    if leader == "nats":
        import importlib.util

        if importlib.util.find_spec("nats") is None:
            raise ConfigurationError(
                "schedule_leader nats needs nats-py: pip install 'nsq-worker[nats]'"
            )
        from nsqworker.schedules.nats_kv import NatsLeaseStore
        from nsqworker.transport import other_producer

        # the NATS transport's own producer, for its connection (through the registry)
        nats_settings = settings.model_copy(update={"transport": "nats"})
        producer: Any = other_producer(nats_settings, 5.0)
        return NatsLeaseStore(producer.connection, settings.schedule_kv_bucket, name, settings)
    if leader == "postgres":
        from nsqworker.schedules.postgres import PostgresLeaseStore

        return PostgresLeaseStore.from_settings(settings, name)
    return LocalStore()


Publish = Callable[[Scheduled, datetime], Awaitable[None]]


def make_publisher(
    settings: Settings, tasks: list[Scheduled], name: str
) -> tuple[Publish, Callable[[], Awaitable[None]]]:
    """``(publish, close)`` on the settings' transport, deduplicated by the broker where
    it can: NATS publishes carry ``Nats-Msg-Id: <task>@<tick>``; RabbitMQ Streams ones
    the publisher reference ``nsqworker-schedules-<lease name>`` and publishing id
    ``<tick in epoch seconds> * 1000 + <task's rank among the topic's scheduled
    tasks>``, so the stream stores a second copy of a tick only once."""
    timeout = max(
        0.5, min(5.0, settings.schedule_lease_duration - settings.schedule_renew_deadline)
    )
    from nsqworker.transport import create_transport, other_producer

    if settings.transport == "nats":
        nats: Any = other_producer(settings, timeout)  # a NatsProducer, from the registry

        async def publish_nats(task: Scheduled, tick: datetime) -> None:
            body = tick_body(task.name, tick)
            await nats.publish(task.topic, body, msg_id=tick_id(task.name, tick))

        return publish_nats, nats.close
    if settings.transport == "rabbitmq-stream":
        stream: Any = other_producer(settings, timeout)  # a StreamProducer, from the registry
        stream.reference = f"nsqworker-schedules-{name}"
        rank = stream_ranks(tasks)

        async def publish_stream(task: Scheduled, tick: datetime) -> None:
            pid = int(tick.timestamp()) * 1000 + rank[task.name]
            await stream.send(task.topic, [tick_body(task.name, tick)], publishing_ids=[pid])

        return publish_stream, stream.close
    transport = create_transport(settings)
    publisher: Any = transport.publisher()

    async def publish(task: Scheduled, tick: datetime) -> None:
        await asyncio.wait_for(publisher.publish(task.topic, tick_body(task.name, tick)), timeout)

    return publish, transport.close


def stream_ranks(tasks: Iterable[Scheduled]) -> dict[str, int]:
    """Each task's rank (by name) among the scheduled tasks of its topic, below 1000:
    the last three digits of its publishing ids on RabbitMQ Streams."""
    by_topic: dict[str, list[str]] = {}
    for task in tasks:
        by_topic.setdefault(task.topic, []).append(task.name)
    ranks = {}
    for names in by_topic.values():
        if len(names) > 1000:
            raise ConfigurationError("more than 1000 scheduled tasks on one stream")
        ranks.update({name: i for i, name in enumerate(sorted(names))})
    return ranks


def identity() -> str:
    """This candidate's name in the lease: ``<hostname>_<pid>_<random>``."""
    return f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


class ScheduleRunner:
    """The candidate of one supervisor: :meth:`start`, then :meth:`stop` on shutdown.

    Raises (from the constructor):
        ConfigurationError: the leader backend cannot work with these settings.
    """

    def __init__(self, target: str, settings: Settings, tasks: Iterable[Scheduled]) -> None:
        self.tasks = list(tasks)
        self.settings = settings
        from nsqworker.settings.schedules import timing_problems

        if problems := timing_problems(settings):
            raise ConfigurationError("; ".join(problems))
        self.leader, why = choose_leader(settings)
        self.name = lease_name(target, settings)
        store = make_store(self.leader, settings, self.name)
        timings = Timings(
            settings.schedule_lease_duration,
            settings.schedule_renew_deadline,
            settings.schedule_retry_period,
        )
        self.elector = Elector(store, identity(), timings)
        self._why = why
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.scheduler: Scheduler | None = None

    def metrics(self) -> Iterator[Any]:
        """Prometheus families for the supervisor's /metrics: whether this candidate
        leads, and per task the ticks it fired and skipped and the last tick fired."""
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        scheduler = self.scheduler
        leading = GaugeMetricFamily(
            "nsqworker_schedule_leader",
            "1 while this supervisor is the schedule leader (may fire), else 0.",
            labels=("backend",),
        )
        leading.add_metric([self.leader], 1.0 if self.elector.leading else 0.0)
        yield leading
        fired = CounterMetricFamily(
            "nsqworker_schedule_ticks_fired", "Ticks this supervisor published.", labels=("task",)
        )
        skipped = CounterMetricFamily(
            "nsqworker_schedule_ticks_skipped",
            "Ticks skipped as older than schedule_catchup.",
            labels=("task",),
        )
        last = GaugeMetricFamily(
            "nsqworker_schedule_last_tick_seconds",
            "Unix time of the last tick this supervisor fired or skipped, per task.",
            labels=("task",),
        )
        marks = scheduler.last_fired() if scheduler is not None else {}
        for task in self.tasks:
            fired.add_metric([task.name], scheduler.fired_by_task[task.name] if scheduler else 0)
            skipped.add_metric(
                [task.name], scheduler.skipped_by_task[task.name] if scheduler else 0
            )
            if task.name in marks:
                last.add_metric([task.name], marks[task.name].timestamp())
        yield from (fired, skipped, last)

    def start(self) -> None:
        """Log the leader backend (once) and start campaigning on a daemon thread."""
        shown = ", ".join(f"{t.name} [{t.schedule}]" for t in self.tasks)
        log.info(
            f"schedules: leader {self.leader} ({self._why}) on "
            f"{self.elector.store.description}, candidate {self.elector.identity}; {shown}"
        )
        if self.leader == "none":
            log.warning(NO_LEADER)
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(ready,), name="nsqworker-schedules", daemon=True
        )
        self._thread.start()
        ready.wait(5.0)

    def request_stop(self) -> None:
        """Stop firing and release the lease, without waiting (a drain begins)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop ended already
                loop.call_soon_threadsafe(stop.set)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop firing, release the lease (another candidate leads at once), and wait."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def _main(self, ready: threading.Event) -> None:
        asyncio.run(self._run(ready))

    async def _run(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ready.set()
        publish, close = make_publisher(self.settings, self.tasks, self.name)
        self.scheduler = Scheduler(
            self.tasks, self.elector, publish, catchup=self.settings.schedule_catchup
        )
        try:
            await self.scheduler.run(self._stop)
        except Exception:
            log.exception("the schedule loop failed; schedules stopped firing")
        finally:
            for closing in (close, self.elector.store.close):
                try:
                    await asyncio.wait_for(closing(), 5.0)
                except Exception as exc:
                    log.debug(f"closing the schedule loop: {exc}")
