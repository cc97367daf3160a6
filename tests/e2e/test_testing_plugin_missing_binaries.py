"""Without nsqd, the plugin skips its tests locally and fails them under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

USER_TEST = """
pytest_plugins = ["nsqworker.testing"]

def test_needs_nsqd(nsqd):
    nsqd.publish("t", b"x")
"""


SECOND_TEST = """

def test_also_needs_nsqd(nsqd):
    nsqd.publish("t", b"y")
"""


def _run_user_suite(
    tmp_path: Path, ci: str | None, *flags: str, tests: str = USER_TEST
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_user.py").write_text(tests)
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "NSQWORKER_TOOLS_BIN"}}
    env["PATH"] = str(tmp_path / "no-bin")  # nothing on PATH, no .tools/bin above tmp_path
    env["XDG_DATA_HOME"] = str(tmp_path / "no-data")  # nothing in the user's tools directory
    env.pop("RABBITMQ_STREAM_TEST_URI", None)
    env.pop("NSQWORKER_RABBITMQ_ROOTFS", None)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            *(flags or ["-rs"]),
            "test_user.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_missing_binaries_skip_locally(tmp_path: Path) -> None:
    result = _run_user_suite(tmp_path, ci=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "go install github.com/nsqio/nsq/apps/nsqd@v1.3.0" in result.stdout
    assert "nsqworker dev broker --transport nsq" in result.stdout


def test_a_quiet_run_still_says_why_it_skipped_and_what_to_do(tmp_path: Path) -> None:
    """``pytest -q`` shows no skip reasons; the plugin's summary line does, outside this repo."""
    result = _run_user_suite(tmp_path, None, "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 test(s) skipped: nsqd not found" in result.stdout
    assert "NSQWORKER_TOOLS_BIN" in result.stdout and "--nsqd-bin-dir" in result.stdout


def test_the_summary_counts_every_test_the_missing_binary_skipped(tmp_path: Path) -> None:
    """The nsqd fixture skips once per session; the summary counts the tests, not that."""
    result = _run_user_suite(tmp_path, None, "-q", tests=USER_TEST + SECOND_TEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 skipped" in result.stdout
    assert "2 test(s) skipped: nsqd not found" in result.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_missing_binaries_fail_in_ci(tmp_path: Path, ci: str) -> None:
    result = _run_user_suite(tmp_path, ci=ci)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "skipped" not in result.stdout
    assert "CI=true and NSQ binaries are missing" in result.stdout
    assert "go install github.com/nsqio/nsq/apps/nsqd@v1.3.0" in result.stdout


def test_a_missing_nats_server_skip_names_commands_a_user_project_can_run(tmp_path: Path) -> None:
    """Outside a clone, the skip names `go install` and `nsqworker dev broker`, not a
    script of the clone (issue 39)."""
    tests = 'pytest_plugins = ["nsqworker.testing"]\n\ndef test_js(nats_server):\n    pass\n'
    result = _run_user_suite(tmp_path, None, "-q", tests=tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 test(s) skipped: nats-server not found" in result.stdout
    assert "go install github.com/nats-io/nats-server/v2@v2.15.2" in result.stdout
    assert "nsqworker dev broker --transport nats" in result.stdout
    assert "scripts/install-tools" not in result.stdout


def test_a_missing_rabbitmq_skip_names_commands_a_user_project_can_run(tmp_path: Path) -> None:
    tests = 'pytest_plugins = ["nsqworker.testing"]\n\ndef test_streams(rabbitmq):\n    pass\n'
    result = _run_user_suite(tmp_path, None, "-q", tests=tests)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())  # the summary line may wrap
    assert "1 test(s) skipped: no RabbitMQ root filesystem" in out
    rootfs = tmp_path / "no-data" / "nsqworker" / "rabbitmq" / "rootfs"
    assert f"--include=rabbitmq-server trixie {rootfs}" in out
    assert "nsqworker dev broker --transport rabbitmq-stream" in out
    assert "RABBITMQ_STREAM_TEST_URI=rabbitmq-stream://" in out
    assert "scripts/install-tools" not in out


def test_the_rabbitmq_fixture_survives_a_conftest_that_imports_the_helpers(tmp_path: Path) -> None:
    """Importing nsqworker.testing.rabbitmq set the package's ``rabbitmq`` attribute to the
    module, and pytest then found no ``rabbitmq`` fixture ("fixture 'rabbitmq' not found")."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "from nsqworker.testing.rabbitmq import RabbitMQProcess  # noqa: F401\n"
        'pytest_plugins = ["nsqworker.testing"]\n'
    )
    (tmp_path / "test_user.py").write_text(
        'def test_uri(rabbitmq):\n    assert rabbitmq == "rabbitmq-stream://u:p@127.0.0.1:1/"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["RABBITMQ_STREAM_TEST_URI"] = "rabbitmq-stream://u:p@127.0.0.1:1/"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_user.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
