"""A dead letter never chooses where the operator publishes: a replay goes back only to
the topic of a task that dead-letters there (``--tasks``), or where ``--to`` says; a
reserved NATS subject is refused even then; ``--dry-run`` shows where each would go; a
refusal exits 1. On NATS and RabbitMQ Streams a replay carries a de-duplication id, so a
replay run again after a crash, or two at once, deliver each dead letter once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsqworker.admin import list_dead_letters, replay_dead_letters
from nsqworker.admin.dead_letters import open_store, to_dead_letter
from nsqworker.dead_letters import dead_letter_envelope
from nsqworker.nsq.transport import DEAD_LETTER_CHANNEL
from nsqworker.testing import make_message, wait_until

if TYPE_CHECKING:
    from conftest import Broker  # tests/admin/conftest.py


def envelope(topic: str, body: bytes) -> bytes:
    return dead_letter_envelope(make_message(body=body, topic=topic), "boom", "bill")


async def put_dead_letters(
    broker: Broker, items: list[tuple[str, bytes]], raw: list[bytes] | None = None
) -> list[Any]:
    """Write envelopes (original topic, body), or ``raw`` messages, to the dead-letter
    topic, as a worker (or an attacker who may write there) would; returns them once
    listed."""
    if broker.name == "nsq":  # what the worker does at start: the tools' channel first
        broker.nsqd.create_channel(broker.dead, DEAD_LETTER_CHANNEL)  # type: ignore[attr-defined]
    bodies = raw if raw is not None else [envelope(topic, body) for topic, body in items]
    await broker.publish(broker.dead, bodies)
    items = items or [("", b"")] * len(bodies)
    settings = broker.settings()
    deadline = asyncio.get_running_loop().time() + 30
    while len(found := await list_dead_letters(settings, broker.dead)) < len(items):
        assert asyncio.get_running_loop().time() < deadline, f"{len(found)} listed"
        await asyncio.sleep(0.2)
    return found


def tasks_module(tmp_path: Path, broker: Broker) -> Path:
    """A tasks module whose task reads ``broker.topic`` and dead-letters to ``broker.dead``."""
    (tmp_path / "shop_tasks.py").write_text(
        textwrap.dedent(f"""
        from nsqworker import task

        @task({broker.topic!r}, channel="billing", dead_letter_topic={broker.dead!r})
        async def bill(msg):
            pass
    """)
    )
    return tmp_path


async def command(broker: Broker, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            broker.command(*args), env=broker.command_env(), capture_output=True, text=True,
            timeout=90, cwd=cwd,
        )  # fmt: skip

    return await asyncio.to_thread(run)


async def test_a_replay_goes_only_where_a_task_dead_letters_from(
    broker: Broker, tmp_path: Path
) -> None:
    elsewhere = broker.topic + "_other"
    seen = await broker.watch(broker.topic)
    other = await broker.watch(elsewhere)
    letters = await put_dead_letters(broker, [(broker.topic, b"mine"), (elsewhere, b"crafted")])
    mine, crafted = sorted(letters, key=lambda d: d.body != b"mine")
    cwd = tasks_module(tmp_path, broker)

    nothing_known = await command(broker, cwd, "replay", broker.dead, "--all")
    assert nothing_known.returncode == 2, nothing_known.stderr
    assert "--tasks" in nothing_known.stderr and "--to" in nothing_known.stderr

    dry = await command(broker, cwd, "replay", broker.dead, "--all", "--tasks", "shop_tasks",
                        "--dry-run", "--json")  # fmt: skip
    assert dry.returncode == 1, dry.stderr  # one is refused: the command says so and fails
    assert f"would replay 1 (1 to {broker.topic}), refused 1, left 0" in dry.stderr
    assert json.loads(dry.stdout)["destinations"] == {broker.topic: 1}
    assert f"its topic {elsewhere!r} is not one whose task dead-letters" in dry.stderr

    done = await command(broker, cwd, "replay", broker.dead, "--all", "--tasks", "shop_tasks")
    assert done.returncode == 1, done.stderr
    assert f"replayed 1 (1 to {broker.topic}), refused 1, left 0" in done.stderr
    await wait_until(lambda: seen() == [b"mine"], timeout=30, message="the replay")
    assert [d.id for d in await list_dead_letters(broker.settings(), broker.dead)] == [crafted.id]
    assert other() == []

    # The operator may send it there on purpose, by name.
    chosen = await command(broker, cwd, "replay", broker.dead, "--id", crafted.id,
                           "--to", elsewhere)  # fmt: skip
    assert chosen.returncode == 0, chosen.stderr
    await wait_until(lambda: other() == [b"crafted"], timeout=30, message="the chosen replay")
    assert mine.id not in [d.id for d in await list_dead_letters(broker.settings(), broker.dead)]


async def test_a_reserved_subject_is_never_a_destination(nats_server: Any, tmp_path: Path) -> None:
    """A crafted NATS dead letter naming ``$JS.API.STREAM.DELETE.ORDERS`` as its topic:
    the replay refuses it, even when a task's topic is that name's stream, and even
    with ``--to``; the operator's ORDERS stream is still there (asked of the server)."""
    import nats

    from nsqworker.nats.producer import NatsProducer
    from nsqworker.settings import Settings

    settings = Settings(transport="nats", nats_servers=[nats_server.url], log_level="warning")
    dead = f"dl.{uuid.uuid4().hex[:8]}.dead"
    env = {"NSQWORKER_TRANSPORT": "nats", "NSQWORKER_NATS_SERVERS": nats_server.url}
    client = await nats.connect(nats_server.url)
    js = client.jetstream()
    await js.add_stream(name="ORDERS", subjects=["orders.>"])  # made by the operator
    producer = NatsProducer(settings=settings)
    try:
        await producer.publish(dead, envelope("$JS.API.STREAM.DELETE.ORDERS", b"{}"))
        letters = await list_dead_letters(settings, dead)
        assert len(letters) == 1
        report = await replay_dead_letters(settings, dead, sources=["$JS.API.STREAM.DELETE.ORDERS"])
        assert report.replayed == [] and list(report.refused) == [letters[0].id]
        assert "reserved name" in report.refused[letters[0].id]
        for name in ("$JS.API.STREAM.DELETE.ORDERS", "_INBOX.abc"):
            cli = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "nsqworker", "dead-letters", "replay", dead, "--all",
                 "--to", name],
                env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert cli.returncode == 2 and "reserved name" in cli.stderr, cli.stderr
        assert (await js.stream_info("ORDERS")).config.name == "ORDERS"
        assert [d.id for d in await list_dead_letters(settings, dead)] == [letters[0].id]
    finally:
        await producer.close()
        await js.delete_stream("ORDERS")
        await client.close()


