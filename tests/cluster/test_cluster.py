"""The chart as users run it, on a real kubelet: install, upgrade under load, evict, SIGKILL.

Every test that uses the ``kube_cluster`` fixture lives in this file (one xdist process,
one cluster: see nsqworker.testing.kube_cluster_plugin). The cluster's namespace holds
only ``lo``: every pod runs with ``hostNetwork: true``, one replica per release (a second
pod of the Deployment would collide on the health port), and rollouts stop the old pod
before starting the new one. nsqd on the node keeps the truth: each wait asks its
``/stats`` (or the API server) for the value it checks, and the handlers' echoes on the
topic ``handled`` say what the pods saw.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import pytest

from nsqworker.testing import wait_for
from nsqworker.testing.kube_cluster import NODE_IP, KubeCluster
from tests.cluster.conftest import FIGURES, AppImage, NodeNsqd, Release, base_values

pytestmark = pytest.mark.timeout(300)


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
    its name is not ``other_than``; return it. It must be on the host network."""

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
    assert pod.spec.host_network and pod.status.pod_ip == NODE_IP, pod.status
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
    bodies = wait_for(
        lambda: (b := nsqd.handled_bodies()) and set(sent) <= set(b) and b,
        timeout=30,
        interval=0.5,
        message=lambda: (
            f"missing from the echoes: {sorted(set(sent) - set(nsqd.handled_bodies()))[:10]}"
        ),
    )
    return len(bodies) - len(set(bodies)), len(bodies)


def test_install_ready_and_consumes(
    kube_cluster: KubeCluster, app_image: AppImage, node_nsqd: NodeNsqd, release: Release
) -> None:
    """helm install: the kubelet runs the pod on the host network (the node's namespace,
    lo only), its probes make it Ready, it consumes."""
    start = time.monotonic()
    release.install(base_values(app_image))
    pod = wait_ready(kube_cluster, release.namespace)
    FIGURES["helm install to pod Ready"] = f"{time.monotonic() - start:.1f} s"
    status = pod.status.container_statuses[0]
    assert status.ready and status.restart_count == 0
    assert pod.spec.containers[0].readiness_probe.http_get.path == "/readyz"
    assert pod.spec.dns_policy == "ClusterFirstWithHostNet"
    assert kube_cluster.links() == ["lo"]  # a pod added no interface to the namespace
    node_nsqd.publish("hello-from-the-cluster")
    wait_for(
        lambda: node_nsqd.finished() == 1,
        timeout=30,
        message=lambda: f"FIN on the channel: {node_nsqd.channel()}",
    )
    wait_for(
        lambda: node_nsqd.handled_bodies() == ["hello-from-the-cluster"],
        timeout=10,
        message=lambda: f"the handler's echo: {node_nsqd.handled_bodies()}",
    )
    FIGURES["cluster RAM with one pod"] = f"{kube_cluster.memory_bytes() / 2**20:.0f} MiB"


def test_upgrade_under_load_loses_nothing(
    kube_cluster: KubeCluster, app_image: AppImage, node_nsqd: NodeNsqd, release: Release
) -> None:
    """helm upgrade (new config, then new image tag) of the one pod while 200 msgs/s flow;
    each rollout stops the old pod (drained) before the new one starts."""
    max_in_flight = 20  # tests/cluster/app's task
    values = base_values(app_image)
    release.install(values)
    pod = wait_ready(kube_cluster, release.namespace)
    deployment = kube_cluster.kubectl("get", "deploy", "-n", release.namespace, "-o", "yaml")
    assert "maxSurge: 0" in deployment and "maxUnavailable: 1" in deployment
    publisher = Publisher(node_nsqd, rate=200, prefix="upgrade")
    publisher.start()
    in_flight: list[int] = []
    try:
        wait_for(
            lambda: node_nsqd.finished() >= 200,
            timeout=30,
            message=lambda: f"consuming: {node_nsqd.channel()}",
        )
        steps = (
            ("config", {**values, "logLevel": "warning"}),  # the ConfigMap checksum rolls it
            (
                "image tag",
                {
                    **values,
                    "logLevel": "warning",
                    "image": {**values["image"], "tag": app_image.retag},
                },
            ),
        )
        for number, (what, new_values) in enumerate(steps, start=2):
            start = time.monotonic()
            in_flight.append(node_nsqd.channel()["in_flight_count"])
            release.upgrade(new_values)
            wait_for(
                lambda n=number: replica_sets(kube_cluster, release.namespace) == n, timeout=30
            )
            wait_for(
                lambda: rolled_out(kube_cluster, release.namespace),
                timeout=120,
                interval=0.3,
                message=lambda w=what: (
                    f"{w} rollout:\n{pods_summary(kube_cluster, release.namespace)}"
                ),
            )
            new = wait_ready(kube_cluster, release.namespace, other_than=pod.metadata.name)
            FIGURES[f"helm upgrade ({what}), 1 pod rolled under load"] = (
                f"{time.monotonic() - start:.1f} s"
            )
            pod = new
        assert pod.spec.containers[0].image == f"{app_image.repository}:{app_image.retag}"
    finally:
        publisher.halt.set()
        publisher.join()
    duplicates, echoes = check_nothing_lost(node_nsqd, publisher.sent)
    channel = node_nsqd.channel()
    stops = len(in_flight)
    FIGURES["upgrade under load"] = (
        f"{len(publisher.sent)} sent, 0 lost, {duplicates} duplicated over {stops} pod stops"
        f" (in flight as each upgrade began: {in_flight});"
        f" nsqd requeue_count {channel['requeue_count']}, timeout_count {channel['timeout_count']}"
    )
    # a stopped pod drains: at most the messages it held in flight come again
    assert duplicates <= stops * max_in_flight, FIGURES["upgrade under load"]
    assert echoes >= len(publisher.sent)


