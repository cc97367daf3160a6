"""One delivery's life as one explicit state (``Message.stage``), moved only as the
table ``MOVES`` allows: the table itself, a forbidden move refused, and the stages the
dispatcher walks a delivery through on the memory transport."""

from __future__ import annotations

import asyncio

import pytest

from nsqworker.dispatch import Dispatcher, Policy
from nsqworker.errors import AlreadyResponded
from nsqworker.memory import MemoryTransport
from nsqworker.message import FINISH, MOVES, Message, Outcome, Reject, Stage, StageError


def message() -> Message:
    return Message(b"0123456789abcdef", b"x", 0, 1, "t", "c", "here")


def test_the_table_covers_every_stage_and_settled_is_the_end() -> None:
    assert set(MOVES) == set(Stage)
    assert MOVES[Stage.SETTLED] == frozenset()
    for stage, allowed in MOVES.items():
        assert stage not in allowed  # no move stays where it is
    reachable = {Stage.NEW}
    for _ in Stage:
        reachable |= {nxt for stage in reachable for nxt in MOVES[stage]}
    assert reachable == set(Stage)


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ((Stage.RUNNING,), Stage.WAITING),  # a started handler never goes back to wait
        ((Stage.ANSWERED,), Stage.RUNNING),  # an answered one never runs again
        ((Stage.SETTLED,), Stage.ANSWERED),  # settled is the end
        ((Stage.WAITING,), Stage.SETTLED),  # nothing is settled without an outcome
    ],
)
def test_a_forbidden_move_is_refused_and_changes_nothing(
    path: tuple[Stage, ...], bad: Stage
) -> None:
    msg = message()
    for stage in path:
        msg.move(stage)
    with pytest.raises(StageError, match=f"{path[-1].value} -> {bad.value}"):
        msg.move(bad)
    assert msg.stage is path[-1]


def test_answering_moves_to_answered_once() -> None:
    msg = message()
    assert not msg.answered and msg.stage is Stage.NEW
    msg.retry(3)
    assert msg.answered and msg.stage is Stage.ANSWERED
    with pytest.raises(AlreadyResponded):
        msg.finish()
    assert msg.stage is Stage.ANSWERED


async def test_the_dispatcher_walks_each_delivery_to_settled() -> None:
    """Inline: NEW -> SETTLED; suspended: NEW -> RUNNING -> ANSWERED -> SETTLED; a
    reject ends SETTLED once its chain ran; answering itself: ANSWERED -> SETTLED."""
    broker = MemoryTransport()
    seen: dict[bytes, list[Stage]] = {}
    kept: dict[bytes, Message] = {}

    async def handle(msg: Message) -> Outcome | None:
        kept[msg.body] = msg
        seen[msg.body] = [msg.stage]
        if msg.body == b"slow":
            await asyncio.sleep(0)
            seen[msg.body].append(msg.stage)
        elif msg.body == b"bad":
            return Reject("bad body")
        elif msg.body == b"self":
            msg.finish()
            seen[msg.body].append(msg.stage)
            return None
        return FINISH

    rejected: list[Stage] = []

    def on_reject(msg: Message, reason: str) -> None:
        rejected.append(msg.stage)

    sub = broker.subscribe("t", "c", name="t/c", max_in_flight=10)
    dispatcher = Dispatcher(
        sub, handle, Policy(max_in_flight=10), capabilities=broker.capabilities,
        on_reject=on_reject,
    )  # fmt: skip
    await dispatcher.start()
    for body in (b"inline", b"slow", b"bad", b"self"):
        await broker.publish("t", body)
    await broker.run_until_idle(until=lambda: dispatcher.received == 4 and not sub.running)
    await dispatcher.stop(0)
    assert seen == {
        b"inline": [Stage.NEW],
        b"slow": [Stage.NEW, Stage.RUNNING],
        b"bad": [Stage.NEW],
        b"self": [Stage.NEW, Stage.SETTLED],  # its own answer reaches the loop at once
    }
    assert rejected == [Stage.ANSWERED]  # the chain runs before the transport is told
    assert {body: m.stage for body, m in kept.items()} == dict.fromkeys(seen, Stage.SETTLED)
    assert (dispatcher.finished, dispatcher.rejected) == (3, 1)


def test_a_stage_copied_or_pickled_is_the_same_value() -> None:
    import copy
    import pickle

    for stage in Stage:
        assert pickle.loads(pickle.dumps(stage)) is stage
        assert copy.deepcopy(stage) is stage
