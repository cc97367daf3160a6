"""What every test server shares: one child process on loopback, its log file, waiting
until it is ready, stopping it (SIGTERM, then SIGKILL), and killing it at exit.

:class:`ServerProcess` is the base of :class:`~nsqworker.testing.processes.NsqdProcess`,
:class:`~nsqworker.testing.processes.NsqlookupdProcess`,
:class:`~nsqworker.testing.nats.NatsServerProcess` and
:class:`~nsqworker.testing.rabbitmq.RabbitMQProcess`; each says how to start and when it
is ready. Every one raises :class:`ServerProcessError` (also importable as
``NsqProcessError``) when it cannot be started or stopped.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, ClassVar, NoReturn, Self

__all__ = ["ServerProcess", "ServerProcessError", "signal_and_wait"]

STOP_TIMEOUT = 5.0
"""Seconds :meth:`ServerProcess.stop` waits after SIGTERM before it sends SIGKILL."""


class ServerProcessError(RuntimeError):
    """Raised when a test server (nsqd, nsqlookupd, nats-server, RabbitMQ) cannot be
    started or stopped; the message carries the end of its log."""


def signal_and_wait(
    proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float
) -> int | None:
    """Send ``sig`` to ``proc`` if it runs and wait; SIGKILL after ``timeout`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


_LIVE: set[ServerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    """Never leave a server behind when the interpreter exits."""
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.kill()
        with contextlib.suppress(Exception):
            server.discard_data()


class ServerProcess:
    """One server process: a subclass sets :attr:`name`, :attr:`log_path`, starts with
    :meth:`spawn` and waits with :meth:`wait_until`.

    ``with server:`` starts it unless it runs and closes it at the end.
    """

    name: str = "server"
    stop_timeout: ClassVar[float] = STOP_TIMEOUT

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0

    # -- what a subclass provides ---------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """The file that receives the server's output."""
        raise NotImplementedError

    def start(self) -> Self:
        """Start the server and wait until it is ready."""
        raise NotImplementedError

    def discard_data(self) -> None:
        """Remove what the server stored, if this object created the place (at close)."""

    @property
    def title(self) -> str:
        """What messages call the server (its :attr:`name` unless a subclass says more)."""
        return self.name

    # -- state -----------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """Process id of the running (or last) process."""
        if self._proc is None:
            raise ServerProcessError(f"{self.title} was never started")
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """Exit status of the last process, None while it runs or before the first start."""
        return None if self._proc is None else self._proc.poll()

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -------------------------------------------------------------------------

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start ``argv`` in a session of its own (a terminal's Ctrl-C reaches only our
        caller), its output appended to :attr:`log_path` after a header line."""
        if self.running:
            raise ServerProcessError(f"{self.title} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"--- {' '.join(argv)}\n".encode())
        self._log.flush()
        self._log_offset = self._log.tell()
        self._proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
        _LIVE.add(self)

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready()`` until it is true; kill the server and raise
        :class:`ServerProcessError` if it exits first or ``timeout`` seconds pass
        (``what`` names what was awaited)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is None or self._proc.poll() is not None:  # what spawn() started
                status = self.returncode
                self.kill()
                self.fail(f"exited with status {status}")
            if ready():
                return
            if time.monotonic() >= deadline:
                self.kill()
                self.fail(f"did not {what} within {timeout:g}s")
            time.sleep(0.02)

    def fail(self, what: str) -> NoReturn:
        """Raise :class:`ServerProcessError` saying ``what`` happened, with the log's end."""
        raise ServerProcessError(
            f"{self.title} {what}; log {self.log_path}:\n{self.log_tail(since_start=True)}"
        )

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout`` seconds, the class's
        ``stop_timeout`` by default); return the exit status."""
        return self.terminate(signal.SIGTERM, self.stop_timeout if timeout is None else timeout)

    def kill(self) -> int | None:
        """SIGKILL and wait, like a crash."""
        return self.terminate(signal.SIGKILL, STOP_TIMEOUT)

    def terminate(self, sig: signal.Signals, timeout: float) -> int | None:
        """Send ``sig``, wait up to ``timeout`` (then SIGKILL), close the log."""
        proc = self._proc
        try:
            return None if proc is None else signal_and_wait(proc, sig, timeout)
        finally:
            _LIVE.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None

    def close(self) -> None:
        """Stop the server and remove its data if this object created the place."""
        try:
            self.stop()
        finally:
            self.discard_data()

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def log_tail(self, lines: int = 20, since_start: bool = False) -> str:
        """Last ``lines`` lines of the log (of the latest start if ``since_start``)."""
        try:
            with self.log_path.open("rb") as log:
                if since_start:
                    log.seek(self._log_offset)
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
