"""``nsqworker dev broker``: what it prints, how it stops, and what it says when it cannot
start (issue 39)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqworker.testing import wait_for
from tests.e2e.dev_broker import DevBroker, exported

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A shell with the binaries where the docs say (NSQWORKER_TOOLS_BIN), nothing else."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    base.update(
        PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin",
        NSQWORKER_TOOLS_BIN=str(ROOT / ".tools" / "bin"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        PYTHONUNBUFFERED="1",
    )
    return base


@contextlib.contextmanager
def dev_broker(tmp_path: Path, env: dict[str, str], *args: str) -> Iterator[DevBroker]:
    broker = DevBroker([sys.executable, "-m", "nsqworker", "dev", "broker", *args], tmp_path, env)
    try:
        yield broker
    finally:
        broker.kill()


def listening(address: str) -> bool:
    host, _, port = address.rpartition("/")[2].rpartition(":")
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, int(port))) == 0


def pids_with(text: str) -> list[int]:
    """Processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def test_sigterm_stops_nsqd_and_nsqlookupd(tmp_path: Path, env: dict[str, str]) -> None:
    with dev_broker(tmp_path, env, "--free-ports") as broker:
        printed = broker.read_until("Ctrl-C stops it.", 30)
        variables = exported(printed)
        assert variables["NSQWORKER_TRANSPORT"] == "nsq"
        nsqd = variables["NSQWORKER_NSQD_TCP_ADDRESSES"]
        lookupd = variables["NSQWORKER_LOOKUPD_HTTP_ADDRESSES"]
        assert f"nsqd TCP (publish, consume)                 {nsqd}" in printed
        assert listening(nsqd) and listening(lookupd)
        code, said = broker.stop(signal.SIGTERM)
    assert code == 0, said
    assert "SIGTERM: stopping the nsq broker" in said and said.rstrip().endswith("stopped")
    assert not listening(nsqd) and not listening(lookupd)


def test_a_broker_that_dies_is_reported_with_its_log(tmp_path: Path, env: dict[str, str]) -> None:
    data = tmp_path / "js-data"
    with dev_broker(tmp_path, env, "-t", "nats", "--free-ports", "--data-dir", str(data)) as broker:
        broker.read_until("Ctrl-C stops it.", 30)
        (pid,) = pids_with(str(data / "js"))  # nats-server --store_dir DIR/js
        os.kill(pid, signal.SIGKILL)
        assert broker.proc.wait(30) == 1
        _, said = broker.stop()
    assert "error: the nats broker stopped by itself; see" in said and "nats-server.log" in said
    assert (data / "js").is_dir()  # --data-dir keeps the JetStream store


def test_a_standard_port_in_use_is_named_with_the_way_out(
    tmp_path: Path, env: dict[str, str]
) -> None:
    with socket.socket() as taken:
        with contextlib.suppress(OSError):  # someone else's nats-server holds it: as good
            taken.bind(("127.0.0.1", 4222))
            taken.listen()
        done = subprocess.run(
            [sys.executable, "-m", "nsqworker", "dev", "broker", "-t", "nats"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "port 4222 (client) on 127.0.0.1 is taken" in done.stderr
    assert "--free-ports" in done.stderr


def test_what_cannot_start_says_why(tmp_path: Path, env: dict[str, str]) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nsqworker", "dev", "broker", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    unknown = run("-t", "kafka")
    assert unknown.returncode == 2
    assert "--transport 'kafka': use one of nsq, nats, rabbitmq-stream" in unknown.stderr
    kept = run("-t", "rabbitmq-stream", "--data-dir", str(tmp_path))
    assert kept.returncode == 1 and "--data-dir is for nsq and nats" in kept.stderr
    env.pop("NSQWORKER_TOOLS_BIN")
    # Neither podman/docker nor a download either (tests/e2e/test_dev_broker_sources.py).
    env.update(NSQWORKER_DEV_CONTAINER="none", NSQWORKER_DEV_NSQ_MIRROR="none")
    nothing = run("-t", "nsq", "--free-ports")
    assert nothing.returncode == 1
    assert "go install github.com/nsqio/nsq/apps/nsqd@v1.3.0" in nothing.stderr


def rabbitmq_instances() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, instance)}`` of every process of a RabbitMQ the helpers
    started (their environment carries the instance's mark)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                environ = (entry / "environ").read_bytes().split(b"\0")
                marks = [e for e in environ if e.startswith(b"NSQWORKER_RABBITMQ_INSTANCE=")]
                if marks:
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    found[int(entry.name)] = (parent, marks[0].split(b"=", 1)[1].decode())
    return found


def test_sigterm_while_rabbitmq_starts_leaves_nothing_running(
    tmp_path: Path, env: dict[str, str]
) -> None:
    with dev_broker(tmp_path, env, "-t", "rabbitmq-stream", "--free-ports") as broker:
        broker.read_until("starting RabbitMQ from", 30, stream="err")
        ours = wait_for(
            lambda: {i for pp, i in rabbitmq_instances().values() if pp == broker.proc.pid},
            20, message="RabbitMQ never started",
        )  # fmt: skip
        code, said = broker.stop(signal.SIGTERM)
    assert code == 130 and "interrupted while starting; stopped" in said, said
    wait_for(lambda: not ours & {i for _, i in rabbitmq_instances().values()}, 30,
             message="RabbitMQ left running")  # fmt: skip
    rootfs = Path(broker.err.split("starting RabbitMQ from ", 1)[1].split(" (", 1)[0])
    assert not [i for i in ours if (rootfs / "nsqw" / i).exists()], "its data was left behind"
