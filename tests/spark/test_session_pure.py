"""@spark_session_task's pure parts: group names, error summaries, settings, holders."""

from __future__ import annotations

from typing import Any

import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings, SettingsError
from nsqworker.spark import spark_session_task
from nsqworker.spark.session import SessionHolder, error_summary, group_name, holder_for
from nsqworker.task import Registry


def test_group_name_is_a_valid_spark_connect_tag() -> None:
    assert group_name("svc.tasks.count", "0a1b2c") == "nsqworker:svc.tasks.count:0a1b2c"
    name = group_name("f.<locals>.g", "id,with space")
    assert "," not in name and " " not in name and "<" not in name


def test_error_summary_keeps_the_cause_not_the_jvm_stack() -> None:
    text = (
        "An error occurred while calling o84.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted: java.lang.RuntimeException: boom\n"
        "\tat org.apache.spark.sql.catalyst.expressions.GeneratedClass.processNext(Unknown)\n"
        "\tat org.apache.spark.rdd.RDD.iterator(RDD.scala:331)\n\n"
        "Caused by: java.lang.RuntimeException: boom\n"
    )
    summary = error_summary(RuntimeError(text))
    assert summary.startswith("RuntimeError: An error occurred")
    assert "boom" in summary and "GeneratedClass" not in summary and "RDD.scala" not in summary
    assert summary.count("\n") == 2
    assert error_summary(ValueError()) == "ValueError: ValueError"


def test_the_handler_must_be_a_plain_function() -> None:
    async def handler(msg: Message, spark: Any) -> None: ...

    with pytest.raises(TypeError, match="plain function"):
        spark_session_task("t", channel="c", registry=Registry())(handler)

    class AsyncCallable:  # its coroutine would never be awaited in a thread
        async def __call__(self, msg: Message, spark: Any) -> None: ...

    with pytest.raises(TypeError, match="plain function"):
        spark_session_task("t", channel="c", registry=Registry())(AsyncCallable())
    with pytest.raises(TypeError, match="on_success"):
        spark_session_task("t", channel="c", registry=Registry(), on_success=3)


def test_the_registry_sees_a_one_argument_handler_with_every_task_option() -> None:
    registry = Registry()

    @spark_session_task("t", channel="c", registry=registry, max_in_flight=2, timeout=30)
    def count(msg: Message, spark: Any) -> int:
        return 1

    (spec,) = list(registry)
    assert spec.name.endswith("count") and spec.max_in_flight == 2 and spec.timeout == 30
    assert spec.is_async and callable(getattr(count, "bind_settings", None))


def test_spark_remote_must_be_a_spark_connect_address() -> None:
    with pytest.raises(SettingsError, match="spark_remote"):
        Settings(spark_remote="http://spark:15002")
    with pytest.raises(SettingsError, match="spark_session_start"):
        Settings(spark_session_start="later")


def test_holders_by_backend_target_and_conf() -> None:
    local = holder_for(Settings(spark_master="local[3]"))
    assert local.backend == "local" and local.target == "local[3]"
    assert holder_for(Settings(spark_master="local[3]")) is local
    assert holder_for(Settings(spark_master="local[3]", spark_session_conf={"a": 1})) is not local
    remote = holder_for(Settings(spark_remote="sc://127.0.0.1:15002"))
    assert remote.backend == "connect" and remote.target == "sc://127.0.0.1:15002"
    assert remote.session is None  # nothing starts before a message (or worker_start)
    typed = holder_for(Settings(spark_session_conf={"spark.ui.enabled": False, "n": 2}))
    assert typed.conf == {"spark.ui.enabled": "false", "n": "2"}


def test_users_are_counted_for_the_last_one_to_stop_the_session() -> None:
    # That the last release stops a real session: test_session_connect.py.
    holder = SessionHolder("local", "local[1]")
    holder.acquire()
    holder.acquire()  # two Workers in one process
    holder.release()
    assert holder.users == 1
    holder.release()
    holder.release()  # more releases than users: no negative count
    assert holder.users == 0 and holder.session is None


@pytest.mark.parametrize(
    ("master", "partitions"),
    [("local[2]", "2"), ("local", "1"), ("local[3, 2]", "3"), ("spark://host:7077", None)],
)
def test_a_local_session_gets_a_shuffle_partition_per_core(
    master: str, partitions: str | None
) -> None:
    from nsqworker.spark.session import local_defaults

    conf = local_defaults(master)
    assert conf["spark.scheduler.mode"] == "FAIR"
    assert conf.get("spark.sql.shuffle.partitions") == partitions  # Spark's own 200 when None


def test_local_star_counts_the_machines_cores() -> None:
    import os

    from nsqworker.spark.session import local_defaults

    assert local_defaults("local[*]")["spark.sql.shuffle.partitions"] == str(os.cpu_count() or 1)
