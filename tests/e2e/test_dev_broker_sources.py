"""Where ``nsqworker dev broker`` gets NSQ when no nsqd is installed (issue 54): the
official image with podman or docker, else the official release archive, downloaded and
checked against its sha256, else a message naming what to install. No network: the image
is built here from ``.tools/bin`` under the official name, and the archive is served from
127.0.0.1 in the official layout."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import http.server
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqworker import Message, Producer, Registry, Settings, Worker
from nsqworker.cli.dev_nsq import IMAGE, SHA256, archive_name, release_platform
from nsqworker.testing import wait_until
from nsqworker.testing.ci import in_ci
from tests.e2e.dev_broker import DevBroker, exported

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"
PODMAN = ROOT / "scripts" / "podman"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A shell with no nsqd, no podman or docker (PATH holds only Python's directory), and
    its own cache and data directories."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    base.update(
        PATH=str(Path(sys.executable).parent),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
    )
    return base


@contextlib.contextmanager
def started(tmp_path: Path, env: dict[str, str]) -> Iterator[DevBroker]:
    argv = [sys.executable, "-m", "nsqworker", "dev", "broker", "--free-ports"]
    broker = DevBroker(argv, tmp_path, env)
    try:
        yield broker
    finally:
        broker.kill()


def run(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsqworker", "dev", "broker", "--free-ports"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def round_trip(variables: dict[str, str]) -> None:
    """Publish to the broker's nsqd and consume it through its nsqlookupd."""
    registry, got = Registry(), []

    @registry.task("dev_check", channel="c")
    async def handle(msg: Message) -> None:
        got.append(msg.body)

    lookupd = variables["NSQWORKER_LOOKUPD_HTTP_ADDRESSES"]
    nsqd = variables["NSQWORKER_NSQD_TCP_ADDRESSES"]
    settings = Settings(lookupd_http_addresses=[lookupd], lookupd_poll_interval=0.2)
    async with Producer([nsqd]) as producer, Worker(registry, settings):
        await producer.publish("dev_check", b"hello")
        await wait_until(lambda: got == [b"hello"], timeout=30, message=lambda: f"got {got}")


# ------------------------------------------------------------------------ the archive


