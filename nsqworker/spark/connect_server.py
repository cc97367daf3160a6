"""A local Spark Connect server, for tests, benchmarks and development.

It is pyspark's own ``spark-submit`` running ``SparkConnectServer`` from the
``spark-connect_2.13`` jar that pyspark 4.1 ships in its ``jars/`` (so the server is
always the client's version), on the Java :func:`~nsqworker.spark.local.require_java`
finds, bound to 127.0.0.1 on a free port, in its own process group. It takes 10-20 s
to listen.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from nsqworker.errors import ConfigurationError
from nsqworker.spark.local import require_java, spark_home

__all__ = ["ConnectServer", "connect_jar"]

_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def connect_jar() -> Path | None:
    """The Spark Connect server jar in pyspark's ``jars/``, or None when this pyspark
    has none (a pyspark older than 4.1, or pyspark-client alone)."""
    try:
        jars = spark_home() / "jars"
    except ConfigurationError:
        return None
    found = sorted(jars.glob("spark-connect_2.13-*.jar"))
    return found[-1] if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ConnectServer:
    """A running local Spark Connect server: ``remote`` is its ``sc://`` address."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def remote(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls, log_path: Path, *, master: str = "local[2]", timeout: float = 180.0
    ) -> ConnectServer:
        """Start a server and return once it accepts connections; its output goes to
        ``log_path``. Raises ConfigurationError without Java or the jar."""
        jar = connect_jar()
        if jar is None:
            raise ConfigurationError(
                "no Spark Connect server jar in pyspark's jars/: install the spark extra "
                "(pyspark 4.1 ships it)"
            )
        java = require_java(os.environ)
        home = spark_home()
        port = _free_port()
        env = dict(os.environ, JAVA_HOME=java.home, SPARK_HOME=str(home))
        command = [
            str(home / "bin" / "spark-submit"), "--class", _SERVER_CLASS,
            "--master", master, "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.scheduler.mode=FAIR",
        ]  # fmt: skip
        with log_path.open("wb") as out:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip
        server = cls(process, port, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"the Spark Connect server exited ({process.returncode}): {tail}"
                )
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return server
            except OSError:
                time.sleep(0.5)
        server.stop()
        raise TimeoutError(f"the Spark Connect server did not listen within {timeout:g}s")

    def stop(self) -> None:
        """End the server's process group: SIGTERM, SIGKILL after 10 s."""
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # what the JVM left behind
        except (ProcessLookupError, PermissionError):
            pass
        if self.process.returncode is None:
            self.process.wait(5)
