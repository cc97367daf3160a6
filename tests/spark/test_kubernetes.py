"""The Kubernetes runner against a real kube-apiserver with the SparkApplication CRD.

No Spark operator runs: :class:`Operator` below plays it, writing RUNNING, then
COMPLETED or FAILED through the status subresource, as the operator would. Messages go
through a real nsqd and Worker, so FIN, REQ, drain and redelivery are the real ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.spark import SparkJob, runner_for, spark_task
from nsqworker.spark.kubernetes import GROUP, PLURAL, VERSION, KubernetesRunner, application_name
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

CRD = Path(__file__).parents[1] / "crds" / "sparkapplication.yaml"
TOPIC, CHANNEL = "spark_k8s", "spark"
APP = "local:///opt/spark/jobs/report.py"


class Operator:
    """Plays the Spark operator: reads applications, writes their status."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    def applications(self) -> list[dict[str, Any]]:
        listing = self.api.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        return list(listing["items"])

    def set_state(self, name: str, state: str, error: str = "") -> None:
        obj = self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        app_state = {"state": state} | ({"errorMessage": error} if error else {})
        obj["status"] = {"applicationState": app_state, "sparkApplicationId": f"spark-{name}"}
        self.api.replace_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, obj
        )


@pytest.fixture
def cluster(kube_control_plane: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    plane = kube_control_plane
    plane.apply_crds(CRD)
    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    yield plane


@pytest.fixture
def namespace(cluster: Any, request: pytest.FixtureRequest) -> str:
    name = "spark-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    cluster.create_namespace(name)
    return name


@pytest.fixture
def operator(cluster: Any, namespace: str) -> Operator:
    from kubernetes import client

    return Operator(client.CustomObjectsApi(cluster.api_client()), namespace)


def settings_for(nsqd: NsqdProcess, namespace: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nsqd_tcp_addresses": [nsqd.tcp_address],
        "spark_runner": "kubernetes",
        "spark_namespace": namespace,
        "spark_image": "registry.example/spark-jobs:1.0",
        "spark_service_account": "spark-driver",
        "spark_ttl": 1800,
        "retry_delay": 0.1,
        "backoff_multiplier": 0.0,
        "drain_timeout": 30.0,
        "health_port": 0,
    }
    values.update(overrides)
    return Settings(**values)


def k8s_runner(settings: Settings, poll_interval: float = 0.5) -> KubernetesRunner:
    runner = runner_for(settings)
    assert isinstance(runner, KubernetesRunner)
    runner.poll_interval = poll_interval
    return runner


def declare(
    registry: Registry, dead: list[str], job_timeout: float | None = None, **options: Any
) -> None:
    @spark_task(
        TOPIC, channel=CHANNEL, registry=registry,
        on_dead_letter=lambda m, r: dead.append(r), **options,
    )  # fmt: skip
    def report(msg: Message) -> SparkJob:
        day = msg.json()["day"]
        return SparkJob(
            APP, ["--day", day], conf={"spark.executor.instances": 2}, env={"DAY": day},
            timeout=job_timeout,
        )  # fmt: skip


def prepare(nsqd: NsqdProcess) -> NsqdProcess:
    nsqd.create_channel(TOPIC, CHANNEL)
    return nsqd.restart()


def client_count(nsqd: NsqdProcess, key: str) -> int:
    stats = nsqd.channel_stats(TOPIC, CHANNEL) or {}
    return sum(c.get(key, 0) for c in stats.get("clients") or [])


async def test_create_runs_and_completes(
    nsqd: NsqdProcess, namespace: str, operator: Operator
) -> None:
    nsqd = prepare(nsqd)
    registry, dead = Registry(), []
    declare(registry, dead)
    settings = settings_for(nsqd, namespace)
    k8s_runner(settings)
    async with Worker(registry, settings):
        nsqd.publish(TOPIC, b'{"day": "2026-11-23"}')
        (app,) = await wait_until(operator.applications, 15, "the SparkApplication")
        name = app["metadata"]["name"]
        operator.set_state(name, "RUNNING")
        await asyncio.sleep(0.5)
        assert client_count(nsqd, "finish_count") == 0  # still running: not FINed
        operator.set_state(name, "COMPLETED")
        await wait_until(lambda: client_count(nsqd, "finish_count") == 1, 15, "the FIN")
    assert dead == []
    meta, spec = app["metadata"], app["spec"]
    message_id = meta["annotations"]["nsqworker.io/message-id"]
    assert name == application_name(TOPIC, CHANNEL, message_id)
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "nsqworker"
    assert meta["labels"]["nsqworker.io/topic"] == TOPIC
    assert meta["annotations"]["nsqworker.io/channel"] == CHANNEL
    # What the API server kept after pruning to the CRD's schema: every field survived.
    assert spec["timeToLiveSeconds"] == 1800
    assert spec["restartPolicy"] == {"type": "Never"}
    assert spec["mainApplicationFile"] == APP and spec["arguments"] == ["--day", "2026-11-23"]
    assert spec["sparkConf"] == {"spark.executor.instances": "2"}
    assert spec["driver"]["serviceAccount"] == "spark-driver"
    assert spec["driver"]["env"] == [{"name": "DAY", "value": "2026-11-23"}]
    assert spec["image"] == "registry.example/spark-jobs:1.0" and spec["type"] == "Python"


async def test_a_failure_of_the_last_attempt_is_dead_lettered_at_once(
    nsqd: NsqdProcess, namespace: str, operator: Operator
) -> None:
    nsqd = prepare(nsqd)
    registry, dead = Registry(), []
    declare(registry, dead, max_attempts=1)
    settings = settings_for(nsqd, namespace)
    k8s_runner(settings)
    async with Worker(registry, settings):
        nsqd.publish(TOPIC, b'{"day": "2026-11-24"}')
        (app,) = await wait_until(operator.applications, 15, "the SparkApplication")
        operator.set_state(app["metadata"]["name"], "FAILED", "driver OOMKilled")
        await wait_until(lambda: dead, 15, "the dead letter")
        requeued = (nsqd.channel_stats(TOPIC, CHANNEL) or {})["requeue_count"]
    assert requeued == 0  # its one allowed attempt failed: dead-lettered then
    assert dead == ["max attempts exceeded"]


async def test_stop_leaves_the_job_running_and_redelivery_adopts_it(
    nsqd: NsqdProcess, namespace: str, operator: Operator
) -> None:
    nsqd = prepare(nsqd)
    registry, dead = Registry(), []
    declare(registry, dead)
    settings = settings_for(nsqd, namespace, drain_timeout=30.0)
    k8s_runner(settings)
    worker = Worker(registry, settings)
    await worker.start()
    nsqd.publish(TOPIC, b'{"day": "2026-11-25"}')
    (app,) = await wait_until(operator.applications, 15, "the SparkApplication")
    name = app["metadata"]["name"]
    operator.set_state(name, "RUNNING")
    started = time.monotonic()
    await worker.stop()  # what SIGTERM does; drain_timeout is 30 s
    assert time.monotonic() - started < 3.0  # requeued at once, not after the drain
    stats = nsqd.channel_stats(TOPIC, CHANNEL) or {}
    assert stats["requeue_count"] == 1 and stats["depth"] + stats["deferred_count"] == 1
    (still,) = operator.applications()  # left running
    assert still["metadata"]["uid"] == app["metadata"]["uid"]

    async with Worker(registry, settings):  # the next worker gets the redelivery
        await wait_until(lambda: client_count(nsqd, "message_count") == 1, 15, "redelivery")
        await asyncio.sleep(0.5)
        (adopted,) = operator.applications()  # no second application
        assert adopted["metadata"]["uid"] == app["metadata"]["uid"]
        operator.set_state(name, "COMPLETED")
        await wait_until(lambda: client_count(nsqd, "finish_count") == 1, 15, "the FIN")
    assert dead == []


@pytest.mark.parametrize("where", ["task", "job"])
async def test_a_job_past_its_time_limit_is_deleted_retried_then_dead_lettered(
    nsqd: NsqdProcess, namespace: str, operator: Operator, where: str
) -> None:
    """The runner is detached, yet at ``@spark_task(timeout=)`` or ``SparkJob(timeout=)``
    the SparkApplication is deleted, not left running; each redelivery starts a new one
    and after ``max_attempts`` the message is dead-lettered with nothing left behind."""
    nsqd = prepare(nsqd)
    registry, dead = Registry(), []
    if where == "task":
        declare(registry, dead, max_attempts=2, timeout=2.0)
    else:
        declare(registry, dead, job_timeout=2.0, max_attempts=2)
    settings = settings_for(nsqd, namespace)
    k8s_runner(settings)
    seen: set[str] = set()

    async def run_them() -> None:  # the operator: every application it sees runs
        while True:
            for app in await asyncio.to_thread(operator.applications):
                uid = app["metadata"]["uid"]
                if uid not in seen:
                    seen.add(uid)
                    await asyncio.to_thread(operator.set_state, app["metadata"]["name"], "RUNNING")
            await asyncio.sleep(0.1)

    running = asyncio.ensure_future(run_them())
    try:
        async with Worker(registry, settings):
            nsqd.publish(TOPIC, b'{"day": "2026-11-26"}')
            await wait_until(lambda: dead, 30, "the dead letter")
            await wait_until(lambda: client_count(nsqd, "finish_count") == 1, 15, "the FIN")
            left = operator.applications()
            requeued = (nsqd.channel_stats(TOPIC, CHANNEL) or {})["requeue_count"]
    finally:
        running.cancel()
    assert len(seen) == 2  # a new application per attempt: the first was deleted
    assert left == []
    assert requeued == 1  # the second failure was the last: dead-lettered then
    assert dead == ["max attempts exceeded"]


async def test_broken_watch_falls_back_to_polling(
    nsqd: NsqdProcess, namespace: str, operator: Operator
) -> None:
    nsqd = prepare(nsqd)
    registry, dead = Registry(), []
    declare(registry, dead)
    settings = settings_for(nsqd, namespace)
    runner = k8s_runner(settings, poll_interval=1.5)
    async with Worker(registry, settings):
        nsqd.publish(TOPIC, b'{"day": "2026-11-26"}')
        (app,) = await wait_until(operator.applications, 15, "the SparkApplication")
        operator.set_state(app["metadata"]["name"], "RUNNING")
        await wait_until(lambda: runner.watch_stats(namespace), 10, "the watch")
        errors = runner.watch_stats(namespace)["watch_errors"]
        # the watch thread may still be connecting: cut once a connection is open
        await wait_until(runner.interrupt_watches, 10, "an open watch connection to cut")
        await wait_until(
            lambda: runner.watch_stats(namespace)["watch_errors"] > errors, 10, "the watch error"
        )
        operator.set_state(app["metadata"]["name"], "COMPLETED")  # while no watch is open
        await wait_until(lambda: client_count(nsqd, "finish_count") == 1, 15, "the FIN")
    assert runner.watch_stats(namespace)["by_poll"] >= 1
    assert dead == []


async def test_many_waiting_jobs_use_a_fixed_number_of_threads(
    cluster: Any, namespace: str, operator: Operator
) -> None:
    """200 jobs waiting at once: one watch thread and the small pool, not 200 threads."""
    import threading

    from nsqworker.spark.job import JobContext, JobState

    runner = KubernetesRunner(
        cluster.api_client(), namespace=namespace, image="img:1", service_account="sa", ttl=60
    )

    def runner_threads() -> int:
        return sum(namespace in t.name for t in threading.enumerate())

    before = threading.active_count()
    jobs = 200
    refs = await asyncio.gather(
        *(
            runner.submit(SparkJob(APP), JobContext(TOPIC, CHANNEL, f"{n:016x}", 1, "t"))
            for n in range(jobs)
        )
    )
    waits = [asyncio.ensure_future(runner.wait(ref)) for ref in refs]
    await wait_until(lambda: runner.watch_stats(namespace), 10, "the watch")
    threads = threading.active_count() - before
    assert threads <= 4 + 1, threads  # the pool and the namespace's watch
    assert runner_threads() <= 4 + 1
    for ref in refs:
        await asyncio.to_thread(operator.set_state, ref.name, "COMPLETED")
    results = await asyncio.wait_for(asyncio.gather(*waits), 60)
    assert {r.state for r in results} == {JobState.SUCCEEDED}
    assert len({r.job_id for r in results}) == jobs == len(operator.applications())
    assert runner_threads() <= 4 + 1
    runner.close()