def release_archive(into: Path) -> tuple[str, str]:
    """An archive in the official layout (``<top>/bin/nsqd``...) built from .tools/bin:
    its file name and sha256."""
    where = release_platform()
    if where is None or not (TOOLS / "nsqd").is_file():
        reason = "no NSQ release for this platform, or no .tools/bin/nsqd"
        if in_ci():
            pytest.fail(f"CI=true and {reason}: `scripts/install-tools nsq`")
        pytest.skip(reason)
    top = archive_name(where)
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in ("nsqd", "nsqlookupd", "nsq_tail"):  # one more, as the real one has
            tar.add(TOOLS / name, arcname=f"{top}/bin/{name}")
        readme = tarfile.TarInfo(f"{top}/README")
        readme.size = 5
        tar.addfile(readme, io.BytesIO(b"test\n"))
    return path.name, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving a directory: its URL and the directory."""
    root = tmp_path / "mirror"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/releases", root / "releases"
    server.shutdown()
    server.server_close()


def test_the_download_is_checked_then_run_then_cached(
    tmp_path: Path, env: dict[str, str], mirror: tuple[str, Path]
) -> None:
    url, root = mirror
    name, sha = release_archive(root)
    env.update(NSQWORKER_DEV_NSQ_MIRROR=url, NSQWORKER_DEV_NSQ_SHA256=sha)
    with started(tmp_path, env) as broker:
        printed = broker.read_until("Ctrl-C stops it.", 60)
        assert f"downloading {url}/{name} ..." in broker.err
        cached = tmp_path / "cache" / "nsqworker" / "nsq" / name.removesuffix(".tar.gz") / "bin"
        assert f"nsq 1.3.0 from {cached}" in printed
        asyncio.run(round_trip(exported(printed)))
        code, _ = broker.stop()
    assert code == 0
    assert sorted(p.name for p in cached.iterdir()) == ["nsqd", "nsqlookupd"]  # nothing else
    shutil.rmtree(root)  # the mirror is gone: the cache serves
    with started(tmp_path, env) as again:
        again.read_until("Ctrl-C stops it.", 60)
        assert "downloading" not in again.err
        assert again.stop()[0] == 0


@pytest.mark.parametrize("given", [True, False])
def test_a_checksum_mismatch_is_refused_naming_the_file_and_both_sums(
    tmp_path: Path, env: dict[str, str], mirror: tuple[str, Path], given: bool
) -> None:
    url, root = mirror
    name, sha = release_archive(root)
    where = release_platform()
    assert where is not None
    expected = "0" * 64 if given else SHA256[where]
    env.update(NSQWORKER_DEV_NSQ_MIRROR=url)
    if given:
        env["NSQWORKER_DEV_NSQ_SHA256"] = expected or ""
    done = run(tmp_path, env)
    assert done.returncode == 1, done.stdout + done.stderr
    if expected is None:  # nothing pinned for this platform: refused all the same
        assert f"refused {name}: no sha256 is pinned for it" in done.stderr
        assert f"NSQWORKER_DEV_NSQ_SHA256={sha}" in done.stderr
    else:
        source = "NSQWORKER_DEV_NSQ_SHA256" if given else "pinned in nsqworker"
        assert f"refused {name} from {url}/{name}: its sha256 is {sha}, expected {expected}" in (
            done.stderr
        )
        assert source in done.stderr
    assert "Ctrl-C" not in done.stdout
    cache = tmp_path / "cache" / "nsqworker" / "nsq"
    assert not [p for p in cache.rglob("*") if p.is_file()], "something of it was kept"


def test_with_nothing_it_names_what_to_install(tmp_path: Path, env: dict[str, str]) -> None:
    env["NSQWORKER_DEV_NSQ_MIRROR"] = "http://127.0.0.1:9/releases"  # the discard port: refused
    done = run(tmp_path, env)
    assert done.returncode == 1, done.stdout + done.stderr
    said = done.stderr
    assert "no NSQ broker could be started:" in said
    assert "nsqd not found" in said
    assert "no podman or docker on PATH (NSQWORKER_DEV_CONTAINER names another command)" in said
    assert "downloading http://127.0.0.1:9/releases/nsq-1.3.0." in said
    assert "Install one of: podman" in said and "Docker" in said and IMAGE in said
    assert "go install github.com/nsqio/nsq/apps/nsqd@v1.3.0" in said


# ------------------------------------------------------------------------ the image


@pytest.fixture
def official_image(tmp_path: Path) -> Iterator[str]:
    """An image named like the official one, built here from .tools/bin (the binaries at
    /, as in nsqio/nsq); removed afterwards, so no stand-in outlives the test."""
    podman = shutil.which("podman")
    if podman is None or not (TOOLS / "nsqd").is_file():
        reason = "podman or .tools/bin/nsqd missing: `scripts/install-tools image nsq`"
        if in_ci():
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    context = tmp_path / "image"
    context.mkdir()
    for name in ("nsqd", "nsqlookupd"):
        shutil.copy2(TOOLS / name, context / name)
    (context / "Containerfile").write_text("FROM scratch\nCOPY nsqd nsqlookupd /\n")
    build = [str(PODMAN), "build", "--network", "host", "-t", IMAGE, str(context)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    yield IMAGE
    subprocess.run([str(PODMAN), "rmi", "--force", IMAGE], capture_output=True, timeout=120)


def test_podman_runs_the_official_image(
    tmp_path: Path, env: dict[str, str], official_image: str
) -> None:
    env["PATH"] += ":/usr/bin:/bin:/usr/sbin:/sbin"  # podman, runc; no nsqd there
    env["NSQWORKER_DEV_CONTAINER"] = str(PODMAN)  # the project's engine settings and store
    env["NSQWORKER_DEV_NSQ_MIRROR"] = "none"  # were the image not run, nothing else would do
    with started(tmp_path, env) as broker:
        printed = broker.read_until("Ctrl-C stops it.", 120)
        assert f"of {official_image}, with {PODMAN}" in printed
        asyncio.run(round_trip(exported(printed)))
        code, said = broker.stop()
    assert code == 0, said
    names = [line for line in printed.split() if line.startswith("nsqworker-dev-")]
    listed = subprocess.run(
        [str(PODMAN), "ps", "--all", "--format", "{{.Names}}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert names and not [n for n in names if n in listed], "a container was left behind"
