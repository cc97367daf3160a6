"""``nsqworker run --reload``: restart the workers when a source file changes.

For development: a daemon thread watches the Python files of the task module's
top-level package (or the module's own file, for a module outside any package) with
`watchfiles <https://watchfiles.helpmanual.io>`_ and tells the supervisor, which drains
every worker (finishing or handing back what it runs, as on SIGTERM) and starts new
ones at once, importing the changed code. Not for production: a deploy replaces pods.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["MISSING_HINT", "WARNING", "Reloader", "in_cluster_refusal", "watched_paths"]

MISSING_HINT = (
    "--reload needs the watchfiles package: pip install 'nsq-worker[reload]' (or watchfiles itself)"
)
WARNING = (
    "--reload is for development: whoever can write the watched files runs code in the "
    "workers within a second, and can keep them unready by touching files"
)
"""Logged at warning when ``nsqworker run --reload`` starts."""


def in_cluster_refusal(environ: Mapping[str, str], forced: bool) -> str | None:
    """Why ``--reload`` must not start here, or None: in a Kubernetes pod (where
    ``KUBERNETES_SERVICE_HOST`` is set) it refuses unless ``--reload-in-cluster`` forces it."""
    if forced or not environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    return (
        "--reload in a Kubernetes pod (KUBERNETES_SERVICE_HOST is set): it is for "
        "development, and a deploy replaces pods instead; pass --reload-in-cluster as well "
        "to reload here anyway (a development cluster)"
    )


def watched_paths(target: str) -> list[Path]:
    """What to watch for ``target`` (``pkg.module`` or ``pkg.module:attr``): the
    directory of its top-level package, or the module's file when it has none."""
    module = target.partition(":")[0]
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {top!r} to watch", name=top)
    if spec.submodule_search_locations:
        return sorted({Path(p).resolve() for p in spec.submodule_search_locations})
    if spec.origin is None:
        raise ModuleNotFoundError(f"{top!r} has no source file to watch", name=top)
    return [Path(spec.origin).resolve()]


class Reloader:
    """Calls ``on_change(paths)`` from a daemon thread whenever Python files under
    ``paths`` change (several changes close together are one call)."""

    def __init__(self, paths: list[Path], on_change: Callable[[list[str]], None]) -> None:
        import watchfiles  # the reload extra: imported here, so a missing one is clear

        self._watch = watchfiles.watch
        self._filter = watchfiles.PythonFilter()
        self.paths = paths
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nsqworker-reload", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (returns within about a second)."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            for changes in self._watch(
                *self.paths, watch_filter=self._filter, stop_event=self._stop,
                raise_interrupt=False, rust_timeout=500, yield_on_timeout=False,
            ):  # fmt: skip
                self._on_change(sorted({path for _, path in changes}))
        except Exception as exc:  # a watcher that dies must say so, not end the run
            print(f"nsqworker: --reload stopped watching: {exc}", file=sys.stderr)
