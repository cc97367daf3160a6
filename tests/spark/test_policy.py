"""What a message may not make a Spark job do (nsqworker/spark/policy.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nsqworker.spark import SparkJob, job_problems, local
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
        "spark.driver.defaultJavaOptions", "spark.executor.defaultJavaOptions",
        "spark.driver.resource.gpu.discoveryScript", "spark.executor.resource.fpga.discoveryScript",
        "spark.resources.discoveryPlugin", "spark.r.command", "spark.r.driver.command",
        "spark.hadoop.fs.s3a.endpoint", "spark.hadoop.fs.s3a.bucket.data.endpoint",
        "spark.hadoop.fs.s3a.endpoint.region", "spark.hadoop.fs.s3a.proxy.host",
        "spark.hadoop.fs.defaultFS", "spark.hadoop.fs.gs.storage.root.url",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
        "spark.hadoop.hadoop.security.credential.provider.path",
        "spark.hadoop.fs.s3a.aws.credentials.provider", "spark.security.credentials.hive.enabled",
    ],
)  # fmt: skip
def test_conf_that_runs_or_fetches_code_is_refused(app: str, key: str) -> None:
    (problem,) = job_problems(SparkJob(app, conf={key: "-XX:OnOutOfMemoryError=sh x"}), "local")
    assert f"conf key {key!r} may not be set by a job" in problem


def test_ordinary_conf_is_accepted(app: str) -> None:
    conf = {"spark.sql.shuffle.partitions": 8, "spark.executor.memory": "2g"}
    assert job_problems(SparkJob(app, conf=conf), "local") == []


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD", "JAVA_TOOL_OPTIONS", "PYTHONPATH", "PATH", "NSQWORKER_AUTH_SECRET",
        "GCONV_PATH", "OPENSSL_CONF", "OPENSSL_MODULES", "HTTP_PROXY", "HTTPS_PROXY",
        "http_proxy", "https_proxy", "ALL_PROXY", "no_proxy",
    ],
)  # fmt: skip
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
    monkeypatch.setattr(local, "spark_home", lambda: Path("/opt/spark"))
    runner = LocalRunner()
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


def test_kubernetes_app_uris_must_match_spark_app_uris() -> None:
    """Default: only files in the image (local://); other URIs need a pattern."""
    assert job_problems(SparkJob("local:///opt/app/job.py"), "kubernetes") == []
    for uri in ("s3a://data/jobs/r.py", "https://evil.example/job.py", "gs://x/y.py"):
        (problem,) = job_problems(SparkJob(uri), "kubernetes")
        assert f"app {uri!r} is not allowed by spark_app_uris (local://*)" in problem
    allowed = ["local://*", "s3a://data/jobs/*"]
    job = SparkJob("s3a://data/jobs/r.py", py_files=["s3a://data/other/lib.zip"])
    (problem,) = job_problems(job, "kubernetes", app_uris=allowed)
    assert "py_files[0] 's3a://data/other/lib.zip' is not allowed" in problem
    (dots,) = job_problems(
        SparkJob("s3a://data/jobs/../secret/r.py"), "kubernetes", app_uris=allowed
    )
    assert "is not allowed by spark_app_uris" in dots
    assert job_problems(SparkJob("s3a://data/jobs/r.py"), "kubernetes", app_uris=allowed) == []


def test_the_spark_app_uris_setting_is_a_list_of_uri_patterns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nsqworker.settings import Settings, SettingsError

    monkeypatch.setenv("NSQWORKER_SPARK_APP_URIS", "local://*, s3a://data/jobs/*")
    assert Settings().spark_app_uris == ["local://*", "s3a://data/jobs/*"]
    monkeypatch.delenv("NSQWORKER_SPARK_APP_URIS")
    assert Settings().spark_app_uris == ["local://*"]
    with pytest.raises(SettingsError, match="spark_app_uris"):
        Settings(spark_app_uris=["data/jobs/*"])
