"""``nsqworker dead-letters`` and :mod:`nsqworker.admin` on real brokers (nsqd, nats-server,
RabbitMQ): a handler fails to dead letter; listing shows it, twice the same; the handler
is fixed; a replay gets it handled exactly once and empties the topic; a purge removes;
a foreign message is reported, never replayed; a replay killed midway loses nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections import Counter
from typing import TYPE_CHECKING, Any

from nsqworker import Registry, Reject, Worker
from nsqworker.admin import (
    list_dead_letters,
    purge_dead_letters,
    replay_dead_letters,
    replay_sources,
)
from nsqworker.dead_letters import dead_letter_envelope
from nsqworker.message import Message
from nsqworker.testing import make_message, wait_until

if TYPE_CHECKING:
    from conftest import Broker  # tests/admin/conftest.py

FOREIGN = b"\x1b[2J[bold red]not an envelope[/bold red] \xff"


async def run_command(broker: Broker, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The ``nsqworker dead-letters`` command, run in a child process."""

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            broker.command(*args), env=broker.command_env(**env), capture_output=True,
            text=True, timeout=90,
        )  # fmt: skip

    return await asyncio.to_thread(run)


async def listed(broker: Broker, count: int) -> list[Any]:
    """The listing, once it has ``count`` dead letters."""
    found: list[Any] = []

    async def enough() -> bool:
        found[:] = await list_dead_letters(broker.settings(), broker.dead)
        return len(found) >= count

    deadline = asyncio.get_running_loop().time() + 30
    while not await enough():
        assert asyncio.get_running_loop().time() < deadline, f"{len(found)} of {count} listed"
        await asyncio.sleep(0.2)
    return found


async def test_a_dead_letter_is_listed_replayed_once_and_a_foreign_one_only_reported(
    broker: Broker,
) -> None:
    handled: Counter[bytes] = Counter()
    attempts: list[int] = []
    broken = [True]
    reg = Registry()

    @reg.task(broker.topic, channel="c", max_attempts=2, dead_letter_topic=broker.dead)
    async def bill(msg: Message) -> None:
        if broken[0]:
            raise Reject("bug 42: no invoice")
        handled[msg.body] += 1
        attempts.append(msg.attempts)

    settings = broker.settings()
    async with Worker(reg, settings):
        await broker.publish(broker.topic, [b'{"order": 1}', b"line\nwith \x1b[31m escapes"])
        await listed(broker, 2)
        await broker.publish(broker.dead, [FOREIGN])
        letters = await listed(broker, 3)

        # Listed twice, the same; the command agrees.
        assert await list_dead_letters(settings, broker.dead) == letters
        first = await run_command(broker, "list", broker.dead, "--json")
        assert first.returncode == 0, first.stderr
        assert [d["id"] for d in json.loads(first.stdout)] == [d.id for d in letters]
        assert json.loads(first.stdout) == [d.to_json() for d in letters]

        # the two are handled at once: which was rejected (and stored) first is not defined
        ours = sorted(
            (d for d in letters if d.problem is None), key=lambda d: d.body != b'{"order": 1}'
        )
        foreign = [d for d in letters if d.problem is not None]
        assert [d.body for d in ours] == [b'{"order": 1}', b"line\nwith \x1b[31m escapes"]
        for letter in ours:
            assert letter.task and letter.task.endswith(".bill") and letter.topic == broker.topic
            assert letter.reason == "bug 42: no invoice" and letter.attempts == 1
            assert letter.rejected_at is not None and letter.envelope is not None
        assert ours[1].body_preview == "line\\nwith \\x1b[31m escapes"
        (alien,) = foreign
        assert alien.problem and alien.problem.startswith("not a dead-letter envelope")
        assert alien.body is None and "\x1b" not in alien.body_preview
        assert letters.index(alien) == 2  # oldest first

        table = await run_command(broker, "list", broker.dead, "--limit", "3", COLUMNS="250")
        assert table.returncode == 0, table.stderr
        assert "[bold red]not an envelope[/bold red]" in table.stdout  # markup shown, not run
        assert "\x1b" not in table.stdout and "bug 42: no invoice" in table.stdout

        # Fixed: the replay publishes each original once, refuses the foreign message.
        broken[0] = False
        sources = replay_sources(reg, broker.dead)
        assert sources == {broker.topic}
        dry = await replay_dead_letters(settings, broker.dead, sources=sources, dry_run=True)
        assert dry.summary() == f"would replay 2 (2 to {broker.topic}), refused 1, left 0"
        assert await list_dead_letters(settings, broker.dead) == letters
        replay = await run_command(broker, "replay", broker.dead, "--all", "--to", broker.topic)
        assert replay.returncode == 1, replay.stderr  # one refused: said, and exit 1
        assert f"replayed 2 (2 to {broker.topic}), refused 1, left 0" in replay.stderr
        assert f"refused {alien.id}: not a dead-letter envelope" in replay.stderr
        await wait_until(lambda: sum(handled.values()) >= 2, timeout=30, message="the replays")
        await asyncio.sleep(0.5)  # a duplicate would have come by now
        assert handled == {b'{"order": 1}': 1, b"line\nwith \x1b[31m escapes": 1}
        assert attempts == [1, 1]  # a replayed message starts with fresh attempts
        assert await list_dead_letters(settings, broker.dead) == [alien]

        purged = await run_command(broker, "purge", broker.dead, "--id", alien.id, "--json")
        assert purged.returncode == 0 and "purged 1, left 0" in purged.stderr, purged.stderr
        assert json.loads(purged.stdout) == {
            "purged": [alien.id],
            "left": [],
            "errors": {},
            "notes": [],
        }
        assert await list_dead_letters(settings, broker.dead) == []
    assert handled == {b'{"order": 1}': 1, b"line\nwith \x1b[31m escapes": 1}


