"""The chart as users run it, on real kubelets: install, upgrade under load, evict, SIGKILL,
KEDA scaling on NSQ and NATS, the schedules' Lease across a deleted pod.

Every test that uses the ``kube_cluster`` fixture lives in this file (one xdist process,
one cluster: see nsqworker.testing.kube_cluster_plugin). The cluster has three nodes in a
namespace that holds only ``lo``: every pod runs with ``hostNetwork: true``, at most one
pod of a release per node. The brokers on the node keep the truth: each wait asks nsqd's
``/stats``, the NATS consumer's info or the API server for the value it checks, and the
handlers' echoes on the topic ``handled`` say what the pods saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from datetime import date
from typing import Any

import pytest

from examples.spark_pipeline.generate import generate, write
from nsqworker.testing import wait_for
from nsqworker.testing.keda import KedaRunner
from nsqworker.testing.kube_cluster import NODE_IP, KubeCluster
from tests.cluster.conftest import (
    CHANNEL,
    FIGURES,
    LOOKUPD_HTTP,
    NATS_MONITOR,
    NATS_PORT,
    TOPIC,
    AppImage,
    NodeNats,
    NodeNsqd,
    Release,
    base_values,
)
from tests.cluster.leases import check_console_lists, leader_pod, ticks
from tests.cluster.pods import (
    Publisher,
    check_nothing_lost,
    core,
    echoes_of,
    pods_summary,
    ready_pods,
    replica_sets,
    rolled_out,
    wait_ready,
)
from tests.cluster.scaling import (
    BACKLOG,
    HANDLE_SECONDS,
    keda_values,
    publish_nats,
    scale_up_and_back,
)
from tests.cluster.spark import JOB_NAMESPACE, PodLog, SparkSetup, dead_letters

pytestmark = pytest.mark.timeout(300)


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
    """helm upgrade (new config, then new image tag) of the one pod while 200 msgs/s flow,
    with the chart's own strategy (maxSurge 1, maxUnavailable 0): the new pod starts on
    another node, and the old one drains once it is Ready."""
    max_in_flight = 20  # tests/cluster/app's task
    values = base_values(app_image)
    release.install(values)
    pod = wait_ready(kube_cluster, release.namespace)
    deployment = kube_cluster.kubectl("get", "deploy", "-n", release.namespace, "-o", "yaml")
    assert "maxSurge: 1" in deployment and "maxUnavailable: 0" in deployment
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
            assert new.spec.node_name != pod.spec.node_name  # surge: both ran at once
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
        [
            *kube_cluster.ctr(kube_cluster.node_of_ip(pod.status.pod_ip)),
            *("tasks", "kill", "--signal", "SIGKILL", container_id),
        ],
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


def test_keda_scales_on_nsq_depth_and_back(
    kube_cluster: KubeCluster,
    app_image: AppImage,
    node_nsqd: NodeNsqd,
    keda: KedaRunner,
    release: Release,
) -> None:
    """The chart's ScaledObject on the real KEDA, nsq trigger through nsqlookupd: a backlog
    takes the Deployment from 1 to 3 replicas and back; each message handled once."""
    values = keda_values(app_image, "nsq", HANDLE_SECONDS)
    values["nsq"] = {"lookupdHttpAddresses": [f"{NODE_IP}:{LOOKUPD_HTTP}"], "nsqdTcpAddresses": []}
    sent = [f"keda-nsq-{i:05d}" for i in range(BACKLOG)]
    scale_up_and_back(
        kube_cluster,
        keda,
        release,
        values,
        publish=lambda: node_nsqd.mpublish(sent),
        drained=lambda: node_nsqd.drained(len(sent)),
        label="nsq",
    )
    duplicates, _ = check_nothing_lost(node_nsqd, sent)
    channel = node_nsqd.channel()
    assert duplicates == 0 and channel["timeout_count"] == 0, channel


def test_keda_scales_on_nats_pending_and_back(
    kube_cluster: KubeCluster,
    app_image: AppImage,
    node_nsqd: NodeNsqd,
    node_nats: NodeNats,
    keda: KedaRunner,
    release: Release,
) -> None:
    """The same on NATS JetStream: the stream made beforehand by an operator (the nats
    CLI), KEDA's nats-jetstream trigger reading the server's monitoring port; the
    consumer's ack floor reaches the last message, each handled once."""
    stream = "orders"
    node_nats.nats("stream", "add", stream, "--subjects", TOPIC, "--defaults")
    values = keda_values(app_image, "nats", HANDLE_SECONDS)
    values["nats"] = {
        "servers": [f"nats://{NODE_IP}:{NATS_PORT}"],
        "monitoringEndpoint": f"{NODE_IP}:{NATS_MONITOR}",
    }
    sent = [f"keda-nats-{i:05d}" for i in range(BACKLOG)]

    def publish() -> None:
        asyncio.run(publish_nats(node_nats.url, TOPIC, sent))
        info = json.loads(node_nats.nats("stream", "info", stream, "--json"))
        assert info["state"]["messages"] == len(sent), info["state"]

    def drained() -> bool:
        c = node_nats.consumer(stream, CHANNEL)
        return bool(
            c["num_pending"] == 0
            and c["num_ack_pending"] == 0
            and c["ack_floor"]["stream_seq"] == len(sent)
        )

    scale_up_and_back(kube_cluster, keda, release, values, publish, drained, label="nats")
    duplicates, _ = echoes_of(node_nsqd, sent)
    assert duplicates == 0, f"{duplicates} handled twice"
    assert node_nats.consumer(stream, CHANNEL)["num_redelivered"] == 0


