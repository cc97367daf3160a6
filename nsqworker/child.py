"""What runs inside each worker process under ``nsqworker run``: a Worker, a heartbeat
of its stats to the supervisor over a pipe, and the exit codes both sides use."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from nsqworker.errors import ConfigurationError
from nsqworker.logging import configure_logging, get_logger

if TYPE_CHECKING:
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

__all__ = ["EXIT_CRASH_LOOP", "EXIT_FORCED", "EXIT_OK", "EXIT_USAGE", "ChildSpec", "child_main"]

log = get_logger("nsqworker.supervisor")

EXIT_OK = 0
EXIT_CRASH_LOOP = 1
EXIT_USAGE = 2
EXIT_FORCED = 130
#: Seconds the supervisor waits for children beyond ``drain_timeout`` before SIGKILL.


@dataclass(frozen=True)
class ChildSpec:
    """What a child process needs; pickled to it by the spawn start method."""

    target: str
    settings: Settings
    index: int
    heartbeat_interval: float


def child_main(spec: ChildSpec, conn: Connection) -> None:
    """Entry point of a worker process: run a Worker until SIGTERM, then exit 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides what Ctrl-C means
    settings = spec.settings
    configure_logging(settings.log_level, settings.log_format)
    from nsqworker.task import TaskImportError, load_registry

    try:
        registry = load_registry(spec.target)
    except TaskImportError as exc:
        log.error("worker could not import its tasks", worker=spec.index, error=str(exc))
        sys.exit(EXIT_USAGE)
    # After the import: a tracer provider the application sets up itself wins, since
    # OpenTelemetry lets the global provider be set only once.
    configure_telemetry()
    from nsqworker.worker import event_loop_factory

    try:
        with asyncio.Runner(loop_factory=event_loop_factory(settings)) as runner:
            runner.run(_serve(registry, settings, conn, spec.heartbeat_interval))
    except ConfigurationError as exc:  # e.g. a value set explicitly that nsqd refuses
        log.error(f"worker {spec.index} cannot start: {exc}")
        sys.exit(EXIT_USAGE)
    except Exception:
        log.exception("worker failed", worker=spec.index)
        sys.exit(1)
    sys.exit(0)


def configure_telemetry() -> None:
    """Set up OpenTelemetry from the ``OTEL_*`` environment variables."""
    from nsqworker.telemetry.setup import configure_from_env

    configure_from_env()


async def _serve(registry: Registry, settings: Settings, conn: Connection, interval: float) -> None:
    from nsqworker.worker import Worker

    worker = Worker(registry, settings)
    beat = _Heartbeat(worker, conn, interval)
    worker.recycle_listeners.append(beat.send)  # a recycle is told at once, not next beat
    beat.start()
    try:
        await worker.run()
    finally:
        # Drained: a late SIGTERM (systemd and `timeout` signal the whole group, then the
        # supervisor does too) must not turn this clean exit into "killed by SIGTERM".
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        beat.stop()


class _Heartbeat:
    """Sends the worker's stats to the supervisor from the worker's own event loop.

    Also answers the supervisor's pings at once, and stops the worker when the
    supervisor is gone (the pipe closes), so no orphan keeps consuming.
    """

    def __init__(self, worker: Worker, conn: Connection, interval: float) -> None:
        self._worker = worker
        self._conn = conn
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

    def start(self) -> None:
        self._loop.add_reader(self._conn.fileno(), self._on_message)
        self._task = self._loop.create_task(self._beat())

    def stop(self) -> None:
        self._loop.remove_reader(self._conn.fileno())
        if self._task is not None:
            self._task.cancel()
        self.send()  # a last snapshot, so the supervisor's totals include the drain

    async def _beat(self) -> None:
        while True:
            self.send()
            await asyncio.sleep(self._interval)

    def send(self) -> None:
        try:
            snapshot = self._worker.stats().as_dict()
        except Exception:  # a broken stats() must not look like a hung loop
            snapshot = {"ready": self._worker.ready}
        try:
            self._conn.send(("stats", snapshot))
        except (OSError, ValueError):
            self._orphaned()

    def _on_message(self) -> None:
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            self._orphaned()
            return
        if message == "ping":
            self.send()

    def _orphaned(self) -> None:
        """The supervisor is gone: drain and exit like on SIGTERM."""
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._conn.fileno())
        self._worker.request_stop()
