"""The ``kubernetes`` schedule leader: a ``coordination.k8s.io/v1`` Lease.

The Lease's spec is client-go's (``holderIdentity``, ``leaseDurationSeconds``,
``acquireTime``, ``renewTime``, ``leaseTransitions``), so ``kubectl get lease`` shows the
leader; the last tick fired per task is the annotation ``nsqworker.io/last-fired`` (JSON),
written in the same replace, so the resourceVersion check covers both. The ``kubernetes``
client blocks, so every call runs in a thread.

Credentials: in a pod, its service account (``load_incluster_config``); elsewhere the
kubeconfig (``KUBECONFIG`` or ``~/.kube/config``). Namespace: ``kubernetes_namespace``,
else the pod's own, else the kubeconfig context's, else ``default``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsqworker.errors import ConfigurationError
from nsqworker.schedules.lease import Conflict, LeaseDenied, LeaseRecord

if TYPE_CHECKING:
    from nsqworker.settings.schedules import ScheduleSettings

__all__ = ["ANNOTATION", "SERVICE_ACCOUNT_DIR", "KubeLeaseStore", "in_pod"]

ANNOTATION = "nsqworker.io/last-fired"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_pod(account_dir: Path | None = None) -> bool:
    """True in a Kubernetes pod that mounts a service-account token."""
    token = (account_dir or SERVICE_ACCOUNT_DIR) / "token"
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and token.is_file()


class KubeLeaseStore:
    """A Lease named ``name`` in ``namespace``, through ``api_client``."""

    def __init__(self, api_client: Any, namespace: str, name: str, timeout: float) -> None:
        from kubernetes import client

        self._api: Any = client.CoordinationV1Api(api_client)
        self._client = api_client
        self.namespace = namespace
        self.name = name
        self.timeout = timeout
        self.description = f"Lease {namespace}/{name}"

    @classmethod
    def from_settings(cls, settings: ScheduleSettings, name: str) -> KubeLeaseStore:
        """The store of ``settings``: in-cluster credentials, else the kubeconfig."""
        try:
            client: Any = importlib.import_module("kubernetes.client")
            config: Any = importlib.import_module("kubernetes.config")
        except ImportError:
            raise ConfigurationError(
                "schedule_leader kubernetes needs the kubernetes client: "
                "pip install 'nsq-worker[kubernetes]'"
            ) from None
        configuration = client.Configuration()
        namespace = settings.kubernetes_namespace
        try:
            config.load_incluster_config(client_configuration=configuration)
            if namespace is None:
                namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip() or None
        except (config.ConfigException, OSError):
            try:
                config.load_kube_config(
                    config_file=os.environ.get("KUBECONFIG") or None,
                    client_configuration=configuration,
                )
            except (config.ConfigException, OSError, TypeError) as exc:
                raise ConfigurationError(
                    "schedule_leader is kubernetes but there are no Kubernetes credentials "
                    f"(no service account, and the kubeconfig: {exc}); set KUBECONFIG, or "
                    "NSQWORKER_SCHEDULE_LEADER=none for one replica"
                ) from None
            if namespace is None:
                namespace = _context_namespace()
        timeout = max(0.5, settings.schedule_renew_deadline / 2)
        return cls(client.ApiClient(configuration), namespace or "default", name, timeout)

    async def get(self) -> tuple[LeaseRecord, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            lease: Any = await asyncio.to_thread(
                self._api.read_namespaced_lease, self.name, self.namespace,
                _request_timeout=self.timeout,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._error(exc, "get") from None
        return _record(lease), str(lease.metadata.resource_version)

    async def create(self, record: LeaseRecord) -> str:
        from kubernetes.client.exceptions import ApiException

        body = self._body(record, None)
        try:
            lease: Any = await asyncio.to_thread(
                self._api.create_namespaced_lease, self.namespace, body,
                _request_timeout=self.timeout,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict("the Lease exists") from None
            raise self._error(exc, "create") from None
        return str(lease.metadata.resource_version)

    async def update(self, record: LeaseRecord, version: str) -> str:
        from kubernetes.client.exceptions import ApiException

        body = self._body(record, version)
        try:
            lease: Any = await asyncio.to_thread(
                self._api.replace_namespaced_lease, self.name, self.namespace, body,
                _request_timeout=self.timeout,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status in (404, 409):
                raise Conflict(f"resourceVersion {version} is not current") from None
            raise self._error(exc, "update") from None
        return str(lease.metadata.resource_version)

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)

    def _body(self, record: LeaseRecord, version: str | None) -> Any:
        from kubernetes import client

        return client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                resource_version=version,
                annotations={ANNOTATION: json.dumps(record.fired, sort_keys=True)},
                labels={"app.kubernetes.io/managed-by": "nsqworker"},
            ),
            spec=client.V1LeaseSpec(
                holder_identity=record.holder or None,
                lease_duration_seconds=max(1, math.ceil(record.lease_duration)),
                acquire_time=record.acquire_time,
                renew_time=record.renew_time,
                lease_transitions=record.transitions,
            ),
        )

    def _error(self, exc: Any, verb: str) -> Exception:
        if exc.status in (401, 403):
            reason = _reason(exc)
            return LeaseDenied(
                f"the worker may not {verb} {self.description} ({exc.status} {reason}); grant "
                f"its service account get, create and update on leases.coordination.k8s.io in "
                f"namespace {self.namespace} (the Helm chart does with schedules.enabled=true)"
            )
        return RuntimeError(f"{self.description}: {verb} failed: {exc.status} {_reason(exc)}")


def _reason(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec
    annotations = lease.metadata.annotations or {}
    try:
        fired = json.loads(annotations.get(ANNOTATION) or "{}")
    except ValueError:
        fired = {}
    if not isinstance(fired, dict):
        fired = {}
    return LeaseRecord(
        holder=spec.holder_identity or None,
        lease_duration=float(spec.lease_duration_seconds or 15),
        acquire_time=spec.acquire_time,
        renew_time=spec.renew_time,
        transitions=int(spec.lease_transitions or 0),
        fired={str(k): str(v) for k, v in fired.items()},
    )


def _context_namespace() -> str | None:
    try:
        config: Any = importlib.import_module("kubernetes.config")
        _, context = config.list_kube_config_contexts(
            config_file=os.environ.get("KUBECONFIG") or None
        )
        return str((context or {}).get("context", {}).get("namespace") or "") or None
    except Exception:
        return None
