"""RabbitMQ Streams, without a server: retry buckets, what a retry carries, and broker
errors in words (issue 40)."""

from __future__ import annotations

import json
import socket

import pytest

from nsqworker.dead_letters import dead_letter_envelope
from nsqworker.message import Message
from nsqworker.streams.errors import reason, unresolved_host
from nsqworker.streams.retries import (
    ORIGIN_OFFSET,
    ORIGIN_TIMESTAMP,
    origin,
    retry_properties,
    retry_stream,
    retry_streams,
)


@pytest.mark.parametrize(
    ("delay", "suffix"),
    [(0.0, ".retry"), (1.0, ".retry"), (10.0, ".retry"), (10.5, ".retry.10m"),
     (60.0, ".retry.10m"), (600.0, ".retry.10m"), (601.0, ".retry.long"),
     (30 * 86400.0, ".retry.long")],
)  # fmt: skip
def test_a_delay_goes_to_its_buckets_retry_stream(delay: float, suffix: str) -> None:
    assert retry_stream("orders", "billing", delay) == f"orders.billing{suffix}"


def test_every_bucket_is_read() -> None:
    streams = retry_streams("orders", "billing")
    assert streams[0] == retry_stream("orders", "billing")  # the name of earlier versions
    assert {retry_stream("orders", "billing", d) for d in (1, 100, 10_000)} == set(streams)


def message(msg_id: str, timestamp: int = 1_700_000_000_123_000_000) -> Message:
    return Message(msg_id.encode(), b"body", timestamp, 3, "orders", "billing", "h:1")


def test_a_retry_carries_attempts_due_time_and_origin() -> None:
    props = retry_properties(message("orders:42"), 2.5, now=1000.0)
    assert props == {
        "x-attempts": 4,
        "x-not-before": 1_002_500,
        "x-origin-offset": 42,
        "x-origin-timestamp": 1_700_000_000_123,
    }


def test_origin_is_read_back_and_a_forged_one_is_ignored() -> None:
    good = {ORIGIN_OFFSET: 42, ORIGIN_TIMESTAMP: 1_700_000_000_123}
    assert origin(good, 7, 99) == (42, 1_700_000_000_123)
    for bad in ({}, {ORIGIN_OFFSET: "42", ORIGIN_TIMESTAMP: 1}, {ORIGIN_OFFSET: -1,
                ORIGIN_TIMESTAMP: 1}, {ORIGIN_OFFSET: 1}):  # fmt: skip
        assert origin(bad, 7, 99) == (7, 99)


def test_a_dead_letter_names_where_the_message_was_first_stored() -> None:
    msg = message("orders:42")
    msg.origin = ("orders", 42)
    letter = json.loads(dead_letter_envelope(msg, "no", "task"))
    assert (letter["stream"], letter["offset"], letter["id"]) == ("orders", 42, "orders:42")
    nsq = json.loads(dead_letter_envelope(message("0123456789abcdef"), "no", "task"))
    assert "stream" not in nsq and "offset" not in nsq


def test_a_server_error_without_text_is_named_by_its_response_code() -> None:
    from rstream import exceptions

    assert reason(exceptions.PreconditionFailed()) == "precondition failed (response code 17)"
    assert reason(exceptions.StreamDoesNotExist()) == "stream does not exist (response code 2)"
    assert reason(exceptions.ServerError()) == "ServerError"
    assert reason(OSError("Connection refused")) == "Connection refused"


def test_an_unresolved_host_is_found_under_a_wrapper() -> None:
    try:
        try:
            raise socket.gaierror(-2, "Name or service not known")
        except OSError as inner:
            raise ConnectionError("connect failed") from inner
    except ConnectionError as wrapped:
        assert unresolved_host(wrapped)
    assert not unresolved_host(ConnectionRefusedError())
