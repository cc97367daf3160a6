"""NSQ's side of the dead-letter tools on a real nsqd: reading through the tools' own
channel leaves every other channel of the topic alone, lists in age order however often
nsqd's queue was rotated, and keeps what it holds alive past the message timeout."""

from __future__ import annotations

import asyncio
from typing import Any

from nsqworker.admin import list_dead_letters, purge_dead_letters, replay_dead_letters
from nsqworker.admin.nsq_store import CHANNEL, NsqStore
from nsqworker.dead_letters import dead_letter_envelope
from nsqworker.settings import Settings
from nsqworker.testing import NsqdFactory, make_message, wait_for

HOLD = 6.5
"""Seconds to hold a message for its 1 s timeout to pass for sure: nsqd looks for timed-out
messages only in the channels it knew at its last refresh of the list (every 5 s)."""


def settings_for(nsqd: Any, **overrides: Any) -> Settings:
    return Settings(nsqd_tcp_addresses=[nsqd.tcp_address], log_level="warning", **overrides)


def channel_stats(nsqd: Any, topic: str, channel: str) -> dict[str, Any]:
    for t in nsqd.stats(topic)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return dict(c)
    raise AssertionError(f"no channel {channel} on {topic}")


async def test_listing_leaves_other_channels_alone_and_keeps_its_order(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqd = nsqd_factory()
    settings = settings_for(nsqd)
    dead = "orders.dead"
    nsqd.create_channel(dead, "alerts")  # someone else's consumer of the dead letters
    nsqd.create_channel(dead, CHANNEL)  # created at deploy time, as docs/operations.md says
    for i in range(20):
        body = dead_letter_envelope(make_message(body=b"%d" % i, topic="orders"), "r", "t")
        nsqd.publish(dead, body)
    listings = [await list_dead_letters(settings, dead) for _ in range(3)]
    assert listings[0] == listings[1] == listings[2]
    assert [d.body for d in listings[0]] == [b"%d" % i for i in range(20)]
    times = [d.rejected_at for d in listings[0]]
    assert times == sorted(times)  # type: ignore[type-var]

    alerts = channel_stats(nsqd, dead, "alerts")
    assert (alerts["depth"], alerts["in_flight_count"], alerts["requeue_count"]) == (20, 0, 0)
    ours = channel_stats(nsqd, dead, CHANNEL)
    assert (ours["depth"], ours["in_flight_count"]) == (20, 0)  # all handed back

    report = await purge_dead_letters(settings, dead)
    assert len(report.purged) == 20
    assert channel_stats(nsqd, dead, "alerts")["depth"] == 20  # theirs, untouched
    wait_for(lambda: channel_stats(nsqd, dead, CHANNEL)["depth"] == 0, timeout=10)


async def test_what_the_tool_holds_outlives_the_message_timeout(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqd = nsqd_factory()
    settings = settings_for(nsqd, msg_timeout=1.0)
    dead = "slow.dead"
    nsqd.create_channel(dead, CHANNEL)  # as the worker does when it starts
    for i in range(3):
        body = dead_letter_envelope(make_message(body=b"%d" % i, topic="slow"), "r", "t")
        nsqd.publish(dead, body)
    async with NsqStore(settings, dead) as store:
        items = await store.read()
        assert len(items) == 3
        await asyncio.sleep(HOLD)  # past the message timeout: only TOUCH keeps them ours
        for item in items:
            await store.remove(item)
    assert store.errors == []  # no E_FIN_FAILED: none had timed out
    stats = channel_stats(nsqd, dead, CHANNEL)
    assert stats["timeout_count"] == 0 and stats["depth"] == 0
    assert await list_dead_letters(settings, dead) == []


async def test_a_fin_nsqd_turns_down_is_reported_not_counted_as_removed(
    nsqd_factory: NsqdFactory, monkeypatch: Any
) -> None:
    nsqd = nsqd_factory()
    settings = settings_for(nsqd, msg_timeout=1.0)
    dead = "late.dead"
    nsqd.create_channel(dead, CHANNEL)
    nsqd.publish(dead, dead_letter_envelope(make_message(body=b"x", topic="late"), "r", "t"))

    async def no_touch(self: NsqStore) -> None:  # a tool stalled past the timeout
        await asyncio.Event().wait()

    monkeypatch.setattr(NsqStore, "_keep_alive", no_touch)
    async with NsqStore(settings, dead) as store:
        (item,) = await store.read()
        await asyncio.sleep(HOLD)
        await store.remove(item)
    assert list(store.failed_removals) == [item.id]
    assert "E_FIN_FAILED" not in store.failed_removals[item.id]
    assert "not in flight" in store.failed_removals[item.id]
    assert [d.id for d in await list_dead_letters(settings, dead)] == [item.id]  # still there


async def test_through_lookupd_every_nsqd_is_read_and_each_replay_goes_where_it_was(
    nsq_cluster: Any,
) -> None:
    settings = Settings(lookupd_http_addresses=nsq_cluster.lookupd_http_addresses,
                        log_level="warning")  # fmt: skip
    dead, target = "spread.dead", "spread"
    first, second = nsq_cluster.nsqds
    first.create_channel(target, "watch")
    second.create_channel(target, "watch")
    first.create_channel(dead, CHANNEL)
    second.create_channel(dead, CHANNEL)
    for i, nsqd in enumerate([first, second, first, second]):
        body = dead_letter_envelope(make_message(body=b"%d" % i, topic=target), "r", "t")
        nsqd.publish(dead, body)

    async def both_listed() -> bool:
        return len(await list_dead_letters(settings, dead)) == 4

    deadline = asyncio.get_running_loop().time() + 30  # nsqd registers topics with lookupd
    while not await both_listed():
        assert asyncio.get_running_loop().time() < deadline, "lookupd never listed both nsqd"
        await asyncio.sleep(0.5)
    letters = await list_dead_letters(settings, dead)
    assert [d.body for d in letters] == [b"0", b"1", b"2", b"3"]  # age order across nsqd

    report = await replay_dead_letters(settings, dead, sources=[target])
    assert len(report.replayed) == 4 and report.left == []
    for nsqd in (first, second):  # each went back through the nsqd that held it
        assert channel_stats(nsqd, target, "watch")["depth"] == 2
    assert await list_dead_letters(settings, dead) == []


async def test_more_than_nsqd_lets_one_client_hold_is_said_and_taken_in_turns(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqd = nsqd_factory(extra_args=["--max-rdy-count=2"])
    settings = settings_for(nsqd)
    dead = "many.dead"
    nsqd.create_channel(dead, CHANNEL)
    for i in range(3):
        nsqd.publish(dead, dead_letter_envelope(make_message(body=b"%d" % i, topic="m"), "r", "t"))
    notes: list[str] = []
    first = await list_dead_letters(settings, dead, on_note=notes.append)
    assert len(first) == 2 and len(notes) == 1 and "--max-rdy-count" in notes[0]
    report = await purge_dead_letters(settings, dead)
    assert len(report.purged) == 2 and report.notes == notes
    (last,) = await list_dead_letters(settings, dead)  # the third shows now
    assert last.id not in report.purged and report.left == []
