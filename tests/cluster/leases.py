"""Helpers of the schedule test in tests/cluster/test_cluster.py: ticks, the Lease's
holder, the console's view of the pods."""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import datetime
from pathlib import Path

import httpx

from nsqworker.testing import free_port, wait_for
from nsqworker.testing.kube_cluster import KubeCluster
from tests.cluster.conftest import NodeNsqd, Release
from tests.cluster.pods import core


def ticks(nsqd: NodeNsqd) -> list[int]:
    """The ``scheduled_for`` (Unix seconds) of every tick the handlers echoed."""
    out = []
    for body in nsqd.handled_bodies():
        tick = json.loads(body)
        out.append(int(datetime.fromisoformat(tick["scheduled_for"]).timestamp()))
    return out


def leader_pod(cluster: KubeCluster, namespace: str, lease: str) -> str | None:
    """The pod whose candidate holds the Lease: each pod's log names its candidate."""
    from kubernetes import client

    try:
        spec = (
            client.CoordinationV1Api(cluster.api_client())
            .read_namespaced_lease(lease, namespace)
            .spec
        )
    except client.ApiException:
        return None
    holder = spec.holder_identity if spec is not None else None
    if not holder:
        return None
    for pod in core(cluster).list_namespaced_pod(namespace).items:
        log = cluster.kubectl("logs", pod.metadata.name, "-n", namespace, check=False)
        if f"candidate {holder}" in log:
            return str(pod.metadata.name)
    return None


def check_console_lists(cluster: KubeCluster, release: Release, pods: set[str]) -> None:
    """Run ``nsqworker console --kubernetes-selector`` on the node (it reads the pods'
    health ports there) and wait for its ``/api/fleet`` to show exactly ``pods``, each
    read without an error."""
    port = free_port()
    console = cluster.start_process(
        "console",
        [
            "env",
            f"KUBECONFIG={cluster.kubeconfig}",
            str(Path(sys.executable).with_name("nsqworker")),
            "console",
            "--kubernetes-selector",
            f"app.kubernetes.io/instance={release.name}",
            "--namespace",
            release.namespace,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
    )
    try:
        url = f"http://127.0.0.1:{cluster.forward(port)}/api/fleet"

        def listed() -> bool:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                fleet = httpx.get(url, timeout=5, trust_env=False).json()
                names = {s["name"] for s in fleet["supervisors"] if not s["error"] and s["status"]}
                return names == pods and len(fleet["supervisors"]) == len(pods)
            return False

        wait_for(listed, timeout=60, interval=0.5, message=lambda: f"the console's fleet at {url}")
    finally:
        console.stop()
