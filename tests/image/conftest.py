"""The container image for real: built with podman, run against an nsqd on the host.

Everything goes through ``scripts/podman`` (the project's engine settings and an image
store under ``.tools/image``) and ``scripts/build-image`` (what ``make image`` runs), on
the local Debian base ``scripts/install-tools`` makes. Without podman or that base the
tests are skipped with one line saying what to install; under ``CI=true`` they fail.
Containers use the host's network (these machines give containers none of their own),
so nsqd and the health port are on 127.0.0.1 as everywhere else in the suite.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

from nsqworker.testing import find_binary, wait_for
from nsqworker.testing.ci import in_ci

ROOT = Path(__file__).resolve().parents[2]
PODMAN = ROOT / "scripts" / "podman"
BUILD_IMAGE = ROOT / "scripts" / "build-image"
BASE_IMAGE = "localhost/nsqworker-python:bookworm"
# Checkouts share .tools (and so the image store): each tags its own images.
TAG = "test-" + hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]
IMAGE = f"localhost/nsqworker:{TAG}"
SERVICE_IMAGE = f"localhost/nsqworker-example:{TAG}"
INSTALL = "`scripts/install-tools image` (apt-get install podman runc debootstrap, as root)"
BUILD_TIMEOUT = 900  # a cold build downloads every wheel

_built: dict[str, Built] = {}  # tag -> what the session built, for the summary
_skipped: set[str] = set()  # why the image tests were skipped, said once at the end


def _in_ci() -> bool:
    return in_ci()


def _unavailable(reason: str) -> NoReturn:
    if _in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    _skipped.add(reason)
    pytest.skip(reason)


class PodmanError(AssertionError):
    """podman exited non-zero; the message holds its command and output."""


@dataclass(frozen=True)
class Built:
    """An image this session built: its tag, size in bytes and build time."""

    tag: str
    size: int
    seconds: float


class Podman:
    """``scripts/podman`` (and ``scripts/build-image``) as a test calls them."""

    base_image = BASE_IMAGE

    def run(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``podman args``; raises :class:`PodmanError` when it fails and ``check``."""
        return _run([str(PODMAN), *args], timeout=timeout, check=check)

    def __init__(self) -> None:
        self.replaced: list[str] = []  # ids of images a build took the tag from

    def build(self, tag: str, *args: str) -> Built:
        """``scripts/build-image tag args``: the image, its size and how long it took."""
        before = self.image_id(tag)
        start = time.monotonic()
        _run([str(BUILD_IMAGE), tag, *args], timeout=BUILD_TIMEOUT, check=True)
        built = Built(tag, self.size(tag), time.monotonic() - start)
        if before and before != self.image_id(tag):
            self.replaced.append(before)
        _built[tag] = built
        return built

    def image_id(self, image: str) -> str | None:
        result = self.run("image", "inspect", "--format", "{{.Id}}", image, check=False)
        return result.stdout.strip() if result.returncode == 0 else None

    def size(self, image: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", image).stdout)

    def inspect(self, what: str) -> Any:
        """``podman inspect`` of one container, pod or image, parsed."""
        (found,) = json.loads(self.run("inspect", what).stdout)
        return found

    def logs(self, container: str) -> str:
        result = self.run("logs", container, check=False)
        return result.stdout + result.stderr

    @contextlib.contextmanager
    def container(self, image: str, *args: str, options: Sequence[str] = ()) -> Iterator[str]:
        """A detached container on the host's network; removed (by name) at the end."""
        name = f"nsqworker-test-{uuid.uuid4().hex[:8]}"
        self.run("run", "-d", "--name", name, "--network", "host", *options, image, *args)
        try:
            yield name
        finally:
            self.run("rm", "--force", "--time", "0", name, check=False)

    def wait_ready(self, container: str, port: int, timeout: float = 60) -> None:
        """Wait until /readyz on 127.0.0.1:``port`` answers 200 while ``container`` runs."""

        def ready() -> bool:
            state = self.inspect(container)["State"]
            assert state["Running"], f"{container} exited:\n{self.logs(container)}"
            return answers(f"http://127.0.0.1:{port}/readyz") == 200

        wait_for(ready, timeout=timeout, message=lambda: f"not ready:\n{self.logs(container)}")


def answers(url: str) -> int | None:
    """The HTTP status ``url`` answers with, None when nothing answers."""
    with contextlib.suppress(httpx.HTTPError), httpx.Client(trust_env=False, timeout=2) as http:
        return http.get(url).status_code
    return None


def _run(argv: list[str], timeout: float, check: bool) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT
    )
    if check and result.returncode != 0:
        raise PodmanError(
            f"{shlex.join(argv)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
        )
    return result


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    """podman with the project's settings; skips (fails under CI) without it or the base.

    At the end the images this session's builds replaced are removed: each holds a copy
    of the virtualenv (200 MB), and a build after every code change would pile them up.
    """
    if shutil.which("podman") is None:
        _unavailable(f"podman is missing: install it with {INSTALL}")
    tool = Podman()
    if tool.run("image", "exists", BASE_IMAGE, check=False).returncode != 0:
        _unavailable(f"the base image {BASE_IMAGE} is missing: make it with {INSTALL}")
    yield tool
    for image in reversed(tool.replaced):  # a service image before the image it is FROM
        tool.run("rmi", image, check=False)


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm `make tools` builds; skips (fails under CI) when it is missing."""
    try:
        return find_binary("helm")
    except FileNotFoundError as exc:
        _unavailable(f"helm is missing ({exc}): `make tools` builds it")


@pytest.fixture(scope="session")
def image(podman: Podman) -> Built:
    """The root Dockerfile, built (layers are cached in .tools/image between runs)."""
    return podman.build(IMAGE)


@pytest.fixture(scope="session")
def service_image(podman: Podman, image: Built) -> Built:
    """examples/docker/Dockerfile: a service's image FROM the one above."""
    return podman.build(
        SERVICE_IMAGE, "--build-arg", f"NSQWORKER_IMAGE={image.tag}", str(ROOT / "examples/docker")
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Report the size and build time of each image built (``-q`` hides the tests' output),
    or in one line why the image tests were skipped."""
    if not (_built or _skipped):
        return
    terminalreporter.write_sep("-", "container images")
    for reason in _skipped:
        terminalreporter.write_line(f"tests/image skipped: {reason}")
    for built in _built.values():
        terminalreporter.write_line(
            f"{built.tag}: {built.size / 1e6:.0f} MB, built in {built.seconds:.1f}s"
        )
