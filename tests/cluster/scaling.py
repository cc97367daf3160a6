"""KEDA on the real cluster: values, a watch of the Deployment's replicas, a backlog.

:class:`ScaleWatch` polls the Deployment (its ``spec.replicas``, what the HPA KEDA made
asked for, and how many pods are Ready) and keeps the timeline; the tests read the
times of the first step up, of reaching the maximum and of the way back from it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsqworker.testing import wait_for
from nsqworker.testing.keda import KedaRunner
from nsqworker.testing.kube_cluster import KubeCluster
from tests.cluster.conftest import (
    BREAK,
    CHANNEL,
    FIGURES,
    TOPIC,
    AppImage,
    Release,
    base_values,
)
from tests.cluster.pods import wait_ready

BACKLOG = 6000
"""Messages of the KEDA tests' backlog: about a minute's work for one pod."""
HANDLE_SECONDS = 0.2
"""A handler's time in the KEDA tests: 20 at once, about 100 messages a second a pod."""

MAX_REPLICAS = 3
"""One pod per node on the host network: the cluster's three nodes."""
POLLING = 5
"""KEDA's pollingInterval in these tests (seconds; the chart's default is 30)."""
WINDOW = 30
"""The chart's default HPA scale-down stabilization window (keda.behavior), seconds."""
HPA_SYNC = 15
"""kube-controller-manager's --horizontal-pod-autoscaler-sync-period (its default)."""


def keda_values(
    image: AppImage, transport: str, handle_seconds: float, **more: Any
) -> dict[str, Any]:
    """The chart's ScaledObject on: 1 to 3 replicas, polled every 5 s, the chart's own
    behavior (scale down 30 s after the backlog is gone), handlers of ``handle_seconds``."""
    values = base_values(image, **more)
    values["extraEnv"] = [
        *values["extraEnv"],
        {"name": "HANDLE_SECONDS", "value": str(handle_seconds)},
    ]
    channel = "nobody-reads-this" if BREAK == "keda-trigger" else CHANNEL
    values["transport"] = transport
    values["keda"] = {
        "enabled": True,
        "minReplicaCount": 1,
        "maxReplicaCount": MAX_REPLICAS,
        "pollingInterval": POLLING,
        "channels": [{"topic": TOPIC, "channel": channel}],
    }
    if BREAK == "keda-behavior":
        values["keda"]["behavior"] = None
    return values


@dataclass
class Sample:
    """One look at the Deployment: seconds since the watch began, asked and Ready pods."""

    at: float
    wanted: int
    ready: int


class ScaleWatch(threading.Thread):
    """The Deployment's replicas every 0.25 s, from ``start()`` until ``stop()``."""

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        super().__init__(daemon=True)
        from kubernetes import client

        self.apps = client.AppsV1Api(cluster.api_client())
        self.namespace = namespace
        self.samples: list[Sample] = []
        self.t0 = time.monotonic()
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                (d,) = self.apps.list_namespaced_deployment(self.namespace).items
                self.samples.append(
                    Sample(
                        time.monotonic() - self.t0,
                        d.spec.replicas or 0,
                        d.status.ready_replicas or 0,
                    )
                )
            except Exception as exc:  # a blip of the API server: the next look counts
                self.error = exc
            self.halt.wait(0.25)

    def stop(self) -> None:
        """End the watch; raise the last error if it never saw the Deployment."""
        self.halt.set()
        self.join()
        if self.error is not None and not self.samples:
            raise self.error

    def now(self) -> float:
        """Seconds since the watch began."""
        return time.monotonic() - self.t0

    def first(self, predicate: Any, after: float = 0.0) -> float | None:
        """When a sample after ``after`` first met ``predicate``; None if none did yet."""
        for s in list(self.samples):
            if s.at >= after and predicate(s):
                return s.at
        return None

    def wait(self, predicate: Any, timeout: float, what: str, after: float = 0.0) -> float:
        """Wait for a sample meeting ``predicate``; return its time."""
        return float(
            wait_for(
                lambda: self.first(predicate, after),
                timeout=timeout,
                interval=0.25,
                message=lambda: f"{what}; replicas so far: {self.timeline()}",
            )
        )

    def timeline(self) -> str:
        """The changes of (asked, Ready), with their times."""
        out, last = [], None
        for s in list(self.samples):
            if (s.wanted, s.ready) != last:
                out.append(f"{s.at:.1f}s {s.wanted}/{s.ready}")
                last = (s.wanted, s.ready)
        return ", ".join(out)

    def least_wanted(self, start: float, end: float) -> int:
        """The fewest replicas asked for between ``start`` and ``end``."""
        return min((s.wanted for s in self.samples if start <= s.at <= end), default=0)