async def test_replay_to_another_topic_and_purge_by_age_and_all(broker: Broker) -> None:
    settings = broker.settings()
    seen = await broker.watch(broker.target)
    bodies = [f"message {i}".encode() for i in range(5)]
    await broker.publish(broker.dead, [envelope(broker.topic, b) for b in bodies])
    letters = await listed(broker, 5)
    assert [d.body for d in letters] == bodies

    report = await replay_dead_letters(
        settings, broker.dead, ids=[letters[0].id, "no-such-id"], to=broker.target
    )
    assert report.replayed == [letters[0].id] and report.left == []
    assert report.refused == {"no-such-id": "no such dead letter"}
    await wait_until(lambda: seen() == [b"message 0"], timeout=30, message="the replay")
    assert [d.id for d in await list_dead_letters(settings, broker.dead)] == [
        d.id for d in letters[1:]
    ]

    assert (await purge_dead_letters(settings, broker.dead, older_than=3600)).purged == []
    assert len(await list_dead_letters(settings, broker.dead, limit=2)) == 2
    report_all = await purge_dead_letters(settings, broker.dead)
    assert report_all.purged == [d.id for d in letters[1:]] and report_all.left == []
    assert await list_dead_letters(settings, broker.dead) == []
    assert seen() == [b"message 0"]


async def test_a_replay_killed_midway_loses_nothing(broker: Broker) -> None:
    count = 1000  # enough that even a fast machine is killed midway
    settings = broker.settings()
    seen = await broker.watch(broker.target)
    bodies = [f"m{i:04d}".encode() for i in range(count)]
    await broker.publish(broker.dead, [envelope(broker.topic, b) for b in bodies])
    await listed(broker, count)

    env = broker.command_env(NSQWORKER_MSG_TIMEOUT="2")  # NSQ: what it held returns in 2 s
    command = broker.command("replay", broker.dead, "--all", "--to", broker.target)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await wait_until(lambda: len(seen()) >= 5, timeout=60, message="the replay to start")
    finally:
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
    assert proc.returncode == -signal.SIGKILL

    def missing(left: list[Any]) -> set[bytes]:
        return set(bodies) - set(seen()) - {d.body for d in left}

    left: list[Any] = []
    deadline = asyncio.get_running_loop().time() + 30
    while missing(left):  # NSQ: the killed tool's messages come back after msg_timeout
        assert asyncio.get_running_loop().time() < deadline, f"lost: {sorted(missing(left))[:5]}"
        await asyncio.sleep(0.5)
        left = await list_dead_letters(settings, broker.dead)
    assert left, "the replay finished before it was killed: nothing was proved"
    assert {d.body for d in left} <= set(bodies)

    report = await replay_dead_letters(settings, broker.dead, to=broker.target)
    assert report.left == [] and report.refused == {}
    await wait_until(lambda: set(seen()) == set(bodies), timeout=30, message="every body")
    assert await list_dead_letters(settings, broker.dead) == []
    if broker.name != "nsq":  # the publish the kill interrupted was de-duplicated
        await broker.publish(broker.target, [b"end"])
        await wait_until(lambda: b"end" in seen(), timeout=30, message="the end marker")
        assert sorted(seen()) == sorted([*bodies, b"end"])


async def test_official_clients_read_the_replayed_messages(
    client_broker: Broker, read_with_official_client: Any
) -> None:
    broker = client_broker
    bodies = [b"replayed one", "replayed two \u00e9".encode()]
    await broker.publish(broker.dead, [envelope(broker.topic, body) for body in bodies])
    await listed(broker, 2)
    report = await replay_dead_letters(broker.settings(), broker.dead, sources=[broker.topic])
    assert len(report.replayed) == 2 and report.left == [] and report.refused == {}
    lines = await read_with_official_client(broker, broker.topic, 2)
    assert lines == ["replayed one", "replayed two \u00e9"]


def envelope(topic: str, body: bytes) -> bytes:
    return dead_letter_envelope(make_message(body=body, topic=topic), "boom", "bill")
