"""Where the workers are: the health URLs given, or the pods of a label selector.

Each :class:`Endpoint` is one ``nsqworker run`` supervisor's health server; the console
reads its ``/status`` and ``/inflight``. On Kubernetes the pods come from the API (the
``kubernetes`` package): only the pods of the selector in one namespace, so the console's
RBAC is ``list pods`` there and nothing else.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nsqworker.settings.console import ConsoleSettings

__all__ = ["Discovery", "Endpoint", "KubernetesPods", "StaticWorkers", "discovery_for"]

#: Where a pod finds its own namespace (the service account's mount).
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Endpoint:
    """One supervisor's health server: ``url`` (http://host:port) and a name to show
    (the pod's name on Kubernetes, else host:port)."""

    url: str
    name: str
    pod: str | None = None


class Discovery:
    """Finds the endpoints; called before each read of the fleet."""

    description = ""

    async def endpoints(self) -> list[Endpoint]:
        """The health servers to read now."""
        raise NotImplementedError


class StaticWorkers(Discovery):
    """The health URLs given with ``--worker`` (``console_workers``)."""

    def __init__(self, urls: list[str]) -> None:
        self._endpoints = [Endpoint(url, url.partition("://")[2]) for url in urls]
        self.description = f"{len(urls)} worker URL{'s' * (len(urls) != 1)}"

    async def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)


class KubernetesPods(Discovery):
    """The running pods of ``selector`` in ``namespace``, each at its container port
    named ``health`` (the chart names it so), else at ``default_port``."""

    def __init__(
        self, selector: str, namespace: str, default_port: int, api_client: Any = None
    ) -> None:
        self.selector = selector
        self.namespace = namespace
        self.default_port = default_port
        self._api_client = api_client
        self.description = f"pods {selector} in namespace {namespace}"

    def _api(self) -> Any:
        client: Any = importlib.import_module("kubernetes.client")
        if self._api_client is None:
            config: Any = importlib.import_module("kubernetes.config")
            try:
                config.load_incluster_config()
            except config.ConfigException:  # KUBECONFIG (read now) or ~/.kube/config
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
            self._api_client = client.ApiClient()
        return client.CoreV1Api(self._api_client)

    def _list(self) -> list[Endpoint]:
        pods = self._api().list_namespaced_pod(
            self.namespace, label_selector=self.selector, _request_timeout=5
        )
        found = []
        for pod in pods.items:
            status = pod.status
            if status is None or status.phase != "Running" or not status.pod_ip:
                continue
            if pod.metadata.deletion_timestamp is not None:
                continue
            host = f"[{status.pod_ip}]" if ":" in status.pod_ip else status.pod_ip
            port = _health_port(pod) or self.default_port
            name = str(pod.metadata.name)
            found.append(Endpoint(f"http://{host}:{port}", name, pod=name))
        return sorted(found, key=lambda e: e.name)

    async def endpoints(self) -> list[Endpoint]:
        return await asyncio.to_thread(self._list)


def _health_port(pod: Any) -> int | None:
    for container in pod.spec.containers or ():
        for port in container.ports or ():
            if port.name == "health":
                return int(port.container_port)
    return None


def discovery_for(settings: ConsoleSettings, api_client: Any = None) -> Discovery:
    """Pods when ``console_kubernetes_selector`` is set, else the worker URLs.

    Raises ``ValueError`` when neither is set, or the namespace cannot be known."""
    selector = settings.console_kubernetes_selector
    if selector:
        namespace = settings.console_kubernetes_namespace
        if namespace is None and NAMESPACE_FILE.is_file():
            namespace = NAMESPACE_FILE.read_text().strip()
        if not namespace:
            raise ValueError(
                "console_kubernetes_namespace is not set and this is not a pod: pass --namespace"
            )
        return KubernetesPods(selector, namespace, settings.console_worker_port, api_client)
    if not settings.console_workers:
        raise ValueError(
            "no workers to show: pass --worker http://HOST:PORT (the health port of "
            "nsqworker run; repeat for several) or --kubernetes-selector LABELS"
        )
    return StaticWorkers(list(settings.console_workers))
