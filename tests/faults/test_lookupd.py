"""nsqlookupd down or broken: consuming from the nsqd already known goes on, and the log
says what is wrong once per kind of failure, not once per poll."""

from __future__ import annotations

import logging

import pytest

from nsqworker.testing import NsqdFactory, NsqlookupdFactory
from nsqworker.testing.faults import HttpFaultServer, SilentServer
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration
LOOKUPD_LOG = "nsqworker.nsq.lookupd"


def lookupd_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOOKUPD_LOG and r.levelno >= logging.WARNING
    ]


async def test_lookupd_down_at_start_then_up(
    nsqlookupd_factory: NsqlookupdFactory,
    nsqd_factory: NsqdFactory,
    kit,
    caplog: pytest.LogCaptureFixture,
) -> None:
    lookupd = nsqlookupd_factory()
    lookupd.stop()  # its ports are known, nothing listens
    seen = kit.Seen()
    settings = kit.fast(lookupd_http_addresses=[lookupd.http_address], lookupd_poll_interval=0.1)
    with caplog.at_level(logging.DEBUG, logger=LOOKUPD_LOG):
        async with Worker(kit.registry(seen), settings) as worker:
            await kit.until(
                lambda: worker.runners[0].dispatcher.subscription.connections.poller.polls >= 5,
                5,
                "no polls",
            )  # type: ignore[union-attr]
            assert not worker.ready  # nobody could say whether the topic has producers
            assert len(lookupd_warnings(caplog)) == 1, lookupd_warnings(caplog)
            lookupd.restart()
            nsqd = nsqd_factory(lookupd)
            nsqd.publish(kit.TOPIC, b"found")
            await kit.until(lambda: seen.bodies["found"], 10, "nsqd not discovered")
            assert worker.ready
    assert any("answers again" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_lookupd_broken_mid_run_consuming_goes_on(
    nsqlookupd_factory: NsqlookupdFactory,
    nsqd_factory: NsqdFactory,
    kit,
    caplog: pytest.LogCaptureFixture,
) -> None:
    lookupd = nsqlookupd_factory()
    nsqd = nsqd_factory(lookupd)
    nsqd.publish(kit.TOPIC, b"first")  # registers the topic with lookupd
    seen = kit.Seen()
    with HttpFaultServer(upstream=lookupd.http_address, delay=30) as front:
        settings = kit.fast(lookupd_http_addresses=[front.address], lookupd_poll_interval=0.1)
        with caplog.at_level(logging.DEBUG, logger=LOOKUPD_LOG):
            async with Worker(kit.registry(seen), settings) as worker:
                await kit.until(lambda: seen.bodies["first"], 10, "not consumed")
                for mode in ("500", "garbage", "down", "slow"):
                    if mode == "down":
                        front.mode = "ok"
                        lookupd.stop()  # the front answers 502: upstream unreachable
                    else:
                        front.mode = mode  # type: ignore[assignment]
                    asked = front.requests
                    polls = 1 if mode == "slow" else 3  # a slow answer holds the poller
                    target, body = asked + polls, f"during {mode}"
                    await kit.until(lambda t=target: front.requests >= t, 5, f"no polls ({mode})")
                    nsqd.publish(kit.TOPIC, body)
                    await kit.until(lambda b=body: seen.bodies[b], 3, f"stuck: {mode}")
                    assert worker.ready, mode
                # A 30 s answer ends at the poller's 5 s timeout, logged once.
                await kit.until(
                    lambda: any("ReadTimeout" in w for w in lookupd_warnings(caplog)), 8, "slow"
                )
    warnings = lookupd_warnings(caplog)
    # One line per kind of failure (500, garbage, 502, timeout), not one per poll.
    assert len(warnings) == 4, warnings
    failures = [r for r in caplog.records if "failed for topic" in r.getMessage()]
    assert len(failures) >= len(warnings) + 6  # the repeats went to debug


async def test_ready_when_no_nsqd_has_the_topic_yet(
    nsqlookupd_factory: NsqlookupdFactory, nsqd_factory: NsqdFactory, kit
) -> None:
    lookupd = nsqlookupd_factory()
    nsqd_factory(lookupd)  # up, but nobody published the topic: nothing to miss
    settings = kit.fast(lookupd_http_addresses=[lookupd.http_address], lookupd_poll_interval=0.2)
    async with Worker(kit.registry(kit.Seen()), settings) as worker:
        assert worker.ready


async def test_not_ready_while_a_producer_exists_and_none_is_subscribed(
    nsqlookupd_factory: NsqlookupdFactory, nsqd_factory: NsqdFactory, kit
) -> None:
    lookupd = nsqlookupd_factory()
    with SilentServer() as silent:
        # lookupd lists this nsqd at the silent server's port: there is a producer, and
        # every connection to it times out in IDENTIFY.
        nsqd = nsqd_factory(lookupd, extra_args=[f"--broadcast-tcp-port={silent.port}"])
        nsqd.publish(kit.TOPIC, b"x")
        await kit.until(lambda: lookupd.lookup(kit.TOPIC), 5, "not registered")
        settings = kit.fast(
            lookupd_http_addresses=[lookupd.http_address], lookupd_poll_interval=0.2
        )
        async with Worker(kit.registry(kit.Seen()), settings) as worker:
            assert not worker.ready
            assert worker.stats().tasks["record"].connection_errors.get("timeout")
            assert worker.stats().as_dict()["tasks"]["record"]["ready"] is False
