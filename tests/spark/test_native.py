"""The kubernetes-native runner's driver pod, as written (no cluster: tests/cluster runs
it on real kubelets): the same name, labels, annotations and env as the SparkApplication,
the Spark properties that place the executors, the operator's pod templates merged."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqworker.errors import ConfigurationError
from nsqworker.settings import Settings
from nsqworker.spark.job import JobContext, SecretRef, SparkJob
from nsqworker.spark.kubernetes import application_body, application_name
from nsqworker.spark.native import DRIVER_CONTAINER, NativeKubernetesRunner, driver_pod_body

CTX = JobContext("clicks", "daily", "0a1b2c3d4e5f6789", 1, "pipeline.sessionize")
JOB = SparkJob(
    app="local:///opt/jobs/job.py",
    args=["--day", "2026-11-23"],
    conf={"spark.sql.shuffle.partitions": 4, "spark.ui.enabled": False},
    name="sessionize",
    py_files=["local:///opt/jobs/lib.zip"],
    env={"MODE": "daily", "TOKEN": SecretRef("creds", "token")},
)


def body(**more: object) -> dict[str, object]:
    name = application_name(CTX.topic, CTX.channel, CTX.message_id)
    return driver_pod_body(
        JOB, CTX, name=name, namespace="jobs", image="spark:1", service_account="spark", **more
    )  # type: ignore[arg-type]


def conf_of(pod: dict) -> dict[str, str]:
    args = pod["spec"]["containers"][0]["args"]
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")


def test_the_driver_pod_carries_what_the_spark_application_carries() -> None:
    pod = body()
    app = application_body(
        JOB, CTX, name=pod["metadata"]["name"], namespace="jobs", image="spark:1",
        service_account="spark", ttl=60, spark_version="4.1.4",
    )  # fmt: skip
    assert pod["metadata"]["name"] == app["metadata"]["name"]
    assert pod["metadata"]["annotations"] == app["metadata"]["annotations"]
    assert pod["metadata"]["labels"] == {**app["metadata"]["labels"], "spark-role": "driver"}
    (container,) = pod["spec"]["containers"]
    assert container["name"] == DRIVER_CONTAINER and container["image"] == "spark:1"
    for env in app["spec"]["driver"]["env"]:
        assert env in container["env"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "spark"
    assert container["args"][-3:] == ["local:///opt/jobs/job.py", "--day", "2026-11-23"]
    assert container["args"][-5:-3] == ["--py-files", "local:///opt/jobs/lib.zip"]


def test_spark_places_the_executors_from_the_driver_pod() -> None:
    pod = body()
    conf = conf_of(pod)
    assert conf["spark.kubernetes.namespace"] == "jobs"
    assert conf["spark.kubernetes.container.image"] == "spark:1"
    assert conf["spark.kubernetes.driver.pod.name"] == pod["metadata"]["name"]  # owner
    assert conf["spark.sql.shuffle.partitions"] == "4" and conf["spark.ui.enabled"] == "false"
    assert conf["spark.app.name"] == "sessionize"
    assert conf["spark.executorEnv.MODE"] == "daily"
    assert conf["spark.kubernetes.executor.secretKeyRef.TOKEN"] == "creds:token"
    assert "TOKEN" not in str([e for e in conf if "executorEnv" in e])
    assert conf["spark.kubernetes.executor.label.nsqworker.io/topic"] == "clicks"
    command = " ".join(pod["spec"]["containers"][0]["command"])
    assert "--deploy-mode client" in command and "spark.driver.host=${NSQWORKER_POD_IP}" in command


def test_a_job_cannot_move_its_executors_elsewhere() -> None:
    hostile = SparkJob(app="local:///a.py", conf={"spark.kubernetes.namespace": "kube-system"})
    name = application_name(CTX.topic, CTX.channel, CTX.message_id)
    pod = driver_pod_body(
        hostile, CTX, name=name, namespace="jobs", image="spark:1", service_account="spark"
    )
    assert conf_of(pod)["spark.kubernetes.namespace"] == "jobs"


def test_the_operators_templates_are_merged() -> None:
    template = {
        "metadata": {"labels": {"team": "data"}},
        "spec": {
            "hostNetwork": True,
            "volumes": [{"name": "data", "hostPath": {"path": "/srv"}}],
            "restartPolicy": "Always",
            "containers": [
                {
                    "name": DRIVER_CONTAINER,
                    "volumeMounts": [{"name": "data", "mountPath": "/srv"}],
                    "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}],
                }
            ],
        },
    }
    pod = body(driver_template=template, executor_template="kind: Pod\n")
    spec = pod["spec"]
    assert spec["hostNetwork"] is True and spec["volumes"][0]["name"] == "data"
    assert spec["restartPolicy"] == "Never"  # retries belong to the broker
    container = spec["containers"][0]
    assert container["volumeMounts"] == [{"name": "data", "mountPath": "/srv"}]
    names = [e["name"] for e in container["env"]]
    assert names[0] == "KUBERNETES_SERVICE_HOST" and "NSQWORKER_EXECUTOR_TEMPLATE" in names
    assert pod["metadata"]["labels"]["team"] == "data"


def test_settings_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="spark_image"):
        NativeKubernetesRunner.from_settings(Settings(spark_runner="kubernetes-native"))
    bad = tmp_path / "t.yaml"
    bad.write_text("kind: Deployment\n")
    with pytest.raises(ConfigurationError, match=r"spark_driver_template: .* is not a Pod"):
        NativeKubernetesRunner.from_settings(
            Settings(
                spark_runner="kubernetes-native", spark_image="i", spark_driver_template=str(bad)
            )
        )
