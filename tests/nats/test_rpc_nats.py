"""``@rpc`` on NATS (docs/rpc.md, "RPC on NATS"), on a real nats-server: endpoints answer
NATS requests on their reply subject; RpcClient, ``nsqworker rpc call`` and the official
``nats req`` CLI (natscli, built by scripts/install-tools) are callers; errors and
encodings as on NSQ, with the NATS service error headers."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nsqworker.errors import RpcError, RpcTimeout
from nsqworker.rpc import RpcClient, rpc
from nsqworker.settings import Settings
from nsqworker.task import Registry, Reject, Retry
from nsqworker.testing import wait_until
from nsqworker.testing.nats import NatsServerProcess
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration


def settings(url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "transport": "nats",
        "nats_servers": [url],
        "retry_delay": 0.05,
        "backoff_multiplier": 0.0,
        "drain_timeout": 5.0,
        "health_port": 0,
        "log_level": "warning",
    }
    return Settings(**(values | overrides))


def nats_cli() -> str:
    found = shutil.which("nats")
    if found is None:
        pytest.fail("the nats CLI is not on PATH: run scripts/install-tools nats")
    return found


@pytest.fixture
async def endpoint(nats_server: NatsServerProcess) -> AsyncIterator[tuple[str, list[Any]]]:
    """A worker serving ``rpc.<hex>`` on the server; yields the topic and the values the
    function saw."""
    topic = f"rpc.{uuid.uuid4().hex[:8]}"
    seen: list[Any] = []
    registry = Registry()

    @rpc(topic, registry=registry)
    async def quote(request: Any) -> Any:
        seen.append(request)
        if request == "boom":
            raise ValueError("no price for boom")
        if request == "reject":
            raise Reject("malformed order")
        if request == "later":
            raise Retry(reason="warming up")
        return {"sku": request["sku"], "price": 42}

    async with Worker(registry, settings(nats_server.url)) as worker:
        await wait_until(lambda: worker.ready, message="the endpoint subscribed")
        yield topic, seen


async def test_rpc_client_calls_an_endpoint_on_nats(
    nats_server: NatsServerProcess, endpoint: tuple[str, list[Any]]
) -> None:
    topic, seen = endpoint
    async with RpcClient(settings=settings(nats_server.url)) as client:
        answers = await asyncio.gather(*(client.call(topic, {"sku": n}) for n in range(20)))
        assert answers == [{"sku": n, "price": 42} for n in range(20)]
        with pytest.raises(RpcError) as raised:
            await client.call(topic, "boom")
        assert raised.value.type == "EndpointError"  # the text is not sent by default
        with pytest.raises(RpcError, match="malformed order"):
            await client.call(topic, "reject")
        with pytest.raises(RpcError, match="retry later: warming up"):
            await client.call(topic, "later")
        with pytest.raises(RpcError, match="no endpoint serves"):
            await client.call("rpc.nobody-here", {}, timeout=2)
        # msgpack travels as msgpack (Content-Type application/msgpack), answered so
        assert await client.call(topic, {"sku": b"\x00\x01"}, encoding="msgpack") == {
            "sku": b"\x00\x01", "price": 42,
        }  # fmt: skip
    assert len(seen) == 24


async def test_the_nats_cli_is_a_client(
    nats_server: NatsServerProcess, endpoint: tuple[str, list[Any]]
) -> None:
    topic, _ = endpoint
    base = [nats_cli(), "--server", nats_server.url, "--timeout", "10s"]

    def request(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, "request", topic, *args], capture_output=True, text=True, timeout=30,
            check=False,
        )  # fmt: skip

    done = await asyncio.to_thread(request, '{"sku": "A1"}', "--raw")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"sku": "A1", "price": 42}
    # A body that is not JSON: a 400 error reply, with the NATS service error headers.
    bad = await asyncio.to_thread(request, "{not json")
    assert "Nats-Service-Error-Code: 400" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
    assert '"error"' in bad.stdout
    # An encoding the endpoint does not know: 415, in JSON.
    odd = await asyncio.to_thread(request, "hello", "--header", "Content-Type:text/plain")
    assert "Nats-Service-Error-Code: 415" in odd.stdout + odd.stderr, odd.stdout + odd.stderr
    assert "unsupported encoding 'text/plain'" in odd.stdout


async def test_nsqworker_rpc_call_on_nats(
    nats_server: NatsServerProcess, endpoint: tuple[str, list[Any]]
) -> None:
    topic, _ = endpoint
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    args = ["rpc", "call", topic, '{"sku": 5}', "--transport", "nats", "--nats", nats_server.url]
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "nsqworker", *args], capture_output=True,
        text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"sku": 5, "price": 42}


async def test_a_caller_times_out_when_the_endpoint_is_too_slow(
    nats_server: NatsServerProcess,
) -> None:
    topic = f"rpc.{uuid.uuid4().hex[:8]}"
    registry = Registry()
    release = asyncio.Event()

    @rpc(topic, registry=registry)
    async def slow(request: Any) -> Any:
        await release.wait()
        return request

    async with Worker(registry, settings(nats_server.url)) as worker:
        await wait_until(lambda: worker.ready, message="the endpoint subscribed")
        async with RpcClient(settings=settings(nats_server.url)) as client:
            with pytest.raises(RpcTimeout):
                await client.call(topic, 1, timeout=0.5)
            assert client.timeouts == 1
            release.set()
            assert await client.call(topic, 2, timeout=10) == 2
