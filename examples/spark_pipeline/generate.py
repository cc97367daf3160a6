"""Click events for the pipeline, as JSON lines: ``python -m examples.spark_pipeline.generate``.

Each line is one click: ``{"user": "u017", "ts": "2026-11-23T09:14:03Z", "page": "/cart"}``.
Users browse in bursts (a few clicks seconds to minutes apart) separated by longer
pauses, so the job's 30-minute sessionization has real sessions to find. The same
seed gives the same file.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

PAGES = ["/", "/search", "/product/1", "/product/2", "/product/3", "/cart", "/checkout", "/help"]
WEIGHTS = [20, 15, 12, 10, 8, 6, 3, 2]


def generate(day: date, users: int = 40, seed: int = 1) -> list[dict[str, str]]:
    """The clicks of ``day``, sorted by time."""
    rng = random.Random(f"{seed}-{day.isoformat()}")
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    clicks = []
    for n in range(users):
        user = f"u{n:03d}"
        at = start + timedelta(minutes=rng.uniform(0, 600))
        for _ in range(rng.randint(1, 4)):  # sessions
            for _ in range(rng.randint(1, 12)):  # clicks in a session
                if at.date() != day:
                    break
                page = rng.choices(PAGES, WEIGHTS)[0]
                clicks.append({"user": user, "ts": at.strftime("%Y-%m-%dT%H:%M:%SZ"), "page": page})
                at += timedelta(seconds=rng.uniform(5, 600))
            at += timedelta(minutes=rng.uniform(31, 240))  # longer than the 30-minute gap
    clicks.sort(key=lambda c: c["ts"])
    return clicks


def write(path: Path, clicks: list[dict[str, str]]) -> Path:
    """Write ``clicks`` to ``path`` as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(c) + "\n" for c in clicks))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--day", type=date.fromisoformat, default=date(2026, 11, 23))
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path(".run/spark_pipeline/input"))
    args = parser.parse_args()
    path = write(args.out / f"clicks-{args.day}.jsonl", generate(args.day, args.users))
    print(path)


if __name__ == "__main__":
    main()
