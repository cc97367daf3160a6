"""The built wheel installs and its ``nsqworker`` command works outside this checkout.

The wheel is built with ``uv build --no-build-isolation`` (hatchling comes with the dev
extra) and installed with ``--no-deps`` into a fresh venv; a ``.pth`` file lets that venv
see the project's installed dependencies, but not its editable ``nsqworker``. So the test
needs no network and takes a few seconds, and what it runs is the wheel's code: the
package files, the metadata and the console script.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _uv() -> str:
    uv = ROOT / ".tools" / "uv" / "bin" / "uv"
    found = str(uv) if uv.exists() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is missing: run `make venv` (it bootstraps .tools/uv)")
    return found


def _run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    build = [_uv(), "build", "--wheel", "--no-build-isolation", "--out-dir", out]
    _run([*build, "--python", sys.executable], cwd=ROOT, env=env)
    (built,) = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", root], cwd=root)
    python = root / "bin" / "python"
    env = {**os.environ, "UV_OFFLINE": "1"}
    env.pop("VIRTUAL_ENV", None)
    _run([_uv(), "pip", "install", "--no-deps", "--python", python, wheel], cwd=root, env=env)
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=root
    ).strip()
    # The project's dependencies (pydantic, typer, ...), appended after the venv's own
    # site-packages; .pth files in that directory (the editable install) are not read.
    deps = sysconfig.get_path("purelib")
    Path(purelib, "zz_project_dependencies.pth").write_text(deps + "\n")
    return root


def test_wheel_is_named_nsq_worker_and_imports_as_nsqworker(wheel: Path) -> None:
    assert wheel.name.startswith("nsq_worker-"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(meta).decode()
        entry_points = archive.read(meta.replace("METADATA", "entry_points.txt")).decode()
    assert "Name: nsq-worker\n" in metadata
    assert "Provides-Extra: spark" in metadata and "Provides-Extra: kubernetes" in metadata
    assert "nsqworker = nsqworker.cli:main" in entry_points
    assert "nsqworker/__init__.py" in names and "nsqworker/py.typed" in names


def test_installed_command_runs_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    bin_dir = venv / "bin"
    where = _run(
        [bin_dir / "python", "-c", "import nsqworker; print(nsqworker.__file__)"], tmp_path
    )
    assert where.strip().startswith(str(venv)), f"imported {where.strip()}, not the wheel's"

    version = _run([bin_dir / "nsqworker", "--version"], tmp_path)
    assert version.startswith("nsqworker 0.1.0"), version

    # A user's project: the quickstart example, outside this checkout.
    shutil.copytree(ROOT / "examples" / "quickstart", tmp_path / "quickstart")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    env["COLUMNS"] = "200"
    listed = _run([bin_dir / "nsqworker", "tasks", "quickstart.tasks", "--json"], tmp_path, env)
    assert '"topic": "quickstart"' in listed, listed


def test_the_wheel_declares_every_extra_of_pyproject(wheel: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(meta).decode()
    declared = {line.split(":", 1)[1].strip() for line in metadata.splitlines()
                if line.startswith("Provides-Extra:")}  # fmt: skip
    assert set(project["optional-dependencies"]) <= declared
    # and what each extra installs: `pip install "nsq-worker[nats] @ file://..."` gets nats-py
    for extra, requirements in project["optional-dependencies"].items():
        for requirement in requirements:
            name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
            wanted = re.compile(
                rf"^Requires-Dist: {re.escape(name)}\b.*extra == '{re.escape(extra)}'", re.M
            )
            assert wanted.search(metadata), f"extra {extra}: {name} not in the wheel's metadata"
