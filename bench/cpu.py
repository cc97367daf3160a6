"""Hot-path CPU: microseconds per message with no nsqd, no socket, no kernel.

Each client gets 256 KiB chunks of pre-encoded message frames straight into
``Connection.data_received`` (see :mod:`bench.profile`), in its own process. ``lean``
is the floor: decode, call the handler, one write of FINs per chunk, nothing else.
Much less noisy than the consume case, so it shows hot-path changes best.
"""

from __future__ import annotations

from bench.config import Config, Say
from bench.env import BenchError, Broker, run_child
from bench.results import Results

PATHS = (
    ("lean", "floor: decode + handler + one FIN write per read"),
    ("consumer", "raw Consumer, no-op callback"),
    ("worker-async", "Worker @task, async no-op"),
    ("worker-sync", "Worker @task, sync no-op"),
)


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    for path, label in PATHS:
        key = f"cpu/{path}"
        results.row(key, "cpu", label, "us/msg", higher_is_better=False)
        if path != "lean":
            results.compare(key, "", "cpu/lean")
    for i in range(cfg.runs):
        for path, label in PATHS:
            say(f"cpu run {i + 1}/{cfg.runs}: {label}")
            series = results.series[f"cpu/{path}"]
            params = {"path": path, "count": cfg.cpu_count, "loop": cfg.loop}
            try:
                result = run_child("offline:feed", params, 300)
                series.add(result["us_per_msg"], result)
            except BenchError as exc:
                series.errors.append(str(exc))
