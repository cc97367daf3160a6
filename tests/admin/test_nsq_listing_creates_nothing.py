"""Listing dead letters never changes nsqd (docs/security.md, "reading never changes a
broker"): no topic is made for a name that does not exist, no channel on a live topic,
and the messages a topic buffers for its first channel stay there. nsqd's own /stats is
asked each time."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nsqworker.admin import list_dead_letters
from nsqworker.admin.nsq_store import CHANNEL, DeadLetterChannelMissing, TopicUncheckable
from nsqworker.dead_letters import dead_letter_envelope
from nsqworker.errors import ConfigurationError
from nsqworker.settings import Settings
from nsqworker.testing import NsqBinaries, NsqdFactory, NsqdProcess, make_message, wait_for
from nsqworker.testing.ports import free_ports

DEAD = "orders.dead"


def topics(nsqd: NsqdProcess) -> dict[str, list[str]]:
    """Every topic nsqd has, with its channels."""
    return {
        t["topic_name"]: sorted(c["channel_name"] for c in t["channels"])
        for t in nsqd.stats()["topics"]
    }


def direct(nsqd: NsqdProcess) -> Settings:
    return Settings(nsqd_tcp_addresses=[nsqd.tcp_address], log_level="warning")


def envelope(body: bytes) -> bytes:
    return dead_letter_envelope(make_message(body=body, topic="orders"), "r", "t")


async def test_listing_a_topic_that_exists_nowhere_makes_no_topic(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqd = nsqd_factory()
    notes: list[str] = []
    letters = await list_dead_letters(direct(nsqd), DEAD, on_note=notes.append)
    assert topics(nsqd) == {}
    assert letters == []
    assert notes == [f"{DEAD} does not exist on nsqd {nsqd.tcp_address}: nothing was"
                     " dead-lettered there"]  # fmt: skip


async def test_a_live_topic_without_the_tools_channel_is_refused_and_left_alone(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqd = nsqd_factory()
    nsqd.create_channel(DEAD, "alerts")  # someone's consumer of the dead letters
    nsqd.publish(DEAD, envelope(b"1"))
    with pytest.raises(DeadLetterChannelMissing) as refused:
        await list_dead_letters(direct(nsqd), DEAD)
    text = str(refused.value)
    assert CHANNEL in text and "made first" in text and "Workers make it" in text
    assert isinstance(refused.value, ConfigurationError)  # the CLI's "exit 2"
    assert topics(nsqd) == {DEAD: ["alerts"]}
    assert nsqd.depth(DEAD, "alerts") == 1

    env = {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "nsqworker", "dead-letters", "list", DEAD, "--wait", "0.2"]
    done = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert CHANNEL in done.stderr and "made first" in " ".join(done.stderr.split())
    assert topics(nsqd) == {DEAD: ["alerts"]}


async def test_the_messages_a_topic_keeps_for_its_first_channel_stay_there(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqd = nsqd_factory()
    for i in range(3):
        nsqd.publish(DEAD, envelope(b"%d" % i))  # no channel yet: the topic buffers them
    with pytest.raises(DeadLetterChannelMissing):
        await list_dead_letters(direct(nsqd), DEAD)
    assert topics(nsqd) == {DEAD: []}
    nsqd.create_channel(DEAD, "billing")  # the real first channel gets all three
    wait_for(lambda: nsqd.depth(DEAD, "billing") == 3, message=lambda: str(topics(nsqd)))


async def test_through_lookupd_only_nsqd_with_the_channel_are_read(nsq_cluster: Any) -> None:
    first, second = nsq_cluster.nsqds
    # second first: an nsqd making a topic also makes the channels lookupd knows for it
    second.create_channel(DEAD, "alerts")
    first.create_channel(DEAD, CHANNEL)
    first.publish(DEAD, envelope(b"kept"))
    second.publish(DEAD, envelope(b"not kept"))
    settings = Settings(lookupd_http_addresses=nsq_cluster.lookupd_http_addresses,
                        log_level="warning")  # fmt: skip
    wait_for(lambda: len(nsq_cluster.lookupd.lookup(DEAD)) == 2, message="both listed")
    notes: list[str] = []
    letters = await list_dead_letters(settings, DEAD, on_note=notes.append)
    assert [d.body for d in letters] == [b"kept"]
    assert topics(second) == {DEAD: ["alerts"]}
    assert [n for n in notes if second.tcp_address in n and CHANNEL in n]


async def test_an_nsqd_whose_topics_cannot_be_checked_is_not_subscribed(
    nsq_binaries: NsqBinaries, tmp_path: Path
) -> None:
    tcp, http = free_ports(2)  # its HTTP API is not at TCP port + 1
    while http == tcp + 1:
        tcp, http = free_ports(2)
    nsqd = NsqdProcess(tcp_port=tcp, http_port=http, data_path=tmp_path, binary=nsq_binaries.nsqd)
    with nsqd.start():
        with pytest.raises(TopicUncheckable) as refused:
            await list_dead_letters(direct(nsqd), DEAD)
        assert "TCP port + 1" in str(refused.value) and nsqd.tcp_address in str(refused.value)
        assert topics(nsqd) == {}
