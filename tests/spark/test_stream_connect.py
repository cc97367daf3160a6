"""The ``nats`` source over Spark Connect: the query started from a Connect client runs
on a local Spark Connect server (pyspark 4.1's own jar), into Parquet with a checkpoint;
stopped and started again from it, each message lands once."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from nsqworker.spark.connect_server import ConnectServer
from tests.spark import session_cases as cases
from tests.spark.streaming_cases import (
    Driver,
    bodies,
    check_exactly_once,
    publish_nats,
    wait_for_rows,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(480)]


def test_nats_source_over_spark_connect(
    nats_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases.need_java()
    name = f"connect{uuid.uuid4().hex[:8]}"
    asyncio.run(publish_nats(nats_server.url, name, bodies(0, 1_000), create=True))
    # the server's Python workers read the connection from their environment
    monkeypatch.setenv("NSQWORKER_NATS_SERVERS", nats_server.url)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv(
        "PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", __import__("sys").executable)
    )
    server = ConnectServer.start(tmp_path / "connect.log")
    try:
        sources = [("nats", {"stream": name})]
        driver = Driver(tmp_path, sources, {}, remote=server.remote)
        try:
            driver.start()
            wait_for_rows(driver, 1_000)
            driver.signal(signal.SIGTERM)  # the client goes; its query stops with it
            assert driver.process is not None
            driver.process.wait(60)
            asyncio.run(publish_nats(nats_server.url, name, bodies(1_000, 1_500)))
            driver.start()
            rows = wait_for_rows(driver, 1_500)
        finally:
            driver.stop()
    finally:
        server.stop()
    check_exactly_once(rows, name, 1_500)
