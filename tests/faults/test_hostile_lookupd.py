"""A hostile or broken nsqlookupd (docs/security.md): answers that are not the shape
nsqlookupd sends do not crash the worker or end its poller, and an nsqd that lookupd
lists gets the AUTH secret only over TLS unless the operator allows it."""

from __future__ import annotations

import json
import logging

import pytest

from nsqworker.nsq import handshake
from nsqworker.nsq.lookupd import MAX_ANSWER_BYTES, LookupdPoller
from nsqworker.nsq.options import ConnectionConfig
from nsqworker.testing import NsqdFactory
from nsqworker.testing.faults import AuthAskingServer, HttpFaultServer
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration
SECRET = "top-secret-token"


def producers(*entries: object) -> bytes:
    return json.dumps({"channels": [], "producers": list(entries)}).encode()


def nsqd_entry(port: int) -> dict[str, object]:
    return {"broadcast_address": "127.0.0.1", "hostname": "h", "tcp_port": port,
            "http_port": 1, "version": "1.3.0"}  # fmt: skip


async def test_malformed_producers_are_skipped_not_a_crash(nsqd_factory: NsqdFactory, kit) -> None:
    nsqd = nsqd_factory()
    nsqd.publish(kit.TOPIC, b"good")
    seen = kit.Seen()
    with HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = producers(
            1, "x", None, {"broadcast_address": 5, "tcp_port": 1},
            {"broadcast_address": "a b/c", "tcp_port": 4150},
            {"broadcast_address": "127.0.0.1", "tcp_port": "4150"}, nsqd_entry(nsqd.tcp_port),
        )  # fmt: skip
        settings = kit.fast(lookupd_http_addresses=[lookupd.address], lookupd_poll_interval=0.1)
        async with Worker(kit.registry(seen), settings) as worker:
            await kit.until(lambda: seen.bodies["good"], 10, "the listed nsqd not consumed")
            poller = worker.runners[0].dispatcher.subscription.connections.poller
            assert poller is not None
            lookupd.body = b'{"producers": {"not": "a list"}}'
            polls = poller.polls
            await kit.until(lambda: poller.polls >= polls + 3, 5, "the poller stopped")
            lookupd.body = producers(nsqd_entry(nsqd.tcp_port))
            nsqd.publish(kit.TOPIC, b"after")
            await kit.until(lambda: seen.bodies["after"], 10, "consuming stopped")
            assert worker.ready


async def test_too_many_producers_is_refused(kit) -> None:
    with HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = producers(*(nsqd_entry(1 + n % 60000) for n in range(10_001)))
        settings = kit.fast(lookupd_http_addresses=[lookupd.address], lookupd_poll_interval=0.1)
        async with Worker(kit.registry(kit.Seen()), settings) as worker:
            poller = worker.runners[0].dispatcher.subscription.connections.poller
            assert poller is not None
            await kit.until(lambda: poller.polls >= 2, 5, "no polls")
            assert poller.answered == 0  # refused: no nsqd dialled
            assert not worker.runners[0].dispatcher.stats().connections


@pytest.mark.parametrize("allowed", [False, True], ids=["default", "lookupd_auth_without_tls"])
async def test_an_nsqd_listed_by_lookupd_gets_no_secret_over_plain_tcp(kit, allowed: bool) -> None:
    with AuthAskingServer() as impostor, HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = producers(nsqd_entry(impostor.port))
        settings = kit.fast(
            lookupd_http_addresses=[lookupd.address], lookupd_poll_interval=0.1,
            auth_secret=SECRET, lookupd_auth_without_tls=allowed,
        )  # fmt: skip
        async with Worker(kit.registry(kit.Seen()), settings):
            await kit.until(lambda: b"IDENTIFY" in impostor.received, 10, "never dialled")
            if allowed:
                await kit.until(lambda: SECRET.encode() in impostor.received, 5, "no AUTH")
            else:
                await kit.until(lambda: impostor.accepted >= 2, 10, "no redial")
                assert SECRET.encode() not in impostor.received
                assert b"AUTH" not in impostor.received


async def test_a_direct_nsqd_still_gets_the_secret(kit) -> None:
    with AuthAskingServer() as impostor:  # listed in nsqd_tcp_addresses: the operator's choice
        settings = kit.fast(nsqd_tcp_addresses=[impostor.address], auth_secret=SECRET)
        worker = Worker(kit.registry(kit.Seen()), settings)
        try:
            await worker.start()
        except Exception:  # the impostor never answers AUTH: the start may fail, fine
            pass
        await kit.until(lambda: SECRET.encode() in impostor.received, 10, "no AUTH")
        await worker.stop()


async def test_lookupd_allowed_nsqd_ignores_the_rest(nsqd_factory: NsqdFactory, kit) -> None:
    nsqd = nsqd_factory()
    nsqd.publish(kit.TOPIC, b"good")
    seen = kit.Seen()
    with AuthAskingServer() as impostor, HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = producers(nsqd_entry(impostor.port), nsqd_entry(nsqd.tcp_port))
        settings = kit.fast(
            lookupd_http_addresses=[lookupd.address], lookupd_poll_interval=0.1,
            lookupd_allowed_nsqd=[f"127.0.0.1:{nsqd.tcp_port}"],
        )  # fmt: skip
        async with Worker(kit.registry(seen), settings):
            await kit.until(lambda: seen.bodies["good"], 10, "the allowed nsqd not consumed")
        assert impostor.accepted == 0


async def test_auth_over_plain_tcp_to_a_listed_nsqd_is_warned_once(
    kit, caplog: pytest.LogCaptureFixture
) -> None:
    with AuthAskingServer() as impostor, HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = producers(nsqd_entry(impostor.port))
        settings = kit.fast(
            lookupd_http_addresses=[lookupd.address], lookupd_poll_interval=0.1,
            auth_secret=SECRET, lookupd_auth_without_tls=True,
        )  # fmt: skip
        with caplog.at_level(logging.WARNING, logger="nsqworker.nsq.consumer"):
            async with Worker(kit.registry(kit.Seen()), settings):
                await kit.until(lambda: impostor.accepted >= 2, 15, "no redial")
    warned = [r.getMessage() for r in caplog.records if "over plain TCP" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"127.0.0.1:{impostor.port}" in warned[0] and "lookupd_auth_without_tls" in warned[0]
    assert SECRET not in warned[0]


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"a": "' + b"x" * (MAX_ANSWER_BYTES + 1) + b'"}'],
    ids=["deep", "huge"],
)
async def test_an_nsqd_info_answer_too_deep_or_too_large_is_ignored(body: bytes) -> None:
    with HttpFaultServer(mode="fixed") as info:
        info.body = b'{"max_heartbeat_interval": 10000000000}'
        assert await handshake.nsqd_info(info.address, ConnectionConfig()) == {
            "max_heartbeat_interval": 10_000_000_000
        }
        info.body = body
        assert await handshake.nsqd_info(info.address, ConnectionConfig()) is None


async def test_the_poller_keeps_the_http_addresses_of_current_producers_only() -> None:
    with HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = producers(nsqd_entry(4150), nsqd_entry(4250))
        poller = LookupdPoller([lookupd.address], "t", lambda found: None)
        try:
            await poller.poll()
            assert set(poller.http_addresses) == {"127.0.0.1:4150", "127.0.0.1:4250"}
            lookupd.body = producers(nsqd_entry(4250))
            await poller.poll()
            assert poller.http_addresses == {"127.0.0.1:4250": "http://127.0.0.1:1"}
        finally:
            await poller.close()
