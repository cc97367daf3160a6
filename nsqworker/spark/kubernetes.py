"""The Kubernetes runner: one ``SparkApplication`` (``sparkoperator.k8s.io/v1beta2``) a job.

The application's name comes from the message's topic, channel and id
(:func:`application_name`), so a redelivered message finds the application its first
delivery created: a 409 on create means adopt it, never start a second one. The Spark
operator runs it; its state is ``.status.applicationState.state``: COMPLETED is
success, FAILED and SUBMISSION_FAILED are failure. ``restartPolicy`` is Never because
retries belong to NSQ, and ``timeToLiveSeconds`` (``spark_ttl``) lets the operator
remove finished applications.

The ``kubernetes`` client blocks, so it never runs on the event loop: creates, gets and
deletes go to a small thread pool, and states come from one watch thread per
namespace that resolves asyncio futures. A backlog of 10,000 jobs is 10,000 futures,
not 10,000 threads. When a watch breaks the thread lists the namespace's applications
(a poll) and watches again from there, polling every ``poll_interval`` until it can.
"""

from __future__ import annotations

import asyncio
import importlib
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger
from nsqworker.spark.job import JobContext, JobResult, JobState, RunnerKind, SparkJob
from nsqworker.spark.kube_job import (
    JobRef,
    application_name,
    check_owner,
    job_annotations,
    job_env,
    job_labels,
    kube_api_client,
)
from nsqworker.spark.policy import DEFAULT_APP_URIS

if TYPE_CHECKING:
    from nsqworker.settings.spark import SparkSettings as Settings

__all__ = [
    "GROUP",
    "PLURAL",
    "VERSION",
    "KubernetesRunner",
    "SparkApplicationRef",
    "application_body",
    "application_name",
    "job_annotations",
    "job_env",
    "job_labels",
    "kube_api_client",
    "state_of",
]

log = get_logger("nsqworker.spark")

GROUP, VERSION, PLURAL, KIND = (
    "sparkoperator.k8s.io",
    "v1beta2",
    "sparkapplications",
    "SparkApplication",
)
MANAGED_BY = "app.kubernetes.io/managed-by=nsqworker"
SUCCESS_STATES = frozenset({"COMPLETED"})
FAILURE_STATES = frozenset({"FAILED", "SUBMISSION_FAILED"})


# --- pure parts: the name, the body, the state -------------------------------------------


def application_body(
    job: SparkJob, ctx: JobContext, *, name: str, namespace: str, image: str,
    service_account: str, ttl: float, spark_version: str,
) -> dict[str, Any]:  # fmt: skip
    """The SparkApplication for ``job`` (field names from the operator's v1beta2 API).

    Labels carry the topic and channel (cleaned to label values), annotations their
    exact values and the message id; the job's ``env`` goes to driver and executors.
    """
    labels = job_labels(ctx)
    annotations = job_annotations(ctx)
    pod = {"labels": dict(labels), "env": job_env(job)}
    spec: dict[str, Any] = {
        "type": "Java" if job.app.endswith(".jar") else "Python",
        "mode": "cluster",
        "image": image,
        "sparkVersion": spark_version,
        "mainApplicationFile": job.app,
        "arguments": list(job.args),
        "sparkConf": job.conf_strings(),
        "restartPolicy": {"type": "Never"},
        "timeToLiveSeconds": int(ttl),
        "driver": {**pod, "serviceAccount": service_account},
        "executor": {**pod, "instances": 1},
    }
    if spec["type"] == "Python":
        spec["pythonVersion"] = "3"
    if job.py_files:
        spec["deps"] = {"pyFiles": list(job.py_files)}
    if job.name:
        spec["sparkConf"].setdefault("spark.app.name", job.name)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name, "namespace": namespace, "labels": labels, "annotations": annotations,
        },
        "spec": spec,
    }  # fmt: skip


def state_of(obj: dict[str, Any]) -> tuple[JobState, str]:
    """The job state of a SparkApplication object, and its error message if any."""
    app_state = (obj.get("status") or {}).get("applicationState") or {}
    state = str(app_state.get("state") or "")
    error = str(app_state.get("errorMessage") or "")
    if state in SUCCESS_STATES:
        return JobState.SUCCEEDED, error
    if state in FAILURE_STATES:
        return JobState.FAILED, error or state
    return (JobState.RUNNING if state else JobState.SUBMITTED), error


# --- the runner --------------------------------------------------------------------------


SparkApplicationRef = JobRef
"""A submitted SparkApplication (the runner's handle)."""