def test_schedule_fires_each_second_once_across_a_deleted_leader_and_the_console_finds_the_pods(
    kube_cluster: KubeCluster, app_image: AppImage, node_nsqd: NodeNsqd, release: Release
) -> None:
    """Two replicas with a schedule every second elect a leader on the chart's Lease
    (its Role, the pods' service-account token); the leader pod is deleted (drained) and
    its replacement starts on the third node: each second from the first tick to the
    last fires once. ``nsqworker console --kubernetes-selector`` lists exactly the
    release's Ready pods, read through the API server as the chart's console does."""
    port = kube_cluster.server.rpartition(":")[2]
    values = base_values(
        app_image,
        tasks="clustertasks.scheduled",
        replicaCount=2,
        schedules={"enabled": True},
    )
    # no kube-proxy here: the pods reach the API server where it listens on the node
    values["extraEnv"] = [
        *values["extraEnv"],
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
    ]
    for topic in ("ticks",):
        node_nsqd.post("/topic/create", topic=topic)
        node_nsqd.post("/channel/create", topic=topic, channel=CHANNEL)
    release.install(values)
    pods = wait_for(
        lambda: len(r := ready_pods(kube_cluster, release.namespace)) == 2 and r,
        timeout=90,
        message=lambda: pods_summary(kube_cluster, release.namespace),
    )
    lease_name = f"{release.name}-nsqworker-schedules"
    leader = wait_for(
        lambda: leader_pod(kube_cluster, release.namespace, lease_name),
        timeout=60,
        message="a pod holds the schedules' Lease",
    )
    assert leader in {p.metadata.name for p in pods}
    check_console_lists(kube_cluster, release, {p.metadata.name for p in pods})
    wait_for(lambda: len(ticks(node_nsqd)) >= 5, timeout=30, message="five ticks handled")
    start = time.monotonic()
    kube_cluster.kubectl("delete", "pod", leader, "-n", release.namespace, "--wait=false")
    successor = wait_for(
        lambda: (p := leader_pod(kube_cluster, release.namespace, lease_name)) != leader and p,
        timeout=60,
        message="another pod takes the Lease",
    )
    FIGURES["schedule leader pod deleted, Lease taken by another"] = (
        f"{time.monotonic() - start:.1f} s"
    )
    wait_for(
        lambda: len(ready_pods(kube_cluster, release.namespace)) == 2,
        timeout=90,
        message=lambda: pods_summary(kube_cluster, release.namespace),
    )
    after = len(ticks(node_nsqd))
    wait_for(lambda: len(ticks(node_nsqd)) >= after + 10, timeout=40, message="ten more ticks")
    seen = ticks(node_nsqd)
    first, last = min(seen), max(seen)
    every = [first + i for i in range(last - first + 1)]
    missing = sorted(set(every) - set(seen))
    doubled = sorted(t for t in set(seen) if seen.count(t) > 1)
    FIGURES["schedule across a deleted leader pod"] = (
        f"{len(every)} seconds, {len(seen)} ticks handled, missing {missing}, doubled"
        f" {doubled}; leader {leader} then {successor}"
    )
    assert not missing and not doubled, FIGURES["schedule across a deleted leader pod"]


