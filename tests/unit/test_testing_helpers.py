"""nsqworker.testing helpers that need no NSQ process."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import pytest

from nsqworker.testing import (
    NsqdProcess,
    NsqProcessError,
    find_binary,
    free_port,
    free_ports,
    port_is_free,
    wait_for,
    wait_until,
)


def _fake_binary(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_binaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty PATH, no NSQWORKER_TOOLS_BIN, an empty user tools directory, and a cwd
    with no .tools above it."""
    monkeypatch.delenv("NSQWORKER_TOOLS_BIN", raising=False)
    monkeypatch.delenv("NSQWORKER_RABBITMQ_ROOTFS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    work = tmp_path / "work" / "sub"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return work


def test_find_binary_reports_how_to_install(no_binaries: Path) -> None:
    with pytest.raises(
        FileNotFoundError,
        match=r"nsqd not found .*go install github.com/nsqio/nsq/apps/nsqd@v1.3.0",
    ):
        find_binary("nsqd")


def test_find_binary_order(no_binaries: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = no_binaries.parent  # .../work
    in_tree = _fake_binary(root / ".tools" / "bin", "nsqd")
    assert find_binary("nsqd") == str(in_tree)

    # where the install hints and `nsqworker dev broker` put them, from any project
    user = _fake_binary(root.parent / "data" / "nsqworker" / "bin", "nsqd")
    assert find_binary("nsqd") == str(user)

    on_path = _fake_binary(root / "path", "nsqd")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_binary("nsqd") == str(on_path)

    from_env = _fake_binary(root / "env", "nsqd")
    monkeypatch.setenv("NSQWORKER_TOOLS_BIN", str(from_env.parent))
    assert find_binary("nsqd") == str(from_env)

    explicit = _fake_binary(root / "explicit", "nsqd")
    assert find_binary("nsqd", explicit.parent) == str(explicit)


def test_find_binary_ignores_non_executables(no_binaries: Path) -> None:
    tools = no_binaries / ".tools" / "bin"
    tools.mkdir(parents=True)
    (tools / "nsqd").write_text("not executable")
    with pytest.raises(FileNotFoundError):
        find_binary("nsqd")


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    assert all(port_is_free(p) for p in ports)
    assert 0 < free_port() < 65536


def test_port_is_free_sees_a_listener() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_is_free(sock.getsockname()[1])


def test_wait_for_returns_the_truthy_value() -> None:
    calls = iter([0, None, "", "done"])
    assert wait_for(lambda: next(calls), timeout=2, interval=0) == "done"


def test_wait_for_raises_with_message() -> None:
    with pytest.raises(AssertionError, match=r"never ready \(waited 0.1s\)"):
        wait_for(lambda: False, timeout=0.1, message="never ready")
    with pytest.raises(AssertionError, match="depth was 3"):
        wait_for(lambda: False, timeout=0, message=lambda: "depth was 3")


async def test_wait_until_lets_the_loop_run_and_returns_the_value() -> None:
    done: list[str] = []
    asyncio.get_running_loop().call_later(0.05, done.append, "done")
    assert await wait_until(lambda: done, 2, "the callback") == ["done"]
    with pytest.raises(AssertionError, match=r"never ready \(waited 0.1s\)"):
        await wait_until(lambda: False, 0.1, lambda: "never ready")


def test_process_properties_before_start(tmp_path: Path) -> None:
    proc = NsqdProcess(["127.0.0.1:4160"], data_path=tmp_path, binary="/bin/false")
    assert not proc.running and proc.returncode is None
    assert proc.lookupd_tcp_addresses == ["127.0.0.1:4160"]
    assert proc.data_path == tmp_path
    with pytest.raises(NsqProcessError, match="before start"):
        _ = proc.tcp_address
    with pytest.raises(NsqProcessError, match="never started"):
        proc.restart()
    assert proc.stop() is None and proc.kill() is None
    assert "stopped" in repr(proc)
    assert os.path.basename(proc.log_path) == "nsqd.log"


def _fake_rootfs(path: Path) -> Path:
    (path / "usr/lib/rabbitmq/bin").mkdir(parents=True)
    (path / "usr/lib/rabbitmq/bin/rabbitmq-server").write_text("")
    return path


def test_a_rabbitmq_root_filesystem_is_found_outside_a_clone(
    no_binaries: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39: not only above the project; the places docs/testing.md gives."""
    from nsqworker.testing.rabbitmq import find_rootfs

    root = no_binaries.parent
    with pytest.raises(FileNotFoundError, match=r"debootstrap --variant=minbase"):
        find_rootfs()
    in_tree = _fake_rootfs(root / ".tools" / "rabbitmq" / "rootfs")
    assert find_rootfs() == in_tree

    user = _fake_rootfs(root.parent / "data" / "nsqworker" / "rabbitmq" / "rootfs")
    assert find_rootfs() == user

    beside = _fake_rootfs(root / "clone" / ".tools" / "rabbitmq" / "rootfs")
    monkeypatch.setenv("NSQWORKER_TOOLS_BIN", str(root / "clone" / ".tools" / "bin"))
    assert find_rootfs() == beside

    named = _fake_rootfs(root / "named")
    monkeypatch.setenv("NSQWORKER_RABBITMQ_ROOTFS", str(named))
    assert find_rootfs() == named


def test_rabbitmq_says_it_needs_root_before_trying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nsqworker.testing import NsqProcessError
    from nsqworker.testing.rabbitmq import RabbitMQProcess

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(NsqProcessError, match=r"runs with chroot, which needs root.*sudo"):
        RabbitMQProcess(_fake_rootfs(tmp_path / "rootfs")).start()


def test_every_server_helper_shares_one_base_and_one_error(tmp_path: Path) -> None:
    from nsqworker.testing import (
        NsqlookupdProcess,
        NsqProcessError,
        ServerProcess,
        ServerProcessError,
    )
    from nsqworker.testing.nats import NatsServerProcess
    from nsqworker.testing.rabbitmq import RabbitMQProcess

    assert NsqProcessError is ServerProcessError
    for cls in (NsqdProcess, NsqlookupdProcess, NatsServerProcess, RabbitMQProcess):
        assert issubclass(cls, ServerProcess)
    # A server that exits at once: the error names it, its status and its log's end.
    server = NatsServerProcess(binary="/bin/false", store_dir=tmp_path)
    with pytest.raises(ServerProcessError, match=r"nats-server n1 exited with status 1"):
        server.start()
    assert not server.running and server.returncode == 1
    assert "--- /bin/false" in server.log_tail()
    server.close()


def test_holds_watches_the_whole_window_and_fails_when_it_breaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time as clock

    from nsqworker.testing.holds import holds, window

    started = clock.monotonic()
    holds(lambda: True, 0.2, "broke")
    assert clock.monotonic() - started >= 0.2  # watched the whole window
    broken_at = clock.monotonic() + 0.1
    with pytest.raises(AssertionError, match=r"it broke \(after 0\.1"):
        holds(lambda: clock.monotonic() < broken_at, 5.0, "it broke")
    monkeypatch.setenv("NSQWORKER_TEST_SLACK", "3")
    assert window(2.0) == 6.0
    monkeypatch.setenv("NSQWORKER_TEST_SLACK", "fast")
    assert window(2.0) == 2.0
