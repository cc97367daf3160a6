"""Hot-path CPU: one client fed pre-encoded frames, no nsqd (see :mod:`bench.profile`)."""

from __future__ import annotations

from typing import Any


def feed(params: dict[str, Any]) -> dict[str, Any]:
    from bench.common import loop_label
    from bench.profile import plain, run_offline

    count, loop = params["count"], params.get("loop", "uvloop")
    elapsed = run_offline(params["path"], count, loop, plain)
    return {
        "us_per_msg": elapsed / count * 1e6,
        "rate": (count - 1) / elapsed,
        "loop": loop_label(loop),
    }
