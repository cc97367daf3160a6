"""Tasks that feed tasks (``publish_to=`` and ``Publish``), on every transport: the
result is published before the ack, typed bodies and sync and async handlers alike; a
publish that fails is a failed attempt (retried, nothing lost); a chain of three tasks
carries one trace."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nsqworker.message import Message
from nsqworker.task import Publish, Registry
from nsqworker.worker import Worker

if TYPE_CHECKING:
    from conftest import Harness  # tests/contract/conftest.py

CHANNEL = "pipeline"


@dataclass
class Order:
    id: int
    qty: int


def worker(broker: Harness, registry: Registry, **settings: Any) -> Worker:
    return Worker(registry, broker.settings(**settings), transport=broker.transport())


def topics(broker: Harness, *names: str) -> list[str]:
    sep = "." if broker.name == "nats" else "_"
    return [f"{broker.topic}{sep}{name}" for name in names]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    yield exporter
    provider.shutdown()


async def test_results_flow_from_task_to_task_before_the_ack(broker: Harness) -> None:
    """orders (async, typed) -> totals (sync, dict) -> out; and Publish routing."""
    totals, out, big = topics(broker, "totals", "out", "big")
    watched_out, watched_big = await broker.watch(out), await broker.watch(big)
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, publish_to=totals)
    async def price(order: Order) -> Order:
        await asyncio.sleep(0)  # suspends: the Task path
        return Order(order.id, order.qty * 10)

    @reg.task(totals, channel=CHANNEL, publish_to=out)
    def total(order: Order) -> dict[str, int] | None:  # sync, in a thread
        return None if order.id == 3 else {"id": order.id, "total": order.qty}

    @reg.task(out, channel=CHANNEL)
    async def route(msg: Message) -> list[Publish]:  # inline (no await); no publish_to
        value = json.loads(msg.body)
        return [Publish(big, msg.body)] if value["total"] >= 20 else []

    await broker.publish(
        broker.topic, [json.dumps({"id": i, "qty": i}).encode() for i in (1, 2, 3)]
    )
    async with worker(broker, reg) as w:
        await broker.until(lambda: len(watched_out()) == 2 and len(watched_big()) == 1, 20, "out")
        for topic, count in ((broker.topic, 3), (totals, 3), (out, 2)):
            await broker.until_settled(topic, CHANNEL, count)  # by the broker's count

        def finished() -> dict[str, int]:
            return {name.rpartition(".")[2]: s.finished for name, s in w.stats().tasks.items()}

        expected = {"price": 3, "total": 3, "route": 2}
        await broker.until(lambda: finished() == expected, 5, f"finished {expected}")
    assert sorted(map(json.loads, watched_out()), key=lambda v: v["id"]) == [
        {"id": 1, "total": 10}, {"id": 2, "total": 20},
    ]  # fmt: skip  # id 3 returned None: nothing published
    assert [json.loads(b) for b in watched_big()] == [{"id": 2, "total": 20}]


async def test_a_failed_publish_is_a_failed_attempt_retried_and_nothing_lost(
    broker: Harness,
) -> None:
    """The first attempt publishes to a topic the broker refuses: the message is
    retried (not acked), its second attempt publishes; one that always fails goes to
    the dead-letter topic with its body."""
    (good,) = topics(broker, "good")
    dead = f"{broker.topic}.dead"
    watched, letters = await broker.watch(good), await broker.watch(dead)
    attempts: Counter[bytes] = Counter()
    lock = threading.Lock()
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, max_attempts=2, dead_letter_topic=dead)
    def handle(msg: Message) -> Publish:
        with lock:
            attempts[msg.body] += 1
        if msg.body == b"doomed" or msg.attempts == 1:
            return Publish("no such topic!", msg.body)  # refused: not a topic name
        return Publish(good, msg.body)

    await broker.publish(broker.topic, [b"flaky", b"doomed"])
    async with worker(broker, reg) as w:
        await broker.until(lambda: watched() and letters(), 20, "the result and the dead letter")
        # Both settled by the broker, after one retry each (a failed publish is no ack).
        await broker.until_settled(broker.topic, CHANNEL, 2, retried=2)

        def counted() -> tuple[int, int, int]:
            stats = w.stats().tasks[handle.spec.name]
            return stats.finished, stats.requeued, stats.dead_lettered

        await broker.until(lambda: counted() == (1, 2, 1), 5, "1 finished, 2 requeued, 1 dead")
    assert watched() == [b"flaky"]
    assert attempts == {b"flaky": 2, b"doomed": 2}
    assert json.loads(letters()[0])["body"] == "doomed"


async def test_a_chain_of_three_tasks_is_one_trace(
    broker: Harness, spans: InMemorySpanExporter
) -> None:
    second, third = topics(broker, "second", "third")
    done: list[str] = []
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, publish_to=second)
    async def one(msg: Message) -> bytes:
        return msg.body + b"1"

    @reg.task(second, channel=CHANNEL, publish_to=third)
    def two(msg: Message) -> bytes:
        return msg.body + b"2"

    @reg.task(third, channel=CHANNEL)
    async def three(msg: Message) -> None:
        done.append(msg.body.decode())

    await broker.publish(broker.topic, [b"x"])
    settings = {"tracing_envelope": True, "trace_parent_mode": "parent"}
    async with worker(broker, reg, **settings):
        await broker.until(lambda: bool(done), 20, "the end of the chain")
        for topic in (broker.topic, second, third):
            await broker.until_settled(topic, CHANNEL, 1)
    assert done == ["x12"]
    names = [f"process {t}" for t in (broker.topic, second, third)]
    process = {s.name: s for s in spans.get_finished_spans() if s.name in names}
    assert set(process) == set(names)
    assert len({s.context.trace_id for s in process.values()}) == 1  # one trace
    first, middle, last = (process[n] for n in names)
    assert first.context.span_id != middle.context.span_id != last.context.span_id