DAY = "2026-11-23"


def test_a_message_runs_the_pipeline_job_as_driver_and_executor_pods(
    kube_cluster: KubeCluster, node_nsqd: NodeNsqd, spark: SparkSetup
) -> None:
    """The Spark pipeline example's task with the kubernetes-native runner: a message
    starts a driver pod, which starts two executor pods; the reports land in the
    directory every pod mounts, the report is announced and the message FINed; the
    driver and executor pods are gone after."""
    write(spark.data / "clicks.jsonl", generate(date.fromisoformat(DAY)))
    reports = spark.data / "reports"
    for topic, channel in (("clicks_batches", "sessionize"), ("reports_ready", "verify")):
        node_nsqd.post("/topic/create", topic=topic)
        node_nsqd.post("/channel/create", topic=topic, channel=channel)
    worker = spark.start_worker(
        "spark-worker",
        "examples.spark_pipeline.tasks",
        {
            "SPARK_PIPELINE_APP": "local:///opt/pipeline/jobs/sessionize.py",
            "SPARK_PIPELINE_OUTPUT": str(reports),
        },
    )
    pods = PodLog(kube_cluster)
    pods.start()
    try:
        start = time.monotonic()
        body = json.dumps({"day": DAY, "input": str(spark.data / "clicks.jsonl")})
        node_nsqd.publish(body, topic="clicks_batches")
        wait_for(
            lambda: node_nsqd.finished("clicks_batches", "sessionize") == 1,
            timeout=240,
            interval=0.5,
            message=lambda: f"the job's FIN; pods {pods.seen}; worker: {worker.log_tail()}",
        )
        FIGURES["Spark pipeline job on pods: message to FIN"] = f"{time.monotonic() - start:.1f} s"
        FIGURES["cluster RAM after the Spark job"] = (
            f"{kube_cluster.memory_bytes() / 2**20:.0f} MiB"
        )
        wait_for(lambda: not spark.driver_pods(), timeout=60, message="the driver pod deleted")
        wait_for(
            lambda: not core(kube_cluster).list_namespaced_pod(JOB_NAMESPACE).items,
            timeout=90,
            message="the executor pods gone with their driver",
        )
    finally:
        pods.stop()
        worker.stop()
    assert pods.roles().count("driver") == 1 and pods.roles().count("executor") == 2, pods.seen
    counts = json.loads((reports / "_counts" / f"day={DAY}.json").read_text())
    assert counts["sessions"] > 0 and counts["daily"] == 1, counts
    assert node_nsqd.channel("reports_ready", "verify")["depth"] == 1
    channel = node_nsqd.channel("clicks_batches", "sessionize")
    assert channel["requeue_count"] == 0 and channel["timeout_count"] == 0, channel


