"""Task-layer policies, pure: retry delays and consumer backoff.

Nothing here sleeps or reads a clock; callers pass ``now`` and a random source, so
every rule can be tested exactly. The same rules apply on every transport.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["REQUEUE_JITTER", "BackoffPhase", "BackoffState", "Policy", "requeue_delay"]

Random = Callable[[], float]

# The longest retry delay any transport is asked for: nsqd v1.3.0 clamps REQ delays
# to its --max-req-timeout, 1 h by default; others cap with Capabilities.max_retry_delay.
MAX_RETRY_DELAY = 3600.0
# "A little jitter": +-10 % keeps retries of one burst from landing together.
REQUEUE_JITTER = 0.1


def requeue_delay(
    attempts: int,
    base: float,
    multiplier: float,
    cap: float,
    jitter: float = REQUEUE_JITTER,
    rand: Random = random.random,
) -> float:
    """Seconds to hold a failed message back before it is delivered again.

    ``base x multiplier^(attempts-1)``, with +-``jitter`` (a fraction), capped by ``cap``
    and by an hour (nsqd's maximum REQ timeout).
    """
    exponent = max(attempts, 1) - 1
    # Bound the exponent so a huge attempts count cannot overflow the float.
    delay = base * multiplier ** min(exponent, 64) if multiplier > 1 else base
    delay *= 1.0 + jitter * (2.0 * rand() - 1.0)
    return max(0.0, min(delay, cap, MAX_RETRY_DELAY))


class BackoffPhase(Enum):
    """Where a consumer is in its backoff cycle."""

    NORMAL = "normal"  # full RDY
    PAUSED = "paused"  # RDY 0 everywhere until ``resume_at``
    PROBING = "probing"  # RDY 1 on one connection; the next outcome decides


@dataclass
class BackoffState:
    """Consumer backoff: failures pause the whole consumer, successes lift the pause.

    A failure raises the level and pauses for ``min(multiplier x 2^level, max_duration)``
    (with jitter); after the pause one connection gets RDY 1 as a probe. Only one
    outcome counts per window: outcomes during a pause are ignored, and while probing
    only a message received after the probe began decides. A successful probe lowers
    the level and probes again at once; level 0 restores full RDY. A failed probe
    raises the level and pauses again. ``multiplier == 0`` turns backoff off.
    """

    multiplier: float
    max_duration: float
    jitter: float = 0.1
    rand: Random = random.random
    level: int = 0
    phase: BackoffPhase = BackoffPhase.NORMAL
    resume_at: float = 0.0
    window_start: float = 0.0
    max_level: int = field(init=False)

    def __post_init__(self) -> None:
        if self.multiplier <= 0 or self.max_duration <= 0:
            self.max_level = 0
        else:
            ratio = self.max_duration / self.multiplier
            self.max_level = max(1, math.ceil(math.log2(ratio))) if ratio > 1 else 1

    @property
    def enabled(self) -> bool:
        """False when the multiplier or the cap is 0."""
        return self.max_level > 0

    def duration(self, level: int) -> float:
        """The pause for ``level``, before jitter."""
        return min(self.multiplier * 2.0 ** min(level, 62), self.max_duration)

    def counts(self, received_at: float) -> bool:
        """Whether the outcome of a message received at ``received_at`` moves the state."""
        if self.phase is BackoffPhase.PAUSED:
            return False
        if self.phase is BackoffPhase.PROBING:
            return received_at >= self.window_start
        return True

    def on_failure(self, received_at: float, now: float) -> bool:
        """Record a failure; return True if the phase changed (RDY must be replanned)."""
        if not self.enabled or not self.counts(received_at):
            return False
        self.level = min(self.level + 1, self.max_level)
        pause = self.duration(self.level) * (1.0 - self.jitter * self.rand())
        self.phase = BackoffPhase.PAUSED
        self.resume_at = now + pause
        return True

    def on_success(self, received_at: float, now: float) -> bool:
        """Record a success; return True if the phase changed."""
        if self.phase is not BackoffPhase.PROBING or received_at < self.window_start:
            return False
        self.level -= 1
        if self.level <= 0:
            self.level = 0
            self.phase = BackoffPhase.NORMAL
            return True
        self.window_start = now
        return False

    def tick(self, now: float) -> bool:
        """Move from PAUSED to PROBING once the pause is over; True if it did."""
        if self.phase is BackoffPhase.PAUSED and now >= self.resume_at:
            self.phase = BackoffPhase.PROBING
            self.window_start = now
            return True
        return False


@dataclass(frozen=True)
class Policy:
    """One task's policy numbers (from its ``@task`` options and the Settings)."""

    max_in_flight: int = 100
    max_attempts: int = 5
    requeue_delay: float = 5.0
    requeue_multiplier: float = 2.0
    max_requeue_delay: float = 900.0
    backoff_multiplier: float = 1.0
    max_backoff_duration: float = 120.0
    drain_timeout: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings, **task: Any) -> Policy:
        """The settings' defaults, overridden by the task's own values (None = unset)."""
        values = {name: getattr(settings, name) for name in cls.__dataclass_fields__}
        values.update({k: v for k, v in task.items() if v is not None})
        return cls(**values)
