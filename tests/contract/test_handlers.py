"""What users of the peers expect of a handler, on every transport: typed bodies, time
limits (async cancelled, sync given back while its thread finishes) and hooks, with
their failure paths: an invalid body, a handler over its limit, a hook that raises."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel, TypeAdapter
from typing_extensions import TypedDict

from nsqworker.message import Message, Outcome
from nsqworker.task import Registry, Reject
from nsqworker.worker import Worker

if TYPE_CHECKING:
    from conftest import Harness  # tests/contract/conftest.py

CHANNEL = "handlers"


class Click(BaseModel):
    id: int
    url: str


@dataclass
class View:
    id: int
    url: str


class Tag(TypedDict):
    id: int
    name: str


def worker(broker: Harness, registry: Registry, **settings: Any) -> Worker:
    return Worker(registry, broker.settings(**settings), transport=broker.transport())


async def test_a_typed_body_is_validated_and_an_invalid_one_dead_lettered_at_once(
    broker: Harness,
) -> None:
    clicks: list[Click] = []
    pairs: list[tuple[str, int]] = []
    dead: list[tuple[bytes, str, int]] = []
    reg = Registry()

    def on_dead(msg: Message, reason: str) -> None:
        dead.append((msg.body, reason, msg.attempts))

    @reg.task(broker.topic, channel=CHANNEL, on_dead_letter=on_dead, max_attempts=5)
    async def archive(click: Click) -> None:
        clicks.append(click)

    @reg.task(broker.topic, channel=f"{CHANNEL}_both")
    def audit(msg: Message, click: Click) -> None:  # sync, the message and the body
        pairs.append((msg.id, click.id))

    good = Click(id=1, url="https://example.com/a").model_dump_json().encode()
    async with worker(broker, reg):  # both channels exist before the messages arrive
        await broker.publish(broker.topic, [good, b'{"id": "x"}', b"not json"])
        await broker.until(lambda: len(clicks) == 1 and len(dead) == 2, 15, "1 handled, 2 dead")
        await broker.until(lambda: len(pairs) == 1, 15, "the pair")
        await broker.until_settled(broker.topic, CHANNEL, 3)  # 1 handled, 2 dead: no retry
        await broker.until_settled(broker.topic, f"{CHANNEL}_both", 3)
    assert clicks == [Click(id=1, url="https://example.com/a")]
    reasons = {body: reason for body, reason, _ in dead}
    assert "body is not a valid Click" in reasons[b'{"id": "x"}']
    assert "id: Input should be a valid integer" in reasons[b'{"id": "x"}']
    assert "url: Field required" in reasons[b'{"id": "x"}']
    assert "Invalid JSON" in reasons[b"not json"]
    assert {attempts for _, _, attempts in dead} == {1}  # retrying cannot fix a body
    assert [click_id for _, click_id in pairs] == [1]


async def test_an_async_handler_past_its_time_limit_is_cancelled_and_retried(
    broker: Harness,
) -> None:
    attempts: list[int] = []
    cancelled: list[int] = []
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, timeout=0.3)
    async def slow_once(msg: Message) -> None:
        attempts.append(msg.attempts)
        if msg.attempts == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(msg.attempts)
                raise

    await broker.publish(broker.topic, [b"x"])
    async with worker(broker, reg) as w:
        await broker.until(lambda: attempts == [1, 2], 15, "the retry after the time limit")
        await broker.until(lambda: w.stats().tasks[slow_once.spec.name].finished == 1, 5, "fin")
        await broker.until_settled(broker.topic, CHANNEL, 1, retried=1)
        stats = w.stats().tasks[slow_once.spec.name]
    assert cancelled == [1]
    assert stats.requeued == 1 and stats.dead_lettered == 0
    assert w.recycle is None  # an async handler is cancelled: no need to replace the process


async def test_a_sync_handler_past_its_limit_is_retried_and_keeps_its_slot(
    broker: Harness,
) -> None:
    runs: list[tuple[int, float, float]] = []
    lock = threading.Lock()
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, timeout=0.3, max_in_flight=1)
    def stuck_once(msg: Message) -> None:
        began = time.monotonic()
        if msg.attempts == 1:
            time.sleep(1.2)  # cannot be interrupted
        with lock:
            runs.append((msg.attempts, began, time.monotonic()))

    await broker.publish(broker.topic, [b"x"])
    async with worker(broker, reg) as w:
        await broker.until(lambda: len(runs) == 2, 15, "both runs")
        await broker.until_settled(broker.topic, CHANNEL, 1, retried=1)
        recycle = w.recycle
    (first, second) = sorted(runs)
    assert [first[0], second[0]] == [1, 2]
    assert second[1] >= first[2] - 0.01  # the retry waited for the stuck thread's slot
    assert recycle is not None and "outlived its time limit" in recycle


async def test_hooks_run_in_order_and_one_that_raises_changes_nothing(
    broker: Harness, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    events: list[str] = []
    reg = Registry()

    @reg.before
    def before(msg: Message) -> None:
        events.append(f"before {msg.body.decode()}")

    @reg.on_error
    async def on_error(msg: Message, error: BaseException) -> None:
        events.append(f"error {msg.body.decode()} {type(error).__name__}")

    @reg.after
    def after(
        msg: Message, outcome: Outcome | None, error: BaseException | None, duration: float
    ) -> None:
        events.append(f"after {msg.body.decode()} {type(outcome).__name__}")

    class Broken:
        def before(self, msg: Message) -> None:
            raise RuntimeError("a broken hook")

    @reg.on_dead_letter
    def last_resort(msg: Message, reason: str) -> None:
        events.append(f"dead {msg.body.decode()} {reason}")

    @reg.task(broker.topic, channel=CHANNEL, hooks=[Broken()], max_attempts=3)
    async def handle(msg: Message) -> None:
        events.append(f"handle {msg.body.decode()}")
        if msg.body == b"bad":
            raise Reject("bad body")

    await broker.publish(broker.topic, [b"ok"])
    async with worker(broker, reg):
        await broker.until(lambda: "after ok Finish" in events, 10, "ok done")
        await broker.publish(broker.topic, [b"bad"])
        await broker.until(lambda: any(e.startswith("dead bad") for e in events), 10, "dead")
        await broker.until_settled(broker.topic, CHANNEL, 2)
    assert events[:3] == ["before ok", "handle ok", "after ok Finish"]
    assert events[3:] == [
        "before bad",
        "handle bad",
        "error bad Reject",
        "after bad Reject",
        "dead bad bad body",
    ]
    failures = [line for line in log_lines() if line["event"].startswith("hook failed")]
    assert len(failures) == 2  # once per message it broke on, with its name
    assert all("Broken.before" in entry["hook"] for entry in failures)


async def test_a_task_without_hooks_runs_its_handler_unwrapped(broker: Harness) -> None:
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL)
    async def plain(msg: Message) -> None:
        pass

    async with worker(broker, reg) as w:
        runner = w.runners[0]
        assert runner.func is plain and not runner.after_hooks


@pytest.mark.parametrize("bad", ['{"id": 1}', "[1, 2]"])
async def test_a_model_published_is_what_a_typed_handler_reads(broker: Harness, bad: str) -> None:
    """The publishing side takes the same models (the memory transport and NSQ's
    Producer both publish a model's JSON)."""
    got: list[Click] = []
    dead: list[str] = []
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, on_dead_letter=lambda m, r: dead.append(r))
    async def archive(click: Click) -> None:
        got.append(click)

    publisher = broker.publisher()
    await publisher.publish(broker.topic, Click(id=7, url="u"))
    await publisher.publish(broker.topic, bad)
    async with worker(broker, reg):
        await broker.until(lambda: len(got) == 1 and len(dead) == 1, 10, "both")
        await broker.until_settled(broker.topic, CHANNEL, 2)
    assert got == [Click(id=7, url="u")]
    assert json.dumps(got[0].model_dump()) == '{"id": 7, "url": "u"}'