def test_a_failing_driver_is_retried_then_dead_lettered_with_its_error(
    kube_cluster: KubeCluster,
    app_image: AppImage,
    node_nsqd: NodeNsqd,
    spark: SparkSetup,
    release: Release,
) -> None:
    """The worker as the chart runs it (``spark.kubernetes.runner: native``: its Role in
    the jobs' namespace, the pod templates mounted from its ConfigMap) with a job whose
    driver exits 3 at once: the message is retried once (max_attempts 2), then
    dead-lettered; each failure's reason, in the worker pod's log, carries the driver's
    own last log line and exit code."""
    for topic, channel in (("doomed", "spark"), ("doomed.dead", "verify")):
        node_nsqd.post("/topic/create", topic=topic)
        node_nsqd.post("/channel/create", topic=topic, channel=channel)
    values = base_values(app_image, tasks="clustertasks.sparktasks", spark=spark.chart_values())
    # no kube-proxy here: the worker reaches the API server where it listens on the node
    values["extraEnv"] = [
        *values["extraEnv"],
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": kube_cluster.server.rpartition(":")[2]},
    ]
    release.install(values)
    worker = wait_ready(kube_cluster, release.namespace).metadata.name

    def worker_log() -> str:
        return kube_cluster.kubectl("logs", worker, "-n", release.namespace, check=False)

    node_nsqd.publish("go", topic="doomed")
    wait_for(
        lambda: node_nsqd.channel("doomed.dead", "verify").get("depth") == 1,
        timeout=180,
        interval=0.5,
        message=lambda: f"one dead letter; worker: {worker_log()[-3000:]}",
    )
    wait_for(lambda: node_nsqd.finished("doomed", "spark") == 1, timeout=30)
    log = worker_log()
    (letter,) = dead_letters(kube_cluster, node_nsqd.nsq_tail, "doomed.dead", 1)
    envelope = json.loads(letter)
    assert envelope["attempts"] == 2 and envelope["reason"] == "max attempts exceeded", letter
    # both failures (the first retried, the second dead-lettered) name the driver's error
    assert log.count("the input is missing, giving up") >= 2 and "exit code 3" in log, log
    assert node_nsqd.channel("doomed", "spark")["requeue_count"] == 1
    wait_for(lambda: not spark.driver_pods(), timeout=60, message="no driver pod left")


def test_a_killed_worker_is_replaced_and_the_new_one_adopts_the_running_job(
    kube_cluster: KubeCluster, node_nsqd: NodeNsqd, spark: SparkSetup
) -> None:
    """SIGKILL the worker while its job's driver runs; nsqd redelivers the message to
    a new worker, which adopts the same driver pod (no second job) and FINs it."""
    (spark.data / "reports-kill").mkdir(exist_ok=True)
    write(spark.data / "clicks.jsonl", generate(date.fromisoformat(DAY)))
    node_nsqd.post("/topic/create", topic="clicks_batches")
    node_nsqd.post("/channel/create", topic="clicks_batches", channel="sessionize")
    env = {
        "SPARK_PIPELINE_APP": "local:///opt/pipeline/jobs/sessionize.py",
        "SPARK_PIPELINE_OUTPUT": str(spark.data / "reports-kill"),
        "NSQWORKER_MSG_TIMEOUT": "10",
    }
    first = spark.start_worker("spark-first", "examples.spark_pipeline.tasks", env)
    node_nsqd.publish(
        json.dumps({"day": DAY, "input": str(spark.data / "clicks.jsonl")}), topic="clicks_batches"
    )
    pods = PodLog(kube_cluster)
    pods.start()
    second = None
    try:
        driver = wait_for(
            lambda: [p for p in spark.driver_pods() if p.status.phase == "Running"],
            timeout=120,
            interval=0.3,
            message=lambda: f"a running driver pod; worker: {first.log_tail()}",
        )[0]
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        second = spark.start_worker("spark-second", "examples.spark_pipeline.tasks", env)
        wait_for(
            lambda: node_nsqd.finished("clicks_batches", "sessionize") == 1,
            timeout=240,
            interval=0.5,
            message=lambda: f"the adopted job's FIN; pods {pods.seen}",
        )
        wait_for(lambda: not spark.driver_pods(), timeout=60, message="the driver pod deleted")
    finally:
        pods.stop()
        first.stop()
        if second is not None:
            second.stop()
    drivers = [name for name, role in pods.seen.items() if role == "driver"]
    assert drivers == [driver.metadata.name], pods.seen  # one job: adopted, not restarted
    assert "adopted driver pod" in second.log_tail(200)