class KubernetesRunner:
    """Runs each job as a SparkApplication in ``namespace``; see the module doc."""

    kind: RunnerKind = "kubernetes"
    detached = True

    def __init__(
        self, api_client: Any, *, namespace: str, image: str, service_account: str,
        ttl: float, pool_size: int = 4, poll_interval: float = 5.0,
        watch_timeout: int = 300, spark_version: str | None = None,
        app_uris: Sequence[str] = DEFAULT_APP_URIS,
    ) -> None:  # fmt: skip
        client: Any = importlib.import_module("kubernetes.client")
        self.api: Any = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        #: URI patterns a job's app and py_files must match (``spark_app_uris``).
        self.app_uris = tuple(app_uris)
        self.image = image
        self.service_account = service_account
        self.ttl = ttl
        self.poll_interval = poll_interval
        self.watch_timeout = watch_timeout
        self.spark_version = spark_version or _installed_spark_version()
        self._pool = ThreadPoolExecutor(pool_size, thread_name_prefix=f"nsqworker-k8s-{namespace}")
        self._watches: dict[str, _NamespaceWatch] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> KubernetesRunner:
        """A runner for ``settings``: in-cluster credentials, else the kubeconfig."""
        if not settings.spark_image:
            raise ConfigurationError(
                "spark_runner is kubernetes but spark_image is not set: set "
                "NSQWORKER_SPARK_IMAGE to the image holding Spark and your job"
            )
        return cls(
            kube_api_client("kubernetes"), namespace=settings.spark_namespace, image=settings.spark_image,
            service_account=settings.spark_service_account, ttl=settings.spark_ttl,
            app_uris=settings.spark_app_uris,
        )  # fmt: skip

    async def submit(self, job: SparkJob, ctx: JobContext) -> SparkApplicationRef:
        """Create the application, or adopt the one an earlier delivery created."""
        name = application_name(ctx.topic, ctx.channel, ctx.message_id)
        body = application_body(
            job, ctx, name=name, namespace=self.namespace, image=self.image,
            service_account=self.service_account, ttl=self.ttl, spark_version=self.spark_version,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        adopted = await loop.run_in_executor(self._pool, self._create, body, ctx)
        ref = SparkApplicationRef(self.namespace, name, adopted)
        what = "adopted SparkApplication" if adopted else "created SparkApplication"
        log.info(what, id=ctx.message_id, job_id=name, namespace=self.namespace)
        return ref

    def _create(self, body: dict[str, Any], ctx: JobContext) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
            return False
        except ApiException as exc:
            if exc.status != 409:
                raise
        name = body["metadata"]["name"]
        existing = self.api.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        check_owner(
            f"SparkApplication {self.namespace}/{name}",
            (existing.get("metadata") or {}).get("annotations"),
            body["metadata"]["annotations"],
        )
        return True

    async def wait(self, handle: SparkApplicationRef) -> JobResult:
        """Wait for COMPLETED, FAILED or SUBMISSION_FAILED (from the namespace's watch)."""
        watch = self._watch(handle.namespace)
        future = watch.register(handle.name)
        try:
            loop = asyncio.get_running_loop()
            current = await loop.run_in_executor(self._pool, self._get, handle)
            if current is not None:
                watch.offer(current, by="get")
            else:
                watch.resolve(handle.name, JobState.FAILED, "the SparkApplication was deleted")
            state, error = await future
        finally:
            watch.unregister(handle.name, future)
        duration = time.monotonic() - handle.submitted
        return JobResult(state, handle.name, duration, error=error)

    def _get(self, handle: SparkApplicationRef) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj: dict[str, Any] = self.api.get_namespaced_custom_object(
                GROUP, VERSION, handle.namespace, PLURAL, handle.name
            )
            return obj
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def cancel(self, handle: SparkApplicationRef) -> None:
        """Delete the application (the operator then removes its pods)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._delete, handle)

    def _delete(self, handle: SparkApplicationRef) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.delete_namespaced_custom_object(
                GROUP, VERSION, handle.namespace, PLURAL, handle.name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _watch(self, namespace: str) -> _NamespaceWatch:
        with self._lock:
            watch = self._watches.get(namespace)
            if watch is None:
                watch = self._watches[namespace] = _NamespaceWatch(self, namespace)
                watch.start()
            return watch

    def watch_stats(self, namespace: str | None = None) -> dict[str, int]:
        """Counters of a namespace's watch: ``watch_errors``, ``polls``, ``by_poll``."""
        watch = self._watches.get(namespace or self.namespace)
        return dict(watch.stats) if watch is not None else {}

    def interrupt_watches(self) -> int:
        """Cut every watch's connection, as a network failure would (tests, diagnostics).

        Returns how many open connections were cut: a watch still connecting has none
        yet, so a caller that needs a cut calls again until this is not 0.
        """
        return sum(watch.interrupt() for watch in list(self._watches.values()))

    def close(self) -> None:
        """Stop the watch threads and the thread pool."""
        for watch in list(self._watches.values()):
            watch.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _installed_spark_version() -> str:
    try:
        import pyspark

        return str(pyspark.__version__)
    except ImportError:
        return "4.1.4"


Waiter = asyncio.Future[tuple[JobState, str]]


class _NamespaceWatch:
    """One thread watching a namespace's nsqworker SparkApplications; it resolves the
    futures of the applications being waited for when they reach a final state."""

    def __init__(self, runner: KubernetesRunner, namespace: str) -> None:
        self.runner = runner
        self.namespace = namespace
        self.stats = {"watch_errors": 0, "polls": 0, "by_poll": 0}
        self._waiters: dict[str, list[Waiter]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._active = threading.Event()  # set while someone waits for an application
        self._idling = False  # the watch was cut because nobody waits any more
        self._current: Any = None
        self._thread = threading.Thread(
            target=self._run, name=f"nsqworker-k8s-watch-{namespace}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._active.set()
        current = self._current
        if current is not None:
            current.stop()

    def register(self, name: str) -> Waiter:
        future: Waiter = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiters.setdefault(name, []).append(future)
            self._active.set()
        return future

    def unregister(self, name: str, future: Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(name)
            if waiters is not None and future in waiters:
                waiters.remove(future)
                if not waiters:
                    del self._waiters[name]
            self._idle_if_unwanted()

    def _idle_if_unwanted(self) -> None:
        """With nobody waiting, stop watching (holding the lock): no idle API traffic."""
        if not self._waiters and self._active.is_set():
            self._active.clear()
            self._idling = True
            self.interrupt()

    def offer(self, obj: dict[str, Any], by: str) -> None:
        """A seen application (any thread): resolves its waiters if it has ended."""
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        state, error = state_of(obj)
        if state.done and self.resolve(name, state, error) and by == "poll":
            self.stats["by_poll"] += 1

    def resolve(self, name: str, state: JobState, error: str) -> bool:
        with self._lock:
            waiters = self._waiters.pop(name, [])
            self._idle_if_unwanted()
        for future in waiters:
            future.get_loop().call_soon_threadsafe(_set_result, future, (state, error))
        return bool(waiters)

    def interrupt(self) -> bool:
        """Cut the open watch connection, if there is one; True when one was cut."""
        response = getattr(self._current, "_resp", None)
        connection = getattr(response, "connection", None) or getattr(response, "_connection", None)
        sock = getattr(connection, "sock", None)
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
        return True

    def _poll(self) -> str:
        """List the namespace's applications, offer each; the list's resourceVersion."""
        self.stats["polls"] += 1
        listing = self.runner.api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, label_selector=MANAGED_BY
        )
        for obj in listing.get("items") or []:
            self.offer(obj, by="poll")
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def _run(self) -> None:
        watch: Any = importlib.import_module("kubernetes.watch")
        version: str | None = None
        while not self._stopped.is_set():
            if not self._active.wait():
                continue
            try:
                if version is None:
                    version = self._poll()
                self._current = stream = watch.Watch()
                if not self._active.is_set():  # went idle while we listed
                    self._take_idle()
                    version = None
                    continue
                started = time.monotonic()
                for event in stream.stream(
                    self.runner.api.list_namespaced_custom_object, GROUP, VERSION,
                    self.namespace, PLURAL, label_selector=MANAGED_BY,
                    resource_version=version, timeout_seconds=self.runner.watch_timeout,
                ):  # fmt: skip
                    obj = event["object"]
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    self.offer(obj, by="watch")
                if self._stopped.is_set() or self._take_idle():
                    version = None
                    continue
                if time.monotonic() - started < self.runner.watch_timeout - 1:
                    raise ConnectionError("the watch ended before its timeout")
            except Exception as exc:
                if self._stopped.is_set():
                    return
                version = None  # the next round lists (polls), then watches from there
                if self._take_idle():
                    continue
                self.stats["watch_errors"] += 1
                gone = getattr(exc, "status", None) == 410
                log.warning(
                    "SparkApplication watch failed; polling until it is back",
                    namespace=self.namespace, error=f"{type(exc).__name__}: {exc}"[:300],
                    gone=gone,
                )  # fmt: skip
                self._stopped.wait(self.runner.poll_interval)
            finally:
                self._current = None

    def _take_idle(self) -> bool:
        with self._lock:
            idling, self._idling = self._idling, False
            return idling


def _set_result(future: Waiter, value: tuple[JobState, str]) -> None:
    if not future.done():
        future.set_result(value)
