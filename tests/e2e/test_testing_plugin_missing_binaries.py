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
    assert "make tools" in result.stdout


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
    assert "make tools" in result.stdout
