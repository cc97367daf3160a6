"""nsqd and nsqlookupd for ``nsqworker dev broker``, from the first place that has them.

1. **Installed binaries**, found as the test fixtures find them (``--bin-dir``,
   ``$NSQWORKER_TOOLS_BIN``, ``PATH``, the user's tools directory, ``.tools/bin``), or
   unpacked by an earlier download into the user's cache: run as child processes.
2. **podman or docker** (the first on ``PATH``; ``NSQWORKER_DEV_CONTAINER`` names another
   command, or ``none``): the official image :data:`IMAGE`, by name and pinned tag, as two
   containers sharing one network namespace (nsqlookupd's; on Linux the host's).
3. **The official release archive** for this platform (:data:`RELEASES`;
   ``NSQWORKER_DEV_NSQ_MIRROR`` names a mirror, or ``none``), downloaded once into the
   user's cache and checked against the sha256 pinned in :data:`SHA256` (or given in
   ``NSQWORKER_DEV_NSQ_SHA256``) before anything of it runs.

When none works, :class:`~nsqworker.cli.local_broker.BrokerError` says what each step
found and what to install. ``NSQWORKER_DEV_*`` are not settings (``RESERVED_ENV_VARS``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from nsqworker.cli.local_broker import BrokerError, LocalBroker

__all__ = [
    "CONTAINER_ENV",
    "IMAGE",
    "MIRROR_ENV",
    "RELEASES",
    "SHA256",
    "SHA256_ENV",
    "STANDARD_PORTS",
    "ChecksumRefused",
    "archive_name",
    "cache_dir",
    "container_engine",
    "download_nsq",
    "release_platform",
    "start_nsq",
]

VERSION = "1.3.0"
GO_VERSION = "go1.21.5"
"""The Go release the official 1.3.0 archives were built with (it is in their names)."""
IMAGE = f"docker.io/nsqio/nsq:v{VERSION}"
"""The official image, fully qualified so that podman needs no short-name lookup."""
RELEASES = f"https://github.com/nsqio/nsq/releases/download/v{VERSION}"
CONTAINER_ENV = "NSQWORKER_DEV_CONTAINER"
MIRROR_ENV = "NSQWORKER_DEV_NSQ_MIRROR"
SHA256_ENV = "NSQWORKER_DEV_NSQ_SHA256"
#: sha256 of each official archive, by ``<os>-<arch>``; None: not pinned (the download is
#: refused unless NSQWORKER_DEV_NSQ_SHA256 gives one). NOT verified by this project: the
#: linux-amd64 value is the one a public CI script records for the GitHub release asset
#: (docs/getting-started.md, "A local broker"); replace it once checked against the release.
SHA256: dict[str, str | None] = {
    "linux-amd64": "eeeb62e003ca7c514b6cb6ef1bbe9d3754f14657ef276e3ebb54b5d57bd7988a",
    "linux-arm64": None,
    "darwin-amd64": None,
    "darwin-arm64": None,
    "freebsd-amd64": None,
}
STANDARD_PORTS = {
    "nsqd TCP": 4150,
    "nsqd HTTP": 4151,
    "nsqlookupd TCP": 4160,
    "nsqlookupd HTTP": 4161,
}
READY_TIMEOUT = 60.0
DOWNLOAD_TIMEOUT = 300.0


class ChecksumRefused(BrokerError):
    """Raised when a downloaded archive's sha256 is not the one expected (or none is)."""


def release_platform() -> str | None:
    """``<os>-<arch>`` as the release archives name this machine, None if none is built."""
    system = {"Linux": "linux", "Darwin": "darwin", "FreeBSD": "freebsd"}.get(platform.system())
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    name = f"{system}-{arch}"
    return name if system and arch and name in SHA256 else None


def archive_name(where: str) -> str:
    """The release archive's top directory for platform ``where`` (add ``.tar.gz``)."""
    return f"nsq-{VERSION}.{where}.{GO_VERSION}"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/nsqworker/nsq``, by default ``~/.cache/nsqworker/nsq``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nsqworker" / "nsq"


