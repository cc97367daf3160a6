"""The seam between ``@spark_task`` and where jobs run: one small protocol.

A runner submits a validated :class:`~nsqworker.spark.job.SparkJob`, waits for its
final state, and can cancel it. ``@spark_task`` owns everything message-shaped (FIN,
REQ, dead letters, drain); a runner only knows jobs. :func:`runner_for` builds (and
keeps, one per configuration) the runner that ``Settings.spark_runner`` names.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from nsqworker.spark.job import JobContext, JobResult, RunnerKind, SparkJob

if TYPE_CHECKING:
    from nsqworker.settings.spark import SparkSettings as Settings

__all__ = ["JobContext", "Runner", "runner_for"]


class Runner(Protocol):
    """Runs Spark jobs. ``submit`` returns a handle once the job is accepted;
    ``wait`` returns its :class:`JobResult` when it has ended (success or failure);
    ``cancel`` stops it and returns when it is gone. A handle has a ``job_id``."""

    kind: RunnerKind
    #: True when a job keeps running without the worker (it is left running on
    #: SIGTERM and the redelivered message adopts it); False when it is a child.
    detached: bool

    async def submit(self, job: SparkJob, ctx: JobContext) -> Any: ...

    async def wait(self, handle: Any) -> JobResult: ...

    async def cancel(self, handle: Any) -> None: ...


_runners: dict[tuple[Any, ...], Runner] = {}
_lock = threading.Lock()


def runner_for(settings: Settings) -> Runner:
    """The runner ``settings.spark_runner`` names, configured from ``settings``.

    One runner per distinct configuration and process: the Kubernetes runner's watch
    threads and client are shared by every task that uses it.
    """
    if settings.spark_runner in ("kubernetes", "kubernetes-native"):
        key: tuple[Any, ...] = (
            settings.spark_runner, settings.spark_namespace, settings.spark_image,
            settings.spark_service_account, settings.spark_ttl, tuple(settings.spark_app_uris),
            settings.spark_driver_template, settings.spark_executor_template,
        )  # fmt: skip
    else:
        key = ("local", settings.spark_master, tuple(settings.spark_app_roots))
    with _lock:
        runner = _runners.get(key)
        if runner is None:
            runner = _runners[key] = _build(settings)
        return runner


def _build(settings: Settings) -> Runner:
    if settings.spark_runner == "kubernetes-native":
        from nsqworker.spark.native import NativeKubernetesRunner

        return NativeKubernetesRunner.from_settings(settings)
    if settings.spark_runner == "kubernetes":
        from nsqworker.spark.kubernetes import KubernetesRunner

        return KubernetesRunner.from_settings(settings)
    from nsqworker.spark.local import LocalRunner

    return LocalRunner(master=settings.spark_master, app_roots=settings.spark_app_roots)
