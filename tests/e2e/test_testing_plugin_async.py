"""``async def`` tests in a user's own project just work with ``nsqworker.testing``.

The project lives in a temporary directory with its own conftest and no pytest
configuration, and runs under this project's pytest: once as installed here (where
pytest-asyncio is present, in its default strict mode, so it leaves unmarked tests
alone) and once with pytest-asyncio turned off, as in a project without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsqworker.testing import NsqBinaries

pytestmark = pytest.mark.e2e

TASKS = """
from nsqworker import Message, task

HANDLED = []

@task("plugin_clicks", channel="archive")
async def archive(msg: Message) -> None:
    HANDLED.append(msg.json())
"""

CONFTEST = 'pytest_plugins = ["nsqworker.testing"]\n'

TESTS = """
import asyncio

from nsqworker import Settings, Worker
from nsqworker.task import load_registry

from myservice import tasks


async def test_archive(nsqd):
    nsqd.publish("plugin_clicks", b'{"id": 1}')
    registry = load_registry("myservice.tasks")
    async with Worker(registry, Settings(nsqd_tcp_addresses=[nsqd.tcp_address])):
        for _ in range(200):
            if tasks.HANDLED:
                break
            await asyncio.sleep(0.05)
    assert tasks.HANDLED == [{"id": 1}]


async def test_runs_on_a_loop():
    assert asyncio.get_running_loop().is_running()


async def test_a_failing_async_test_fails():
    await asyncio.sleep(0)
    raise AssertionError("seen")
"""


@pytest.mark.parametrize("extra", [[], ["-p", "no:asyncio"]], ids=["as-installed", "no-asyncio"])
def test_async_tests_run_in_a_users_project(
    tmp_path: Path, nsq_binaries: NsqBinaries, extra: list[str]
) -> None:
    (tmp_path / "myservice").mkdir()
    (tmp_path / "myservice" / "tasks.py").write_text(TASKS)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_tasks.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSQWORKER_", "PYTEST_"))}
    env["NSQWORKER_TOOLS_BIN"] = str(Path(nsq_binaries.nsqd).parent)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert "1 failed, 2 passed" in out, out
    assert "AssertionError: seen" in out
    assert "not natively supported" not in out and "PytestUnhandledCoroutineWarning" not in out