def container_engine() -> list[str] | None:
    """The container command: ``$NSQWORKER_DEV_CONTAINER`` (split as a shell would; ``none``
    for no containers), else podman or docker from PATH; None without one."""
    named = os.environ.get(CONTAINER_ENV, "").strip()
    if named.lower() == "none":
        return None
    if named:
        return shlex.split(named)
    for name in ("podman", "docker"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


# --------------------------------------------------------------------- the download


def _expected_sha256(where: str) -> tuple[str | None, str]:
    """The sha256 the archive must have, and where that value comes from."""
    given = os.environ.get(SHA256_ENV, "").strip().lower()
    if given:
        return given, SHA256_ENV
    return SHA256.get(where), f"pinned in nsqworker for nsq {VERSION} {where}"


def _fetch(url: str, to: Path) -> None:
    """Stream ``url`` into ``to``; raises BrokerError naming the URL."""
    import httpx  # here: `nsqworker --version` imports this module

    try:
        with httpx.stream("GET", url, follow_redirects=True, timeout=30.0) as response:
            if response.status_code != 200:
                raise BrokerError(f"downloading {url} failed: HTTP {response.status_code}")
            with to.open("wb") as out:
                for chunk in response.iter_bytes(1 << 16):
                    out.write(chunk)
    except httpx.HTTPError as exc:
        raise BrokerError(f"downloading {url} failed: {exc or type(exc).__name__}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _unpack(archive: Path, top: str, into: Path) -> None:
    """Copy ``top/bin/nsqd`` and ``top/bin/nsqlookupd`` out of ``archive`` into ``into``
    (nothing else, so no name in the archive can write elsewhere)."""
    into.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        for name in ("nsqd", "nsqlookupd"):
            try:
                member = tar.getmember(f"{top}/bin/{name}")
            except KeyError:
                raise BrokerError(f"{archive.name} holds no {top}/bin/{name}") from None
            source = tar.extractfile(member)
            if source is None:
                raise BrokerError(f"{archive.name}: {top}/bin/{name} is not a file")
            target = into / name
            with source, target.open("wb") as out:
                shutil.copyfileobj(source, out)
            target.chmod(0o755)


def download_nsq(where: str, mirror: str, cache: Path) -> Path:
    """Download ``<mirror>/<archive>.tar.gz`` for platform ``where``, check its sha256,
    unpack nsqd and nsqlookupd into ``cache/<archive>/bin`` and return that directory.

    Raises:
        BrokerError: the download failed, no sha256 is known for it, or it does not match
            (the message names the file and both sums; nothing is kept).
    """
    top = archive_name(where)
    url = f"{mirror.rstrip('/')}/{top}.tar.gz"
    expected, source = _expected_sha256(where)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as work:
        archive = Path(work) / f"{top}.tar.gz"
        print(f"downloading {url} ...", file=sys.stderr, flush=True)
        _fetch(url, archive)
        actual = _sha256(archive)
        if expected is None:
            raise ChecksumRefused(
                f"refused {archive.name}: no sha256 is pinned for it in this nsqworker; its"
                f" sha256 is {actual}. Compare that with a source you trust, then set"
                f" {SHA256_ENV}={actual} to accept it"
            )
        if actual != expected:
            raise ChecksumRefused(
                f"refused {archive.name} from {url}: its sha256 is {actual}, expected"
                f" {expected} ({source}); the download was deleted"
            )
        staged = Path(work) / "bin"
        _unpack(archive, top, staged)
        final = cache / top / "bin"
        final.parent.mkdir(exist_ok=True)
        if not final.is_dir():
            staged.rename(final)
    return final


def _cached_binaries() -> tuple[str, str] | None:
    where = release_platform()
    if where is None:
        return None
    bin_dir = cache_dir() / archive_name(where) / "bin"
    found = [bin_dir / name for name in ("nsqd", "nsqlookupd")]
    if all(p.is_file() and os.access(p, os.X_OK) for p in found):
        return str(found[0]), str(found[1])
    return None


# ------------------------------------------------------------------------- starting


def _ports(standard: bool) -> dict[str, int]:
    from nsqworker.testing.ports import free_ports

    if standard:
        return dict(STANDARD_PORTS)
    return dict(zip(STANDARD_PORTS, free_ports(len(STANDARD_PORTS)), strict=True))


def _broker(
    ports: dict[str, int],
    logs: list[Path],
    alive: Callable[[], bool],
    stop: Callable[[], None],
    notes: list[str],
) -> LocalBroker:
    nsqd, lookupd = f"127.0.0.1:{ports['nsqd TCP']}", f"http://127.0.0.1:{ports['nsqlookupd HTTP']}"
    return LocalBroker(
        transport="nsq",
        addresses={
            "nsqd TCP (publish, consume)": nsqd,
            "nsqd HTTP": f"http://127.0.0.1:{ports['nsqd HTTP']}",
            "nsqlookupd HTTP (consumers find nsqd here)": lookupd,
        },
        env={
            "NSQWORKER_TRANSPORT": "nsq",
            "NSQWORKER_LOOKUPD_HTTP_ADDRESSES": lookupd,
            "NSQWORKER_NSQD_TCP_ADDRESSES": nsqd,
        },
        logs=logs,
        alive=alive,
        stop=stop,
        notes=notes,
    )


def _processes(
    binaries: tuple[str, str], standard: bool, data_dir: Path | None, notes: list[str]
) -> LocalBroker:
    """nsqlookupd and nsqd as child processes (the test fixtures' helpers)."""
    from nsqworker.testing.processes import NsqdProcess, NsqlookupdProcess

    ports = _ports(True) if standard else None
    lookupd = NsqlookupdProcess(
        binary=binaries[1],
        data_path=data_dir / "nsqlookupd" if data_dir else None,
        tcp_port=ports["nsqlookupd TCP"] if ports else None,
        http_port=ports["nsqlookupd HTTP"] if ports else None,
    ).start()
    try:
        nsqd = NsqdProcess(
            [lookupd],
            binary=binaries[0],
            data_path=data_dir / "nsqd" if data_dir else None,
            tcp_port=ports["nsqd TCP"] if ports else None,
            http_port=ports["nsqd HTTP"] if ports else None,
        ).start()
    except BaseException:
        lookupd.close()
        raise

    def stop() -> None:
        try:
            nsqd.close()
        finally:
            lookupd.close()

    actual = {"nsqd TCP": nsqd.tcp_port, "nsqd HTTP": nsqd.http_port}
    actual |= {"nsqlookupd TCP": lookupd.tcp_port, "nsqlookupd HTTP": lookupd.http_port}
    logs = [nsqd.log_path, lookupd.log_path]
    return _broker(actual, logs, lambda: nsqd.running and lookupd.running, stop, notes)


def _run(engine: list[str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*engine, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _containers(engine: list[str], standard: bool, data_dir: Path | None) -> LocalBroker:
    """nsqlookupd and nsqd from :data:`IMAGE`; raises BrokerError with the engine's words."""
    shown = " ".join(engine)
    if _run(engine, "image", "inspect", IMAGE).returncode != 0:
        print(f"pulling {IMAGE} with {shown} ...", file=sys.stderr, flush=True)
        pulled = _run(engine, "pull", IMAGE, timeout=DOWNLOAD_TIMEOUT)
        if pulled.returncode != 0:
            raise BrokerError(f"`{shown} pull {IMAGE}` failed: {pulled.stderr.strip()[-500:]}")
    ports = _ports(standard)
    host = sys.platform.startswith("linux")  # elsewhere containers run in a VM: publish
    bind = "127.0.0.1" if host else "0.0.0.0"  # inside the container; published on 127.0.0.1
    logs_dir = data_dir or Path(tempfile.mkdtemp(prefix="nsqworker-dev-nsq-"))
    logs_dir.mkdir(parents=True, exist_ok=True)
    mark = uuid.uuid4().hex[:8]
    names = (f"nsqworker-dev-nsqlookupd-{mark}", f"nsqworker-dev-nsqd-{mark}")
    if host:
        network = ["--network", "host"]
    else:
        network = [f"-p=127.0.0.1:{port}:{port}" for port in ports.values()]
    volume = ["-v", f"{data_dir / 'nsqd'}:/data"] if data_dir else []
    if data_dir:
        (data_dir / "nsqd").mkdir(parents=True, exist_ok=True)
    commands = [
        [*network, IMAGE, "/nsqlookupd", f"--tcp-address={bind}:{ports['nsqlookupd TCP']}",
         f"--http-address={bind}:{ports['nsqlookupd HTTP']}", "--broadcast-address=127.0.0.1"],
        ["--network", f"container:{names[0]}", *volume, IMAGE, "/nsqd",
         f"--tcp-address={bind}:{ports['nsqd TCP']}", f"--http-address={bind}:{ports['nsqd HTTP']}",
         f"--lookupd-tcp-address=127.0.0.1:{ports['nsqlookupd TCP']}",
         "--broadcast-address=127.0.0.1", *(["--data-path=/data"] if data_dir else [])],
    ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    logs = [logs_dir / "nsqlookupd.log", logs_dir / "nsqd.log"]

    def stop() -> None:
        for name in reversed(names):  # each was run with --rm: stopped is removed
            _run(engine, "stop", "-t", "2", name, timeout=30)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    try:
        for name, command, log in zip(names, commands, logs, strict=True):
            with log.open("ab") as out:
                argv = [*engine, "run", "--rm", "--name", name, *command]
                procs.append(subprocess.Popen(argv, stdout=out, stderr=out))
            _wait_ready(procs[-1], name, log, ports)
    except BaseException:
        stop()
        raise
    notes = [f"containers {names[0]} and {names[1]} of {IMAGE}, with {shown}"]
    alive = lambda: all(p.poll() is None for p in procs)  # noqa: E731
    return _broker(ports, [logs[1], logs[0]], alive, stop, notes)


def _wait_ready(proc: subprocess.Popen[bytes], name: str, log: Path, ports: dict[str, int]) -> None:
    """Wait for the container's HTTP ``/ping``; BrokerError if it exits or never answers."""
    port = ports["nsqlookupd HTTP" if "nsqlookupd" in name else "nsqd HTTP"]
    deadline = time.monotonic() + READY_TIMEOUT
    while not _answers(f"http://127.0.0.1:{port}/ping"):
        if proc.poll() is not None or time.monotonic() > deadline:
            said = log.read_text(errors="replace").strip()[-800:]
            raise BrokerError(f"container {name} did not start ({log}): {said}")
        time.sleep(0.1)


def _no_nsq(reasons: list[str]) -> BrokerError:
    from nsqworker.testing.locations import nsq_install_hint

    found = "".join(f"\n  - {reason}" for reason in reasons)
    return BrokerError(
        f"no NSQ broker could be started:{found}\nInstall one of: podman (Debian/Ubuntu:"
        " `apt-get install podman`; macOS: `brew install podman`, then `podman machine init"
        " && podman machine start`) or Docker (https://docs.docker.com/get-docker/), and"
        f" this command runs {IMAGE}; or {nsq_install_hint()}"
    )


def start_nsq(standard: bool, data_dir: Path | None, bin_dir: Path | None) -> LocalBroker:
    """nsqd and nsqlookupd running, from the first source of the module docstring.

    Raises:
        BrokerError: none worked (each step's reason and what to install), or a download's
            checksum did not match.
    """
    from nsqworker.testing.processes import find_binary

    reasons: list[str] = []
    try:
        binaries = (find_binary("nsqd", bin_dir), find_binary("nsqlookupd", bin_dir))
    except FileNotFoundError as exc:
        reasons.append(str(exc).split(";", 1)[0])
        cached = _cached_binaries()
        if cached is not None:
            return _processes(cached, standard, data_dir, [f"nsq {VERSION} from {cache_dir()}"])
    else:
        return _processes(binaries, standard, data_dir, [])
    engine = container_engine()
    if engine is None:
        reasons.append(f"no podman or docker on PATH ({CONTAINER_ENV} names another command)")
    else:
        try:
            return _containers(engine, standard, data_dir)
        except (BrokerError, OSError, subprocess.SubprocessError) as exc:
            reasons.append(f"{' '.join(engine)}: {exc}")
    mirror = os.environ.get(MIRROR_ENV, "").strip() or RELEASES
    where = release_platform()
    if mirror.lower() == "none":
        reasons.append(f"downloads are off ({MIRROR_ENV}=none)")
    elif where is None:
        reasons.append(
            f"NSQ publishes no release archive for {platform.system()} {platform.machine()}"
        )
    else:
        try:
            bin_dir = download_nsq(where, mirror, cache_dir())
        except ChecksumRefused:
            raise
        except (BrokerError, OSError, tarfile.TarError) as exc:
            reasons.append(str(exc))
        else:
            binaries = (str(bin_dir / "nsqd"), str(bin_dir / "nsqlookupd"))
            return _processes(binaries, standard, data_dir, [f"nsq {VERSION} from {bin_dir}"])
    raise _no_nsq(reasons)
