"""What handler features cost per message: ``python bench/bench_handlers.py``.

In one process, through the worker's own task runner (``TaskRunner.callback``, the
eager path an async handler takes for every message), microseconds per message of:

1. ``plain``: ``async def handle(msg: Message)``, no hooks (the baseline);
2. ``typed``: ``async def handle(click: Click)``, the body (a 60-byte JSON object of
   three fields) validated into a pydantic model;
3. ``hook-before``: the plain handler with one plain ``before`` hook on its registry;
4. ``hook-after``: the plain handler with one plain ``after`` hook;
5. ``timeout``: the plain handler with ``timeout=30`` (never reached);
6. ``publish-to``: ``publish_to="out"``, the handler returning the body: the result
   published before the ack, on the memory transport (the task layer's share: a Task,
   the encoding, the publish call; a broker's own cost is in the publishing rows).

Each case runs ``--repeat`` passes of ``--messages`` calls, interleaved; the best pass
is printed (the machine's other load only ever adds time), then each case's cost over
``plain``. No broker and no SDK: the transport's and the telemetry's share is elsewhere
in docs/benchmarks.md; this isolates what each feature adds.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from nsqworker.logging import configure_logging
from nsqworker.memory import MemoryTransport
from nsqworker.message import Message
from nsqworker.nsq.transport import CAPABILITIES
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.task_runner import TaskRunner

BODY = b'{"id": 12345, "url": "https://example.com/a/b", "ok": true}'


class Click(BaseModel):
    id: int
    url: str
    ok: bool


def _runner(registry: Registry, transport: Any = None) -> TaskRunner:
    (spec,) = list(registry)
    settings = Settings(nsqd_tcp_addresses=["127.0.0.1:4150"], log_level="warning")
    if transport is None:  # its subscription is never started: the callback is called
        transport = MemoryTransport()
        transport.capabilities = CAPABILITIES  # spans and logs of an NSQ task
    return TaskRunner(spec, settings, transport, hooks=registry.hooks)


def cases() -> dict[str, TaskRunner]:
    """One task runner per case."""
    built: dict[str, TaskRunner] = {}

    plain = Registry()

    @plain.task("bench", channel="c")
    async def handle(msg: Message) -> None:
        pass

    built["plain"] = _runner(plain)

    typed = Registry()

    @typed.task("bench", channel="c")
    async def handle_typed(click: Click) -> None:
        pass

    built["typed"] = _runner(typed)

    before = Registry()
    before.before(lambda msg: None)

    @before.task("bench", channel="c")
    async def handle_before(msg: Message) -> None:
        pass

    built["hook-before"] = _runner(before)

    after = Registry()
    after.after(lambda msg, outcome, error, duration: None)

    @after.task("bench", channel="c")
    async def handle_after(msg: Message) -> None:
        pass

    built["hook-after"] = _runner(after)

    limited = Registry()

    @limited.task("bench", channel="c", timeout=30)
    async def handle_limited(msg: Message) -> None:
        pass

    built["timeout"] = _runner(limited)

    piped = Registry()

    @piped.task("bench", channel="c", publish_to="out")
    async def handle_piped(msg: Message) -> bytes:
        return msg.body

    built["publish-to"] = _runner(piped, MemoryTransport())
    return built


async def one_pass(callback: Callable[[Message], Any], messages: int) -> float:
    """Seconds per message of ``messages`` calls (and of the Tasks they started)."""
    msgs = [
        Message(f"{i:016x}".encode(), BODY, 0, 1, "bench", "c", "127.0.0.1:4150")
        for i in range(messages)
    ]
    started = time.perf_counter()
    tasks = []
    for msg in msgs:
        result = callback(msg)
        if isinstance(result, asyncio.Task):  # publish_to: the publish, then the outcome
            tasks.append(result)
    if tasks:
        await asyncio.gather(*tasks)
    return (time.perf_counter() - started) / messages


async def main(messages: int, repeat: int) -> None:
    configure_logging("warning", "json")  # as a worker runs: success logs nothing
    runners = cases()
    best = {name: float("inf") for name in runners}
    for _ in range(repeat):
        for name, runner in runners.items():
            best[name] = min(best[name], await one_pass(runner.callback, messages))
    for name, seconds in best.items():
        print(f"{name} {seconds * 1e6:.3f} us/message")
    for name, seconds in best.items():
        if name != "plain":
            print(f"{name} over plain {(seconds - best['plain']) * 1e6:.3f} us/message")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.repeat))
