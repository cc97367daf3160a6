"""nsqworker.testing.kube: a real etcd + kube-apiserver, and the fixture's skip/fail policy."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from nsqworker.testing.kube import KubeControlPlane, find_kube_binaries

ROOT = Path(__file__).resolve().parents[2]
KEDA_CRD = ROOT / "tests" / "crds" / "keda-scaledobject.yaml"


def test_the_session_control_plane(kube_control_plane: KubeControlPlane) -> None:
    from kubernetes import client

    kube = kube_control_plane
    assert kube.server.startswith("https://127.0.0.1:")
    assert client.VersionApi(kube.api_client()).get_code().git_version == "v1.34.4"
    config = json.loads(kube.kubeconfig.read_text())
    (cluster,) = config["clusters"]
    assert cluster["cluster"]["server"] == kube.server
    assert Path(cluster["cluster"]["certificate-authority"]).is_file()
    assert oct(kube.kubeconfig.stat().st_mode & 0o777) == "0o600"
    # the certificate verifies; without the token nobody gets in
    with httpx.Client(
        verify=ssl.create_default_context(cafile=kube.ca_file), trust_env=False
    ) as http:
        assert http.get(f"{kube.server}/version").status_code == 401
        token = {"Authorization": f"Bearer {kube.token}"}
        assert http.get(f"{kube.server}/version", headers=token).status_code == 200


def test_crds_and_namespaces_are_idempotent(kube_control_plane: KubeControlPlane) -> None:
    from kubernetes import client

    kube = kube_control_plane
    kube.apply_crds(KEDA_CRD)
    kube.apply_crds(KEDA_CRD)  # replaced, still Established
    kube.create_namespace("twice")
    kube.create_namespace("twice")
    custom = client.CustomObjectsApi(kube.api_client())
    body = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "so"},
        "spec": {"scaleTargetRef": {"name": "d"}, "triggers": [{"type": "nsq", "metadata": {}}]},
    }
    custom.create_namespaced_custom_object("keda.sh", "v1alpha1", "twice", "scaledobjects", body)
    with pytest.raises(client.ApiException) as refused:  # the CRD's schema is enforced
        bad = {**body, "metadata": {"name": "bad"}, "spec": {"triggers": []}}
        custom.create_namespaced_custom_object("keda.sh", "v1alpha1", "twice", "scaledobjects", bad)
    assert refused.value.status == 422 and "scaleTargetRef" in str(refused.value.body)


def test_apply_crds_refuses_other_kinds(
    kube_control_plane: KubeControlPlane, tmp_path: Path
) -> None:
    path = tmp_path / "not-a-crd.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(RuntimeError, match="'ConfigMap' is not a CRD"):
        kube_control_plane.apply_crds(path)


@pytest.mark.slow
def test_stop_leaves_nothing_behind(kube_control_plane: KubeControlPlane) -> None:
    """A second control plane (the session's keeps running): stopped, nothing remains."""
    binaries = kube_control_plane.binaries
    with KubeControlPlane(binaries=binaries) as kube:
        pids = kube.pids
        assert len(pids) == 2
        work_dir = kube.work_dir
        assert work_dir is not None and (work_dir / "etcd").is_dir()
        assert kube.server != kube_control_plane.server
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not work_dir.exists() and kube.pids == []
    with pytest.raises(RuntimeError, match="not started"):
        _ = kube.server


USER_TEST = """
pytest_plugins = ["nsqworker.testing"]

def test_needs_kube(kube_control_plane):
    kube_control_plane.create_namespace("x")
"""


def _run_user_suite(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_user.py").write_text(USER_TEST)
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "NSQWORKER_TOOLS_BIN"}}
    env["PATH"] = str(tmp_path / "no-bin")  # nothing on PATH, no .tools/bin above tmp_path
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.e2e
def test_missing_binaries_skip_locally(tmp_path: Path) -> None:
    result = _run_user_suite(tmp_path, ci=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "etcd not found" in result.stdout and "make tools" in result.stdout


@pytest.mark.e2e
def test_missing_binaries_fail_in_ci(tmp_path: Path) -> None:
    result = _run_user_suite(tmp_path, ci="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "CI=true and the control plane cannot start: etcd not found" in result.stdout


def test_find_kube_binaries_names_the_tool_to_build(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NSQWORKER_TOOLS_BIN", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as missing:
        find_kube_binaries()
    assert "etcd not found" in str(missing.value)
    assert "put etcd and kube-apiserver on PATH" in str(missing.value)
    assert "`make tools` builds both" in str(missing.value)
    assert "NSQ v1.3.0" not in str(missing.value)  # the kube tools, not NSQ
