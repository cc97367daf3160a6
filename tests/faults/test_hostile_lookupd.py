"""A hostile or broken nsqlookupd (docs/security.md): answers that are not the shape
nsqlookupd sends do not crash the worker or end its poller, and an nsqd that lookupd
lists gets the AUTH secret only over TLS unless the operator allows it."""

from __future__ import annotations

import json

import pytest

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
            poller = worker._runners[0].dispatcher.subscription.connections.poller
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
            poller = worker._runners[0].dispatcher.subscription.connections.poller
            assert poller is not None
            await kit.until(lambda: poller.polls >= 2, 5, "no polls")
            assert poller.answered == 0  # refused: no nsqd dialled
            assert not worker._runners[0].dispatcher.stats().connections


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
