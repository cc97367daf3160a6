"""The soak in the suite (issue 43): consumption never stops, on every transport.

The short form runs ``python -m bench.soak`` (what ``make soak`` runs) for 60 s on each
real broker, the three at once: ``nsqworker run`` with default settings, 2 worker processes, 5% of handler
calls raising ``Retry``, a broker restart every 20 s and a worker process killed with
SIGKILL; every message must be handled, no backoff stall reported, and (on NSQ) no
stretch longer than the longest backoff with a backlog, every connection at RDY 0 and
nothing handled. The
long form runs on the memory transport, whose virtual clock jumps over every pause: 30
minutes of traffic in seconds, with a worker drained and replaced twice. The 5- and
30-minute forms on real brokers stay in ``make soak`` (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from nsqworker.memory import MemoryTransport
from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry, Retry
from nsqworker.testing.ci import in_ci
from nsqworker.testing.rabbitmq import find_rootfs
from nsqworker.worker import Worker

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def quiet() -> Iterator[None]:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    yield
    structlog.configure(**saved)


TRANSPORTS = ["nsq", "nats", "rabbitmq-stream"]


def _missing(transport: str, request: pytest.FixtureRequest) -> str:
    """Why ``transport``'s broker cannot run here ('' when it can)."""
    try:
        if transport == "nats":
            request.getfixturevalue("nats_server_binary")
        elif transport == "rabbitmq-stream":
            find_rootfs(ROOT)
    except (FileNotFoundError, pytest.skip.Exception) as exc:
        return str(exc).splitlines()[0]
    return ""


@pytest.fixture(scope="module")
def short_soaks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[subprocess.Popen[str], Path] | str]]:
    """The three short soaks, started at once: each is light (10 messages a second), so
    the suite waits for the longest of them rather than for their sum."""
    out = tmp_path_factory.mktemp("soaks")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSQWORKER_", "SOAK_"))}
    # 5% failures with default backoff: each failure pauses a worker about 2 s, so the
    # rate stays where two workers keep up (about 20 a second) and the backlog can drain.
    env |= {"SOAK_SECONDS": "60", "SOAK_RATE": "10", "SOAK_FAIL": "0.05", "SOAK_DOC": "0"}
    soaks: dict[str, tuple[subprocess.Popen[str], Path] | str] = {}
    for transport in TRANSPORTS:
        if missing := _missing(transport, request):
            soaks[transport] = missing
            continue
        log = out / f"{transport}.out"
        # stderr apart: a library's log line written there must not land inside the report
        with log.open("w") as stdout, (out / f"{transport}.err").open("w") as stderr:
            soaks[transport] = (
                subprocess.Popen(
                    [sys.executable, "-m", "bench.soak"], cwd=ROOT, text=True,
                    env=env | {"TRANSPORT": transport}, stdout=stdout, stderr=stderr,
                ),
                log,
            )  # fmt: skip
    yield soaks
    for soak in soaks.values():
        if isinstance(soak, tuple) and soak[0].poll() is None:
            soak[0].kill()
            soak[0].wait()


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_short_soak_handles_every_message(
    transport: str, short_soaks: dict[str, tuple[subprocess.Popen[str], Path] | str]
) -> None:
    soak = short_soaks[transport]
    if isinstance(soak, str):
        if in_ci():
            pytest.fail(f"CI=true and the {transport} broker is missing: {soak}", pytrace=False)
        pytest.skip(soak)
    process, log = soak
    returncode = process.wait(timeout=400)
    out = log.read_text()
    err = log.with_suffix(".err").read_text()
    assert "{" in out, f"no report (exit {returncode}):\n{out[-3000:]}\n{err[-3000:]}"
    # the report is the JSON object printed last
    start = out.rindex("\n{\n") + 1 if "\n{\n" in out else out.index("{")
    report, _ = json.JSONDecoder().raw_decode(out, start)
    figures, checks = report["figures"], report["checks"]
    assert all(checks.values()), f"{checks}\n{figures}\n{out[-3000:]}"
    assert returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    assert figures["published"] >= 150 and figures["missing"] == 0
    assert figures["worker processes killed (SIGKILL)"] >= 1
    assert any(k.endswith("restarts") and v >= 2 for k, v in figures.items())


async def test_the_long_soak_on_the_memory_transport(quiet: None) -> None:
    """30 virtual minutes, 10 messages a second, 5% failing, two drains and restarts."""
    broker = MemoryTransport()
    handled: set[bytes] = set()
    calls = 0
    reg = Registry()

    @reg.task("soak", channel="worker", max_attempts=10, max_in_flight=50)
    async def soak(msg: Message) -> None:
        nonlocal calls
        calls += 1
        if calls % 20 == 7:  # 5%, spread evenly
            raise Retry(delay=0.2, reason="the ones that fail")
        handled.add(msg.body)

    seconds, rate = 30 * 60, 10
    for second in range(seconds):
        bodies = [f"{second * rate + i}".encode() for i in range(rate)]
        broker.call_later(second, lambda b=bodies: [broker.publish_nowait("soak", x) for x in b])
    settings = Settings(transport="memory", health_port=0, log_level="critical")
    replace_at = [seconds / 3, 2 * seconds / 3]
    start = broker.clock()
    levels = []
    total = seconds * rate
    for turn in range(3):  # a worker, drained and replaced at a third and two thirds
        until = start + replace_at[turn] if turn < len(replace_at) else float("inf")
        async with Worker(reg, settings, transport=broker) as worker:
            await broker.run_until_idle(
                timeout=120,
                until=lambda until=until: broker.clock() >= until or len(handled) == total,
            )
            task = worker.stats().tasks[soak.spec.name]
            levels.append(task.backoff_level)
            assert task.backoff_stalls == 0
    missing = seconds * rate - len(handled)
    assert missing == 0, f"{missing} never handled; {broker.pending('soak', 'worker')} pending"
    assert broker.clock() - start >= seconds  # the whole half hour went by, virtually
    assert len(levels) == 3