async def test_running_handlers_are_in_flight_and_a_slow_one_logged_once(
    broker: Harness, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """``Worker.inflight()`` (what /inflight serves) lists an async handler that awaits
    and a sync one in its thread; past ``slow_handler_after`` each is logged once."""
    release_async = asyncio.Event()
    release_sync = threading.Event()
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL)
    async def waits(msg: Message) -> None:
        await release_async.wait()

    @reg.task(broker.topic, channel=f"{CHANNEL}_sync")
    def blocks(msg: Message) -> None:
        release_sync.wait(30)

    async with worker(broker, reg, slow_handler_after=0.3) as w:
        await broker.publish(broker.topic, [b"x"])

        def both_old() -> bool:
            rows = w.inflight()
            return len(rows) == 2 and all(row["age_s"] > 0.6 for row in rows)

        await broker.until(both_old, 15, "both handlers in flight for 0.6 s")
        rows = {row["task"]: row for row in w.inflight()}
        assert rows[waits.spec.name]["handler"].startswith("task ")
        assert rows[blocks.spec.name]["handler"].startswith("thread nsqworker-blocks-")
        assert {row["state"] for row in rows.values()} == {"running"}

        def warned() -> int:
            return sum(line["event"] == "handler still running" for line in log_lines())

        await broker.until(lambda: warned() == 2, 10, "both handlers warned of")
        # The negative check, after that sync point: a stated window of some four more
        # sweeps (one every 0.25 s), and still one warning per message.
        await asyncio.sleep(1.0)
        release_async.set()
        release_sync.set()
        await broker.until(lambda: not w.inflight(), 10, "both done")
    slow = [line for line in log_lines() if line["event"] == "handler still running"]
    assert sorted(line["task"] for line in slow) == sorted([waits.spec.name, blocks.spec.name])