def wait_scaled_object_ready(cluster: KubeCluster, keda: KedaRunner, namespace: str) -> str:
    """Wait until KEDA took the chart's ScaledObject (Ready) and made its HPA; return
    the HPA's name."""
    from kubernetes import client

    custom = client.CustomObjectsApi(cluster.api_client())
    auto = client.AutoscalingV2Api(cluster.api_client())

    def ready() -> str | None:
        (so,) = custom.list_namespaced_custom_object(
            "keda.sh", "v1alpha1", namespace, "scaledobjects"
        )["items"]
        conditions = so.get("status", {}).get("conditions", [])
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return None
        hpas = auto.list_namespaced_horizontal_pod_autoscaler(namespace).items
        return hpas[0].metadata.name if hpas else None

    return str(
        wait_for(
            ready,
            timeout=60,
            interval=0.5,
            message=lambda: cluster.kubectl(
                "get", "scaledobject,hpa", "-n", namespace, "-o", "yaml", check=False
            )[-3000:],
        )
    )


def scale_up_and_back(
    cluster: KubeCluster,
    keda: KedaRunner,
    release: Release,
    values: dict[str, Any],
    publish: Callable[[], None],
    drained: Callable[[], bool],
    label: str,
) -> None:
    """Install with KEDA on, publish the backlog, and check the Deployment goes from 1 to
    3 replicas (3 Ready pods) and, once the backlog is handled, back to 1 within the
    chart's scale-down window (30 s) plus one HPA sync and one KEDA poll, never below 3
    while the backlog lasts."""
    release.install(values)
    wait_ready(cluster, release.namespace)
    hpa = wait_scaled_object_ready(cluster, keda, release.namespace)
    watch = ScaleWatch(cluster, release.namespace)
    watch.start()
    try:
        published = watch.now()
        publish()
        up = watch.wait(lambda s: s.wanted > 1, timeout=120, what=f"{hpa} scales up")
        top = watch.wait(
            lambda s: s.wanted == MAX_REPLICAS and s.ready == MAX_REPLICAS,
            timeout=120,
            what=f"{MAX_REPLICAS} Ready pods",
        )
        FIGURES[f"cluster RAM with {MAX_REPLICAS} pods (KEDA on {label})"] = (
            f"{cluster.memory_bytes() / 2**20:.0f} MiB"
        )
        wait_for(drained, timeout=240, interval=0.5, message=f"the {label} backlog handled")
        gone = watch.now()
        bound = WINDOW + HPA_SYNC + POLLING + 30
        down = watch.wait(
            lambda s: s.wanted == 1,
            timeout=bound,
            after=top,
            what=f"back to 1 replica within {bound} s of the backlog's end",
        )
        watch.wait(lambda s: s.ready == 1, timeout=60, after=down, what="1 Ready pod again")
    finally:
        watch.stop()
    assert watch.least_wanted(top, gone) == MAX_REPLICAS, watch.timeline()
    assert down >= gone, watch.timeline()
    FIGURES[f"KEDA on {label}: {BACKLOG} messages"] = (
        f"first step up {up - published:.1f} s after the publish, {MAX_REPLICAS} Ready at"
        f" {top - published:.1f} s, backlog handled at {gone - published:.1f} s, back to 1"
        f" replica {down - gone:.1f} s later (timeline: {watch.timeline()})"
    )


async def publish_nats(url: str, subject: str, bodies: list[str]) -> None:
    """Publish ``bodies`` to JetStream, 500 at a time, each acknowledged by the stream:
    when this returns the stream holds every one (a core NATS publish may still be in
    flight, or dropped, when the backlog is counted)."""
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for i in range(0, len(bodies), 500):
            batch = bodies[i : i + 500]
            await asyncio.gather(*(js.publish(subject, b.encode(), timeout=30) for b in batch))
    finally:
        await nc.close()
