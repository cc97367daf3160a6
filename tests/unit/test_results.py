"""What a handler's return value publishes (``publish_to=``, ``Publish``), checked
without a broker: the declaration, the plan and the body encoding."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nsqworker import Publish, Registry
from nsqworker.results import encode_body, planned
from nsqworker.task import TaskDefinitionError


@dataclass
class Total:
    id: int
    total: float


def test_publish_to_is_checked_when_the_task_is_declared() -> None:
    with pytest.raises(TaskDefinitionError, match=r"publish_to: .*bad topic"):
        Registry().task("orders", channel="c", publish_to="bad topic!")
    spec = Registry().task("orders", channel="c", publish_to="priced")(lambda msg: None).spec
    assert spec.publish_to == "priced"


def test_publish_checks_its_delay_and_topic() -> None:
    assert Publish("t", b"x", delay=2).delay == 2
    with pytest.raises(ValueError, match="give seconds from 0 to 3600"):
        Publish("t", b"x", delay=-1)
    with pytest.raises(TypeError, match="must be a topic name"):
        Publish("", b"x")


def test_what_a_return_value_publishes() -> None:
    assert planned(None, "out") == []
    assert planned({"a": 1}, None) == []  # ignored without publish_to, as always
    assert planned({"a": 1}, "out") == [Publish("out", {"a": 1})]
    routed = [Publish("a", b"1"), Publish("b", b"2", delay=5)]
    assert planned(routed, None) == routed and planned(routed, "out") == routed
    assert planned([], "out") == [Publish("out", [])]  # a JSON value like any other
    with pytest.raises(TypeError, match="mixing Publish"):
        planned([Publish("a", b"1"), {"b": 2}], "out")


def test_bodies_are_encoded_as_producers_do_or_as_json() -> None:
    assert encode_body(b"raw") == b"raw" and encode_body("é") == "é".encode()
    assert encode_body(Total(1, 2.5)) == b'{"id":1,"total":2.5}'
    assert encode_body({"id": 1, "name": "é"}) == '{"id":1,"name":"é"}'.encode()
    assert encode_body([1, 2]) == b"[1,2]" and encode_body(7) == b"7"
    with pytest.raises(TypeError, match="cannot publish a set"):
        encode_body({1, 2})
    with pytest.raises(TypeError, match="empty body"):
        encode_body(b"")
