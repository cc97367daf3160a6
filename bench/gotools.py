"""NSQ's own Go benchmark clients, bench_reader and bench_writer (v1.3.0), as limits.

Both run for a fixed ``--runfor`` and print one line, e.g.::

    [bench_reader] 2026/11/22 17:14:43 duration: 1.005s - 16.517mb/s - 173197.956ops/s - 5.774us/op

Both open one connection per Go scheduler thread (``GOMAXPROCS``, the number of CPUs
by default). bench_reader subscribes every connection, then sends ``RDY --rdy`` on
each and counts messages until ``--runfor`` ends; bench_writer sends ``MPUB`` of
``--batch-size`` bodies of ``--size`` bytes on each connection, one at a time, waiting
for each answer.
"""

from __future__ import annotations

import os
import re
from typing import Any

from bench.common import BODY_SIZE, CHANNEL
from bench.env import Broker, run_tool, tool

_RESULT = re.compile(r"duration: (\S+) - ([\d.]+)mb/s - ([\d.]+)ops/s - ([\d.]+)us/op")


def parse(output: str) -> dict[str, float]:
    """``ops_s`` and ``us_op`` from a Go bench tool's output line."""
    match = _RESULT.search(output)
    if match is None:
        raise ValueError(f"no result line in the output: {output.strip()[-300:]!r}")
    return {"rate": float(match.group(3)), "us_op": float(match.group(4))}


def cpus() -> int:
    """What Go picks for GOMAXPROCS here: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def bench_reader(
    broker: Broker, topic: str, runfor: float, max_in_flight: int, connections: int
) -> dict[str, Any]:
    """Consume ``topic`` (already loaded) for ``runfor`` seconds over ``connections``
    connections with ``max_in_flight`` spread over them as RDY."""
    rdy = max(1, max_in_flight // connections)
    argv = [
        tool("bench_reader"),
        f"--topic={topic}",
        f"--channel={CHANNEL}",
        f"--nsqd-tcp-address={broker.tcp_address}",
        f"--size={BODY_SIZE}",
        f"--runfor={runfor:.3f}s",
        f"--rdy={rdy}",
    ]
    env = {**os.environ, "GOMAXPROCS": str(connections)}
    result = parse(run_tool(argv, timeout=runfor + 30, env=env))
    return {**result, "connections": connections, "rdy": rdy, "runfor": runfor}


def bench_writer(
    broker: Broker, topic: str, runfor: float, batch_size: int, connections: int = 1
) -> dict[str, Any]:
    """Publish to ``topic`` for ``runfor`` seconds: MPUB of ``batch_size``, one at a time
    on each of ``connections`` connections."""
    argv = [
        tool("bench_writer"),
        f"--topic={topic}",
        f"--nsqd-tcp-address={broker.tcp_address}",
        f"--size={BODY_SIZE}",
        f"--runfor={runfor:.3f}s",
        f"--batch-size={batch_size}",
    ]
    env = {**os.environ, "GOMAXPROCS": str(connections)}
    result = parse(run_tool(argv, timeout=runfor + 30, env=env))
    return {**result, "connections": connections, "batch_size": batch_size}
