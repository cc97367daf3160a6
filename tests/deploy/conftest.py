"""The Helm chart, the Dockerfile and the real tools that check them.

``helm`` runs the helm from ``make tools`` (skipped when missing, failed under CI=true,
as for nsqd) with its own config, cache and data directories, so a user's helm setup
plays no part. ``kube_helm`` is the same helm pointed at the session's real
kube-apiserver (the ``kube_control_plane`` fixture of nsqworker.testing).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from nsqworker.testing import find_binary
from nsqworker.testing.ci import in_ci
from nsqworker.testing.kube import KubeControlPlane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nsqworker"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
CRDS = [
    ROOT / "tests" / "crds" / "keda-scaledobject.yaml",
    ROOT / "tests" / "crds" / "servicemonitor.yaml",
]
DOCKERFILE = ROOT / "Dockerfile"
RELEASE = "orders"


def _in_ci() -> bool:
    return in_ci()


class HelmError(AssertionError):
    """helm exited non-zero; ``stderr`` holds its message."""

    def __init__(self, argv: list[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"{shlex.join(argv)} exited {result.returncode}:\n{result.stderr}")
        self.stderr = result.stderr


class Helm:
    """The helm binary with private home directories (and a kubeconfig, if given)."""

    def __init__(self, binary: str, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.home = home
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        if kubeconfig is not None:
            self.env["KUBECONFIG"] = str(kubeconfig)
        self._files = 0

    def run(self, *args: str, timeout: float = 60) -> str:
        """Run ``helm args``; return stdout, raise :class:`HelmError` when it fails."""
        argv = [self.binary, *args]
        result = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise HelmError(argv, result)
        return result.stdout

    def values_file(self, values: Mapping[str, Any]) -> Path:
        """``values`` written to a new YAML file (plain files, not --set: types stay exact)."""
        self._files += 1
        path = self.home / f"values-{self._files}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        return path

    def value_args(self, files: Iterable[Path], values: Mapping[str, Any] | None) -> list[str]:
        args: list[str] = []
        for path in files:
            args += ["-f", str(path)]
        if values:
            args += ["-f", str(self.values_file(values))]
        return args

    def template(
        self,
        *files: Path,
        values: Mapping[str, Any] | None = None,
        namespace: str = "default",
    ) -> Manifests:
        """The manifests ``helm template`` renders, parsed (test hooks included)."""
        out = self.run(
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            namespace,
            *self.value_args(files, values),
        )
        return Manifests(doc for doc in yaml.safe_load_all(out) if doc)


@pytest.fixture(scope="session")
def helm_binary(pytestconfig: pytest.Config) -> str:
    """Path of helm; skips (fails under CI) when ``make tools`` has not built it."""
    try:
        return find_binary("helm", pytestconfig.getoption("nsqd_bin_dir", None))
    except FileNotFoundError as exc:
        message = str(exc).split("; run")[0] + "; run `make tools` to build helm"
        if _in_ci():
            pytest.fail(f"CI=true and helm is missing: {message}", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def helm(helm_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm for lint and template (no cluster)."""
    return Helm(helm_binary, tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="session")
def kube(kube_control_plane: KubeControlPlane) -> KubeControlPlane:
    """The session's control plane with the KEDA and ServiceMonitor CRDs installed."""
    kube_control_plane.apply_crds(*CRDS)
    return kube_control_plane


@pytest.fixture(scope="session")
def kube_helm(
    helm_binary: str, kube: KubeControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Helm:
    """helm whose kubeconfig is the session's kube-apiserver."""
    return Helm(helm_binary, tmp_path_factory.mktemp("kube-helm"), kubeconfig=kube.kubeconfig)


# ---------------------------------------------------------------------------- manifests


class Manifests(list[dict[str, Any]]):
    """Rendered (or stored) Kubernetes objects, with lookups the tests share."""

    def find(self, kind: str, name: str | None = None) -> dict[str, Any]:
        """The one object of ``kind`` (and ``name``); fails when there is not exactly one."""
        found = [
            d for d in self if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
        ]
        names = [d["metadata"]["name"] for d in found]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {names}"
        return found[0]

    def kinds(self) -> set[str]:
        return {d["kind"] for d in self}

    def pod_spec(self) -> dict[str, Any]:
        return dict(self.find("Deployment")["spec"]["template"]["spec"])

    def container(self) -> dict[str, Any]:
        """The worker container of the Deployment."""
        containers = self.pod_spec()["containers"]
        assert [c["name"] for c in containers] == ["nsqworker"]
        return dict(containers[0])

    def configmap_env(self) -> dict[str, str]:
        """The worker's settings: the ConfigMap the Deployment reads its env from."""
        (source,) = self.container()["envFrom"]
        return dict(self.find("ConfigMap", name=source["configMapRef"]["name"])["data"])


# ---------------------------------------------------------------------------- Dockerfile


class Dockerfile:
    """The root Dockerfile's instructions, one list of ``(INSTRUCTION, args)`` per stage.

    Continuation lines are joined and comments dropped; global ARGs before the first
    FROM are in :attr:`head`.
    """

    def __init__(self, path: Path = DOCKERFILE) -> None:
        self.path = path
        text = re.sub(r"\\\n", " ", path.read_text())
        self.head: list[tuple[str, str]] = []
        self.stages: list[list[tuple[str, str]]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            instruction, _, rest = line.partition(" ")
            if instruction.upper() == "FROM":
                self.stages.append([])
            (self.stages[-1] if self.stages else self.head).append(
                (instruction.upper(), rest.strip())
            )

    @property
    def build(self) -> list[tuple[str, str]]:
        return self.stages[0]

    @property
    def runtime(self) -> list[tuple[str, str]]:
        return self.stages[-1]

    @staticmethod
    def all(stage: list[tuple[str, str]], instruction: str) -> list[str]:
        return [rest for i, rest in stage if i == instruction]

    @staticmethod
    def env(stage: list[tuple[str, str]]) -> dict[str, str]:
        """The ENV of one stage (``KEY=value`` pairs; ``$PATH`` left as written)."""
        env: dict[str, str] = {}
        for rest in Dockerfile.all(stage, "ENV"):
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
        return env

    @staticmethod
    def exec_form(stage: list[tuple[str, str]], instruction: str) -> list[str]:
        """ENTRYPOINT or CMD of a stage, which must be in exec form (a JSON list)."""
        values = Dockerfile.all(stage, instruction)
        assert len(values) == 1, f"expected one {instruction}, got {values}"
        parsed = json.loads(values[0])
        assert isinstance(parsed, list), f"{instruction} must use the exec form (a JSON list)"
        return [str(part) for part in parsed]


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    """The root Dockerfile, parsed."""
    return Dockerfile()
