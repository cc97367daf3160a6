"""What a message may not make a Spark job do (nsqworker/spark/policy.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nsqworker.spark import SparkJob, job_problems
from nsqworker.spark.local import LocalRunner
from nsqworker.spark.policy import masked_command


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("print('hi')\n")
    return "job.py"


@pytest.mark.parametrize(
    "key",
    [
        "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions", "spark.jars",
        "spark.jars.packages", "spark.kubernetes.driver.volumes.hostPath.x.mount.path",
        "spark.kubernetes.executor.podTemplateFile", "spark.plugins",
        "spark.executorEnv.LD_PRELOAD", "spark.kubernetes.container.image",
        "spark.kubernetes.authenticate.driver.serviceAccountName",
    ],
)  # fmt: skip
def test_conf_that_runs_or_fetches_code_is_refused(app: str, key: str) -> None:
    (problem,) = job_problems(SparkJob(app, conf={key: "-XX:OnOutOfMemoryError=sh x"}), "local")
    assert f"conf key {key!r} may not be set by a job" in problem


def test_ordinary_conf_is_accepted(app: str) -> None:
    conf = {"spark.sql.shuffle.partitions": 8, "spark.executor.memory": "2g"}
    assert job_problems(SparkJob(app, conf=conf), "local") == []


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "JAVA_TOOL_OPTIONS", "PYTHONPATH", "PATH", "NSQWORKER_AUTH_SECRET"]
)
def test_env_that_changes_what_runs_is_refused(app: str, name: str) -> None:
    (problem,) = job_problems(SparkJob(app, env={name: "x"}), "local")
    assert f"env name {name!r} may not be set by a job" in problem
    assert job_problems(SparkJob(app, env={"REPORT_DAY": "x"}), "local") == []


def test_app_paths_stay_under_the_roots(app: str, tmp_path: Path) -> None:
    outside = tmp_path.parent / "outside.py"
    outside.write_text("")
    for value in ("../outside.py", str(outside), "file://" + str(outside)):
        (problem,) = job_problems(SparkJob(value), "local")
        assert "is outside spark_app_roots" in problem, value
    assert job_problems(SparkJob(str(outside)), "local", roots=[tmp_path.parent]) == []
    (remote,) = job_problems(SparkJob("https://evil.example/job.py"), "local")
    assert "is remote" in remote


def test_spark_submit_does_not_inherit_the_workers_secrets(
    app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NSQWORKER_AUTH_SECRET", "top-secret-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cloud-key")
    runner = LocalRunner()
    runner._home = Path("/opt/spark")
    env = runner.environment(SparkJob(app, env={"REPORT_DAY": "1"}))
    assert "NSQWORKER_AUTH_SECRET" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["REPORT_DAY"] == "1" and env["PATH"] == os.environ["PATH"]


def test_debug_command_masks_secret_looking_conf() -> None:
    command = ["spark-submit", "--conf", "spark.hadoop.fs.s3a.secret.key=abc", "--conf",
               "spark.sql.shuffle.partitions=8", "app.py"]  # fmt: skip
    assert masked_command(command) == [
        "spark-submit", "--conf", "spark.hadoop.fs.s3a.secret.key=**********", "--conf",
        "spark.sql.shuffle.partitions=8", "app.py",
    ]  # fmt: skip


def test_secret_env_is_a_secret_key_ref_on_kubernetes(app: str) -> None:
    from nsqworker.spark import SecretRef
    from nsqworker.spark.job import JobContext
    from nsqworker.spark.kubernetes import application_body

    job = SparkJob("local:///opt/r.py", env={"DB_PASSWORD": SecretRef("db", "password"), "A": "1"})
    assert job_problems(job, "kubernetes") == []
    ctx = JobContext("clicks", "spark", "0a1b2c3d4e5f6a7b", 1, "svc.daily")
    body = application_body(
        job, ctx, name="n", namespace="jobs", image="img:1", service_account="sa",
        ttl=600.0, spark_version="3.5.7",
    )  # fmt: skip
    assert body["spec"]["driver"]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
    ]
    (local,) = job_problems(SparkJob(app, env={"X": SecretRef("db", "password")}), "local")
    assert "the local runner has no Kubernetes Secrets" in local
    (bad,) = job_problems(
        SparkJob("local:///r.py", env={"X": SecretRef("Bad_Name", "k")}), "kubernetes"
    )
    assert "not a Secret name and key" in bad
