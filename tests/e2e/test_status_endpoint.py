"""``/status`` of ``nsqworker run``: what ``nsqworker console`` reads from each supervisor."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from nsqworker.testing import NsqdProcess, wait_for

from .conftest import Supervised

MODULE = """
from nsqworker import task, Reject

@task("orders", channel="billing", max_attempts=2, dead_letter_topic="orders.dead")
async def bill(msg):
    if msg.body.startswith(b"bad"):
        raise Reject("no such customer " + msg.body.decode())
    if msg.body.startswith(b"flaky"):
        raise ValueError("database <down>")
"""


def status(run: Supervised) -> dict[str, Any]:
    code, body = run.get("/status")
    assert code == 200, body
    doc: dict[str, Any] = json.loads(body)
    return doc


def test_status_lists_processes_tasks_and_last_error(
    supervise: Callable[..., Supervised],
    write_module: Callable[[str, str], str],
    nsqd: NsqdProcess,
) -> None:
    write_module("statussvc", MODULE)
    run = supervise(
        "statussvc", "--workers", "2", env={"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address}
    )
    run.wait_ready()
    doc = status(run)
    assert doc["transport"] == "nsq" and doc["target"] == "statussvc"
    assert doc["pid"] == run.proc.pid and doc["memory_bytes"] > 0
    assert sorted(w["worker"] for w in doc["workers"]) == [1, 2]
    assert all(w["pid"] > 0 and w["memory_bytes"] > 0 for w in doc["workers"])
    (row,) = doc["tasks"]
    assert row["task"] == "statussvc.bill" and row["system"] == "nsq"
    assert (row["topic"], row["channel"]) == ("orders", "billing")
    assert row["dead_letter_topic"] == "orders.dead" and row["last_error"] is None

    nsqd.publish("orders", b"bad 42")
    wait_for(
        lambda: status(run)["tasks"][0]["dead_lettered"] == 1, 20, message=lambda: run.output()
    )
    error = status(run)["tasks"][0]["last_error"]
    assert error["error"] == "Reject: no such customer bad 42" and error["outcome"] == "reject"
    nsqd.publish("orders", b"flaky")
    wait_for(lambda: status(run)["tasks"][0]["requeued"] >= 1, 20, message=lambda: run.output())
    error = status(run)["tasks"][0]["last_error"]
    assert error["error"] == "ValueError: database <down>" and error["outcome"] == "retry"
    assert status(run)["tasks"][0]["received"] >= 2


def test_status_is_read_only(
    supervise: Callable[..., Supervised], write_module: Callable[[str, str], str], nsqd: NsqdProcess
) -> None:
    import urllib.error
    import urllib.request

    write_module("statussvc2", MODULE)
    run = supervise("statussvc2", env={"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address})
    run.wait_ready()
    request = urllib.request.Request(
        f"http://127.0.0.1:{run.health_port}/status", data=b"{}", method="POST"
    )
    try:
        urllib.request.urlopen(request, timeout=5)
        raise AssertionError("POST /status was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 405
