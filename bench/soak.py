"""``make soak``: nsqworker run for SOAK_MINUTES (30 by default) while things break.

A steady stream of messages goes to the brokers of ``TRANSPORT`` (nsq: 3 nsqd registered
with one nsqlookupd; nats: a nats-server with JetStream; rabbitmq-stream: RabbitMQ 4.0,
see bench/soak_brokers.py). ``nsqworker run`` (2 worker processes, default settings)
consumes them with a handler that raises ``Retry(delay=0.2)`` for SOAK_FAIL of the calls
(1% by default). Meanwhile each broker in turn is restarted (SIGTERM, start again on the
same data) every few minutes, and now and then a worker process is killed with SIGKILL.

At the end the script checks that every published message was handled at least once,
that nothing was dead-lettered (max_attempts=10), that consumption never stalled (no
backoff stall reported by the workers; on NSQ, no stretch longer than the longest
backoff with a backlog, every connection at RDY 0 and nothing handled), and, for runs of 5 minutes or
more, that resident memory and open file descriptors stayed flat: the mean of the last
window within 10% of the first window after warm-up (windows of 10 minutes, or a third of
the run when it is shorter). It writes the figures into .run/soak/reliability.md
(between the transport's ``soak`` markers) and a plot to .run/soak/soak.png
(soak-<transport>.png); with SOAK_DOC=1 into docs/reliability.md and docs/ instead (to
publish a run), with SOAK_DOC=0 nowhere. It exits 1 if a check failed.

    SOAK_MINUTES=3 TRANSPORT=nats .venv/bin/python -m bench.soak
    SOAK_SECONDS=60 SOAK_FAIL=0.05 SOAK_RATE=10 SOAK_DOC=0 .venv/bin/python -m bench.soak

The suite runs that short form on each transport (tests/soak/).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.soak_brokers import BROKERS, Brokers, stalls_reported
from nsqworker.settings import Settings
from nsqworker.testing import free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
"""Where SOAK_DOC=1 writes: docs/reliability.md and the plot beside it."""
RUNS = ROOT / ".run" / "soak"
"""Where a run writes by default, so the checkout's docs change only when asked."""
WARMUP = 60.0  # seconds before the first memory window
SAMPLE_EVERY = 5.0
STALL_LOOK_EVERY = 1.0
PROGRESS_EVERY = 60.0  # seconds between progress lines
# Messages a second by default. A RabbitMQ stream channel has one active consumer (the
# other process stands by), and under default consumer backoff each failure pauses it
# about 2 s: with 1% failing it keeps up with some 50 a second, not 100
# (docs/rabbitmq-streams.md, "Consumer backoff on one active consumer").
DEFAULT_RATE = {"nsq": "100", "nats": "100", "rabbitmq-stream": "30"}
# Said after "on the 2-core development machine" in the doc, e.g. what else ran.
SOAK_NOTE = os.environ.get("SOAK_NOTE", "")
STALL_NOTE = 15.0  # seconds of a stall before a progress line says so
REBOOT = 20.0  # seconds after a worker kill left out of the memory windows
MEMORY_CHECK_MINUTES = 5.0  # shorter runs are too short to tell a leak from a warm-up
# A backlog that no connection may receive for longer than the longest backoff pause
# plus the stall detector's margin is a stall.
_defaults = Settings()
LONGEST_PAUSE = _defaults.max_backoff_duration + 10.0
WORKERS = 2
IN_FLIGHT = 50  # the soak task's max_in_flight, per worker process

TASKS = """
import os
import random

from nsqworker.task import Retry, task


def _append(name, line):
    fd = os.open(os.environ[name], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line + b"\\n")
    finally:
        os.close(fd)


def dead(msg, reason):
    _append("SOAK_DEAD", msg.body)


FAIL = float(os.environ["SOAK_FAIL"])


@task("soak", channel="worker", max_attempts=10, max_in_flight={in_flight}, on_dead_letter=dead)
async def soak(msg):
    if random.random() < FAIL:
        raise Retry(delay=0.2, reason="the ones that fail")
    _append("SOAK_HANDLED", msg.body)
"""


@dataclass
class Sample:
    """One measurement of the worker processes (children summed) and the supervisor."""

    t: float
    workers_rss: int
    workers_fds: int
    supervisor_rss: int
    supervisor_fds: int
    children: int
    load: float = 0.0
    """The machine's 1-minute load average: how quiet the run was."""


