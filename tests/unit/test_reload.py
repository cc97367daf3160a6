"""``nsqworker run --reload``: what it watches, and what it says without watchfiles."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nsqworker.cli import app
from nsqworker.reload import MISSING_HINT, in_cluster_refusal, watched_paths


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package ``rl_shop`` (with a subpackage) and a lone module ``rl_single``."""
    (tmp_path / "rl_shop" / "orders").mkdir(parents=True)
    (tmp_path / "rl_shop" / "__init__.py").write_text("")
    (tmp_path / "rl_shop" / "orders" / "__init__.py").write_text("")
    (tmp_path / "rl_shop" / "orders" / "tasks.py").write_text("")
    (tmp_path / "rl_single.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path.resolve()


def test_a_module_in_a_package_watches_the_top_level_package(project: Path) -> None:
    assert watched_paths("rl_shop.orders.tasks") == [project / "rl_shop"]
    assert watched_paths("rl_shop.orders.tasks:registry") == [project / "rl_shop"]


def test_a_module_outside_any_package_watches_its_own_file(project: Path) -> None:
    assert watched_paths("rl_single") == [project / "rl_single.py"]
    assert watched_paths("rl_single:tasks") == [project / "rl_single.py"]


def test_a_module_that_does_not_exist_is_named(project: Path) -> None:
    with pytest.raises(ModuleNotFoundError, match="no module named 'rl_nowhere' to watch"):
        watched_paths("rl_nowhere.tasks")


def test_reload_without_watchfiles_exits_2_with_the_install_hint(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "rl_single.py").write_text(
        "from nsqworker import Registry\nregistry = Registry()\n"
        "@registry.task('rl', channel='c')\nasync def handle(msg):\n    pass\n"
    )
    monkeypatch.setitem(sys.modules, "watchfiles", None)  # as if it were not installed
    for key in ("NSQWORKER_CONFIG", "NSQWORKER_NSQD_TCP_ADDRESSES"):
        monkeypatch.delenv(key, raising=False)
    result = CliRunner().invoke(
        app, ["run", "rl_single:registry", "--reload", "--nsqd", "127.0.0.1:4150"]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"error: {MISSING_HINT}"
    assert "pip install 'nsq-worker[reload]'" in result.stderr


def test_reload_in_a_kubernetes_pod_is_refused_unless_forced(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "rl_single.py").write_text(
        "from nsqworker import Registry\nregistry = Registry()\n"
        "@registry.task('rl', channel='c')\nasync def handle(msg):\n    pass\n"
    )
    for key in ("NSQWORKER_CONFIG", "NSQWORKER_NSQD_TCP_ADDRESSES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    result = CliRunner().invoke(
        app, ["run", "rl_single:registry", "--reload", "--nsqd", "127.0.0.1:4150"]
    )
    assert result.exit_code == 2, result.output
    assert "KUBERNETES_SERVICE_HOST is set" in result.stderr
    assert "--reload-in-cluster" in result.stderr


def test_in_cluster_refusal_is_lifted_by_the_flag_and_absent_outside_a_pod() -> None:
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert in_cluster_refusal(pod, forced=False) is not None
    assert in_cluster_refusal(pod, forced=True) is None
    assert in_cluster_refusal({}, forced=False) is None
    assert in_cluster_refusal({"KUBERNETES_SERVICE_HOST": ""}, forced=False) is None
