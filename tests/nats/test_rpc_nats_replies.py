"""Where an ``@rpc`` endpoint on NATS may answer (docs/rpc.md, "RPC on NATS";
nsqworker/rpc/replies.py), on a real nats-server: the reply subject is the caller's
word, and the endpoint answers only on one matching ``rpc_reply_subjects`` (``_INBOX.>``
by default), never on a ``$`` subject. The ORDERS stream stands for an operator's data:
it is made by a plain nats-py client, as an operator would, not by nsqworker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from nsqworker.message import Message
from nsqworker.rpc import rpc
from nsqworker.task import Registry
from nsqworker.testing import wait_until
from nsqworker.testing.nats import NatsServerProcess
from nsqworker.worker import Worker
from tests.nats.test_rpc_nats import settings

pytestmark = pytest.mark.integration

DELETE_ORDERS = "$JS.API.STREAM.DELETE.ORDERS"


@dataclass
class Endpoint:
    """A served ``@rpc`` topic, the values its function saw and the dead letters' reasons."""

    topic: str
    calls: list[Any] = field(default_factory=list)
    letters: list[str] = field(default_factory=list)


@pytest.fixture
async def operator(nats_server: NatsServerProcess) -> AsyncIterator[Any]:
    """A plain nats-py client that made the ORDERS stream (subjects ``orders.>``)."""
    import nats

    client = await nats.connect(nats_server.url)
    await client.jetstream().add_stream(name="ORDERS", subjects=["orders.>"])
    try:
        yield client
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def serve(url: str, **overrides: Any) -> AsyncIterator[Endpoint]:
    """A worker serving an ``@rpc`` endpoint that answers ``{}``."""
    endpoint = Endpoint(f"rpc.audit{uuid.uuid4().hex[:6]}")
    registry = Registry()

    def on_dead_letter(msg: Message, reason: str) -> None:
        endpoint.letters.append(reason)

    @rpc(endpoint.topic, registry=registry, on_dead_letter=on_dead_letter)
    async def audit(request: Any) -> Any:
        endpoint.calls.append(request)
        return {}

    async with Worker(registry, settings(url, **overrides)) as worker:
        await wait_until(lambda: worker.ready, message="the endpoint subscribed")
        yield endpoint


async def orders_messages(client: Any) -> int:
    """The ORDERS stream's message count, as the server says (NotFoundError if gone)."""
    info = await client.jetstream().stream_info("ORDERS")
    return int(info.state.messages)


async def wait_for_messages(client: Any, count: int, timeout: float = 10.0) -> None:
    """Wait until the server says ORDERS holds ``count`` messages."""
    deadline = time.monotonic() + timeout
    while (now := await orders_messages(client)) != count:
        assert time.monotonic() < deadline, f"ORDERS holds {now} messages, not {count}"
        await asyncio.sleep(0.02)


async def test_a_reply_subject_outside_the_inboxes_is_dead_lettered_unanswered(
    nats_server: NatsServerProcess, operator: Any
) -> None:
    async with serve(nats_server.url) as endpoint:
        # A client allowed to publish only to the endpoint's topic names the JetStream
        # API as its reply subject: answering there would delete ORDERS.
        await operator.publish(endpoint.topic, b"{}", reply=DELETE_ORDERS)
        await wait_until(lambda: endpoint.letters, message="the request dead-lettered")
        assert repr(DELETE_ORDERS) in endpoint.letters[0]
        # A subject the ORDERS stream captures: answering there writes into its data.
        await operator.publish(endpoint.topic, b"{}", reply="orders.created")
        await wait_until(lambda: len(endpoint.letters) == 2, message="the second dead letter")
        assert "reply subject 'orders.created' is not allowed" in endpoint.letters[1]
        # A caller's own inbox is answered, after both (the worker's publishes are ordered).
        answer = await operator.request(endpoint.topic, b'{"n": 1}', timeout=10)
        assert json.loads(answer.data) == {}
        assert endpoint.calls == [{"n": 1}]  # the refused two never reached the function
        assert await orders_messages(operator) == 0  # ORDERS is there, unchanged


async def test_no_setting_makes_a_dollar_subject_a_reply_subject(
    nats_server: NatsServerProcess, operator: Any
) -> None:
    with pytest.raises(ValueError, match=r"never go to \$ subjects"):
        settings(nats_server.url, rpc_reply_subjects=["$JS.API.>"])
    # ">" allows every subject: orders.created is answered, the JetStream API still not.
    async with serve(nats_server.url, rpc_reply_subjects=[">"]) as endpoint:
        await operator.publish(endpoint.topic, b"{}", reply=DELETE_ORDERS)
        await wait_until(lambda: endpoint.letters, message="the request dead-lettered")
        assert f"reply subject {DELETE_ORDERS!r} is a $ subject" in endpoint.letters[0]
        await operator.publish(endpoint.topic, b"{}", reply="orders.created")
        await wait_for_messages(operator, 1)  # answered there: the setting allows it
        assert endpoint.calls == [{}]


async def test_the_nats_cli_is_still_answered(
    nats_server: NatsServerProcess, operator: Any
) -> None:
    """``nats req`` replies on its client's ``_INBOX.`` subject: the default allows it."""
    cli = shutil.which("nats")
    if cli is None:
        pytest.fail("the nats CLI is not on PATH: run scripts/install-tools nats")
    async with serve(nats_server.url) as endpoint:
        done = await asyncio.to_thread(
            subprocess.run,
            [cli, "--server", nats_server.url, "--timeout", "10s", "request", endpoint.topic,
             '{"sku": "A1"}', "--raw"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {}
        assert endpoint.calls == [{"sku": "A1"}]
        assert endpoint.letters == []
