"""Reconnect delays every transport shares, pure: exponential with jitter.

Part of the transports' kit (a module the layout test lets every transport import):
NSQ's connections and producer pool, NATS' and RabbitMQ Streams' resubscriptions wait
these delays, so a fleet of workers does not reconnect in step after a broker restart.
Nothing here sleeps or reads a clock; callers pass a random source, so the rule can be
tested exactly. (Retry delays and consumer backoff are task policy: nsqworker.policy
and nsqworker.backoff.)
"""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["reconnect_delay"]

Random = Callable[[], float]


def reconnect_delay(failures: int, base: float, cap: float, rand: Random = random.random) -> float:
    """Seconds to wait before reconnect attempt number ``failures`` (1 = first retry).

    Exponential with "equal jitter": somewhere between half and all of
    ``base x 2^(failures-1)``, capped, so a fleet of workers does not reconnect in step.
    """
    ceiling = min(cap, base * 2.0 ** min(max(failures, 1) - 1, 62))
    return ceiling / 2.0 + rand() * ceiling / 2.0
