"""Issue 54's "done when" for the ``postgres`` schedule leader: two ``nsqworker run``
supervisors on NSQ (real nsqd), the lease in a real PostgreSQL (the ``postgres``
fixture), a schedule every second for two minutes, the leader's process group SIGKILLed
twice (each time restarted, as systemd or a Deployment would): every tick is published
exactly once.

Published ticks are counted on nsqd itself: the channel ``audit``, created before the
first tick and read by nobody until the end, keeps a copy of every message published to
the topic; ``nsq_tail`` reads them all and they are counted by ``scheduled_for``.

Where the kill lands: while the leader waits for the next second, after it recorded the
last tick (read from the lease row) — where a leader spends nearly all its time. A kill
in the few milliseconds between a tick's publish and its record is the one case the
next leader publishes that tick again (NSQ has no deduplication; docs/schedules.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from nsqworker.schedules.cron import format_tick, parse_tick
from nsqworker.schedules.postgres import TABLE
from nsqworker.testing import wait_for
from nsqworker.testing.postgres import PostgresProcess
from nsqworker.testing.processes import find_binary

from .test_schedules_run import TICK_TASKS, TIMINGS, handled, holder_pid, seconds

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

Start = Callable[..., Any]
LEASE = "ticks-pg"
TOPIC = "ticks_pg"
RUN_FOR = 120.0  # seconds of ticks, from the first one handled


def lease_row(postgres: PostgresProcess) -> tuple[str | None, int, str | None]:
    """``(holder, fencing token, last tick recorded)`` of the lease row."""
    try:
        with psycopg.connect(postgres.dsn, connect_timeout=5) as conn:
            found = conn.execute(
                f"SELECT holder, token, fired->>'tick' FROM {TABLE} WHERE name = %s", (LEASE,)
            ).fetchone()
    except psycopg.Error:
        return None, 0, None
    return (found[0], int(found[1]), found[2]) if found else (None, 0, None)


def quiet_leader(postgres: PostgresProcess, runs: list[Any]) -> Any:
    """Wait until the leader has recorded the current second and is between ticks
    (0.3-0.7 s into the second); the run that leads."""
    found: list[Any] = []

    def between_ticks() -> bool:
        holder, _, last = lease_row(postgres)
        now = datetime.now(UTC)
        if last is None or not 0.3 <= now.microsecond / 1e6 <= 0.7:
            return False
        if last != format_tick(now.replace(microsecond=0)):
            return False
        found[:] = [r for r in runs if r.proc.pid == holder_pid(holder)]
        return bool(found)

    wait_for(between_ticks, 60, message=lambda: f"no quiet leader: {lease_row(postgres)}",
             interval=0.02)  # fmt: skip
    return found[0]


def read_audit(nsqd: Any) -> list[str]:
    """Every message published to the topic (kept by the unread channel ``audit``)."""
    depth = nsqd.depth(TOPIC, "audit")
    out = subprocess.run(
        [
            find_binary("nsq_tail"), f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--topic={TOPIC}", "--channel=audit", f"-n={depth}",
        ],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    import json

    bodies = [json.loads(line)["scheduled_for"] for line in out.splitlines() if line.strip()]
    assert len(bodies) == depth, (len(bodies), depth)
    return bodies


@pytest.mark.timeout(420)
def test_two_supervisors_fire_each_second_once_across_two_leader_kills(
    supervise: Start,
    write_module: Callable[[str, str], str],
    postgres: PostgresProcess,
    nsqd: Any,
    tmp_path: Path,
) -> None:
    nsqd.create_channel(TOPIC, "audit")  # before any tick: it keeps them all
    nsqd.create_channel(TOPIC, "c")  # the workers' own, also there before the first tick
    module = write_module("pg_ticks", TICK_TASKS)
    env = {
        **TIMINGS,
        "TICK_TOPIC": TOPIC,
        "NSQWORKER_SCHEDULE_LEADER": "postgres",
        "NSQWORKER_SCHEDULE_POSTGRES_DSN": postgres.dsn,
        "NSQWORKER_SCHEDULE_LEASE_NAME": LEASE,
    }
    args = (module, "--nsqd", nsqd.tcp_address, "--workers", "1")
    path = tmp_path / "handled.txt"
    runs = [supervise(*args, env=env) for _ in range(2)]
    for run in runs:
        run.wait_ready()
    wait_for(lambda: handled(path), 60, message=lambda: runs[0].output())
    started = time.monotonic()
    kills: list[tuple[datetime, int]] = []
    for at in (RUN_FOR / 3, 2 * RUN_FOR / 3):
        wait_for(lambda at=at: time.monotonic() - started >= at, RUN_FOR)
        victim = quiet_leader(postgres, runs)
        killed = datetime.now(UTC)
        os.killpg(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(10)
        kills.append((killed, victim.proc.pid))
        survivor = next(r for r in runs if r is not victim)
        runs = [survivor, supervise(*args, env=env)]  # restarted, as a service would be
        runs[1].wait_ready()
        # the survivor takes over and fires the seconds missed since the kill
        after = format_tick(killed + timedelta(seconds=8))
        resumed = lambda after=after: max(handled(path), default="") >= after  # noqa: E731
        wait_for(resumed, 60, message=survivor.output)
        assert holder_pid(lease_row(postgres)[0]) in {r.proc.pid for r in runs}
    wait_for(lambda: time.monotonic() - started >= RUN_FOR, RUN_FOR)
    for run in runs:
        run.signal(signal.SIGTERM)
    for run in runs:
        assert run.wait(30) == 0, run.output()

    published = Counter(read_audit(nsqd))
    first, last = min(published), max(published)
    assert (parse_tick(last) - parse_tick(first)).total_seconds() >= RUN_FOR
    missing = sorted(set(seconds(first, last)) - set(published))
    assert not missing, f"ticks never published: {missing}"
    twice = {tick: n for tick, n in published.items() if n > 1}
    assert not twice, f"ticks published more than once: {twice}; kills at {kills}"
    seen = handled(path)  # the last ticks may be left unhandled by the stop
    assert not sorted(set(seconds(first, max(seen))) - set(seen)), "a tick was not handled"
    assert all(len(ids) == 1 for ids in seen.values())
    _, token, _ = lease_row(postgres)
    assert token >= 3, token  # the first holder, then one per takeover
    output = "\n".join(r.output() for r in runs)
    assert (
        f"leader postgres (NSQWORKER_SCHEDULE_LEADER) on PostgreSQL 127.0.0.1:{postgres.port}"
        in output
    )
    assert postgres.password not in output
    print(f"{len(published)} ticks, each published once; kills at {[k[0] for k in kills]}")
