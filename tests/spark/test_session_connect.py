"""@spark_session_task on a real Spark Connect server (started once for the module on
127.0.0.1): the same handlers as on a local driver (session_cases.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.spark import spark_session_task
from nsqworker.spark.connect_server import ConnectServer, connect_jar
from nsqworker.spark.session import SessionHolder, holder_for
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker
from tests.spark import session_cases as cases

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    cases.need_java()
    if connect_jar() is None:
        if cases.in_ci():
            pytest.fail("no Spark Connect server jar in pyspark's jars/ under CI=true")
        pytest.skip("no Spark Connect server jar in pyspark's jars/")
    log = tmp_path_factory.mktemp("spark-connect") / "server.log"
    server = ConnectServer.start(log)
    yield server
    server.stop()


#: Session conf a Connect client may set (the server's static conf is its own).
CONNECT_CONF = {"spark.sql.shuffle.partitions": "2"}


def remote(server: ConnectServer) -> dict[str, Any]:
    return {"spark_remote": server.remote, "spark_session_conf": CONNECT_CONF}


def holder_of(server: ConnectServer) -> SessionHolder:
    return holder_for(Settings(**remote(server)))


async def test_success_fin_and_parquet_output(
    server: ConnectServer, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    await cases.success_writes_parquet(nsqd, tmp_path, **remote(server))
    holder = holder_of(server)
    assert holder.backend == "connect"
    assert holder.session is None and holder.started >= 1  # the worker's, stopped on drain


async def test_job_failure_requeued_then_dead_lettered(
    server: ConnectServer, nsqd: NsqdProcess
) -> None:
    await cases.failure_requeued_then_dead_lettered(nsqd, **remote(server))


async def test_drain_interrupts_the_messages_tag(server: ConnectServer, nsqd: NsqdProcess) -> None:
    seen = await cases.drain_cancels_the_running_job(nsqd, holder_of(server), **remote(server))
    assert "OPERATION_CANCELED" in seen["error"]


async def test_two_messages_run_as_concurrent_jobs(
    server: ConnectServer, nsqd: NsqdProcess
) -> None:
    await cases.concurrent_messages_overlap(nsqd, **remote(server))


async def test_worker_start_starts_the_session_before_any_message(
    server: ConnectServer, nsqd: NsqdProcess
) -> None:
    registry = Registry()

    @spark_session_task(cases.TOPIC, channel=cases.CHANNEL, registry=registry)
    def unused(msg: Message, spark: Any) -> None: ...

    holder = holder_of(server)
    settings = cases.settings_for(nsqd, spark_session_start="worker_start", **remote(server))
    async with Worker(registry, settings):
        await wait_until(lambda: holder.session is not None, 60, "the session at start")
        assert holder.users == 1
    assert holder.session is None and holder.users == 0  # stopped on drain
