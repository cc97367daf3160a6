"""NATS JetStream as operators run it (issue 40): streams and consumers made beforehand
are used as they are, and a server without JetStream is one clear line, exit 2."""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
from typing import Any

import pytest

from nsqworker.cli.publish import publish_command
from nsqworker.errors import ConfigurationError
from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import wait_until
from nsqworker.testing.nats import NatsServerProcess
from nsqworker.worker import Worker


def settings(url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "transport": "nats",
        "nats_servers": [url],
        "health_port": 0,
        "log_level": "info",
        "drain_timeout": 2.0,
    }
    return Settings(**(values | overrides))


async def admin(url: str) -> Any:
    import nats

    return await nats.connect(url)


async def test_a_stream_and_consumer_made_beforehand_are_used_as_they_are(
    nats_server: NatsServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's stream (interest retention, a message limit) and durable pull
    consumer (deliver only new messages, ack_wait 7 s, max_deliver 20): the worker binds
    to them without changing them (before, it asked to create the consumer with its own
    settings, and the server refused the deliver policy), and says once what differs."""
    from nats.js.api import ConsumerConfig, DeliverPolicy, RetentionPolicy, StreamConfig

    subject = f"ops.{uuid.uuid4().hex[:8]}"
    nc = await admin(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(name="OPS_" + subject[4:], subjects=[subject],
                     retention=RetentionPolicy.INTEREST, max_msgs=10_000)
    )  # fmt: skip
    durable = "billing"
    await js.add_consumer(
        "OPS_" + subject[4:],
        ConsumerConfig(durable_name=durable, filter_subject=subject,
                       deliver_policy=DeliverPolicy.NEW, ack_wait=7.0, max_deliver=20),
    )  # fmt: skip
    await js.publish(subject, b"one")
    seen: list[bytes] = []
    reg = Registry()

    @reg.task(subject, channel=durable)
    async def handle(msg: Message) -> None:
        seen.append(msg.body)

    caplog.set_level(logging.INFO, logger="nsqworker.nats")
    async with Worker(reg, settings(nats_server.url)):
        await wait_until(lambda: seen == [b"one"], 15, message=lambda: f"{seen}")
    async with Worker(reg, settings(nats_server.url)):  # a second start: nothing new logged
        await js.publish(subject, b"two")
        await wait_until(lambda: seen == [b"one", b"two"], 15, message=lambda: f"{seen}")
    info = await js.consumer_info("OPS_" + subject[4:], durable)
    stream = await js.stream_info("OPS_" + subject[4:])
    await nc.close()
    assert info.config.ack_wait == 7.0 and info.config.max_deliver == 20
    assert info.config.deliver_policy == DeliverPolicy.NEW
    assert stream.config.retention == RetentionPolicy.INTEREST
    logged = [r.getMessage() for r in caplog.records if "exists with" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "ack_wait=7 (the worker's: 30)" in logged[0] and "max_deliver=20" in logged[0]


async def test_a_stream_holding_other_subjects_too_is_used(nats_server: NatsServerProcess) -> None:
    """A stream of the operator's with interest retention over ``orders.*``: the worker
    finds it by the subject and reads its subject alone."""
    from nats.js.api import RetentionPolicy, StreamConfig

    base = f"ops{uuid.uuid4().hex[:8]}"
    nc = await admin(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=base.upper(), subjects=[f"{base}.*"],
                                     retention=RetentionPolicy.INTEREST))  # fmt: skip
    seen: list[bytes] = []
    reg = Registry()

    @reg.task(f"{base}.created", channel="c")
    async def handle(msg: Message) -> None:
        seen.append(msg.body)

    async with Worker(reg, settings(nats_server.url)):
        await js.publish(f"{base}.deleted", b"not ours")
        await js.publish(f"{base}.created", b"ours")
        await wait_until(lambda: seen == [b"ours"], 15, message=lambda: f"{seen}")
        await asyncio.sleep(0.3)
    await nc.close()
    assert seen == [b"ours"]


async def test_a_consumer_that_cannot_serve_a_channel_says_why(
    nats_server: NatsServerProcess,
) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

    subject = f"ops.{uuid.uuid4().hex[:8]}"
    nc = await admin(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="OPS_" + subject[4:], subjects=[subject]))
    await js.add_consumer("OPS_" + subject[4:], ConsumerConfig(
        durable_name="c", filter_subject=subject, ack_policy=AckPolicy.ALL))  # fmt: skip
    await nc.close()
    reg = Registry()

    @reg.task(subject, channel="c")
    async def handle(msg: Message) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        async with Worker(reg, settings(nats_server.url)):
            pass
    assert str(info.value) == (
        f"consumer 'c' of stream 'OPS_{subject[4:]}' acknowledges with ack_policy"
        f" all, not explicit: a channel needs a durable pull consumer with explicit acks"
        f" filtered to '{subject}'; change or delete the consumer, or use another channel"
    )


async def test_with_creation_off_a_missing_stream_or_consumer_is_an_error(
    nats_server: NatsServerProcess,
) -> None:
    from nats.js.api import StreamConfig

    reg = Registry()

    @reg.task("ops.missing", channel="c")
    async def handle(msg: Message) -> None: ...

    off = settings(nats_server.url, nats_create=False)
    with pytest.raises(ConfigurationError) as info:
        async with Worker(reg, off):
            pass
    assert str(info.value) == (
        "no JetStream stream holds subject 'ops.missing', and nats_create is off: create a"
        " stream for 'ops.missing' (or name one in nats_stream), or turn nats_create on"
    )
    nc = await admin(nats_server.url)
    await nc.jetstream().add_stream(StreamConfig(name="OPS_MISSING", subjects=["ops.missing"]))
    await nc.close()
    with pytest.raises(ConfigurationError) as info:
        async with Worker(reg, off):
            pass
    assert str(info.value) == (
        "consumer 'c' does not exist on stream 'OPS_MISSING', and nats_create is off:"
        " create it (a durable pull consumer with explicit acks), or turn nats_create on"
    )


# ---------------------------------------------------------------------------- JetStream off

OFF = (
    "JetStream is not enabled on the NATS server at {url}: start nats-server with -js"
    " (--jetstream), or add `jetstream {{}}` to its configuration file"
)


@pytest.fixture
def no_jetstream(nats_server_binary: str) -> Any:
    with NatsServerProcess(binary=nats_server_binary, jetstream=False) as server:
        yield server


def test_publish_without_jetstream_is_one_line_and_exit_2(no_jetstream: NatsServerProcess) -> None:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=400)
    code = publish_command("orders", "x", nsqd=[], delay=None, console=console,
                           transport="nats", nats=[no_jetstream.url])  # fmt: skip
    assert code == 2
    assert out.getvalue().splitlines() == [f"error: {OFF.format(url=no_jetstream.url)}"]


def test_publish_with_a_refused_login_is_one_line_and_exit_2(nats_server_binary: str) -> None:
    from rich.console import Console

    with NatsServerProcess(
        binary=nats_server_binary, extra_args=["--user", "app", "--pass", "right"]
    ) as server:
        out = io.StringIO()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("NSQWORKER_NATS_USER", "app")
            patch.setenv("NSQWORKER_NATS_PASSWORD", "s3cret-wrong")
            code = publish_command("orders", "x", nsqd=[], delay=None,
                                   console=Console(file=out, width=400), transport="nats",
                                   nats=[server.url])  # fmt: skip
    assert code == 2
    assert out.getvalue().splitlines() == [
        f"error: NATS at {server.url} refused the login (nats: 'Authorization Violation');"
        " check nats_user and nats_password"
    ]
