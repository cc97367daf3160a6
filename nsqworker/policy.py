"""Task-layer policies, pure: retry delays and the numbers of a task's policy.

Consumer backoff is a state machine of its own: :mod:`nsqworker.backoff`.

Nothing here sleeps or reads a clock; callers pass ``now`` and a random source, so
every rule can be tested exactly. The same rules apply on every transport.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsqworker.transport import MAX_RETRY_DELAY

if TYPE_CHECKING:
    from nsqworker.settings.worker import WorkerSettings

__all__ = ["RETRY_JITTER", "Policy", "retry_delay"]

Random = Callable[[], float]

# "A little jitter": +-10 % keeps retries of one burst from landing together.
RETRY_JITTER = 0.1


def retry_delay(
    attempts: int,
    base: float,
    multiplier: float,
    cap: float,
    jitter: float = RETRY_JITTER,
    rand: Random = random.random,
) -> float:
    """Seconds to hold a failed message back before it is delivered again.

    ``base x multiplier^(attempts-1)``, with +-``jitter`` (a fraction), capped by ``cap``
    and by :data:`~nsqworker.transport.MAX_RETRY_DELAY` (an hour).
    """
    exponent = max(attempts, 1) - 1
    # Bound the exponent so a huge attempts count cannot overflow the float.
    delay = base * multiplier ** min(exponent, 64) if multiplier > 1 else base
    delay *= 1.0 + jitter * (2.0 * rand() - 1.0)
    return max(0.0, min(delay, cap, MAX_RETRY_DELAY))


@dataclass(frozen=True)
class Policy:
    """One task's policy numbers (from its ``@task`` options and the Settings)."""

    max_in_flight: int = 100
    max_attempts: int = 5
    retry_delay: float = 5.0
    retry_multiplier: float = 2.0
    max_retry_delay: float = 900.0
    backoff_multiplier: float = 1.0
    max_backoff_duration: float = 120.0
    drain_timeout: float = 30.0

    @classmethod
    def from_settings(cls, settings: WorkerSettings, **task: Any) -> Policy:
        """The settings' defaults, overridden by the task's own values (None = unset)."""
        values = {name: getattr(settings, name) for name in cls.__dataclass_fields__}
        values.update({k: v for k, v in task.items() if v is not None})
        return cls(**values)
