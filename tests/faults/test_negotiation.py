"""IDENTIFY that adapts: a Worker with default settings consumes from an nsqd whose
limits are below our defaults; a value the operator chose that nsqd refuses is a clear
error at start, not a retry loop."""

from __future__ import annotations

import logging
import re

import pytest

from nsqworker.errors import ConfigurationError
from nsqworker.testing import NsqdFactory, NsqlookupdFactory
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "flag",
    [
        "--max-msg-timeout=10s",
        "--max-heartbeat-interval=10s",
        "--max-rdy-count=5",
        "--max-output-buffer-timeout=50ms",
    ],
)
async def test_default_settings_consume_from_a_restricted_nsqd(
    nsqd_factory: NsqdFactory, kit, flag: str, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = nsqd_factory(extra_args=[flag])
    bodies = [f"m{i}" for i in range(20)]
    nsqd.mpublish(kit.TOPIC, bodies)
    seen = kit.Seen()
    # Only the address: every IDENTIFY value is the default.
    settings = kit.Settings(nsqd_tcp_addresses=[nsqd.tcp_address])
    with caplog.at_level(logging.WARNING, logger="nsqworker.nsq.connection"):
        async with Worker(kit.registry(seen), settings) as worker:
            await kit.until(lambda: not seen.missing(bodies), 10, f"not consumed with {flag}")
            assert worker.ready
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    if flag == "--max-heartbeat-interval=10s":
        # One retry on a fresh connection, one warning naming setting, asked and used.
        assert len(refusals) == 1, refusals
        assert "heartbeat_interval=30 s" in refusals[0] and "using nsqd's default" in refusals[0]
    else:
        assert refusals == []  # the defaults need no retry


async def test_reconnects_ask_the_adapted_values_at_once(
    nsqd_factory: NsqdFactory, kit, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = nsqd_factory(extra_args=["--max-heartbeat-interval=10s"])
    seen = kit.Seen()
    settings = kit.fast(nsqd_tcp_addresses=[nsqd.tcp_address])
    with caplog.at_level(logging.WARNING, logger="nsqworker.nsq.connection"):
        async with Worker(kit.registry(seen), settings) as worker:
            nsqd.restart()
            nsqd.publish(kit.TOPIC, b"after")
            await kit.until(lambda: seen.bodies["after"], 10, "not consumed after restart")
            errors = worker.stats().tasks["record"].connection_errors
    assert "nsqd_error" not in errors, errors  # no second refusal after the restart
    assert sum("refused" in r.getMessage() for r in caplog.records) == 1


async def test_an_explicit_msg_timeout_above_nsqds_limit_fails_at_start(
    nsqd_factory: NsqdFactory, kit
) -> None:
    nsqd = nsqd_factory(extra_args=["--max-msg-timeout=10s"])
    settings = kit.fast(nsqd_tcp_addresses=[nsqd.tcp_address], msg_timeout=60)
    with pytest.raises(ConfigurationError) as caught:
        async with Worker(kit.registry(kit.Seen()), settings):
            pass
    text = str(caught.value)
    assert "NSQWORKER_MSG_TIMEOUT (msg_timeout) = 60 s" in text
    assert "at most 10 s" in text and "--max-msg-timeout" in text


async def test_an_explicit_heartbeat_above_nsqds_limit_fails_at_start(
    nsqd_factory: NsqdFactory, kit
) -> None:
    nsqd = nsqd_factory(extra_args=["--max-heartbeat-interval=10s"])
    settings = kit.fast(nsqd_tcp_addresses=[nsqd.tcp_address], heartbeat_interval=20)
    with pytest.raises(ConfigurationError, match=r"heartbeat_interval.*--max-heartbeat-interval"):
        async with Worker(kit.registry(kit.Seen()), settings):
            pass


async def test_a_producer_with_default_settings_publishes_to_a_restricted_nsqd(
    nsqd_factory: NsqdFactory, kit
) -> None:
    from nsqworker.nsq.producer import Producer

    nsqd = nsqd_factory(extra_args=["--max-heartbeat-interval=10s", "--max-msg-timeout=10s"])
    settings = kit.Settings(nsqd_tcp_addresses=[nsqd.tcp_address])
    async with Producer(settings=settings) as producer:
        await producer.publish(kit.TOPIC, b"hello")
    assert nsqd.topic_stats(kit.TOPIC)["message_count"] == 1  # type: ignore[index]


async def test_through_lookupd_a_refused_default_is_clamped_to_nsqds_limit(
    nsqlookupd_factory: NsqlookupdFactory,
    nsqd_factory: NsqdFactory,
    kit,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # lookupd tells nsqd's HTTP port; its /info gives max_heartbeat_interval.
    lookupd = nsqlookupd_factory()
    nsqd = nsqd_factory(lookupd, extra_args=["--max-heartbeat-interval=10s"])
    nsqd.publish(kit.TOPIC, b"via lookupd")
    seen = kit.Seen()
    settings = kit.Settings(lookupd_http_addresses=[lookupd.http_address])
    with caplog.at_level(logging.WARNING, logger="nsqworker.nsq.connection"):
        async with Worker(kit.registry(seen), settings) as worker:
            await kit.until(lambda: seen.bodies["via lookupd"], 10, "not consumed")
            sessions = worker.runners[0].dispatcher.subscription.connections.sessions
            assert [s.conn.config.heartbeat_interval for s in sessions] == [10.0]
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "using 10 s, its limit" in refusals[0], refusals


async def test_an_explicit_heartbeat_refused_through_lookupd_names_nsqds_limit(
    nsqlookupd_factory: NsqlookupdFactory, nsqd_factory: NsqdFactory, kit,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    lookupd = nsqlookupd_factory()
    nsqd = nsqd_factory(lookupd, extra_args=["--max-heartbeat-interval=10s"])
    nsqd.publish(kit.TOPIC, b"x")
    settings = kit.fast(lookupd_http_addresses=[lookupd.http_address], heartbeat_interval=20)
    # Found through lookupd: logged and retried, not fatal (anyone may get an nsqd listed).
    async with Worker(kit.registry(kit.Seen()), settings) as worker:
        assert not worker.ready  # /readyz says so
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(re.search(r"= 20 s .*at most 10 s", e) for e in errors), errors
