"""A hostile nsqlookupd against the RPC client and the worker's start (docs/security.md).

The fake nsqd and lookupd here (nsqworker.testing.faults) are the attacker's servers,
not brokers under test; the real nsqd are real.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import socket
from typing import Any

import pytest

from nsqworker.cli.rpc import EXIT_FAILED, call_command
from nsqworker.errors import NoConnection
from nsqworker.rpc import RpcClient, rpc
from nsqworker.task import Registry
from nsqworker.testing import NsqdFactory
from nsqworker.testing.faults import AuthAskingServer, HttpFaultServer, SilentServer
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration
SECRET = "top-secret-token"


def nodes(*ports: int) -> bytes:
    entries = [{"broadcast_address": "127.0.0.1", "hostname": "h", "tcp_port": port,
                "http_port": 1, "version": "1.3.0"} for port in ports]  # fmt: skip
    return json.dumps({"producers": entries}).encode()


class RefusingNsqd(SilentServer):
    """An nsqd impostor that refuses every IDENTIFY's msg_timeout, as an nsqd with a
    lower --max-msg-timeout would: ConfigurationError for an explicit msg_timeout."""

    def _serve(self, client: socket.socket) -> None:
        error = b"E_BAD_BODY IDENTIFY msg timeout (60000) is invalid"
        frame = (len(error) + 4).to_bytes(4, "big") + b"\0\0\0\1" + error
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if b"IDENTIFY" in data:
                    client.sendall(frame)


async def test_the_rpc_client_sends_no_secret_to_an_nsqd_lookupd_lists(kit) -> None:
    with AuthAskingServer() as impostor, HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = nodes(impostor.port)
        settings = kit.fast(auth_secret=SECRET)
        client = RpcClient(lookupd_http_addresses=[lookupd.address], settings=settings, timeout=2)
        with pytest.raises(NoConnection):
            async with client:
                pass
        assert b"IDENTIFY" in impostor.received  # dialled, asked for AUTH, got none
        err = io.StringIO()
        code = await _call(lookupd.address, settings, err)
        assert code == EXIT_FAILED
    assert impostor.accepted >= 2
    assert SECRET.encode() not in impostor.received
    assert b"AUTH" not in impostor.received


@pytest.mark.parametrize(
    "answer",
    [b'{"producers":[1]}', b'{"producers":{"a":1}}', b"[" * 100_000, b"not json"],
    ids=["entry", "not-a-list", "deep", "garbage"],
)
async def test_a_garbage_nodes_answer_is_a_clear_error(kit, answer: bytes) -> None:
    with HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = answer
        client = RpcClient(lookupd_http_addresses=[lookupd.address], settings=kit.fast())
        with pytest.raises(NoConnection, match="no nsqd found through nsqlookupd"):
            await client.start()
        err = io.StringIO()
        code = await _call(lookupd.address, kit.fast(), err)
    assert code == EXIT_FAILED
    assert "no nsqd found through nsqlookupd" in err.getvalue()


async def test_the_rpc_client_keeps_to_lookupd_allowed_nsqd(nsqd_factory: NsqdFactory, kit) -> None:
    nsqd = nsqd_factory()
    registry = Registry()

    @rpc("sec_rpc", registry=registry)
    async def answer(request: Any) -> Any:
        return {"ok": request}

    with AuthAskingServer() as impostor, HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = nodes(impostor.port, nsqd.tcp_port)  # the impostor first
        settings = kit.fast(
            auth_secret=SECRET, lookupd_allowed_nsqd=[nsqd.tcp_address],
            nsqd_tcp_addresses=[nsqd.tcp_address],
        )  # fmt: skip
        client = RpcClient(lookupd_http_addresses=[lookupd.address], settings=settings)
        async with Worker(registry, settings), client:
            assert client.reply_nsqd == nsqd.tcp_address
            assert await client.call("sec_rpc", 3, timeout=10) == {"ok": 3}
    assert impostor.accepted == 0


async def test_a_listed_nsqd_refusing_our_settings_does_not_stop_the_start(
    nsqd_factory: NsqdFactory, kit, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = nsqd_factory()
    nsqd.publish(kit.TOPIC, b"good")
    seen = kit.Seen()
    with RefusingNsqd() as hostile, HttpFaultServer(mode="fixed") as lookupd:
        lookupd.body = nodes(hostile.port, nsqd.tcp_port)
        settings = kit.fast(
            lookupd_http_addresses=[lookupd.address], lookupd_poll_interval=0.1, msg_timeout=60
        )
        with caplog.at_level(logging.DEBUG, logger="nsqworker.nsq.consumer"):
            async with Worker(kit.registry(seen), settings) as worker:
                await kit.until(lambda: seen.bodies["good"], 10, "the real nsqd not consumed")
                await kit.until(lambda: hostile.accepted >= 4, 10, "the refusal not retried")
                assert worker.ready
    refusals = [r for r in caplog.records if f"127.0.0.1:{hostile.port}" in r.getMessage()
                and "refuses our settings" in r.getMessage()]  # fmt: skip
    assert [r.levelno for r in refusals][:1] == [logging.ERROR]
    assert all(r.levelno == logging.DEBUG for r in refusals[1:])  # named once, not per retry


async def test_a_direct_nsqd_refusing_our_settings_still_fails_the_start(kit) -> None:
    from nsqworker.errors import ConfigurationError

    with RefusingNsqd() as hostile:
        settings = kit.fast(nsqd_tcp_addresses=[hostile.address], msg_timeout=60)
        with pytest.raises(ConfigurationError, match="msg_timeout"):
            async with Worker(kit.registry(kit.Seen()), settings):
                pass


async def _call(lookupd: str, settings: Any, err: io.StringIO) -> int:
    """``nsqworker rpc call sec_rpc 1 --lookupd`` (it runs its own event loop)."""
    from rich.console import Console

    return await asyncio.to_thread(
        call_command, "sec_rpc", "1", lookupd=[lookupd], settings=settings, timeout=2,
        out=io.StringIO(), console=Console(file=err, width=400),
    )  # fmt: skip