def test_eviction_respects_the_pod_disruption_budget(
    kube_cluster: KubeCluster, app_image: AppImage, node_nsqd: NodeNsqd, release: Release
) -> None:
    """Eviction API on the only pod: refused (429) while the chart's PDB says none may be
    unavailable (maxUnavailable 0), and the pod keeps running and consuming; once the PDB
    allows one (maxUnavailable 1) the eviction goes through and the replacement is Ready."""
    from kubernetes import client

    values = base_values(app_image, podDisruptionBudget={"enabled": True, "maxUnavailable": 0})
    release.install(values)
    pod = wait_ready(kube_cluster, release.namespace)
    policy = client.PolicyV1Api(kube_cluster.api_client())

    def budget(allowed: int) -> bool:
        pdbs = policy.list_namespaced_pod_disruption_budget(release.namespace).items
        if len(pdbs) != 1:
            return False
        pdb = pdbs[0]
        s = pdb.status
        return bool(
            s is not None
            and s.observed_generation == pdb.metadata.generation
            and s.current_healthy == 1
            and (s.disruptions_allowed or 0) == allowed
        )

    wait_for(lambda: budget(0), timeout=30, message="the PDB, observed, allows no disruption")
    api = core(kube_cluster)

    def evict(name: str) -> None:
        api.create_namespaced_pod_eviction(
            name,
            release.namespace,
            client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=release.namespace)),
        )

    with pytest.raises(client.ApiException) as refused:
        evict(pod.metadata.name)
    assert refused.value.status == 429, refused.value.body
    assert "disruption budget" in str(refused.value.body).lower()
    # the pod keeps running: the same one, not leaving, never restarted, still consuming
    kept = api.read_namespaced_pod(pod.metadata.name, release.namespace)
    assert kept.metadata.uid == pod.metadata.uid and kept.metadata.deletion_timestamp is None
    assert kept.status.container_statuses[0].restart_count == 0
    node_nsqd.publish("after-the-refusal")
    wait_for(
        lambda: node_nsqd.finished() == 1,
        timeout=30,
        message=lambda: f"the kept pod consumes: {node_nsqd.channel()}",
    )
    assert ready_pods(kube_cluster, release.namespace)[0].metadata.uid == pod.metadata.uid
    # the refusal was the budget's: once it allows one disruption the eviction goes through
    release.upgrade({**values, "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1}})
    wait_for(lambda: budget(1), timeout=30, message="the PDB, observed, allows one disruption")
    start = time.monotonic()
    evict(pod.metadata.name)
    wait_ready(kube_cluster, release.namespace, other_than=pod.metadata.name)
    FIGURES["evicted pod replaced and Ready"] = f"{time.monotonic() - start:.1f} s"
    node_nsqd.publish("after-the-eviction")
    wait_for(
        lambda: "after-the-eviction" in node_nsqd.handled_bodies(),
        timeout=30,
        message=lambda: f"the replacement consumes: {node_nsqd.channel()}",
    )


def test_sigkill_of_the_container_loses_nothing(
    kube_cluster: KubeCluster, app_image: AppImage, node_nsqd: NodeNsqd, release: Release
) -> None:
    """SIGKILL from the runtime mid-stream: nsqd redelivers what was in flight, the
    kubelet restarts the container and it is Ready again."""
    values = base_values(
        app_image,
        extraEnv=[*base_values(app_image)["extraEnv"], {"name": "HANDLE_SECONDS", "value": "0.5"}],
        settings={"msg_timeout": 5},
    )
    release.install(values)
    pod = wait_ready(kube_cluster, release.namespace)
    sent = [f"kill-{i:04d}" for i in range(100)]
    for body in sent:
        node_nsqd.publish(body)
    wait_for(
        lambda: node_nsqd.channel().get("in_flight_count", 0) >= 10,
        timeout=30,
        message=lambda: f"messages in flight: {node_nsqd.channel()}",
    )
    container_id = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
    in_flight = node_nsqd.channel()["in_flight_count"]
    subprocess.run(
        [*kube_cluster.ctr(), "tasks", "kill", "--signal", "SIGKILL", container_id],
        check=True,
        timeout=30,
    )

    def restarted() -> Any:
        (p,) = core(kube_cluster).list_namespaced_pod(release.namespace).items
        s = p.status.container_statuses[0]
        return p if s.restart_count >= 1 and s.ready else None

    start = time.monotonic()
    wait_for(
        restarted,
        timeout=90,
        interval=0.2,
        message=lambda: pods_summary(kube_cluster, release.namespace),
    )
    FIGURES["SIGKILLed container Ready again"] = f"{time.monotonic() - start:.1f} s"
    duplicates, _ = check_nothing_lost(node_nsqd, sent)
    channel = node_nsqd.channel()
    FIGURES["SIGKILL"] = (
        f"{in_flight} in flight at the kill, 0 lost, {duplicates} duplicated;"
        f" nsqd timeout_count {channel['timeout_count']}, requeue_count {channel['requeue_count']}"
    )
    assert channel["timeout_count"] + channel["requeue_count"] >= 1, channel
    assert duplicates <= in_flight