@dataclass
class Run:
    """What happened during the soak."""

    minutes: float
    transport: str = "nsq"
    rate: int = 100
    fail: float = 0.01
    published: int = 0
    publish_failures: int = 0
    broker_restarts: int = 0
    worker_kills: int = 0
    stalled_for: float = 0.0
    stalled_at: float = 0.0
    """When (seconds into the run) that longest stretch began."""
    """The longest stretch the broker showed a backlog no connection could receive."""
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)


def _stall_text(run: Run) -> str:
    if not run.stalled_for:
        return "0"
    return f"{run.stalled_for:.1f} (from {run.stalled_at:.0f} s into the run)"


def _load_text(samples: list[Sample]) -> str:
    loads = [s.load for s in samples]
    return f"{sum(loads) / len(loads):.2f} / {max(loads):.2f}" if loads else "n/a"


def rss_and_fds(pid: int) -> tuple[int, int]:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return 0, 0


def get_json(url: str) -> dict[str, object]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as exc:
        return dict(json.load(exc))
    except OSError:
        return {}


class Soak:
    def __init__(
        self, run: Run, brokers: Brokers, workdir: Path, report_dir: Path | None = RUNS
    ) -> None:
        self.run = run
        self.brokers = brokers
        self.report_dir = report_dir  # None: no report
        self.write_docs = report_dir is not None
        self.workdir = workdir
        self.handled_file = workdir / "handled.txt"
        self.dead_file = workdir / "dead.txt"
        self.stop_publishing = threading.Event()
        self.lock = threading.Lock()
        self.down: set[int] = set()  # nsqd being restarted: publish elsewhere
        self.start = time.monotonic()
        self.stalled_since: float | None = None
        self.last_handled = -1
        self.stalls = 0

    def now(self) -> float:
        return time.monotonic() - self.start

    def note(self, what: str) -> None:
        self.run.events.append((self.now(), what))
        print(f"[{self.now():7.1f} s] {what}", flush=True)

    # -- the cluster and the worker ------------------------------------------------------

    def main(self) -> int:
        (self.workdir / "soak_tasks.py").write_text(
            textwrap.dedent(TASKS).format(in_flight=IN_FLIGHT)
        )
        with contextlib.ExitStack() as stack:
            self.brokers.start(stack)
            self.health = free_port()
            self.supervisor = self.start_worker()
            stack.callback(self.stop_worker)
            wait_for(self.ready, 60, message="the worker never became ready")
            self.start = time.monotonic()  # the run's minutes count from the first publish
            self.note(f"worker ready on {self.brokers.name}; publishing {self.run.rate}/s")
            publisher = threading.Thread(target=lambda: asyncio.run(self.publish()), daemon=True)
            publisher.start()
            self.chaos_and_sample()
            self.stop_publishing.set()
            publisher.join()
            self.note(f"published {self.run.published}; waiting for the last ones")
            complete = self.wait_handled(timeout=120)
            self.stalls = stalls_reported(self.health)
            self.stop_worker()
        status = self.report(complete)
        if status or os.environ.get("SOAK_KEEP_LOG"):  # past the temporary directory
            kept = Path(tempfile.gettempdir()) / f"nsqworker-soak-{self.run.transport}-worker.log"
            with contextlib.suppress(OSError):
                kept.write_bytes((self.workdir / "worker.log").read_bytes())
                why = "a check failed" if status else "SOAK_KEEP_LOG"
                print(f"{why}; the workers' log is in {kept}", file=sys.stderr)
        return status

    def start_worker(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
        env |= {
            "PYTHONPATH": os.pathsep.join([str(self.workdir), env.get("PYTHONPATH", "")]),
            "SOAK_HANDLED": str(self.handled_file),
            "SOAK_DEAD": str(self.dead_file),
            "SOAK_FAIL": str(self.run.fail),
            "NSQWORKER_RETRY_DELAY": "0.2",
            "NSQWORKER_LOG_LEVEL": "warning",
            "NSQWORKER_LOG_FORMAT": "json",
            **self.brokers.worker_env(),
        }
        log = (self.workdir / "worker.log").open("wb")
        return subprocess.Popen(
            [sys.executable, "-m", "nsqworker", "run", "soak_tasks", "--workers", str(WORKERS),
             "--health-port", str(self.health)],
            env=env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def stop_worker(self) -> None:
        if self.supervisor.poll() is None:
            self.supervisor.send_signal(signal.SIGTERM)
            try:
                self.supervisor.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.supervisor.pid, signal.SIGKILL)
                self.supervisor.wait()

    def worker_pids(self) -> list[int]:
        """The worker processes, as the supervisor's /readyz lists them (its other
        children, such as multiprocessing's resource tracker, are not workers)."""
        workers = get_json(f"http://127.0.0.1:{self.health}/readyz").get("workers") or []
        if not isinstance(workers, list):
            return []
        return [int(w["pid"]) for w in workers if isinstance(w, dict) and w.get("pid")]

    def ready(self) -> bool:
        return get_json(f"http://127.0.0.1:{self.health}/readyz").get("ready") is True

    # -- load, chaos, samples --------------------------------------------------------------

    async def publish(self) -> None:
        """``rate`` messages a second, in batches every 0.1 s, round robin over the
        brokers that are up; a batch counts once the broker acknowledged it."""
        seq, turn, nodes = 0, 0, self.brokers.nodes
        batch = max(1, self.run.rate // 10)
        every = batch / self.run.rate
        next_at = time.monotonic()
        while not self.stop_publishing.is_set():
            bodies = [str(seq + i) for i in range(batch)]
            for _ in range(nodes):
                turn = (turn + 1) % nodes
                with self.lock:
                    if turn in self.down:
                        continue
                try:
                    await asyncio.wait_for(self.brokers.publish(turn, bodies), 10)
                except Exception:
                    self.run.publish_failures += 1
                    continue
                seq += batch
                self.run.published = seq
                break
            next_at += every
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await self.brokers.close_publishers()

    def chaos_and_sample(self) -> None:
        duration = self.run.minutes * 60
        restart_every = max(20.0, min(180.0, duration / 9))  # 3 min in a 30 min run
        kill_every = max(45.0, min(300.0, duration / 4))
        next_restart, next_kill, next_sample = restart_every, kill_every, 0.0
        next_look = 0.0
        next_progress = PROGRESS_EVERY
        which = 0
        while self.now() < duration:
            if self.now() >= next_look:
                self.look_for_a_stall()
                next_look += STALL_LOOK_EVERY
            if self.now() >= next_sample:
                self.sample()
                next_sample += SAMPLE_EVERY
            if self.now() >= next_progress:
                published, handled = self.run.published, len(self.handled())
                self.note(
                    f"published {published}, handled {handled} ({published - handled} behind)"
                )
                next_progress += PROGRESS_EVERY
            if self.now() >= next_restart:
                self.restart_broker(which)
                which = (which + 1) % self.brokers.nodes
                next_restart += restart_every
            if self.now() >= next_kill:
                self.kill_a_worker()
                next_kill += kill_every
            time.sleep(0.2)

    def restart_broker(self, index: int) -> None:
        with self.lock:
            self.down.add(index)
        self.brokers.restart(index, down=2.0)
        with self.lock:
            self.down.discard(index)
        self.run.broker_restarts += 1
        self.note(f"{self.brokers.what_restarts} {index + 1} restarted")

    def kill_a_worker(self) -> None:
        children = self.worker_pids()
        if children:
            victim = random.choice(children)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            self.run.worker_kills += 1
            self.note(f"worker process {victim} killed with SIGKILL")

    def look_for_a_stall(self) -> None:
        """Every second: a stall is a backlog at the broker, every connection at RDY 0 and
        nothing handled since the last look. Under 1% failures each worker pauses about
        2 s after every failure and is at RDY 0 most of the time while it keeps up, so RDY
        0 alone, looked at now and then, would find long "stalls" that handled hundreds of
        messages."""
        handled = self.handled_bytes()
        progress, self.last_handled = handled != self.last_handled, handled
        if self.brokers.stalled() and not progress:
            if self.stalled_since is None:
                self.stalled_since = self.now() - STALL_LOOK_EVERY
            stalled_for = self.now() - self.stalled_since
            if stalled_for >= STALL_NOTE > self.run.stalled_for:
                self.note(
                    f"nothing handled since {self.stalled_since:.0f} s, a backlog and every "
                    f"connection at RDY 0: {getattr(self.brokers, 'detail', '')}"
                )
            if stalled_for > self.run.stalled_for:
                self.run.stalled_for = stalled_for
                self.run.stalled_at = self.stalled_since
        else:
            self.stalled_since = None

    def handled_bytes(self) -> int:
        try:
            return self.handled_file.stat().st_size
        except OSError:
            return 0

    def sample(self) -> None:
        children = self.worker_pids()
        measured = [rss_and_fds(pid) for pid in children]
        sup = rss_and_fds(self.supervisor.pid)
        self.run.samples.append(
            Sample(
                self.now(),
                sum(r for r, _ in measured),
                sum(f for _, f in measured),
                sup[0],
                sup[1],
                len(children),
                os.getloadavg()[0],
            )
        )

    def wait_handled(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.missing():
                return True
            time.sleep(1.0)
        return False

    def handled(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        if self.handled_file.exists():
            for line in self.handled_file.read_text().split():
                counts[line] = counts.get(line, 0) + 1
        return counts

    def missing(self) -> list[int]:
        seen = self.handled()
        return [i for i in range(self.run.published) if str(i) not in seen]

    # -- the verdict ------------------------------------------------------------------

    def report(self, complete: bool) -> int:
        run = self.run
        seen = self.handled()
        missing = self.missing()
        dead = self.dead_file.read_text().split() if self.dead_file.exists() else []
        duplicates = sum(n - 1 for n in seen.values())
        window = min(600.0, (run.minutes * 60 - WARMUP) / 3)
        # A worker process started to replace a killed one is still booting for a while:
        # its memory says nothing about a leak, so those samples are left out.
        kills = [t for t, what in run.events if "SIGKILL" in what]
        steady = [s for s in run.samples if not any(0 <= s.t - k < REBOOT for k in kills)]
        first = [s for s in steady if WARMUP <= s.t < WARMUP + window]
        last = [s for s in steady if s.t >= run.minutes * 60 - window]
        drift = {
            name: _drift([getattr(s, name) for s in first], [getattr(s, name) for s in last])
            for name in ("workers_rss", "workers_fds", "supervisor_rss", "supervisor_fds")
        }
        long_enough = run.minutes >= MEMORY_CHECK_MINUTES
        bound = duplicates_bound(run)
        checks = {
            "every message handled at least once": complete and not missing,
            "nothing dead-lettered": not dead,
            "consumption never stalled (no backoff stall reported)": self.stalls == 0,
            f"no backlog left unreceivable longer than {LONGEST_PAUSE:g} s": (
                run.stalled_for <= LONGEST_PAUSE
            ),
            "duplicates within the bound": duplicates <= bound,
        }
        if long_enough:
            checks["memory and fds flat (last window within 10% of the first)"] = all(
                abs(d) <= 0.10 for d in drift.values()
            )
        figures = {
            "transport": run.transport,
            "minutes": round(run.minutes, 2),
            "rate (messages/s)": run.rate,
            "handler failures (Retry)": f"{run.fail:.0%}",
            "published": run.published,
            "handled (distinct)": len(seen),
            "handled more than once (duplicates)": duplicates,
            "duplicates bound": bound,
            "missing": len(missing),
            "dead-lettered": len(dead),
            f"{self.brokers.what_restarts} restarts": run.broker_restarts,
            "worker processes killed (SIGKILL)": run.worker_kills,
            "publish batches refused (broker restarting)": run.publish_failures,
            "backoff stalls reported": self.stalls,
            "longest stretch with a backlog, every connection at RDY 0, nothing handled (s)": _stall_text(
                run
            ),
            "machine load average, 1 min (mean / max; 2 cores)": _load_text(run.samples),
        }
        if long_enough:
            figures |= {
                "window (s)": round(window),
                **{f"{k} drift": f"{v:+.1%}" for k, v in drift.items()},
                **{f"{k} first window (mean)": _mean_text(k, first) for k in drift},
                **{f"{k} last window (mean)": _mean_text(k, last) for k in drift},
            }
        print(json.dumps({"figures": figures, "checks": checks}, indent=2))
        if self.write_docs:
            self.write_doc(figures, checks)
            self.plot(first, last)
        return 0 if all(checks.values()) else 1

    @property
    def markers(self) -> tuple[str, str]:
        key = "soak" if self.run.transport == "nsq" else f"soak-{self.run.transport}"
        return f"<!-- {key}:begin -->", f"<!-- {key}:end -->"

    @property
    def plot_path(self) -> Path:
        name = "soak.png" if self.run.transport == "nsq" else f"soak-{self.run.transport}.png"
        assert self.report_dir is not None
        return self.report_dir / name

    def write_doc(self, figures: dict[str, object], checks: dict[str, bool]) -> None:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        begin, end = self.markers
        lines = [
            begin,
            f"Run of {when}, `SOAK_MINUTES={self.run.minutes:g} TRANSPORT={self.run.transport}`, "
            f"{self.run.rate} messages/s, {self.brokers.setup}, "
            f"{WORKERS} worker processes, on the 2-core development machine{SOAK_NOTE}.",
            "",
            "| figure | value |",
            "|---|---|",
            *(f"| {k} | {v} |" for k, v in figures.items()),
            "",
            "| check | result |",
            "|---|---|",
            *(f"| {k} | {'pass' if ok else '**FAIL**'} |" for k, ok in checks.items()),
            "",
            f"![RSS and open files of the worker processes during the soak]({self.plot_path.name})",
            end,
        ]
        assert self.report_dir is not None
        doc = self.report_dir / "reliability.md"
        doc.parent.mkdir(parents=True, exist_ok=True)
        text = doc.read_text() if doc.exists() else f"# Reliability\n\n{begin}\n{end}\n"
        if begin not in text:
            text += f"\n{begin}\n{end}\n"
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        doc.write_text(head + "\n".join(lines) + tail)
        print(f"soak: figures in {doc.relative_to(ROOT)}, plot in {self.plot_path.name}")

    def plot(self, first: list[Sample], last: list[Sample]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        samples = self.run.samples
        minutes = [s.t / 60 for s in samples]
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        top.plot(minutes, [s.workers_rss / 2**20 for s in samples], label="worker processes")
        top.plot(minutes, [s.supervisor_rss / 2**20 for s in samples], label="supervisor")
        top.set_ylabel("RSS (MiB)")
        bottom.plot(minutes, [s.workers_fds for s in samples], label="worker processes")
        bottom.plot(minutes, [s.supervisor_fds for s in samples], label="supervisor")
        bottom.set_ylabel("open fds")
        bottom.set_xlabel("minutes")
        for axis in (top, bottom):
            for t, what in self.run.events:
                if "restarted" in what or "killed" in what:
                    color = "tab:red" if "killed" in what else "tab:gray"
                    axis.axvline(t / 60, color=color, alpha=0.3, linewidth=1)
            for window in (first, last):
                if window:
                    axis.axvspan(window[0].t / 60, window[-1].t / 60, color="tab:green", alpha=0.08)
            axis.legend(loc="upper left")
        top.set_title(
            f"soak on {self.run.transport}: gray = {self.brokers.what_restarts} restart, "
            "red = worker SIGKILL, green = compared windows"
        )
        fig.tight_layout()
        self.plot_path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(self.plot_path, dpi=90)


def duplicates_bound(run: Run) -> int:
    """How many messages may be handled twice: each broker restart or worker kill may
    bring back what the worker processes held in flight plus about a second of handling
    (acknowledgements in transit, the RabbitMQ Streams offset stored every 0.2 s), and a
    publish batch that timed out may have reached the broker before it was sent again."""
    per_event = WORKERS * IN_FLIGHT + run.rate
    batch = max(1, run.rate // 10)
    return (run.broker_restarts + run.worker_kills) * per_event + run.publish_failures * batch


def _drift(first: list[int], last: list[int]) -> float:
    if not first or not last or not statistics.mean(first):
        return 0.0
    return statistics.mean(last) / statistics.mean(first) - 1


def _mean_text(name: str, window: list[Sample]) -> str:
    if not window:
        return "-"
    mean = statistics.mean(getattr(s, name) for s in window)
    return f"{mean / 2**20:.1f} MiB" if name.endswith("rss") else f"{mean:.1f}"


def main() -> int:
    env = os.environ
    minutes = float(env["SOAK_SECONDS"]) / 60 if "SOAK_SECONDS" in env else None
    minutes = minutes or float(env.get("SOAK_MINUTES", "30"))
    transport = env.get("TRANSPORT", "nsq") or "nsq"
    if transport not in BROKERS:
        print(f"TRANSPORT must be one of {', '.join(BROKERS)}, not {transport!r}", file=sys.stderr)
        return 2
    run = Run(
        minutes,
        transport=transport,
        rate=int(env.get("SOAK_RATE", DEFAULT_RATE[transport])),
        fail=float(env.get("SOAK_FAIL", "0.01")),
    )
    with tempfile.TemporaryDirectory(prefix="nsqworker-soak-") as workdir:
        where = {"0": None, "1": DOCS}.get(env.get("SOAK_DOC", ""), RUNS)
        soak = Soak(run, BROKERS[transport](), Path(workdir), where)
        return soak.main()


if __name__ == "__main__":
    raise SystemExit(main())