@pytest.mark.parametrize(
    ("body_type", "good", "bad", "error"),
    [
        (View, b'{"id": 1, "url": "u"}', b'{"id": 1}', "body is not a valid View: url: "),
        (
            Tag,
            b'{"id": 1, "name": "n"}',
            b'{"id": "x", "name": "n"}',
            "body is not a valid Tag: id: ",
        ),
        (list[int], b"[1, 2]", b'[1, "two"]', "body is not a valid list[int]: 1: "),
    ],
    ids=["dataclass", "TypedDict", "list[int]"],
)
async def test_other_typed_bodies_are_validated_too(
    broker: Harness, body_type: Any, good: bytes, bad: bytes, error: str
) -> None:
    """What pydantic's TypeAdapter validates besides models: a dataclass, a TypedDict,
    ``list[int]``; an invalid body is a dead letter at once, with the errors."""
    got: list[Any] = []
    dead: list[tuple[str, int]] = []
    reg = Registry()

    async def handle(body: Any) -> None:
        got.append(body)

    handle.__annotations__["body"] = body_type  # the annotation under test
    reg.task(
        broker.topic, channel=CHANNEL, max_attempts=5,
        on_dead_letter=lambda m, r: dead.append((r, m.attempts)),
    )(handle)  # fmt: skip
    async with worker(broker, reg):
        await broker.publish(broker.topic, [good, bad])
        await broker.until(lambda: len(got) == 1 and len(dead) == 1, 15, "1 handled, 1 dead")
        await broker.until_settled(broker.topic, CHANNEL, 2)
    assert got == [TypeAdapter(body_type).validate_json(good)]
    ((reason, attempts),) = dead
    assert reason.startswith(error) and attempts == 1


