"""Whether the tests run in CI: one answer for the fixtures and the suite.

In CI every server a test needs is installed by ``scripts/install-tools``, so a fixture
that would skip for a missing binary on a developer's machine fails instead: a green CI
never hides a missing install step.
"""

from __future__ import annotations

import os

__all__ = ["CI_VALUES", "in_ci"]

CI_VALUES = frozenset({"true", "1", "yes"})
"""Values of ``$CI`` (any case, blanks ignored) that mean "in CI"."""


def in_ci() -> bool:
    """True when ``$CI`` says so (``true``, ``1`` or ``yes``, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in CI_VALUES
