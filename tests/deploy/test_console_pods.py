"""The console finds worker pods through a real kube-apiserver (no kubelet runs, so the
test writes each pod's status itself), and reads the health servers they point at."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from nsqworker.admin.console.discovery import KubernetesPods, discovery_for
from nsqworker.admin.console.fleet import Fleet
from nsqworker.health import HealthServer, WorkerMetrics
from nsqworker.settings import Settings
from nsqworker.testing.kube import KubeControlPlane

SELECTOR = "app.kubernetes.io/name=nsqworker,app.kubernetes.io/instance=orders"
WORKER_LABELS = {"app.kubernetes.io/name": "nsqworker", "app.kubernetes.io/instance": "orders"}


def served(pid: int) -> HealthServer:
    status = {"pid": pid, "hostname": f"host-{pid}", "workers": [], "tasks": []}
    server = HealthServer(
        "127.0.0.1", 0, lambda: True, lambda: (True, {}), WorkerMetrics(),
        lambda: {"inflight": []}, lambda: status,
    )  # fmt: skip
    server.start()
    return server


@pytest.fixture
def servers() -> Iterator[list[HealthServer]]:
    started = [served(101), served(202)]
    yield started
    for server in started:
        server.stop()


def make_pod(
    api: Any, namespace: str, name: str, labels: dict[str, str], port: int | None,
    running: bool = True,
) -> None:  # fmt: skip
    ports = [{"name": "health", "containerPort": port}] if port else []
    api.create_namespaced_pod(namespace, {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "w", "image": "nsqworker:test", "ports": ports}]},
    })  # fmt: skip
    if running:
        api.patch_namespaced_pod_status(name, namespace, {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        }})  # fmt: skip


async def test_the_pods_of_the_selector_are_the_workers(
    kube_control_plane: KubeControlPlane,
    servers: list[HealthServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubernetes import client

    kube = kube_control_plane
    namespace = f"console-{uuid.uuid4().hex[:6]}"
    kube.create_namespace(namespace)
    api = client.CoreV1Api(kube.api_client())
    # no controller makes the namespace's default account here; admission wants one
    api.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    named, default = servers
    make_pod(api, namespace, "orders-a", WORKER_LABELS, named.port)
    make_pod(api, namespace, "orders-b", WORKER_LABELS, None)  # the default port
    make_pod(api, namespace, "orders-pending", WORKER_LABELS, named.port, running=False)
    make_pod(api, namespace, "other", {"app.kubernetes.io/name": "other"}, named.port)

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))  # as kubectl would find it
    settings = Settings(
        console_kubernetes_selector=SELECTOR,
        console_kubernetes_namespace=namespace,
        console_worker_port=default.port,
    )
    discovery = discovery_for(settings)
    assert isinstance(discovery, KubernetesPods)
    endpoints = await discovery.endpoints()
    assert [(e.pod, e.url) for e in endpoints] == [
        ("orders-a", f"http://127.0.0.1:{named.port}"),
        ("orders-b", f"http://127.0.0.1:{default.port}"),
    ]
    fleet = Fleet(discovery, None, 1.0)
    try:
        view = await fleet.refresh()
    finally:
        await fleet.close()
    assert [(s.endpoint.pod, s.status.get("pid"), s.error) for s in view.supervisors] == [
        ("orders-a", 101, None),
        ("orders-b", 202, None),
    ]


async def test_an_api_error_is_shown_not_fatal(kube_control_plane: KubeControlPlane) -> None:
    discovery = KubernetesPods("bad selector ===", "default", 8080, kube_control_plane.api_client())
    fleet = Fleet(discovery, None, 1.0)
    try:
        view = await fleet.refresh()
    finally:
        await fleet.close()
    assert view.supervisors == [] and view.discovery_error is not None
    assert "cannot find the workers" in view.discovery_error