async def test_a_dataclass_published_is_what_a_typed_handler_reads(broker: Harness) -> None:
    got: list[View] = []
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL)
    async def archive(view: View) -> None:
        got.append(view)

    publisher = broker.publisher()
    await publisher.publish(broker.topic, View(id=7, url="u"))
    async with worker(broker, reg):
        await broker.until(lambda: len(got) == 1, 10, "the view")
        await broker.until_settled(broker.topic, CHANNEL, 1)
    assert got == [View(id=7, url="u")]


async def test_on_error_hooks_see_a_time_limit_async_and_sync(broker: Harness) -> None:
    """An async handler cancelled at its limit, and a sync one past it (its thread still
    running), both reach the on_error hooks with the TaskTimeout."""
    seen: list[tuple[str, str, float]] = []
    release = threading.Event()
    reg = Registry()

    @reg.on_error
    def report(msg: Message, error: BaseException) -> None:
        seen.append((msg.body.decode(), type(error).__name__, getattr(error, "limit", 0.0)))

    @reg.task(broker.topic, channel=CHANNEL, timeout=0.2, max_attempts=1)
    async def waits(msg: Message) -> None:
        await asyncio.sleep(30)

    @reg.task(broker.topic, channel=f"{CHANNEL}_sync", timeout=0.2, max_attempts=1)
    def blocks(msg: Message) -> None:
        release.wait(30)

    async with worker(broker, reg) as w:
        await broker.publish(broker.topic, [b"x"])
        await broker.until(lambda: len(seen) == 2, 15, "both time limits reported")
        release.set()
        await broker.until(lambda: not w.inflight(), 10, "the thread returned")
        await broker.until_settled(broker.topic, CHANNEL, 1)  # max_attempts 1: dead at once
        await broker.until_settled(broker.topic, f"{CHANNEL}_sync", 1)
    assert sorted(seen) == [("x", "TaskTimeout", 0.2)] * 2


async def test_hooks_that_raise_around_a_sync_handler_change_nothing(
    broker: Harness, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """before (in the handler's thread), on_error and after hooks that raise: each is
    logged once per message, and the messages are settled as the handler said."""
    dead: list[bytes] = []
    handled: list[bytes] = []

    class Broken:
        def before(self, msg: Message) -> None:
            raise RuntimeError("before")

        def on_error(self, msg: Message, error: BaseException) -> None:
            raise RuntimeError("on_error")

        async def after(
            self, msg: Message, outcome: Outcome | None, error: BaseException | None, d: float
        ) -> None:
            raise RuntimeError("after")

    reg = Registry()

    @reg.task(
        broker.topic, channel=CHANNEL, hooks=[Broken()], max_attempts=1,
        on_dead_letter=lambda m, r: dead.append(m.body),
    )  # fmt: skip
    def handle(msg: Message) -> None:
        handled.append(msg.body)
        if msg.body == b"bad":
            raise ValueError("bad")

    async with worker(broker, reg) as w:
        await broker.publish(broker.topic, [b"ok", b"bad"])
        await broker.until(lambda: dead == [b"bad"], 15, "bad dead-lettered")
        await broker.until(lambda: w.stats().tasks[handle.spec.name].finished == 1, 10, "ok")
        await broker.until_settled(broker.topic, CHANNEL, 2)

        def after_failures() -> int:
            return sum(
                line["event"].startswith("hook failed") and line["hook"].endswith(".after")
                for line in log_lines()
            )

        await broker.until(lambda: after_failures() == 2, 10, "the async after-hooks ran")
    assert sorted(handled) == [b"bad", b"ok"]
    failures = sorted(
        (line["hook"].rpartition(".")[2], line["id"])
        for line in log_lines()
        if line["event"].startswith("hook failed")
    )
    ids = {line["id"] for line in log_lines() if line["event"].startswith("hook failed")}
    assert len(ids) == 2
    assert [hook for hook, _ in failures] == ["after"] * 2 + ["before"] * 2 + ["on_error"]
