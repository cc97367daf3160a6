"""Helpers of tests/cluster/test_cluster.py: pods, rollouts, load, and what nsqd saw."""

from __future__ import annotations

import threading
import time
from typing import Any

from nsqworker.testing import wait_for
from nsqworker.testing.kube_cluster import KubeCluster
from tests.cluster.conftest import NodeNsqd


def core(cluster: KubeCluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api_client())


def ready_pods(cluster: KubeCluster, namespace: str) -> list[Any]:
    """Pods of the namespace that are Ready and not being deleted."""
    pods = core(cluster).list_namespaced_pod(namespace).items
    return [
        p
        for p in pods
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
    ]


def pods_summary(cluster: KubeCluster, namespace: str) -> str:
    return cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False)


def wait_ready(
    cluster: KubeCluster, namespace: str, timeout: float = 90, other_than: str = ""
) -> Any:
    """Wait until the namespace's one pod is Ready (kubelet probes), none is leaving, and
    its name is not ``other_than``; return it. It must be on the host network: its
    address is its node's."""

    def ready() -> Any:
        pods = core(cluster).list_namespaced_pod(namespace).items
        good = ready_pods(cluster, namespace)
        if len(good) == 1 == len(pods) and good[0].metadata.name != other_than:
            return good[0]
        return None

    pod = wait_for(
        ready,
        timeout=timeout,
        interval=0.2,
        message=lambda: f"one Ready pod:\n{pods_summary(cluster, namespace)}",
    )
    node = cluster.node_of_ip(pod.status.pod_ip)
    assert pod.spec.host_network and pod.spec.node_name == node.name, pod.status
    return pod


def rolled_out(cluster: KubeCluster, namespace: str) -> bool:
    """The Deployment's newest template runs its one Ready pod, and nothing else."""
    from kubernetes import client

    (d,) = client.AppsV1Api(cluster.api_client()).list_namespaced_deployment(namespace).items
    s = d.status
    return bool(
        s.observed_generation == d.metadata.generation
        and s.updated_replicas == 1
        and s.ready_replicas == 1
        and s.replicas == 1
        and len(core(cluster).list_namespaced_pod(namespace).items) == 1
    )


def replica_sets(cluster: KubeCluster, namespace: str) -> int:
    return cluster.kubectl("get", "rs", "-n", namespace, "-o", "name").count("\n")


class Publisher(threading.Thread):
    """Publish ``rate`` numbered messages a second to nsqd's ``orders`` until stopped."""

    def __init__(self, nsqd: NodeNsqd, rate: float, prefix: str) -> None:
        super().__init__(daemon=True)
        self.nsqd, self.rate, self.prefix = nsqd, rate, prefix
        self.sent: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.halt.is_set():
            body = f"{self.prefix}-{len(self.sent):06d}"
            self.nsqd.publish(body)
            self.sent.append(body)
            pause = start + len(self.sent) / self.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)


def check_nothing_lost(nsqd: NodeNsqd, sent: list[str], timeout: float = 90) -> tuple[int, int]:
    """Wait until nsqd's channel delivered and had answered all of ``sent`` and the
    handlers' echoes hold each of them; return (duplicates, echoes)."""
    wait_for(
        lambda: nsqd.drained(len(sent)),
        timeout=timeout,
        interval=0.2,
        message=lambda: f"channel drained: {nsqd.channel()}",
    )
    return echoes_of(nsqd, sent)


def echoes_of(nsqd: NodeNsqd, sent: list[str]) -> tuple[int, int]:
    """Wait until the handlers' echoes (on nsqd's ``handled``) hold each of ``sent``;
    return (duplicates, echoes)."""
    bodies = wait_for(
        lambda: (b := nsqd.handled_bodies()) and set(sent) <= set(b) and b,
        timeout=30,
        interval=0.5,
        message=lambda: (
            f"missing from the echoes: {sorted(set(sent) - set(nsqd.handled_bodies()))[:10]}"
        ),
    )
    return len(bodies) - len(set(bodies)), len(bodies)
