"""The pure parts of nsqworker.spark, without Spark or a cluster: job checks, the
spark-submit command, finding Java, the SparkApplication name and body."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from nsqworker.errors import ConfigurationError
from nsqworker.spark.job import JobContext, JobState, SparkJob, job_problems
from nsqworker.spark.kubernetes import application_body, application_name, state_of
from nsqworker.spark.local import LocalRunner, find_java, require_java, spark_submit_command

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)  # apps must be under the worker's directory
    path = tmp_path / "job.py"
    path.write_text("print('hi')\n")
    return str(path)


# --- SparkJob checks ---------------------------------------------------------------------


def test_a_good_job_has_no_problems(app: str) -> None:
    job = SparkJob(app, ["--day", "2026-11-23"], conf={"spark.x": 8, "spark.y": True}, name="r")
    assert job_problems(job, "local") == []
    assert job.conf_strings() == {"spark.x": "8", "spark.y": "true"}


def test_missing_app_file_names_the_path(tmp_path: Path) -> None:
    (problem,) = job_problems(SparkJob(str(tmp_path / "nope.py")), "local", roots=[tmp_path])
    assert problem.startswith("app ") and "nope.py" in problem and "no such file" in problem


def test_relative_paths_resolve_from_cwd(app: str) -> None:
    folder, name = os.path.split(app)
    assert job_problems(SparkJob(name), "local", cwd=folder) == []
    assert job_problems(SparkJob("file://" + app), "local") == []
    (remote,) = job_problems(SparkJob("s3a://bucket/job.py"), "local")
    assert "is remote; the local runner runs files under the spark_app_roots only" in remote


@pytest.mark.parametrize(
    ("conf", "fragment"),
    [
        ({"spark.a": None}, "conf['spark.a'] = None is a NoneType"),
        ({"spark.a": {"b": 1}}, "is a dict"),
        ({"spark.a": "x\ny"}, "newline"),
        ({"spark.a": ""}, "empty"),
        ({"spark.a": float("nan")}, "not a finite number"),
        ({"bad key": "1"}, "not a Spark property name"),
        ("spark.a=1", "conf must be a mapping"),
    ],
)
def test_bad_conf_values(app: str, conf: object, fragment: str) -> None:
    problems = job_problems(SparkJob(app, conf=conf), "local")  # type: ignore[arg-type]
    assert len(problems) == 1 and fragment in problems[0], problems


def test_other_fields_checked(app: str) -> None:
    job = SparkJob(app, args="--day", env={"1X": "a"}, timeout=-1, py_files=["missing.zip"])  # type: ignore[arg-type]
    problems = job_problems(job, "local")
    assert any(p.startswith("args must be a list") for p in problems)
    assert any("env name '1X'" in p for p in problems)
    assert any(p.startswith("timeout must be") for p in problems)
    assert any(p.startswith("py_files[0] 'missing.zip'") for p in problems)
    assert job_problems("not a job", "local") == ["the handler returned str, not a SparkJob"]


def test_kubernetes_needs_uris() -> None:
    assert job_problems(SparkJob("local:///opt/app/job.py"), "kubernetes") == []
    remote = SparkJob("s3a://b/job.py", py_files=["s3a://b/lib.zip"])
    assert job_problems(remote, "kubernetes", app_uris=["local://*", "s3a://b/*"]) == []
    (problem,) = job_problems(SparkJob("jobs/report.py"), "kubernetes")
    assert "not a URI the driver can fetch" in problem and "local:///" in problem


# --- spark-submit command ------------------------------------------------------------------


def test_spark_submit_command() -> None:
    job = SparkJob(
        "jobs/r.py", ["--day", "d"], conf={"spark.b": 2, "spark.a": "x y"},
        py_files=["lib.zip", "util.py"],
    )  # fmt: skip
    assert spark_submit_command(job, spark_submit="/s/bin/spark-submit", master="local[2]", name="t") == [
        "/s/bin/spark-submit", "--master", "local[2]", "--name", "t",
        "--conf", "spark.a=x y", "--conf", "spark.b=2",
        "--py-files", "lib.zip,util.py", "jobs/r.py", "--day", "d",
    ]  # fmt: skip
    named = SparkJob("a.py", name="own")
    assert spark_submit_command(named, spark_submit="ss", master="m", name="t")[3:5] == [
        "--name",
        "own",
    ]


# --- Java ----------------------------------------------------------------------------------


def _fake_java(home: Path) -> Path:
    java = home / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return java


def test_find_java_order(tmp_path: Path) -> None:
    home = tmp_path / "jdk"
    _fake_java(home)
    on_path = tmp_path / "other"
    java = _fake_java(on_path)
    assert find_java({"JAVA_HOME": str(home), "PATH": str(java.parent)}) == (
        type(find_java({"JAVA_HOME": str(home)}))(str(home), "JAVA_HOME")
    )
    found = find_java({"JAVA_HOME": str(tmp_path / "broken"), "PATH": str(java.parent)})
    assert found is not None and found.source == "PATH" and found.home == str(on_path)
    assert find_java({"PATH": str(tmp_path / "empty")}) is None


def test_no_java_or_an_old_one_is_a_clear_error(tmp_path: Path) -> None:
    """Spark 4.1 needs Java 17+: no Java names what to set; Java 11 is refused by name;
    17 and 21 pass, and a home with no ``release`` file is given the benefit of doubt."""
    with pytest.raises(ConfigurationError, match=r"JAVA_HOME.*Java 17"):
        require_java({"PATH": str(tmp_path / "empty")})
    home = tmp_path / "jdk"
    _fake_java(home)
    assert require_java({"JAVA_HOME": str(home)}).major is None
    for release, ok in (
        ('"11.0.2"', False),
        ('"1.8.0_402"', False),
        ('"17.0.15"', True),
        ('"21"', True),
    ):
        (home / "release").write_text(f"IMPLEMENTOR=x\nJAVA_VERSION={release}\n")
        if ok:
            assert require_java({"JAVA_HOME": str(home)}).major == int(
                release.strip('"').split(".")[0]
            )
        else:
            with pytest.raises(ConfigurationError, match=r"needs Java 17 or newer.*is Java (11|8)"):
                require_java({"JAVA_HOME": str(home)})
    runner = LocalRunner(env={"PATH": str(tmp_path / "empty")})
    with pytest.raises(ConfigurationError, match="no Java runtime for Spark"):
        runner.environment(SparkJob("app.py"))


# --- SparkApplication name, body and state ---------------------------------------------------


def test_short_names_are_readable() -> None:
    assert (
        application_name("reports", "spark", "0a1b2c3d4e5f6a7b") == "reports-spark-0a1b2c3d4e5f6a7b"
    )


@pytest.mark.parametrize(
    ("topic", "channel"),
    [
        ("Clicks_Batches", "spark"),
        ("a" * 64, "b" * 64),
        ("9lives", "c"),
        ("t.x#ephemeral", "c#ephemeral"),
        ("___", "___"),
    ],
)
def test_names_are_dns_labels_and_deterministic(topic: str, channel: str) -> None:
    name = application_name(topic, channel, "0a1b2c3d4e5f6a7b")
    assert len(name) <= 63 and DNS_LABEL.match(name), name
    assert name == application_name(topic, channel, "0a1b2c3d4e5f6a7b")
    assert name != application_name(topic, channel, "0a1b2c3d4e5f6a7c")


def test_names_that_clean_alike_stay_apart() -> None:
    assert application_name("a_b", "c", "1" * 16) != application_name("a.b", "c", "1" * 16)


def test_application_body() -> None:
    job = SparkJob(
        "local:///opt/jobs/r.py", ["--day", "d"], conf={"spark.executor.instances": 2},
        name="daily", py_files=["local:///opt/jobs/lib.zip"], env={"B": "2", "A": "1"},
    )  # fmt: skip
    ctx = JobContext("clicks#ephemeral", "spark", "0a1b2c3d4e5f6a7b", 1, "svc.daily")
    body = application_body(
        job, ctx, name="n", namespace="jobs", image="img:1", service_account="sa",
        ttl=600.0, spark_version="3.5.7",
    )  # fmt: skip
    assert body["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert body["kind"] == "SparkApplication"
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"]) == ("n", "jobs")
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "nsqworker",
        "nsqworker.io/topic": "clicks_ephemeral",
        "nsqworker.io/channel": "spark",
    }
    assert meta["annotations"]["nsqworker.io/topic"] == "clicks#ephemeral"
    assert meta["annotations"]["nsqworker.io/message-id"] == "0a1b2c3d4e5f6a7b"
    spec = body["spec"]
    assert spec["type"] == "Python" and spec["pythonVersion"] == "3" and spec["mode"] == "cluster"
    assert spec["restartPolicy"] == {"type": "Never"}
    assert spec["timeToLiveSeconds"] == 600
    assert spec["mainApplicationFile"] == "local:///opt/jobs/r.py"
    assert spec["arguments"] == ["--day", "d"]
    assert spec["sparkConf"] == {"spark.executor.instances": "2", "spark.app.name": "daily"}
    assert spec["deps"] == {"pyFiles": ["local:///opt/jobs/lib.zip"]}
    assert spec["driver"]["serviceAccount"] == "sa"
    assert spec["driver"]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert spec["executor"]["env"] == spec["driver"]["env"]
    assert (spec["image"], spec["sparkVersion"]) == ("img:1", "3.5.7")


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (None, JobState.SUBMITTED),
        ({"applicationState": {"state": "RUNNING"}}, JobState.RUNNING),
        ({"applicationState": {"state": "COMPLETED"}}, JobState.SUCCEEDED),
        ({"applicationState": {"state": "FAILED", "errorMessage": "oom"}}, JobState.FAILED),
        ({"applicationState": {"state": "SUBMISSION_FAILED"}}, JobState.FAILED),
        ({"applicationState": {"state": "PENDING_RERUN"}}, JobState.RUNNING),
    ],
)
def test_state_of(status: dict | None, state: JobState) -> None:
    assert state_of({"status": status})[0] is state


def test_failure_carries_the_operator_error() -> None:
    assert state_of(
        {"status": {"applicationState": {"state": "FAILED", "errorMessage": "oom"}}}
    ) == (
        JobState.FAILED,
        "oom",
    )
