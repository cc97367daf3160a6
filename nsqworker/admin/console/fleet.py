"""The fleet as the console shows it: every supervisor's ``/status`` and ``/inflight``,
merged per task, with the broker's backlog and rates computed over the last minutes.

:class:`Fleet` reads everything once per ``console_poll_interval`` in the background, so
a page renders from memory (50 tasks and 20 processes in a few milliseconds) and the
workers are read once per interval however many people look.

Every answer is checked against :class:`StatusDocument` and :class:`InflightDocument`
before anything is read from it: a field an older worker lacks is fine, a field of the
wrong type (a list where a topic goes, an integer too large for a float) makes that
worker an error row, and the others are shown as ever. A worker that answers slowly or
at length is cut off after :data:`READ_TIMEOUT` seconds or :data:`MAX_DOCUMENT` bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nsqworker.admin.console.backlog import Backlog, BacklogValue, TaskKey
from nsqworker.admin.console.discovery import Discovery, Endpoint
from nsqworker.logging import get_logger

__all__ = [
    "MAX_DOCUMENT",
    "RATE_WINDOW",
    "READ_TIMEOUT",
    "RECENT_WINDOW",
    "Fleet",
    "FleetView",
    "InflightDocument",
    "StatusDocument",
    "Supervisor",
    "TaskRow",
    "error_time",
    "problem_of",
]

log = get_logger("nsqworker.console")

#: Seconds over which "handled per second" is measured.
RATE_WINDOW = 60.0
#: Seconds over which retries and dead letters are counted ("in the last 5 minutes").
RECENT_WINDOW = 300.0
#: Seconds a read of one worker (its ``/status`` and ``/inflight``) may take in all.
READ_TIMEOUT = 3.0
#: Bytes of one ``/status`` or ``/inflight`` answer at most.
MAX_DOCUMENT = 4 * 2**20
#: Largest counter, pid or byte count taken from a worker (a signed 64-bit integer).
MAX_COUNT = 2**63 - 1

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class _Document(BaseModel):
    """Strict about types (no ``"5"`` for 5, no list for a name, finite numbers only),
    lenient about presence (what an older worker lacks is None), and blind to fields
    it does not know (a newer worker's)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, frozen=True)


class LastError(_Document):
    """A task's last handler failure (``last_error`` in ``/status``)."""

    error: str | None = None
    id: str | None = None
    attempts: Count | None = None
    outcome: str | None = None
    at: float | None = None
    """Unix seconds."""


class TaskStatus(_Document):
    """One task of one supervisor (``tasks[]`` in ``/status``)."""

    task: str
    topic: str
    channel: str
    system: str | None = None
    subscribed: bool | None = None
    dead_letter_topic: str | None = None
    in_flight: Count | None = None
    received: Count | None = None
    finished: Count | None = None
    requeued: Count | None = None
    dead_lettered: Count | None = None
    last_error: LastError | None = None


class WorkerStatus(_Document):
    """One worker process (``workers[]`` in ``/status``)."""

    worker: Count | None = None
    pid: Count | None = None
    ready: bool | None = None
    uptime_s: float | None = None
    memory_bytes: Count | None = None
    in_flight: Count | None = None


class StatusDocument(_Document):
    """What the console reads of a supervisor's ``/status``."""

    pid: Count | None = None
    hostname: str | None = None
    target: str | None = None
    transport: str | None = None
    uptime_s: float | None = None
    memory_bytes: Count | None = None
    restarts: Count | None = None
    stopping: bool | None = None
    workers: list[WorkerStatus] = Field(default_factory=list)
    tasks: list[TaskStatus] = Field(default_factory=list)


class Held(_Document):
    """A message a worker process holds (``inflight[]`` in ``/inflight``)."""

    pid: Count | None = None
    worker: Count | None = None
    task: str | None = None
    id: str | None = None
    attempts: Count | None = None
    age_s: float | None = None
    state: str | None = None
    handler: str | None = None


class InflightDocument(_Document):
    """What the console reads of a supervisor's ``/inflight``."""

    inflight: list[Held] = Field(default_factory=list)


def problem_of(path: str, exc: ValidationError) -> str:
    """One line saying what is wrong with a document: the first bad field and why."""
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0] if errors else {"loc": (), "msg": "not valid"}
    where = ".".join(str(part) for part in first["loc"]) or "the document"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"malformed {path}: {where}: {first['msg']}{more}"


class _Refused(Exception):
    """A worker's answer that the console will not read."""


