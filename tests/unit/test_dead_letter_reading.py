"""Reading a dead-letter topic's messages (nsqworker.admin.envelopes): every envelope
nsqworker writes comes back whole or refused with its reason, and nothing a hostile
producer sends raises or reaches a terminal unescaped."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime

import pytest

from nsqworker.admin.dead_letters import to_dead_letter
from nsqworker.admin.envelopes import preview, read_envelope
from nsqworker.admin.stores import Stored
from nsqworker.cli.dead_letters import parse_duration
from nsqworker.dead_letters import dead_letter_envelope
from nsqworker.nsq.protocol import check_topic
from nsqworker.testing import make_message


@pytest.mark.parametrize(
    "body", [b'{"order": 1}', b"", b"\xff\x00binary\x80", "ünïcode \u202e".encode(), b"x" * 5000]
)
def test_every_envelope_nsqworker_writes_gives_its_body_back(body: bytes) -> None:
    msg = make_message(body=body, topic="orders")
    reading = read_envelope(dead_letter_envelope(msg, "boom", "bill"), check_topic)
    assert reading.envelope is not None and reading.envelope["reason"] == "boom"
    if body:
        assert reading.problem is None and reading.body == body
    else:
        assert reading.problem == "empty body (brokers refuse empty messages)"
        assert reading.body is None


def test_a_body_cut_to_fit_is_refused_with_its_size_and_digest() -> None:
    body = bytes(range(256)) * 40
    data = dead_letter_envelope(make_message(body=body, topic="t"), "r", "task", limit=2000)
    reading = read_envelope(data, check_topic)
    assert reading.body is None and reading.problem is not None
    assert "truncated" in reading.problem and f"of {len(body)} bytes" in reading.problem
    assert hashlib.sha256(body).hexdigest() in reading.problem
    assert body.startswith(reading.shown) and reading.shown  # the prefix is still shown


def test_a_whole_body_sent_as_base64_is_checked_against_its_size_and_digest() -> None:
    body = b"\x00" * 300  # escapes cost more than base64: whole, flagged not truncated
    data = dead_letter_envelope(make_message(body=body, topic="t"), "r", "task", limit=800)
    doc = json.loads(data)
    assert doc["body_truncated"] is False
    assert read_envelope(data).body == body
    doc["body_sha256"] = "0" * 64
    assert read_envelope(json.dumps(doc).encode()).problem == (
        "body does not match the envelope's body_sha256"
    )
    doc["body_sha256"], doc["body_size"] = hashlib.sha256(body).hexdigest(), 3
    assert "the envelope says 3" in (read_envelope(json.dumps(doc).encode()).problem or "")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"plain text", "not a dead-letter envelope (not a JSON object)"),
        (b"\xff\xfe\x00", "not a dead-letter envelope (not a JSON object)"),
        (b"[1, 2]", "not a dead-letter envelope (not a JSON object)"),
        (b"[" * 100_000, "not a dead-letter envelope (not a JSON object)"),
        (b'{"topic": "t"}', "not a dead-letter envelope (no body as text)"),
        (b'{"body": 1, "topic": 2}', "not a dead-letter envelope (no topic or body as text)"),
        (b'{"topic": "t", "body": "@@@", "body_encoding": "base64"}', "bad base64 body"),
        (b'{"topic": "t", "body": "eA==", "body_encoding": "rot13"}', "unknown body_encoding"),
        (b'{"topic": "t", "body": "\\ud800"}', "body is not valid text"),
        (b'{"topic": "no spaces here", "body": "x"}', "invalid original topic"),
        (b'{"topic": "", "body": "x"}', "invalid original topic"),
    ],
)
def test_foreign_and_hostile_messages_are_refused_never_raise(data: bytes, problem: str) -> None:
    reading = read_envelope(data, check_topic)
    assert reading.problem is not None and reading.problem.startswith(problem)
    assert reading.body is None


def test_a_listing_escapes_what_a_terminal_would_obey() -> None:
    assert preview(b"a\nb\tc\x1b[31m") == "a\\nb\\tc\\x1b[31m"
    assert preview("rtl \u202eevil \u200b".encode()) == "rtl \\u202eevil \\u200b"
    assert preview(b"back\\slash \xff\xfe") == "back\\\\slash \\xff\\xfe"
    assert preview(b"[bold]x[/bold]") == "[bold]x[/bold]"  # markup is the table's to escape
    assert preview(b"x" * 100, 10) == "x" * 10 + "…"
    assert preview(b"") == ""


def test_a_dead_letter_takes_only_well_typed_fields() -> None:
    doc = {"topic": "t", "body": "x", "attempts": True, "task": 5, "reason": "why"}
    when = datetime(2026, 1, 2, tzinfo=UTC)
    letter = to_dead_letter(Stored("7", json.dumps(doc).encode(), when), check_topic)
    assert (letter.attempts, letter.task, letter.reason) == (None, None, "why")
    assert letter.replayable and letter.body == b"x" and letter.rejected_at == when
    row = letter.to_json()
    assert row["body_base64"] == base64.b64encode(b"x").decode() and row["replayable"]
    assert row["rejected_at"] == "2026-01-02T00:00:00+00:00"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("30s", 30.0), ("15m", 900.0), ("2h", 7200.0), ("7d", 604800.0),
     ("1h30m", 5400.0), ("1.5h", 5400.0), ("0", 0.0)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "5x", "-5", "1h 30m", "nan", "inf", "5m3"])
def test_bad_durations_say_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
