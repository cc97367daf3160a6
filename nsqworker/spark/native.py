"""The native Kubernetes runner: each job is a driver pod the worker creates, no operator.

``spark_runner=kubernetes-native`` needs no Spark operator: Spark submits to Kubernetes
by itself. The worker creates one **driver pod** per message, named like the
SparkApplication runner's application (:func:`~nsqworker.spark.kubernetes.application_name`)
with the same labels, annotations and job environment. The pod runs ``spark-submit``
against the API server in client mode inside that pod (the driver is the pod: what
``--deploy-mode cluster`` makes), with ``spark.driver.host`` set to the pod's own
address, so executors reach it without a Service or cluster DNS, and
``spark.kubernetes.driver.pod.name`` set to itself, so the executor pods Spark creates
are owned by it and removed with it. The image (``spark_image``) holds Spark, a JRE and
the job (``deploy/spark/Dockerfile`` builds one).

The worker follows the driver pod (a read every ``poll_interval`` seconds): Succeeded
is success, Failed is failure with the end of the driver's log as the reason, an image
that cannot be pulled is failure at once. It deletes the pod once the job has ended.
A redelivered message finds the pod its first delivery created: a running or
succeeded one is adopted (never a second job for one message), a failed one is
deleted and the job submitted again (the retry).

``spark_driver_template`` and ``spark_executor_template`` are pod templates (YAML
files on the worker) the operator writes, as Spark's ``podTemplateFile``: volumes,
node selectors, tolerations, ``hostNetwork``, environment. A job cannot set either
(:mod:`nsqworker.spark.policy` refuses the pod template, volume and image keys).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger
from nsqworker.spark.job import JobContext, JobResult, JobState, RunnerKind, SecretRef, SparkJob
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
    from collections.abc import Sequence

    from nsqworker.settings.spark import SparkSettings as Settings

__all__ = ["DRIVER_CONTAINER", "DriverPodRef", "NativeKubernetesRunner", "driver_pod_body"]

log = get_logger("nsqworker.spark")

DRIVER_CONTAINER = "spark-kubernetes-driver"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
EXECUTOR_TEMPLATE = "/tmp/nsqworker-executor-template.yaml"
#: The driver's command: spark-submit in client mode inside the pod, against the API
#: server the pod's environment names, the driver reachable at the pod's address.
SUBMIT = (
    'if [ -n "$NSQWORKER_EXECUTOR_TEMPLATE" ]; then'
    f' printf %s "$NSQWORKER_EXECUTOR_TEMPLATE" > {EXECUTOR_TEMPLATE}; set -- --conf'
    f' spark.kubernetes.executor.podTemplateFile={EXECUTOR_TEMPLATE} "$@"; fi; exec spark-submit'
    ' --master "k8s://https://${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT}"'
    ' --deploy-mode client --conf "spark.driver.host=${NSQWORKER_POD_IP}"'
    ' --conf "spark.driver.bindAddress=${NSQWORKER_POD_IP}" "$@"'
)
#: Waiting reasons of the driver container that no wait will fix.
STUCK = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
     "CreateContainerConfigError", "CreateContainerError"}
)  # fmt: skip
LOG_LINES = 20


def driver_pod_body(
    job: SparkJob, ctx: JobContext, *, name: str, namespace: str, image: str,
    service_account: str, driver_template: dict[str, Any] | None = None,
    executor_template: str | None = None, trace_env: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The driver pod of ``job``: labels, annotations and env as the SparkApplication
    runner's, the Spark properties that place executors (namespace, image, owner pod,
    the pod's service-account token), the job's conf, app and arguments."""
    labels = {**job_labels(ctx), "spark-role": "driver"}
    conf: dict[str, str] = {**job.conf_strings()}
    conf.update(
        {
            "spark.kubernetes.namespace": namespace,
            "spark.kubernetes.container.image": image,
            "spark.kubernetes.driver.pod.name": name,
            "spark.kubernetes.authenticate.caCertFile": f"{SA_DIR}/ca.crt",
            "spark.kubernetes.authenticate.oauthTokenFile": f"{SA_DIR}/token",
            "spark.kubernetes.executor.podNamePrefix": name[:47].rstrip("-"),
        }
    )
    if job.name:
        conf.setdefault("spark.app.name", job.name)
    for key, value in job_labels(ctx).items():
        conf[f"spark.kubernetes.executor.label.{key}"] = value
    for key, env_value in sorted(job.env.items()):
        if isinstance(env_value, SecretRef):
            ref = f"{env_value.name}:{env_value.key}"
            conf[f"spark.kubernetes.executor.secretKeyRef.{key}"] = ref
        else:
            conf[f"spark.executorEnv.{key}"] = env_value
    args: list[str] = []
    for key, value in sorted(conf.items()):
        args += ["--conf", f"{key}={value}"]
    if job.py_files:
        args += ["--py-files", ",".join(job.py_files)]
    args += [job.app, *job.args]
    env = [{"name": "NSQWORKER_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    env += job_env(job)
    env += [{"name": k, "value": v} for k, v in sorted((trace_env or {}).items())]
    if executor_template:
        env.append({"name": "NSQWORKER_EXECUTOR_TEMPLATE", "value": executor_template})
    container: dict[str, Any] = {
        "name": DRIVER_CONTAINER,
        "image": image,
        "command": ["/bin/sh", "-c", SUBMIT, "spark-submit"],
        "args": args,
        "env": env,
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account,
        "automountServiceAccountToken": True,
        "containers": [container],
    }
    template = driver_template or {}
    merged_spec = {**(template.get("spec") or {})}
    containers = merged_spec.pop("containers", None) or []
    base = next((c for c in containers if c.get("name") == DRIVER_CONTAINER), None)
    base = base or (containers[0] if containers else {})
    merged_spec.update(spec)
    container["env"] = [*(base.get("env") or []), *env]  # ours last: they win
    for key, value in base.items():
        container.setdefault(key, value)  # volumeMounts, resources, securityContext...
    metadata = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(metadata.get("labels") or {}), **labels},
            "annotations": {**(metadata.get("annotations") or {}), **job_annotations(ctx)},
        },
        "spec": merged_spec,
    }


