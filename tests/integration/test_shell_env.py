"""Tests of a user's project ignore the shell's NSQWORKER_* settings: with
``NSQWORKER_LOOKUPD_HTTP_ADDRESSES`` exported for a dev broker (a second nsqd behind an
nsqlookupd), the plugin's worker test consumes only from its own nsqd; the dev nsqd keeps
its message (asked of nsqd). ``--nsqworker-shell-env`` keeps the variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from nsqworker.testing import NsqdFactory, NsqlookupdProcess, wait_for
from nsqworker.testing.shell_env import set_aside

USER_TEST = """
import asyncio, json, os
from pathlib import Path

from nsqworker import Message, Registry, Settings, Worker


async def test_archive(nsqd):
    nsqd.create_channel("clicks", "archive")
    nsqd.publish("clicks", b"mine")
    seen = []
    reg = Registry()

    @reg.task("clicks", channel="archive")
    async def archive(msg: Message) -> None:
        seen.append(msg.body.decode())

    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address], health_port=0)
    async with Worker(reg, settings):
        while not seen:
            await asyncio.sleep(0.05)
    Path(os.environ["REPORT"]).write_text(json.dumps(
        {"lookupd": list(settings.lookupd_http_addresses), "seen": seen}
    ))
"""


def run_user_tests(tmp_path: Path, env: dict[str, str], *args: str) -> dict[str, object]:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["nsqworker.testing"]\n')
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TEST))
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_user.py", *args],
        cwd=tmp_path, env={**env, "REPORT": str(report)}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    header = done.stdout + done.stderr
    return {**json.loads(report.read_text()), "output": header}


def test_the_shell_s_settings_do_not_reach_a_project_s_tests(
    tmp_path: Path, nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    dev = nsqd_factory(lookupd=nsqlookupd)  # the dev broker the shell exported
    dev.create_channel("clicks", "archive")
    dev.publish("clicks", b"the dev broker's")
    wait_for(lambda: nsqlookupd.lookup("clicks"), message="the dev nsqd in lookupd")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    env["NSQWORKER_LOOKUPD_HTTP_ADDRESSES"] = nsqlookupd.http_address
    env["NSQWORKER_TOOLS_BIN"] = str(Path(__file__).resolve().parents[2] / ".tools" / "bin")

    isolated = run_user_tests(tmp_path, env, "-v")
    assert isolated["lookupd"] == [] and isolated["seen"] == ["mine"]
    assert "set aside the shell's NSQWORKER_LOOKUPD_HTTP_ADDRESSES" in str(isolated["output"])
    assert (dev.channel_stats("clicks", "archive") or {}).get("depth") == 1  # still there

    kept = run_user_tests(tmp_path, env, "--nsqworker-shell-env")
    assert kept["lookupd"] == [nsqlookupd.http_address]


def test_only_settings_are_set_aside() -> None:
    environ = {
        "NSQWORKER_LOOKUPD_HTTP_ADDRESSES": "http://127.0.0.1:4161",
        "NSQWORKER_REQUEUE_DELAY": "3",  # a renamed setting's old name
        "NSQWORKER_CONFIG": "dev.toml",
        "NSQWORKER_TOOLS_BIN": "/opt/nsq/bin",  # the test tools', not a setting
        "PATH": "/usr/bin",
    }
    taken = set_aside(environ)
    assert sorted(taken) == [
        "NSQWORKER_CONFIG", "NSQWORKER_LOOKUPD_HTTP_ADDRESSES", "NSQWORKER_REQUEUE_DELAY",
    ]  # fmt: skip
    assert environ == {"NSQWORKER_TOOLS_BIN": "/opt/nsq/bin", "PATH": "/usr/bin"}
