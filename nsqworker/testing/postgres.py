"""A real PostgreSQL on loopback, for tests: ``initdb`` into a temporary directory, then
``postgres`` on a free 127.0.0.1 port, stopped by its process group.

The binaries come from :func:`find_postgres_bin`: ``$NSQWORKER_POSTGRES_BIN``, the
directory of ``initdb`` on ``PATH``, else Debian's ``/usr/lib/postgresql/<version>/bin``
(newest first; ``scripts/install-tools postgres`` installs Debian's ``postgresql``).
PostgreSQL refuses to run as root, so as root the server runs as the user ``postgres``
(Debian's package creates it), else ``nobody``, through ``setpriv``. The cluster has one
user, ``nsqworker``, with a random password (SCRAM), so :attr:`PostgresProcess.dsn`
carries a password like a real one does.

The pytest plugin ``nsqworker.testing`` registers the fixture ``postgres``: one running
:class:`PostgresProcess` per test, stopped and removed at teardown. Without PostgreSQL
the tests that use it are skipped, except under ``CI=true`` (or ``CI=1``), where they
fail. ::

    with PostgresProcess() as db:
        settings = Settings(schedule_leader="postgres", schedule_postgres_dsn=db.dsn)
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from nsqworker.testing.ports import LOOPBACK, free_port
from nsqworker.testing.server import ServerProcess, ServerProcessError

try:
    import pytest
except ImportError:  # pragma: no cover - the process works without pytest
    _HAVE_PYTEST = False
else:
    _HAVE_PYTEST = True

__all__ = ["POSTGRES_BIN_ENV", "POSTGRES_HINT", "PostgresProcess", "find_postgres_bin"]

POSTGRES_BIN_ENV = "NSQWORKER_POSTGRES_BIN"
POSTGRES_HINT = (
    "install PostgreSQL: scripts/install-tools postgres in a clone (Debian's postgresql, as"
    f" root), or apt-get install postgresql; or name its bin directory in ${POSTGRES_BIN_ENV}"
)
READY_TIMEOUT = 60.0
_READY = "database system is ready to accept connections"
_IN_USE = re.compile(r"could not bind|Address already in use|could not create any TCP/IP")


def _has_server(directory: Path) -> bool:
    return (directory / "initdb").is_file() and (directory / "postgres").is_file()


def find_postgres_bin(debian: Path = Path("/usr/lib/postgresql")) -> Path:
    """The directory of ``initdb`` and ``postgres``: ``$NSQWORKER_POSTGRES_BIN``, that of
    ``initdb`` on ``PATH`` (symlinks followed), else ``/usr/lib/postgresql/<version>/bin``
    of the newest version (``debian``: where Debian puts them).

    Raises:
        FileNotFoundError: none found; the message says how to install PostgreSQL.
    """
    places: list[Path] = []
    if os.environ.get(POSTGRES_BIN_ENV):
        places.append(Path(os.environ[POSTGRES_BIN_ENV]))
    if on_path := shutil.which("initdb"):
        places.append(Path(on_path).resolve().parent)
    versions = [p for p in debian.iterdir() if p.name.isdigit()] if debian.is_dir() else []
    places += [p / "bin" for p in sorted(versions, key=lambda p: int(p.name), reverse=True)]
    for place in places:
        if _has_server(place):
            return place
    searched = ", ".join(map(str, places)) or "PATH and /usr/lib/postgresql/*/bin"
    raise FileNotFoundError(f"no PostgreSQL server (searched {searched}); {POSTGRES_HINT}")


def _run_as() -> tuple[int, int] | None:
    """``(uid, gid)`` to run the server as, when this process is root; else None."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    raise ServerProcessError("PostgreSQL will not run as root, and there is no user postgres")


