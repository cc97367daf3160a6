"""Scheduled tasks across three ``nsqworker run`` supervisors, as replicas run them:
one leader fires each second once; SIGKILL of the leader's process group hands over
within the lease and the missed seconds are fired; the same on NATS with the JetStream
key-value leader. The Kubernetes runs are in test_schedules_kube.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nsqworker.schedules.cron import format_tick, parse_tick
from nsqworker.testing import wait_for

TICK_TASKS = """
import os

from nsqworker import task


@task(os.environ["TICK_TOPIC"], channel="c", schedule="* * * * * *", name="tick")
async def tick(msg):
    fd = os.open(os.environ["HANDLED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{msg.json()['scheduled_for']} {msg.id!s}\\n".encode())
    finally:
        os.close(fd)
"""

#: Short lease timings (client-go's are 15/10/2 s): takeover within about 4.5 s.
TIMINGS = {
    "NSQWORKER_SCHEDULE_LEASE_DURATION": "4",
    "NSQWORKER_SCHEDULE_RENEW_DEADLINE": "2.5",
    "NSQWORKER_SCHEDULE_RETRY_PERIOD": "0.5",
    "NSQWORKER_MSG_TIMEOUT": "5",  # a tick in the killed worker's hands comes back soon
    "NSQWORKER_DRAIN_TIMEOUT": "3",
}
Start = Callable[..., Any]


def handled(path: Path) -> dict[str, set[str]]:
    """scheduled_for -> the ids of the messages that carried it (one per publish)."""
    seen: dict[str, set[str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            tick, _, message_id = line.partition(" ")
            seen.setdefault(tick, set()).add(message_id)
    return seen


def seconds(first: str, last: str) -> list[str]:
    start, end = parse_tick(first), parse_tick(last)
    return [
        format_tick(start + timedelta(seconds=s))
        for s in range(int((end - start).total_seconds()) + 1)
    ]


def holder_pid(holder: str | None) -> int | None:
    """The supervisor pid in a lease holder ``<hostname>_<pid>_<random>``."""
    if not holder:
        return None
    parts = holder.rsplit("_", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def kill_the_leader_and_check(
    runs: list[Any], path: Path, leader: Callable[[], int | None], lease: float
) -> dict[str, Any]:
    """The scenario of the issue, once: ~30 s with the leader killed inside it."""
    for run in runs:
        run.wait_ready()
    wait_for(lambda: len(handled(path)) >= 8, 30, message=lambda: runs[0].output())
    pid = leader()
    victim = next(r for r in runs if r.proc.pid == pid)
    killed = datetime.now(UTC)
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(10)
    rest = [r for r in runs if r is not victim]
    until = format_tick(killed + timedelta(seconds=12))
    wait_for(lambda: max(handled(path), default="") >= until, 30, message=lambda: rest[0].output())
    new = leader()
    assert new in {r.proc.pid for r in rest}, (new, [r.proc.pid for r in rest])
    # /metrics says who leads, and what it fired
    leading = [r for r in rest if r.metric("nsqworker_schedule_leader") == 1]
    assert [r.proc.pid for r in leading] == [new]
    assert leading[0].metric("nsqworker_schedule_ticks_fired_total") >= 10
    assert leading[0].metric("nsqworker_schedule_last_tick_seconds") > killed.timestamp()
    for run in rest:
        run.signal(signal.SIGTERM)
    for run in rest:
        assert run.wait(20) == 0, run.output()
    seen = handled(path)
    first, last = min(seen), max(seen)
    missing = sorted(set(seconds(first, last)) - set(seen))
    assert not missing, f"ticks never handled: {missing}"
    doubled = {tick: ids for tick, ids in seen.items() if len(ids) > 1}
    # a duplicate only for the tick being published at the kill, same scheduled_for
    assert len(doubled) <= 1, doubled
    for tick in doubled:
        assert abs((parse_tick(tick) - killed).total_seconds()) <= 3, (tick, killed)
    return {"killed": killed, "seen": seen, "doubled": doubled}


def takeover_seconds(output: str, killed: datetime) -> float:
    """Seconds from the kill to the first 'leading' line of a survivor (its log time)."""
    for line in output.splitlines():
        if "schedules: leading" in line:
            stamp = json.loads(line).get("timestamp")
            if stamp:
                at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                if at > killed:
                    return (at - killed).total_seconds()
    return float("inf")


def test_three_supervisors_on_nats_fire_each_second_once_across_a_leader_kill(
    supervise: Start, write_module: Callable[[str, str], str], nats_server: Any, tmp_path: Path
) -> None:
    module = write_module("nats_ticks", TICK_TASKS)
    env = {
        **TIMINGS,
        "TICK_TOPIC": "ticks.nats",
        "NSQWORKER_SCHEDULE_LEADER": "nats",
        "NSQWORKER_SCHEDULE_LEASE_NAME": "ticks-nats",
    }
    args = (module, "--transport", "nats", "--nats", nats_server.url, "--workers", "1")
    runs = [supervise(*args, env=env) for _ in range(3)]

    def leader() -> int | None:
        return holder_pid(kv_holder(nats_server.url, "nsqworker_schedules", "ticks-nats"))

    result = kill_the_leader_and_check(runs, tmp_path / "handled.txt", leader, lease=4)
    output = "\n".join(r.output() for r in runs)
    assert (
        "leader nats (NSQWORKER_SCHEDULE_LEADER) on JetStream KV nsqworker_schedules/ticks-nats"
        in output
    )
    # JetStream's Nats-Msg-Id dedup leaves no copy of the tick at the kill either
    assert not result["doubled"], result["doubled"]
    takeover = min(takeover_seconds(r.output(), result["killed"]) for r in runs)
    assert takeover <= 4 + 0.5 + 3, takeover  # lease + retry, and slack for a loaded CI


def kv_holder(url: str, bucket: str, key: str) -> str | None:
    import nats

    async def read() -> str | None:
        client = await nats.connect(url)
        try:
            kv = await client.jetstream().key_value(bucket)
            entry = await kv.get(key)
            return json.loads(entry.value or b"{}").get("holder")
        finally:
            await client.close()

    deadline = time.monotonic() + 10
    while True:
        holder = asyncio.run(read())
        if holder or time.monotonic() > deadline:
            return holder
        time.sleep(0.2)