@dataclass
class Supervisor:
    """One ``nsqworker run`` as read from its health server."""

    endpoint: Endpoint
    status: dict[str, Any] = field(default_factory=dict)
    inflight: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def inflight_of(self, pid: int) -> list[dict[str, Any]]:
        """What worker process ``pid`` holds, oldest first."""
        return [row for row in self.inflight if row.get("pid") == pid]


@dataclass
class TaskRow:
    """One task over the whole fleet."""

    task: str
    system: str
    topic: str
    channel: str
    dead_letter_topic: str | None = None
    backlog: int | None = None
    backlog_note: str = ""
    in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0
    dead_lettered: int = 0
    rate: float = 0.0
    """Messages handled (finished, retried or dead-lettered) per second, last minute."""
    retries_recent: int = 0
    dead_recent: int = 0
    last_error: dict[str, Any] | None = None
    supervisors: int = 0
    subscribed: bool = False

    @property
    def key(self) -> TaskKey:
        return (self.system, self.topic, self.channel)

    @property
    def handled(self) -> int:
        return self.finished + self.requeued + self.dead_lettered


@dataclass
class FleetView:
    """What the pages render: one consistent read of the fleet."""

    supervisors: list[Supervisor]
    tasks: list[TaskRow]
    at: float
    """Unix time of the read."""
    discovery_error: str | None = None

    @property
    def processes(self) -> int:
        return sum(len(s.status.get("workers") or ()) for s in self.supervisors)


def merge_tasks(supervisors: list[Supervisor]) -> list[TaskRow]:
    """Per task (name, transport, topic, channel), summed over supervisors; the latest
    last error of any."""
    rows: dict[tuple[str, str, str, str], TaskRow] = {}
    for sup in supervisors:
        for raw in sup.status.get("tasks") or ():
            key = (str(raw.get("task")), str(raw.get("system") or "nsq"),
                   str(raw.get("topic")), str(raw.get("channel")))  # fmt: skip
            row = rows.get(key)
            if row is None:
                row = rows[key] = TaskRow(*key)
            row.supervisors += 1
            row.subscribed = row.subscribed or bool(raw.get("subscribed"))
            row.dead_letter_topic = raw.get("dead_letter_topic") or row.dead_letter_topic
            for name in ("in_flight", "received", "finished", "requeued", "dead_lettered"):
                setattr(row, name, getattr(row, name) + _count(raw.get(name)))
            error = raw.get("last_error")
            if isinstance(error, dict) and (
                row.last_error is None or error_time(error) > error_time(row.last_error)
            ):
                row.last_error = error
    return [rows[k] for k in sorted(rows)]


class _History:
    """Counter readings per task over the last :data:`RECENT_WINDOW` seconds."""

    def __init__(self) -> None:
        self._readings: deque[tuple[float, dict[str, tuple[int, int, int]]]] = deque()

    def add(self, now: float, tasks: list[TaskRow]) -> None:
        self._readings.append(
            (now, {r.task: (r.handled, r.requeued, r.dead_lettered) for r in tasks})
        )
        # keep one reading at or before the window's start: the base of "recent"
        while len(self._readings) > 1 and now - self._readings[1][0] >= RECENT_WINDOW:
            self._readings.popleft()

    def apply(self, now: float, tasks: list[TaskRow]) -> None:
        """Set each row's rate and recent counts against the reading that starts each
        window (the last one at or before its start, else the oldest: the console is
        younger than the window)."""
        for row in tasks:
            rate_from = self._base(now - RATE_WINDOW, row.task)
            if rate_from is not None and now > rate_from[0]:
                handled = _delta(row.handled, rate_from[1][0])
                row.rate = handled / (now - rate_from[0])
            recent = self._base(now - RECENT_WINDOW, row.task)
            base = recent[1] if recent is not None else (0, 0, 0)
            row.retries_recent = _delta(row.requeued, base[1])
            row.dead_recent = _delta(row.dead_lettered, base[2])

    def _base(self, since: float, task: str) -> tuple[float, tuple[int, int, int]] | None:
        found = None
        for at, counts in self._readings:
            if task not in counts:
                continue
            if found is None or at <= since:
                found = (at, counts[task])
            if at > since:
                break
        return found


def error_time(error: dict[str, Any] | None) -> float:
    """When a last error happened (Unix seconds); 0 when unknown or not a number."""
    at = (error or {}).get("at")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return 0.0
    try:
        return float(at)
    except OverflowError:  # a checked document never has one; a hand-made row may
        return 0.0