DriverPodRef = JobRef
"""A submitted job's driver pod (the runner's handle)."""


class NativeKubernetesRunner:
    """Runs each job as a driver pod in ``namespace``; see the module doc."""

    kind: RunnerKind = "kubernetes"
    detached = True

    def __init__(
        self, api_client: Any, *, namespace: str, image: str, service_account: str,
        driver_template: dict[str, Any] | None = None, executor_template: str | None = None,
        app_uris: Sequence[str] = DEFAULT_APP_URIS, poll_interval: float = 2.0,
        pool_size: int = 4,
    ) -> None:  # fmt: skip
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.image = image
        self.service_account = service_account
        self.driver_template = driver_template
        self.executor_template = executor_template
        #: URI patterns a job's app and py_files must match (``spark_app_uris``).
        self.app_uris = tuple(app_uris)
        self.poll_interval = poll_interval
        self._pool = ThreadPoolExecutor(pool_size, thread_name_prefix="nsqworker-spark-pods")

    @classmethod
    def from_settings(cls, settings: Settings) -> NativeKubernetesRunner:
        """A runner for ``settings``: in-cluster credentials, else the kubeconfig."""
        if not settings.spark_image:
            raise ConfigurationError(
                "spark_runner is kubernetes-native but spark_image is not set: set "
                "NSQWORKER_SPARK_IMAGE to the image holding Spark, a JRE and your job"
            )
        driver = _template(settings.spark_driver_template, "spark_driver_template")
        executor = None
        if settings.spark_executor_template:
            _template(settings.spark_executor_template, "spark_executor_template")
            executor = Path(settings.spark_executor_template).read_text()
        return cls(
            kube_api_client("kubernetes-native"), namespace=settings.spark_namespace,
            image=settings.spark_image, service_account=settings.spark_service_account,
            driver_template=driver, executor_template=executor, app_uris=settings.spark_app_uris,
        )  # fmt: skip

    async def submit(self, job: SparkJob, ctx: JobContext) -> DriverPodRef:
        """Create the driver pod, or adopt the one an earlier delivery created."""
        name = application_name(ctx.topic, ctx.channel, ctx.message_id)
        body = driver_pod_body(
            job, ctx, name=name, namespace=self.namespace, image=self.image,
            service_account=self.service_account, driver_template=self.driver_template,
            executor_template=self.executor_template, trace_env=_trace_env(),
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        adopted = await loop.run_in_executor(self._pool, self._create, body)
        what = "adopted driver pod" if adopted else "created driver pod"
        log.info(what, id=ctx.message_id, job_id=name, namespace=self.namespace)
        return DriverPodRef(self.namespace, name, adopted)

    def _create(self, body: dict[str, Any]) -> bool:
        from kubernetes.client.exceptions import ApiException

        name = body["metadata"]["name"]
        for _ in range(3):
            try:
                self.core.create_namespaced_pod(self.namespace, body)
                return False
            except ApiException as exc:
                if exc.status != 409:
                    raise
            pod = self._read(name)
            if pod is None:
                continue  # deleted meanwhile: create it again
            check_owner(
                f"pod {self.namespace}/{name}",
                pod.metadata.annotations,
                body["metadata"]["annotations"],
            )
            if pod.status.phase != "Failed" and pod.metadata.deletion_timestamp is None:
                return True
            # a failed earlier attempt (its worker ended before deleting it): retry anew
            self._delete(name, wait=True)
        raise RuntimeError(f"pod {self.namespace}/{name} kept coming back; not submitting")

    async def wait(self, handle: DriverPodRef) -> JobResult:
        """Follow the driver pod until it succeeds or fails; then delete it."""
        loop = asyncio.get_running_loop()
        while True:
            pod = await loop.run_in_executor(self._pool, self._read, handle.name)
            state, error, code = self._state(pod)
            if state.done:
                break
            await asyncio.sleep(self.poll_interval)
        if state is JobState.FAILED and pod is not None:
            logs = await loop.run_in_executor(self._pool, self._log_tail, handle.name)
            error = f"{error}; driver log: {logs}" if logs else error
        await loop.run_in_executor(self._pool, self._delete, handle.name)
        duration = time.monotonic() - handle.submitted
        return JobResult(state, handle.name, duration, exit_code=code, error=error)

    @staticmethod
    def _state(pod: Any) -> tuple[JobState, str, int | None]:
        if pod is None:
            return JobState.FAILED, "the driver pod was deleted", None
        phase = pod.status.phase or "Pending"
        statuses = pod.status.container_statuses or []
        code = None
        for status in statuses:
            if status.state and status.state.terminated:
                code = status.state.terminated.exit_code
            waiting = status.state.waiting if status.state else None
            if waiting and waiting.reason in STUCK:
                return JobState.FAILED, f"{waiting.reason}: {waiting.message or ''}".strip(), None
        if phase == "Succeeded":
            return JobState.SUCCEEDED, "", code
        if phase == "Failed":
            return JobState.FAILED, f"the driver pod failed (exit code {code})", code
        return (JobState.RUNNING if phase == "Running" else JobState.SUBMITTED), "", None

    def _read(self, name: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _log_tail(self, name: str) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            text = self.core.read_namespaced_pod_log(
                name, self.namespace, container=DRIVER_CONTAINER, tail_lines=LOG_LINES
            )
        except ApiException as exc:
            return f"(no log: {exc.status} {exc.reason})"
        lines = [line for line in str(text).splitlines() if line.strip()]
        return " | ".join(lines[-LOG_LINES:])[-2000:]

    async def cancel(self, handle: DriverPodRef) -> None:
        """Delete the driver pod (its executors go with it)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._delete, handle.name)

    def _delete(self, name: str, wait: bool = False) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
        deadline = time.monotonic() + 60
        while wait and self._read(name) is not None and time.monotonic() < deadline:
            time.sleep(0.5)

    def close(self) -> None:
        """Stop the runner's threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _template(path: str | None, setting: str) -> dict[str, Any] | None:
    if not path:
        return None
    import yaml  # type: ignore[import-untyped]

    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{setting}: cannot read the pod template {path}: {exc}") from exc
    if not isinstance(loaded, dict) or loaded.get("kind", "Pod") != "Pod":
        raise ConfigurationError(f"{setting}: {path} is not a Pod (kind: Pod, spec: ...)")
    return loaded


def _trace_env() -> dict[str, str]:
    """The current trace context as ``TRACEPARENT``/``TRACESTATE`` for the driver."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {
        key.upper(): value for key, value in carrier.items() if key in ("traceparent", "tracestate")
    }
