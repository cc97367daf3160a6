"""@spark_session_task scenarios against a real nsqd and real Spark, the same for both
backends (test_session.py runs them on a local driver, test_session_connect.py on a
Spark Connect server): one handler code, two sessions."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.spark import spark_session_task
from nsqworker.spark.local import find_java
from nsqworker.spark.session import SessionHolder
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.testing.ci import in_ci
from nsqworker.worker import Worker

TOPIC = "spark_sessions"
CHANNEL = "session"
#: Small and loopback-only: no UI, two shuffle partitions.
CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


def need_java() -> None:
    """Skip without Java; under CI=true, fail instead (scripts/install-tools spark
    installs Java 17)."""
    if find_java(os.environ) is None:
        if in_ci():
            pytest.fail("no Java runtime for Spark under CI=true: scripts/install-tools spark")
        pytest.skip("no Java runtime (JAVA_HOME or java on PATH)")


def settings_for(nsqd: NsqdProcess, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nsqd_tcp_addresses": [nsqd.tcp_address],
        "spark_master": "local[2]",
        "spark_session_conf": CONF,
        "retry_delay": 0.1,
        "backoff_multiplier": 0.0,
        "drain_timeout": 5.0,
        "msg_timeout": 60.0,
        "health_port": 0,
    }
    values.update(overrides)
    return Settings(**values)


def prepare(nsqd: NsqdProcess) -> NsqdProcess:
    """Create the channel and restart nsqd so requeued messages come back at once."""
    nsqd.create_channel(TOPIC, CHANNEL)
    return nsqd.restart()


def channel(nsqd: NsqdProcess) -> dict[str, Any]:
    return nsqd.channel_stats(TOPIC, CHANNEL) or {}


def finished(nsqd: NsqdProcess) -> int:
    return sum(c.get("finish_count", 0) for c in channel(nsqd).get("clients") or [])


def sleep_sql(ms: int) -> str:
    """A job that sleeps in a JVM task (no Python worker): a cancel interrupts it."""
    return f"SELECT reflect('java.lang.Thread', 'sleep', CAST({ms} AS BIGINT))"


async def success_writes_parquet(nsqd: NsqdProcess, tmp_path: Path, **settings: Any) -> None:
    nsqd = prepare(nsqd)
    source = tmp_path / "events.jsonl"
    rows = [("ann", 3), ("bob", 4), ("ann", 5), ("cyd", 1), ("bob", 6)]
    source.write_text("".join(json.dumps({"user": u, "value": v}) + "\n" for u, v in rows))
    target = tmp_path / "out"
    registry = Registry()
    dead: list[str] = []

    @spark_session_task(
        TOPIC, channel=CHANNEL, registry=registry, on_dead_letter=lambda m, r: dead.append(r)
    )
    def aggregate(msg: Message, spark: Any) -> None:
        body = msg.json()
        events = spark.read.json(body["in"])
        out = events.groupBy("user").agg({"value": "sum", "*": "count"})
        out = out.withColumnRenamed("sum(value)", "total").withColumnRenamed("count(1)", "events")
        out.write.mode("overwrite").parquet(body["out"])

    async with Worker(registry, settings_for(nsqd, **settings)):
        nsqd.publish(TOPIC, json.dumps({"in": str(source), "out": str(target)}))
        await wait_until(lambda: finished(nsqd) == 1, 120, "the FIN")
        stats = channel(nsqd)
    assert dead == []
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0
    got = {r["user"]: (r["events"], r["total"]) for r in pq.read_table(target).to_pylist()}
    assert got == {"ann": (2, 8), "bob": (2, 10), "cyd": (1, 1)}


async def failure_requeued_then_dead_lettered(nsqd: NsqdProcess, **settings: Any) -> None:
    nsqd = prepare(nsqd)
    registry = Registry()
    dead: list[tuple[int, str]] = []
    errors: list[str] = []

    @spark_session_task(
        TOPIC, channel=CHANNEL, registry=registry, max_attempts=2,
        on_dead_letter=lambda m, r: dead.append((m.attempts, r)),
    )  # fmt: skip
    def fail(msg: Message, spark: Any) -> None:
        spark.sql("SELECT raise_error('boom from the job')").collect()

    registry.on_error(lambda m, e: errors.append(str(e)))

    async with Worker(registry, settings_for(nsqd, **settings)):
        nsqd.publish(TOPIC, b"{}")
        await wait_until(lambda: dead, 120, "the dead letter")
        await wait_until(lambda: finished(nsqd) == 1, 10, "the FIN after the dead letter")
        stats = channel(nsqd)
    assert stats["requeue_count"] == 1  # the last attempt's failure is dead-lettered then
    assert dead == [(2, "max attempts exceeded")]
    assert len(errors) == 2 and all("boom from the job" in e for e in errors)


async def drain_cancels_the_running_job(
    nsqd: NsqdProcess, holder: SessionHolder, **settings: Any
) -> dict[str, Any]:
    """A drain past its deadline cancels the message's job group and requeues it;
    returns what the handler saw (group, error) for backend-specific checks."""
    nsqd = prepare(nsqd)
    registry = Registry()
    seen: dict[str, Any] = {}
    started, ended = threading.Event(), threading.Event()

    @spark_session_task(TOPIC, channel=CHANNEL, registry=registry)
    def long_job(msg: Message, spark: Any) -> None:
        seen["id"] = msg.id
        started.set()
        try:
            spark.sql(sleep_sql(120_000)).collect()
        except Exception as exc:
            seen["error"] = str(exc)
            raise
        finally:
            seen["thread_ended"] = time.monotonic()
            ended.set()

    seen["task"] = long_job.spec.name  # type: ignore[attr-defined]
    drain = 1.0
    async with Worker(registry, settings_for(nsqd, drain_timeout=drain, **settings)) as worker:
        nsqd.publish(TOPIC, b"{}")
        await wait_until(started.is_set, 60, "the handler to start")
        await wait_until(lambda: holder.session is not None, 60, "the session")
        await _job_running(holder)
        begin = time.monotonic()
        await worker.stop()
        stopped = time.monotonic() - begin
    await wait_until(ended.is_set, 10, "the handler's thread to end")
    assert stopped < drain + 6, f"the drain took {stopped:.1f}s"
    assert seen["thread_ended"] - begin < drain + 6
    assert "cancel" in seen["error"].lower()
    stats = channel(nsqd)
    assert stats["requeue_count"] == 1 and nsqd.depth(TOPIC, CHANNEL) == 1
    return seen


async def _job_running(holder: SessionHolder) -> None:
    if holder.backend == "local":
        tracker = holder.session.sparkContext.statusTracker()
        await wait_until(lambda: tracker.getActiveJobsIds(), 60, "the job to run")
        return
    # Connect: no status tracker on the client; the job starts within a second.
    await asyncio.sleep(2.0)


async def concurrent_messages_overlap(nsqd: NsqdProcess, **settings: Any) -> None:
    """Two messages at once: two jobs running together in the one session; and the
    task's timeout cancels exactly the slow message's job while the other finishes."""
    nsqd = prepare(nsqd)
    registry = Registry()
    spans: dict[str, tuple[float, float]] = {}
    outcome: dict[str, str] = {}
    sessions: set[int] = set()

    @spark_session_task(
        TOPIC, channel=CHANNEL, registry=registry, max_in_flight=2, timeout=8, max_attempts=1
    )
    def sleeper(msg: Message, spark: Any) -> None:
        body = msg.json()
        sessions.add(id(spark))
        begin = time.monotonic()
        try:
            spark.sql(sleep_sql(body["ms"])).collect()
            outcome[body["name"]] = "done"
        except Exception:
            outcome[body["name"]] = "cancelled"
            raise
        finally:
            spans.setdefault(body["name"], (begin, time.monotonic()))

    async with Worker(registry, settings_for(nsqd, **settings)):
        nsqd.publish(TOPIC, json.dumps({"name": "a", "ms": 4000}))
        nsqd.publish(TOPIC, json.dumps({"name": "slow", "ms": 120_000}))
        await wait_until(lambda: "a" in outcome and "slow" in outcome, 90, "both jobs")
        # a's FIN, then slow's dead letter (its one attempt failed: dead-lettered at once).
        await wait_until(lambda: finished(nsqd) == 2, 30, "the FIN of a")
        stats = channel(nsqd)
    assert outcome == {"a": "done", "slow": "cancelled"}
    assert len(sessions) == 1
    (a0, a1), (s0, s1) = spans["a"], spans["slow"]
    assert max(a0, s0) < min(a1, s1), (
        f"the jobs did not overlap: a {spans['a']} slow {spans['slow']}"
    )
    assert s1 - s0 < 8 + 6, "the timeout did not cancel the slow job"
    assert stats["requeue_count"] == 0  # a failed last attempt is never requeued