def _count(value: Any) -> int:
    """A counter from a worker's JSON; anything but a whole number counts as 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _delta(now: int, then: int) -> int:
    """Growth of a counter; after a reset (a supervisor restarted) its whole value."""
    return now - then if now >= then else now


class Fleet:
    """Reads the fleet every ``interval`` seconds; :meth:`view` is the latest read."""

    def __init__(
        self,
        discovery: Discovery,
        backlog: Callable[[httpx.AsyncClient], Backlog] | None,
        interval: float,
    ) -> None:
        self.discovery = discovery
        self.interval = interval
        self.http = httpx.AsyncClient(timeout=READ_TIMEOUT, trust_env=False)
        self.backlog = backlog(self.http) if backlog is not None else None
        self._history = _History()
        self._view: FleetView | None = None
        self._first = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def view(self) -> FleetView:
        """The latest read (waits for the first one). Without :meth:`start` (an app
        served without its lifespan), a read older than ``interval`` is renewed first."""
        if self._task is None and (self._view is None or self._age() >= self.interval):
            await self.refresh()
        await self._first.wait()
        assert self._view is not None
        return self._view

    def _age(self) -> float:
        return time.time() - self._view.at if self._view is not None else float("inf")

    def start(self) -> None:
        """Read now and then every ``interval`` seconds, until :meth:`close`."""
        self._task = asyncio.create_task(self._loop(), name="nsqworker-console-fleet")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.backlog is not None:
            await self.backlog.close()
        await self.http.aclose()

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # never stop reading: the next turn may work
                log.exception("reading the fleet failed")
                if self._view is None:  # pages wait for a first read: give them one
                    problem = f"reading the fleet failed: {_one_line(exc)}"
                    self._view = FleetView([], [], time.time(), problem)
                    self._first.set()
            await asyncio.sleep(self.interval)

    async def refresh(self) -> FleetView:
        """Read every worker and the backlog once; the new view."""
        problem = None
        try:
            endpoints = await self.discovery.endpoints()
        except Exception as exc:
            endpoints, problem = [], f"cannot find the workers: {type(exc).__name__}: {exc}"
        supervisors = list(await asyncio.gather(*(self._read(e) for e in endpoints)))
        tasks = merge_tasks([s for s in supervisors if s.ok])
        if self.backlog is not None and tasks:
            values = await self.backlog.measure(sorted({t.key for t in tasks}))
            for row in tasks:
                value = values.get(row.key) or BacklogValue(None, "not measured")
                row.backlog, row.backlog_note = value.count, value.note
        now = time.monotonic()
        self._history.add(now, tasks)
        self._history.apply(now, tasks)
        self._view = FleetView(supervisors, tasks, time.time(), problem)
        self._first.set()
        return self._view

    async def _read(self, endpoint: Endpoint) -> Supervisor:
        """One supervisor: its checked ``/status`` and ``/inflight``, or why not."""
        sup = Supervisor(endpoint)
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                status_doc, inflight_doc = await asyncio.gather(
                    self._get(endpoint.url, "/status"), self._get(endpoint.url, "/inflight")
                )
        except TimeoutError:
            sup.error = f"unreachable: no full answer within {READ_TIMEOUT:g} s"
            return sup
        except _Refused as exc:
            sup.error = str(exc)
            return sup
        except Exception as exc:  # refused, reset, not HTTP, not JSON, nested too deep...
            sup.error = f"unreachable: {_one_line(exc)}"
            return sup
        try:
            StatusDocument.model_validate(status_doc)
        except ValidationError as exc:
            sup.error = problem_of("/status", exc)
            return sup
        try:
            InflightDocument.model_validate(inflight_doc)
        except ValidationError as exc:
            sup.error = problem_of("/inflight", exc)
            return sup
        # the documents as sent (a field an older worker lacks stays absent), now that
        # every field the pages read is known to have its type
        sup.status = status_doc
        sup.inflight = list(inflight_doc.get("inflight") or [])
        return sup

    async def _get(self, url: str, path: str) -> Any:
        """``url + path`` as JSON, at most :data:`MAX_DOCUMENT` bytes."""
        async with self.http.stream("GET", url + path) as response:
            if response.status_code != 200:
                raise _Refused(f"{path} answered HTTP {response.status_code}, not 200 "
                               "(is this nsqworker run's health port?)")  # fmt: skip
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT:
                    raise _Refused(f"malformed {path}: more than {MAX_DOCUMENT // 2**20} MiB")
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise _Refused(f"malformed {path}: not JSON ({_one_line(exc)})") from None


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, at most 300 characters."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:300] + "..."
