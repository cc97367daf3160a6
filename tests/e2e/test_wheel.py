"""The built wheel installs and its ``nsqworker`` command works outside this checkout.

The wheel is built with ``uv build --no-build-isolation`` (hatchling comes with the dev
extra) and installed with ``--no-deps`` into a fresh venv; a ``.pth`` file lets that venv
see the project's installed dependencies, but not its editable ``nsqworker``. So the test
needs no network and takes a few seconds, and what it runs is the wheel's code: the
package files, the metadata and the console script.

The last test follows getting-started's route with pip itself: ``pip wheel --no-deps``,
then ``pip install "nsq-worker[uvloop] @ file://..."``, offline (``--no-index``).
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


def test_the_documented_pip_route_installs_the_wheel_with_an_extra(tmp_path: Path) -> None:
    """docs/getting-started.md: build with `pip wheel --no-deps`, install the wheel with
    an extra. Tests do not reach PyPI, so the dependencies come from this venv (links in
    a directory the new venv reads), less nsq-worker itself and uvloop: the extra must
    ask for uvloop, and pip must find it. `--no-build-isolation` is the one change: an
    isolated build would download hatchling."""
    root = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", root], cwd=tmp_path)  # with pip (ensurepip)
    python = root / "bin" / "python"
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path
    ).strip()
    deps = tmp_path / "deps"
    deps.mkdir()
    own = ("nsq_worker", "_editable_impl_nsq_worker", "nsqworker")
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if not entry.name.startswith((*own, "uvloop")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    Path(purelib, "zz_project_dependencies.pth").write_text(f"{deps}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    pip = [python, "-m", "pip"]

    dist = tmp_path / "dist"
    build = ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, ROOT]
    _run([*pip, *build], cwd=tmp_path, env=env)
    (wheel,) = dist.glob("nsq_worker-*.whl")
    install = [*pip, "install", "--no-index", f"nsq-worker[uvloop] @ file://{wheel}"]

    missing = subprocess.run(
        [str(a) for a in install], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert missing.returncode != 0, "the uvloop extra did not ask for uvloop"
    assert "No matching distribution found for uvloop" in missing.stderr, missing.stderr

    for entry in Path(sysconfig.get_path("purelib")).glob("uvloop*"):
        (deps / entry.name).symlink_to(entry)
    _run(install, cwd=tmp_path, env=env)
    found = _run([python, "-c", "import nsqworker, uvloop; print(nsqworker.__file__)"], tmp_path)
    assert found.strip().startswith(str(root)), f"imported {found.strip()}, not the wheel's"
    assert _run([root / "bin" / "nsqworker", "--version"], tmp_path).startswith("nsqworker 0.1.0")
