"""What a schedule costs a worker: ``nsqworker run`` with and without a per-second
schedule, consuming the same count of messages (bench/outofbox.py's method).

Each run starts ``nsqworker run --workers 1`` on the out-of-the-box no-op task, alone or
with a second task scheduled every second (``schedule_leader=none``: this supervisor
fires each tick, publishes it, records it), and times ``--count`` messages; the two
are interleaved. The scheduler is a thread of the supervisor, so the worker process
pays nothing for it; the one tick a second is one more message it handles.
``python -m bench.schedules [--runs N] [--count N]``.
"""

from __future__ import annotations

import argparse
import statistics

from bench import outofbox
from bench.config import Config
from bench.env import Broker
from bench.results import Series

SCHEDULED = (
    outofbox.TASKS
    + """

@task(os.environ["BENCH_TOPIC"] + "-ticks", channel="ticks", schedule="* * * * * *")
async def tick(msg):
    pass
"""
)
CASES = {
    "no schedule": (outofbox.TASKS, {}),
    "a per-second schedule, this supervisor the leader": (
        SCHEDULED,
        {"NSQWORKER_SCHEDULE_LEADER": "none"},
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.schedules", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each case, interleaved")
    parser.add_argument("--count", type=int, default=1_000_000, help="messages timed per run")
    args = parser.parse_args(argv)
    cfg = Config(runs=args.runs, consume_count=args.count)
    series = {name: Series(name, "schedules", name, "msgs/s") for name in CASES}
    broker = Broker()
    try:
        for i in range(args.runs):
            for name, (tasks, env) in CASES.items():
                print(f"run {i + 1}/{args.runs}: {name}", flush=True)
                outofbox.measure(broker, cfg, series[name], 1, None, tasks=tasks, extra_env=env)
        topics = broker.nsqd.stats().get("topics") or []
        ticks = sum(
            int(t.get("message_count") or 0) for t in topics if t["topic_name"].endswith("-ticks")
        )
    finally:
        broker.close()
    base = series["no schedule"]
    print()
    print("| nsqworker run --workers 1 | msgs/s median | min-max | runs | vs no schedule |")
    print("|---|---|---|---|---|")
    for name, row in series.items():
        if row.errors:
            print(f"| {name} | failed: {row.errors[0].splitlines()[0]} | | | |")
            continue
        ratio = statistics.median(row.values) / statistics.median(base.values) if base.values else 0
        print(
            f"| {name} | {statistics.median(row.values):,.0f} | {min(row.values):,.0f}-"
            f"{max(row.values):,.0f} | {len(row.values)} | {ratio:.0%} |"
        )
    print(f"\nticks fired and published by the scheduled runs' supervisors: {ticks}")
    if not ticks:
        print("error: the schedule never fired; the comparison means nothing")
        return 1
    return 0 if all(row.values and not row.errors for row in series.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
