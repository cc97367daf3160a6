"""The nsqworker.testing fixtures and process helpers, against real nsqd/nsqlookupd."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest

from nsqworker.testing import (
    NsqCluster,
    NsqdFactory,
    NsqdProcess,
    NsqHttpError,
    NsqlookupdProcess,
    NsqProcessError,
    find_binary,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_nsqd_listens_on_loopback_ports(nsqd: NsqdProcess) -> None:
    assert nsqd.running
    assert nsqd.tcp_address == f"127.0.0.1:{nsqd.tcp_port}"
    assert nsqd.http_address == f"http://127.0.0.1:{nsqd.http_port}"
    assert httpx.get(f"{nsqd.http_address}/ping", trust_env=False).text == "OK"
    info = nsqd.info()
    assert info["version"] == "1.3.0"
    assert (info["tcp_port"], info["http_port"]) == (nsqd.tcp_port, nsqd.http_port)
    assert info["broadcast_address"] == "127.0.0.1"
    with socket.create_connection(("127.0.0.1", nsqd.tcp_port), timeout=2):
        pass
    assert nsqd.log_path.parent == nsqd.data_path
    assert "TCP: listening on 127.0.0.1" in nsqd.log_path.read_text()


def test_publish_and_read_stats(nsqd: NsqdProcess) -> None:
    nsqd.create_channel("clicks", "archive")
    nsqd.publish("clicks", b'{"id": 1}')
    nsqd.publish("clicks", "text body")
    nsqd.mpublish("clicks", [b"a", b"b", "c"])
    nsqd.mpublish("clicks", [b"line\nbreak", b"\x00\xff"], binary=True)

    wait_for(lambda: nsqd.depth("clicks", "archive") == 7, message="depth never reached 7")
    topic = nsqd.topic_stats("clicks")
    assert topic is not None and topic["message_count"] == 7
    channel = nsqd.channel_stats("clicks", "archive")
    assert channel is not None and channel["depth"] == 7 and channel["in_flight_count"] == 0
    assert nsqd.in_flight("clicks", "archive") == 0
    assert [t["topic_name"] for t in nsqd.stats()["topics"]] == ["clicks"]

    assert nsqd.topic_stats("nope") is None
    assert nsqd.channel_stats("clicks", "nope") is None
    assert nsqd.depth("nope", "nope") == 0


def test_mpublish_text_mode_rejects_newlines(nsqd: NsqdProcess) -> None:
    with pytest.raises(ValueError, match="binary=True"):
        nsqd.mpublish("clicks", [b"two\nlines"])


def test_deferred_publish_is_not_in_depth(nsqd: NsqdProcess) -> None:
    nsqd.create_channel("later", "c")
    nsqd.publish("later", b"x", defer_ms=60_000)
    # the channel exists before nsqd has moved the deferred message into it: wait for it
    channel = wait_for(
        lambda: (c := nsqd.channel_stats("later", "c")) and c["deferred_count"] == 1 and c,
        message="the deferred message in the channel",
    )
    assert channel["depth"] == 0


def test_http_errors_carry_status_and_text(nsqd: NsqdProcess) -> None:
    with pytest.raises(NsqHttpError, match="INVALID_TOPIC") as info:
        nsqd.publish("bad topic!", b"x")
    assert info.value.status_code == 400


def test_nsqd_registers_with_lookupd(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    nsqd = nsqd_factory(lookupd=nsqlookupd)
    assert nsqd.lookupd_tcp_addresses == [nsqlookupd.tcp_address]
    assert nsqlookupd.lookup("clicks") == []

    nsqd.publish("clicks", b"hello")
    producers = wait_for(lambda: nsqlookupd.lookup("clicks"), message="clicks never in lookupd")
    assert [(p["broadcast_address"], p["tcp_port"], p["http_port"]) for p in producers] == [
        ("127.0.0.1", nsqd.tcp_port, nsqd.http_port)
    ]
    assert [n["tcp_port"] for n in nsqlookupd.nodes()] == [nsqd.tcp_port]
    assert nsqlookupd.topics() == ["clicks"]


def test_kill_and_restart_keep_ports_and_data(nsqd_factory: NsqdFactory) -> None:
    # Every message goes to disk and is synced at once, so it survives SIGKILL.
    nsqd = nsqd_factory(extra_args=["--mem-queue-size=0", "--sync-every=1"])
    nsqd.create_channel("jobs", "c")
    nsqd.mpublish("jobs", [b"1", b"2"])
    wait_for(lambda: nsqd.depth("jobs", "c") == 2)
    ports, old_pid = (nsqd.tcp_port, nsqd.http_port), nsqd.pid

    assert nsqd.kill() == -9
    assert not nsqd.running and not _alive(old_pid)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{nsqd.http_address}/ping", trust_env=False)

    nsqd.restart()
    assert nsqd.running and nsqd.pid != old_pid
    assert (nsqd.tcp_port, nsqd.http_port) == ports
    assert nsqd.depth("jobs", "c") == 2
    assert nsqd.log_path.read_text().count("--- ") == 2  # one log, appended per start


def test_stop_is_graceful_and_idempotent(nsqd: NsqdProcess) -> None:
    nsqd.create_channel("t", "c")
    nsqd.publish("t", b"kept in memory, flushed on SIGTERM")
    assert nsqd.stop() == 0
    assert nsqd.stop() == 0
    assert "NSQ: bye" in nsqd.log_path.read_text()
    nsqd.restart()
    assert nsqd.depth("t", "c") == 1


def test_restart_of_a_running_process(nsqlookupd: NsqlookupdProcess) -> None:
    old_pid, port = nsqlookupd.pid, nsqlookupd.http_port
    nsqlookupd.restart()
    assert nsqlookupd.pid != old_pid and nsqlookupd.http_port == port
    assert nsqlookupd.nodes() == []


def test_extra_args_reach_nsqd(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory(extra_args=["--msg-timeout=2s", "--max-msg-size=4096"])
    assert httpx.get(f"{nsqd.http_address}/config/msg_timeout", trust_env=False).json() == (
        2_000_000_000
    )
    with pytest.raises(NsqHttpError, match="MSG_TOO_BIG"):
        nsqd.publish("t", b"x" * 5000)


def test_start_failure_reports_the_log(nsqd: NsqdProcess, tmp_path: Path) -> None:
    taken = NsqdProcess(
        tcp_port=nsqd.tcp_port,
        http_port=free_port(),
        data_path=tmp_path,
        binary=find_binary("nsqd"),
        ready_timeout=5,
    )
    with pytest.raises(NsqProcessError, match="address already in use"):
        taken.start()
    assert not taken.running


def test_bad_flag_fails_fast(tmp_path: Path) -> None:
    proc = NsqdProcess(extra_args=["--no-such-flag"], data_path=tmp_path)
    with pytest.raises(NsqProcessError, match="exited with status"):
        proc.start()


def test_context_managers_clean_up() -> None:
    with NsqlookupdProcess() as lookupd, NsqdProcess([lookupd]) as nsqd:
        pid, data = nsqd.pid, nsqd.data_path
        nsqd.publish("ctx", b"x")
        wait_for(lambda: lookupd.lookup("ctx"))
    assert not nsqd.running and not lookupd.running
    assert not _alive(pid)
    assert not data.exists()  # temporary data path removed


def test_cluster_fixture(nsq_cluster: NsqCluster) -> None:
    assert len(nsq_cluster.nsqds) == 2
    for n in nsq_cluster.nsqds:
        n.publish("spread", b"x")
    wait_for(lambda: len(nsq_cluster.lookupd.lookup("spread")) == 2)
    assert sorted(nsq_cluster.nsqd_tcp_addresses) == sorted(
        f"127.0.0.1:{p['tcp_port']}" for p in nsq_cluster.lookupd.lookup("spread")
    )
    assert nsq_cluster.lookupd_http_addresses == [nsq_cluster.lookupd.http_address]


async def test_fixtures_work_in_async_tests(nsqd: NsqdProcess) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(f"{nsqd.http_address}/pub?topic=async", content=b"x")
    assert response.text == "OK"
    assert nsqd.topic_stats("async") is not None
