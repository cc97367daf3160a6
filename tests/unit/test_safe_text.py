"""Text from outside made one line (nsqworker.safe_text), and typed-body reasons built
from it at a cost bounded by the body (nsqworker.bodies; issue 41)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from nsqworker.bodies import BodySpec, fail_fast_schema, typed_handler, validation_reason
from nsqworker.message import Message
from nsqworker.safe_text import one_line


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, ünïcode and emoji 🙂", "plain text, ünïcode and emoji 🙂"),
        ("two\nlines\r\n\ttab", "two\\nlines\\r\\n\\ttab"),
        ("\x1b[31mred\x1b[0m \x07 \x00 \x7f \x9b", "\\x1b[31mred\\x1b[0m \\x07 \\x00 \\x7f \\x9b"),
        ("line\u2028sep \u202eevil", "line\\u2028sep \\u202eevil"),
    ],
)
def test_one_line_escapes_every_control_character(text: str, shown: str) -> None:
    assert one_line(text) == shown
    assert one_line(text).isprintable() or " " in one_line(text)
    assert "\n" not in one_line(text) and "\x1b" not in one_line(text)


def test_one_line_cuts_to_its_limit_after_escaping() -> None:
    assert one_line("a" * 10, 10) == "a" * 10
    assert one_line("a" * 11, 10) == "aaaaaaa..."
    assert one_line("\n" * 10, 10) == "\\n\\n\\n..."  # escapes count toward the limit


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int


def test_a_reason_lists_the_first_errors_and_counts_the_rest() -> None:
    spec = BodySpec(Strict, False)
    body = json.dumps({"id": "x", **{f"k{i}": i for i in range(5)}})
    with pytest.raises(ValidationError) as info:
        Strict.model_validate_json(body)
    assert validation_reason(spec, info.value) == (
        "body is not a valid Strict: id: Input should be a valid integer, unable to parse "
        "string as an integer; k0: Extra inputs are not permitted; k1: Extra inputs are not "
        "permitted; and 3 more"
    )


def test_a_reason_of_very_many_errors_only_counts_them() -> None:
    body = json.dumps({f"k{i}": i for i in range(5000)} | {"id": 1})
    with pytest.raises(ValidationError) as info:
        Strict.model_validate_json(body)
    started = time.perf_counter()
    reason = validation_reason(BodySpec(Strict, False), info.value)
    took = time.perf_counter() - started
    assert reason == "body is not a valid Strict: 5000 errors"
    print(f"reason of 5000 errors built in {took * 1e6:.0f} us")


@dataclass
class Batch:
    ids: list[int]
    names: dict[str, int]


def test_the_fail_fast_schema_stops_each_container_at_its_first_invalid_item() -> None:
    spec = BodySpec(Batch, False)
    seen: list[Batch] = []
    handler = typed_handler(seen.append, spec, Reject)
    body = json.dumps({"ids": ["a"] * 1000, "names": {f"n{i}": "x" for i in range(1000)}})
    with pytest.raises(Reject) as info:
        handler(Message(b"0" * 16, body.encode(), 0, 1, "t", "c", "a:1"))
    assert str(info.value) == (
        "body is not a valid Batch: ids.0: Input should be a valid integer, unable to parse "
        "string as an integer; names.n0: Input should be a valid integer, unable to parse "
        "string as an integer"
    )
    handler(Message(b"0" * 16, b'{"ids": [1, 2], "names": {"a": 1}}', 0, 1, "t", "c", "a:1"))
    assert seen == [Batch([1, 2], {"a": 1})]  # a valid body validates as before


def test_fail_fast_schema_copies_only_dicts_and_lists() -> None:
    marker = object()
    schema = {"type": "list", "items_schema": {"type": "int"}, "metadata": {"x": marker}}
    copied = fail_fast_schema(schema)
    assert copied["fail_fast"] is True and "fail_fast" not in schema
    assert copied["metadata"]["x"] is marker


class Reject(Exception):
    pass


def test_a_dead_letter_envelope_carries_its_reason_on_one_line() -> None:
    from nsqworker.dead_letters import MAX_REASON, dead_letter_envelope

    msg = Message(b"0" * 16, b"{}", 0, 1, "t", "c", "a:1")
    doc = json.loads(dead_letter_envelope(msg, "bad key\n\x1b[31m", "task"))
    assert doc["reason"] == "bad key\\n\\x1b[31m"
    long = json.loads(dead_letter_envelope(msg, "x" * (MAX_REASON * 2), "task"))
    assert len(long["reason"]) == MAX_REASON and long["reason"].endswith("...")
