"""``timeout_action``: the pure rule, the option's check at import, the process's count of
abandoned threads, and the thread pool giving an abandoned thread's place to a new one."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest

from nsqworker.outcomes import Reject, TaskTimeout
from nsqworker.pool import ThreadPool
from nsqworker.settings import Settings, SettingsError
from nsqworker.task import Registry, TaskDefinitionError
from nsqworker.testing import make_message, wait_until
from nsqworker.time_limits import TIMEOUT_ACTIONS, AbandonedThreads, timeout_reject


def test_the_rule() -> None:
    timeout = TaskTimeout(2)
    assert timeout_reject(timeout, 1, "retry", 0) is None
    assert timeout_reject(timeout, 1, "abandon", 0) is None
    assert timeout_reject(ValueError("x"), 1, "dead_letter", 0) is None  # time limits only
    rejected = timeout_reject(timeout, 1, "dead_letter", 0)
    assert isinstance(rejected, Reject)
    assert rejected.reason == (
        "the handler ran past its time limit of 2s on attempt 1 "
        "(timeout_action dead_letter: not retried)"
    )
    assert timeout_reject(timeout, 1, "abandon", 2) is None
    rejected = timeout_reject(timeout, 2, "abandon", 2)
    assert rejected is not None and "timeout_dead_letter_attempts 2" in rejected.reason


def test_the_option_and_the_setting_are_checked() -> None:
    with pytest.raises(TaskDefinitionError, match="timeout_action must be one of 'retry', "):
        Registry().task("t", channel="c", timeout_action="drop")  # type: ignore[arg-type]
    spec = Registry().task("t", channel="c", timeout_action="abandon")(lambda msg: None).spec
    assert spec.timeout_action == "abandon"
    assert TIMEOUT_ACTIONS == ("retry", "dead_letter", "abandon")
    assert Settings().timeout_action == "retry"
    with pytest.raises(SettingsError, match="timeout_action"):
        Settings(timeout_action="drop")


def test_abandoned_threads_are_bounded() -> None:
    threads = AbandonedThreads(2)
    assert threads.take() and threads.take()
    assert not threads.take() and threads.count == 2
    threads.release()
    assert threads.take()


async def test_an_abandoned_thread_is_replaced_and_exits_when_done() -> None:
    loop = asyncio.get_running_loop()
    release = threading.Event()
    results: list[Any] = []

    def handler(msg: Any) -> None:
        if msg.body == b"stuck":
            release.wait(30)

    def finish(msg: Any, *rest: Any) -> None:
        results.append(msg.body)

    pool = ThreadPool(handler, finish, loop, 1, "t")
    stuck, other = make_message(b"stuck"), make_message(b"other")
    pool.submit(stuck, contextvars.copy_context(), None)
    await wait_until(lambda: stuck in pool.running())
    pool.submit(other, contextvars.copy_context(), None)
    assert pool.abandon(stuck)
    assert not pool.abandon(stuck)  # once
    await wait_until(lambda: results == [b"other"])  # a size-1 pool, its slot given back
    assert pool.started() == 2 and pool.alive() == 2
    release.set()
    await wait_until(lambda: results == [b"other", b"stuck"])
    await wait_until(lambda: pool.alive() == 1)  # the abandoned thread ended
    pool.shutdown()