async def test_a_replay_after_a_crash_or_two_at_once_deliver_each_once(
    broker: Broker,
) -> None:
    """A crash between the publish and the removal (a store that published, then was
    closed), replayed again; then two replays at once. NATS and Streams de-duplicate
    by the dead letter's id; NSQ hands a message to one reader at a time, so two replays
    at once never both hold it (a crash there can duplicate: nsqd has no de-duplication,
    docs/operations.md says so). One of two replays at once may stop early (its report
    says so); the other replays the rest."""
    settings = broker.settings()
    seen = await broker.watch(broker.target)
    bodies = [b"first", *(f"m{i}".encode() for i in range(20))]
    await put_dead_letters(broker, [(broker.topic, b) for b in bodies])

    if broker.name != "nsq":
        async with open_store(settings, broker.dead) as store:
            item = (await store.read(limit=1))[0]
            letter = to_dead_letter(item, None)
            assert letter.body == b"first"
            await store.publish(item, broker.target, letter.body)
        # crashed here: published, never removed

    reports = await asyncio.gather(
        replay_dead_letters(settings, broker.dead, to=broker.target),
        replay_dead_letters(settings, broker.dead, to=broker.target),
    )
    # Two at once race for each dead letter: on Streams one may find its removal already
    # done by the other and stop there, leaving to the other what it had not reached.
    # What holds: nothing refused, every dead letter replayed by one of them, what one
    # left the other replayed, and (below) each body delivered once, nothing left over.
    assert all(r.refused == {} for r in reports), reports
    replayed = set(reports[0].replayed) | set(reports[1].replayed)
    assert len(replayed) == len(bodies), reports
    assert set(reports[0].left) | set(reports[1].left) <= replayed, reports
    await wait_until(lambda: set(seen()) == set(bodies), timeout=30, message="every body")
    await broker.publish(broker.target, [b"end"])
    await wait_until(lambda: b"end" in seen(), timeout=30, message="the end marker")
    assert sorted(seen()) == sorted([*bodies, b"end"])  # each once
    assert await list_dead_letters(settings, broker.dead) == []


async def test_the_id_in_the_workers_log_names_the_dead_letter(
    broker: Broker, tmp_path: Path
) -> None:
    """The worker's dead-letter line shows the original message's id; the tools take it
    as well as the dead letter's own. An id that names nothing exits 1."""
    seen = await broker.watch(broker.target)
    message = make_message(body=b"logged", topic=broker.topic)
    raw = [dead_letter_envelope(message, "boom", "bill")]
    (letter,) = await put_dead_letters(broker, [], raw=raw)
    assert letter.id != message.id and letter.envelope is not None
    cwd = tmp_path
    nothing = await command(broker, cwd, "purge", broker.dead, "--id", "no-such-id", "--yes")
    assert nothing.returncode == 1 and "no such dead letter" in nothing.stderr
    done = await command(broker, cwd, "replay", broker.dead, "--id", message.id,
                         "--to", broker.target)  # fmt: skip
    assert done.returncode == 0, done.stderr
    await wait_until(lambda: seen() == [b"logged"], timeout=30, message="the replay")
