"""RPC on NSQ and on NATS: calls/s and p50/p99 latency at 1, 100 and 1,000 concurrent calls.

    python -m bench.rpc [--seconds 5] [--concurrency 1,100,1000] [--transport nsq,nats]
                        [--loop uvloop] [--json]

Per transport, one broker (nsqd, or nats-server, started here from .tools/bin), one
endpoint worker in its own process (an ``@rpc`` echo of a small JSON object), one
:class:`~nsqworker.rpc.RpcClient` in this process running ``concurrency`` callers that
each call again as soon as answered. Latency is from ``call()`` to its return: on NSQ
both PUBs, both deliveries, the endpoint's FIN and the client's; on NATS a core NATS
request and its reply. Goals (NSQ): >= 10,000 calls/s at 1,000 concurrent, p99 <= 5 ms
at 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import default_loop, run_on

REQUEST = {"sku": "A1", "quantity": 2, "note": "x" * 40}
GOALS = {"calls_per_s@1000": 10_000.0, "p99_ms@1": 5.0}


# --- the endpoint process -----------------------------------------------------------


def _settings(transport: str, address: str, **values: Any) -> Any:
    from nsqworker.settings import Settings

    if transport == "nats":
        return Settings(transport="nats", nats_servers=[address], **values)
    return Settings(nsqd_tcp_addresses=[address], **values)


async def serve(address: str, transport: str = "nsq") -> None:
    """Run the echo endpoint until stdin closes."""
    from nsqworker.logging import configure_logging
    from nsqworker.rpc import rpc
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    configure_logging("warning", stream=sys.stderr)  # a log line per call would be the bench
    registry = Registry()

    @rpc("bench_rpc", registry=registry, max_in_flight=2500)
    async def echo(request: Any) -> Any:
        return request

    settings = _settings(transport, address, max_in_flight=2500)
    assert isinstance(settings, Settings)
    async with Worker(registry, settings):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


# --- the client -------------------------------------------------------------------


async def measure(
    address: str, concurrency: int, seconds: float, transport: str = "nsq"
) -> dict[str, Any]:
    """Run ``concurrency`` callers for ``seconds`` (after a short warm-up)."""
    from nsqworker.rpc import RpcClient

    settings = _settings(transport, address)
    latencies: list[float] = []
    nsqd = [address] if transport == "nsq" else None
    async with RpcClient(nsqd, settings=settings, timeout=30.0) as client:
        stop_at = 0.0
        recording = False
        perf = time.perf_counter

        async def caller() -> None:
            while True:
                start = perf()
                await client.call("bench_rpc", REQUEST)
                end = perf()
                if recording:
                    latencies.append(end - start)
                if end >= stop_at:
                    return

        loop = asyncio.get_running_loop()
        stop_at = perf() + min(1.0, seconds / 2)  # warm-up: connections, topic, JIT-free caches
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        latencies.clear()
        recording = True
        started = perf()
        cpu = time.process_time()
        stop_at = started + seconds
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        elapsed = perf() - started
        cpu = time.process_time() - cpu
        del loop
        assert client.timeouts == 0 and client.late_replies == 0
    latencies.sort()
    count = len(latencies)
    return {
        "transport": transport,
        "concurrency": concurrency,
        "calls": count,
        "seconds": round(elapsed, 3),
        "calls_per_s": round(count / elapsed, 1),
        "p50_ms": round(latencies[count // 2] * 1e3, 3),
        "p99_ms": round(latencies[min(count - 1, int(count * 0.99))] * 1e3, 3),
        "mean_ms": round(statistics.fmean(latencies) * 1e3, 3),
        "client_cpu_s": round(cpu, 2),
    }


# --- the run ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rpc", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level")
    parser.add_argument("--concurrency", default="1,100,1000", help="comma-separated levels")
    parser.add_argument("--loop", default=default_loop(), choices=["uvloop", "asyncio"])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--transport", default="nsq,nats", help="comma-separated: nsq, nats")
    parser.add_argument("--serve", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        profile = os.environ.get("BENCH_RPC_PROFILE")  # a file for cProfile's stats
        if profile:
            import cProfile

            code = "run_on(args.loop, serve(args.serve, args.transport))"
            cProfile.runctx(code, globals(), locals(), profile)
        else:
            run_on(args.loop, serve(args.serve, args.transport))
        return 0

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    rows: list[dict[str, Any]] = []
    for transport in [t.strip() for t in args.transport.split(",") if t.strip()]:
        rows += _run_transport(transport, levels, args)
    report = {
        "loop": args.loop,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "results": rows,
        "goals": _goals([r for r in rows if r["transport"] == "nsq"]),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"loop {args.loop}, load average {report['load_average'][0]:.2f} on {os.cpu_count()} CPUs"
        )
        for goal, (target, value, ok) in report["goals"].items():
            print(f"goal {goal}: {value} (target {target}) {'met' if ok else 'NOT met'}")
    return 0


def _run_transport(transport: str, levels: list[int], args: Any) -> list[dict[str, Any]]:
    """Start the broker and the endpoint process for ``transport``; one row per level."""
    from nsqworker.testing import NsqdProcess
    from nsqworker.testing.nats import NatsServerProcess

    with contextlib.ExitStack() as stack:
        if transport == "nats":
            server = stack.enter_context(NatsServerProcess())
            address, broker_pid = server.url, server.pid
        elif transport == "nsq":
            data = stack.enter_context(tempfile.TemporaryDirectory())
            nsqd = stack.enter_context(NsqdProcess(data_path=Path(data)))
            nsqd.create_channel("bench_rpc", "rpc")
            address, broker_pid = nsqd.tcp_address, nsqd.pid
        else:
            raise SystemExit(f"unknown transport {transport!r}: use nsq or nats")
        return _measure_levels(transport, address, broker_pid, levels, args)


def _measure_levels(
    transport: str, address: str, broker_pid: int, levels: list[int], args: Any
) -> list[dict[str, Any]]:
    rows = []
    endpoint = subprocess.Popen(
        [sys.executable, "-m", "bench.rpc", "--serve", address, "--loop", args.loop,
         "--transport", transport],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "NSQWORKER_HEALTH_PORT": "0"},
    )  # fmt: skip
    try:
        assert endpoint.stdout is not None
        for line in endpoint.stdout:  # its log lines come first
            if line.strip() == "ready":
                break
        else:
            raise SystemExit("the endpoint worker did not start")
        for level in levels:
            before = _cpu_seconds(endpoint.pid), _cpu_seconds(broker_pid)
            row = run_on(args.loop, measure(address, level, args.seconds, transport))
            row["endpoint_cpu_s"] = round(_cpu_seconds(endpoint.pid) - before[0], 2)
            row["broker_cpu_s"] = round(_cpu_seconds(broker_pid) - before[1], 2)
            rows.append(row)
            if not args.json:
                print(
                    f"{transport:>4} {level:>6} concurrent: {row['calls_per_s']:>9,.0f} "
                    f"calls/s  p50 {row['p50_ms']:7.3f} ms  p99 {row['p99_ms']:7.3f} ms  "
                    f"({row['calls']:,} calls in {row['seconds']:.1f} s; CPU s: client "
                    f"{row['client_cpu_s']}, endpoint {row['endpoint_cpu_s']}, "
                    f"{'nats-server' if transport == 'nats' else 'nsqd'} "
                    f"{row['broker_cpu_s']})",
                    flush=True,
                )
    finally:
        if endpoint.stdin is not None:
            endpoint.stdin.close()
        try:
            endpoint.wait(15)
        except subprocess.TimeoutExpired:
            endpoint.kill()
    return rows


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc (0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _goals(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float, bool]]:
    by_level = {r["concurrency"]: r for r in rows}
    goals: dict[str, tuple[float, float, bool]] = {}
    if 1000 in by_level:
        value = by_level[1000]["calls_per_s"]
        goals["calls_per_s@1000"] = (GOALS["calls_per_s@1000"], value, value >= 10_000)
    if 1 in by_level:
        value = by_level[1]["p99_ms"]
        goals["p99_ms@1"] = (GOALS["p99_ms@1"], value, value <= 5.0)
    return goals


if __name__ == "__main__":
    raise SystemExit(main())
