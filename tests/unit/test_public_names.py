"""Every name the package exports is there: ``nsqworker.__all__`` (lazy names included,
imported as a user would) and the ``__all__`` of the transport seam and its kit, which
third-party transports build on."""

from __future__ import annotations

import importlib

import pytest

import nsqworker

SEAM = (
    "nsqworker.transport",
    "nsqworker.subscription_kit",
    "nsqworker.reconnect",
    "nsqworker.outcomes",
    "nsqworker.policy",
)


@pytest.mark.parametrize("name", nsqworker.__all__)
def test_every_name_of_the_package_imports(name: str) -> None:
    exec(f"from nsqworker import {name}", {})  # the import a user writes


@pytest.mark.parametrize("module", SEAM)
def test_every_name_of_the_seam_is_there(module: str) -> None:
    mod = importlib.import_module(module)
    assert [n for n in mod.__all__ if not hasattr(mod, n)] == []