class PostgresProcess(ServerProcess):
    """PostgreSQL in a directory of its own on a free loopback port; :attr:`dsn` reaches
    its database ``postgres`` as the user ``nsqworker``."""

    name = "PostgreSQL"
    stop_timeout = 15.0
    user = "nsqworker"
    port = 0
    """The server's port on 127.0.0.1 (0 before the first start)."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        super().__init__()
        self.bin_dir = bin_dir or find_postgres_bin()
        self.base = Path(tempfile.mkdtemp(prefix="nsqworker-postgres-"))
        self._password = secrets.token_hex(12)
        self._owner = _run_as()

    @property
    def password(self) -> str:
        """The password of the user ``nsqworker`` (random, per instance)."""
        return self._password

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory (``initdb``'s)."""
        return self.base / "data"

    @property
    def log_path(self) -> Path:
        """The server's output."""
        return self.base / "postgres.log"

    @property
    def dsn(self) -> str:
        """``postgresql://nsqworker:<password>@127.0.0.1:<port>/postgres``."""
        return f"postgresql://{self.user}:{self.password}@{LOOPBACK}:{self.port}/postgres"

    def _as_owner(self, argv: list[str]) -> list[str]:
        if self._owner is None:
            return argv
        uid, gid = self._owner
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if self._owner is not None:
            os.chown(self.base, *self._owner)
        self.base.chmod(0o700)
        secret = self.base / "pwfile"
        secret.write_text(self._password + "\n")
        if self._owner is not None:
            os.chown(secret, *self._owner)
        argv = [
            str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.user,
            f"--pwfile={secret}", "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C",
            "--no-sync",
        ]  # fmt: skip
        try:
            done = subprocess.run(
                self._as_owner(argv), capture_output=True, text=True, timeout=120, check=False
            )
        finally:
            secret.unlink(missing_ok=True)
        if done.returncode != 0:
            raise ServerProcessError(
                f"initdb exited {done.returncode}: {(done.stderr or done.stdout).strip()[-2000:]}"
            )

    def start(self) -> Self:
        """initdb (the first time), then start the server and wait until it accepts
        connections; a port taken meanwhile is replaced by another (three tries).

        Raises:
            ServerProcessError: initdb failed, or the server did not start.
        """
        self._initdb()
        for attempt in range(3):
            self.port = self.port or free_port()
            # fsync off: a test's commits survive a kill of the server (the kernel has
            # them), not a crash of the machine; synchronous_commit stays on for that
            argv = [
                str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-c", f"listen_addresses={LOOPBACK}", "-c", f"unix_socket_directories={self.base}",
                "-c", "fsync=off", "-c", "full_page_writes=off",
                "-c", "max_connections=50", "-c", "shared_buffers=16MB",
            ]  # fmt: skip
            self.spawn(self._as_owner(argv), cwd=self.base)
            try:
                self.wait_until(self._ready, READY_TIMEOUT, "accept connections")
                return self
            except ServerProcessError:
                if attempt == 2 or not _IN_USE.search(self.log_tail(since_start=True)):
                    raise
                self.port = 0
        raise AssertionError("unreachable")

    def _ready(self) -> bool:
        return _READY in self.log_tail(200, since_start=True)

    def terminate(self, sig: signal.Signals, timeout: float) -> int | None:
        """Send ``sig`` to the server's process group (SIGTERM becomes SIGINT, a fast
        shutdown that does not wait for clients); SIGKILL to the group after ``timeout``."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT if sig == signal.SIGTERM else sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        if proc is not None:  # the rest of the group: backends outlive a killed postmaster
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        return super().terminate(signal.SIGKILL, 5.0)

    def discard_data(self) -> None:
        """Remove the cluster's directory (its data and log)."""
        shutil.rmtree(self.base, ignore_errors=True)


if _HAVE_PYTEST:

    @pytest.fixture
    def postgres() -> Iterator[PostgresProcess]:
        """One running PostgreSQL on loopback, removed at teardown; skips (fails under
        CI) when PostgreSQL is not installed."""
        from nsqworker.testing import _in_ci, _skip_missing

        try:
            server = PostgresProcess()
        except FileNotFoundError as exc:
            if _in_ci():
                pytest.fail(f"CI=true and PostgreSQL is missing: {exc}", pytrace=False)
            _skip_missing(str(exc))
        try:
            server.start()
            yield server
        finally:
            server.close()
