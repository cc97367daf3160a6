"""``nsqworker dev broker`` run in the background by a test, its output read as it comes."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path


def exported(output: str) -> dict[str, str]:
    """The variables of the ``export ...`` line the command printed."""
    (line,) = [x.strip() for x in output.splitlines() if x.strip().startswith("export ")]
    return dict(item.split("=", 1) for item in line.removeprefix("export ").split())


class DevBroker:
    """``nsqworker dev broker`` in the background, with its output read as it comes."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.out = ""
        self.err = ""

    def read_until(self, text: str, timeout: float, stream: str = "out") -> str:
        """Everything printed on ``stream`` ("out" or "err") until ``text`` appears there
        (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            assert self.proc.stdout is not None and self.proc.stderr is not None
            sel.register(self.proc.stdout, selectors.EVENT_READ, "out")
            sel.register(self.proc.stderr, selectors.EVENT_READ, "err")
            while text not in (self.out if stream == "out" else self.err):
                left = deadline - time.monotonic()
                assert left > 0 and self.proc.poll() is None, (
                    f"{self.argv} did not print {text!r}:\n{self.out}{self.err}"
                )
                for key, _ in sel.select(min(left, 1.0)):  # raw reads: no buffer hides lines
                    chunk = os.read(key.fd, 65536).decode(errors="replace")
                    if key.data == "out":
                        self.out += chunk
                    else:
                        self.err += chunk
        return self.out if stream == "out" else self.err

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str]:
        """Ctrl-C (or ``sig``), as a user would; the exit code and what it said on stderr."""
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=60)
        self.err += err
        return self.proc.returncode, self.err

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
