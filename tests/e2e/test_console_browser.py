"""``nsqworker console`` driven by a real browser (Debian's chromium through Playwright),
over a real ``nsqworker run`` on nsqd and on NATS JetStream.

The browser sees the backlog the broker reports, what a worker holds, a dead letter's
envelope and body (a ``<script>`` body shown as text, never run), signs in with the
token, presses Replay and sees the message handled and the backlog at zero. A console
without a token shows no action, and its server refuses one sent anyway.

With ``NSQWORKER_SCREENSHOTS=docs`` (``make screenshots``) the NSQ run writes the docs'
screenshots, docs/console-*.png; otherwise they go to the test's tmp_path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqworker.testing import free_port, wait_for
from nsqworker.testing.ci import in_ci
from nsqworker.testing.holds import holds

from .conftest import Supervised

BROWSER = "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
TOKEN = "console-test-token-0123456789"
HOSTILE = "bad <script>window.__pwned = 1</script><b>bold</b> & co"
TASK = "consolesvc.bill"
WAIT_MS = 30_000

MODULE = """
import asyncio, os
from nsqworker import task, Reject

@task(os.environ["ORDERS"], channel="billing", max_in_flight=1, max_attempts=3,
      dead_letter_topic=os.environ["ORDERS"] + ".dead")
async def bill(msg):
    while os.path.exists(os.environ["HOLD_FILE"]):
        await asyncio.sleep(0.05)
    body = msg.body.decode()
    if body.startswith("bad") and not os.path.exists(os.environ["FIXED_FILE"]):
        raise Reject("no such customer: " + body)
    with open(os.environ["HANDLED_FILE"], "a") as out:
        out.write(body + "\\n")
"""


class ConsoleProcess:
    """``python -m nsqworker console`` on a free port, its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = cwd / f"console-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqworker", "console", "--port", str(self.port), *args],
            env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_up(self) -> ConsoleProcess:
        wait_for(self._up, 30, message=lambda: f"console never answered:\n{self.output()}")
        return self

    def _up(self) -> bool:
        assert self.proc.poll() is None, f"console exited:\n{self.output()}"
        try:
            with urllib.request.urlopen(self.url + "/api/fleet", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


@pytest.fixture
def console(tmp_path: Path, base_env: dict[str, str]) -> Iterator[Callable[..., ConsoleProcess]]:
    started: list[ConsoleProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ConsoleProcess:
        full = {**base_env, "NSQWORKER_CONSOLE_POLL_INTERVAL": "0.5", **(env or {})}
        started.append(ConsoleProcess(list(args), full, tmp_path))
        return started[-1]

    yield start
    for proc in started:
        proc.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium under Playwright (never Playwright's own browser download)."""
    if not os.path.exists(BROWSER):
        message = f"{BROWSER} is missing: scripts/install-tools browser installs it"
        if in_ci():
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=BROWSER, headless=True, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    opened = context.new_page()
    opened.on("dialog", lambda dialog: dialog.accept())  # the Replay/Purge confirmations
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert errors == [], f"errors in the page's script: {errors}"


def shots_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get("NSQWORKER_SCREENSHOTS")
    return Path(chosen) if chosen else tmp_path


def broker_env(request: pytest.FixtureRequest, transport: str) -> tuple[dict[str, str], list[str]]:
    """The worker's environment and the console's broker flags for ``transport``."""
    if transport == "nsq":
        lookupd = request.getfixturevalue("nsqlookupd")
        request.getfixturevalue("nsqd_factory")(lookupd)
        return (
            {"NSQWORKER_LOOKUPD_HTTP_ADDRESSES": lookupd.http_address,
             "NSQWORKER_LOOKUPD_POLL_INTERVAL": "1"},
            ["--lookupd", lookupd.http_address],
        )  # fmt: skip
    server = request.getfixturevalue("nats_server")
    return (
        {"NSQWORKER_TRANSPORT": "nats", "NSQWORKER_NATS_SERVERS": server.url},
        ["--transport", "nats", "--nats", server.url],
    )


def publish(env: dict[str, str], topic: str, bodies: list[str]) -> None:
    """Publish with nsqworker's own Producer, from a thread of its own (Playwright's sync
    API owns this thread's event loop)."""
    from nsqworker import Producer
    from nsqworker.settings import Settings

    keys = ("TRANSPORT", "NATS_SERVERS", "LOOKUPD_HTTP_ADDRESSES")
    values = {k.lower(): env[f"NSQWORKER_{k}"] for k in keys if f"NSQWORKER_{k}" in env}
    settings = Settings(**values)
    if settings.transport == "nsq":  # the nsqd that lookupd knows, for the Producer
        url = settings.lookupd_http_addresses[0] + "/nodes"
        with urllib.request.urlopen(url, timeout=5) as response:
            node = json.loads(response.read())["producers"][0]
        settings = Settings(nsqd_tcp_addresses=[f"127.0.0.1:{node['tcp_port']}"])

    async def send() -> None:
        async with Producer(settings=settings) as producer:
            for body in bodies:
                await producer.publish(topic, body.encode())

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, send()).result(60)


def cell(page: Any, name: str) -> Any:
    return page.locator(f'#tasks tr[data-task="{TASK}"] td.{name}')


@pytest.mark.parametrize("transport", ["nsq", "nats"])
def test_the_console_in_a_browser(
    transport: str,
    request: pytest.FixtureRequest,
    supervise: Callable[..., Supervised],
    write_module: Callable[[str, str], str],
    console: Callable[..., ConsoleProcess],
    page: Any,
    base_env: dict[str, str],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    topic = "orders"
    dead = topic + ".dead"
    hold, fixed, handled = tmp_path / "hold", tmp_path / "fixed", tmp_path / "handled.txt"
    hold.touch()
    env, console_flags = broker_env(request, transport)
    env |= {"ORDERS": topic, "HOLD_FILE": str(hold), "FIXED_FILE": str(fixed),
            "HANDLED_FILE": str(handled)}  # fmt: skip
    write_module("consolesvc", MODULE)
    run = supervise("consolesvc", env=env)
    worker = f"http://127.0.0.1:{run.health_port}"
    acting = console("--worker", worker, *console_flags, env={"NSQWORKER_CONSOLE_TOKEN": TOKEN})
    looking = console("--worker", worker, *console_flags)
    run.wait_ready()
    acting.wait_up(), looking.wait_up()
    publish_env = {**base_env, **env}

    # 1. Three messages while the handler is held: one in flight, two waiting.
    publish(publish_env, topic, ["bad-1", "ok-2", "ok-3"])
    page.goto(acting.url + "/")
    expect(page.locator("#tasks")).to_contain_text(TASK)
    expect(cell(page, "transport")).to_have_text(transport)
    expect(cell(page, "backlog")).to_have_text("2", timeout=WAIT_MS)
    expect(cell(page, "in-flight")).to_have_text("1", timeout=WAIT_MS)
    shots = shots_dir(tmp_path)
    if transport == "nsq":
        page.screenshot(path=str(shots / "console-tasks.png"), full_page=True)
    page.goto(acting.url + "/workers")
    expect(page.locator("ul.held li").first).to_contain_text(TASK, timeout=WAIT_MS)
    expect(page.locator("section.supervisor .meta")).to_contain_text(f"pid {run.proc.pid}")
    if transport == "nsq":
        page.screenshot(path=str(shots / "console-workers.png"), full_page=True)

    # 2. Released: bad-1 and the hostile one are dead letters, the rest handled; the
    # open page follows by itself (live refresh), sorted as it was asked.
    page.goto(acting.url + "/?sort=dead&order=desc")
    expect(cell(page, "backlog")).to_have_text("2", timeout=WAIT_MS)
    publish(publish_env, topic, [HOSTILE])
    hold.unlink()
    wait_for(lambda: handled.exists() and handled.read_text().count("ok-") == 2, 30,
             message=run.output)  # fmt: skip
    expect(cell(page, "backlog")).to_have_text("0", timeout=WAIT_MS)
    expect(page.locator('th[data-key="dead"]')).to_have_attribute("aria-sort", "descending")
    expect(cell(page, "dead")).to_have_text("2", timeout=WAIT_MS)
    expect(cell(page, "error")).to_contain_text("<script>window.__pwned", timeout=WAIT_MS)

    # 3. The dead letters, the hostile body as text.
    page.goto(f"{acting.url}/dead-letters?topic={dead}")
    rows = page.locator("#dead-letters tbody tr")
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    expect(page.locator("button[data-action]")).to_have_count(0)  # not signed in yet
    page.locator("#dead-letters tbody tr", has_text="__pwned").locator("a").click()
    expect(page.locator("#body")).to_have_text(HOSTILE)
    assert page.locator("#body b").count() == 0 and page.locator("main script").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    expect(page.locator("#envelope")).to_contain_text('"reason": "no such customer: bad <script>')
    status = page.evaluate(
        """async (topic) => (await fetch('/api/dead-letters/replay', {method: 'POST',
            headers: {'Content-Type': 'application/json', 'X-Nsqworker-Console': '1'},
            body: JSON.stringify({topic, all: true})})).status""",
        dead,
    )
    assert status == 401  # the server refuses, not only the page

    # 4. Sign in, fix the handler, replay bad-1: handled once, backlog back to zero.
    page.fill("#token", TOKEN)
    page.click("#token-form button[type=submit]")
    expect(page.locator("#access")).to_contain_text("actions enabled")
    if transport == "nsq":
        page.screenshot(path=str(shots / "console-dead-letter.png"), full_page=True)
    fixed.touch()
    page.goto(f"{acting.url}/dead-letters?topic={dead}")
    page.locator("#dead-letters tbody tr", has_text="bad-1").locator("a").click()
    expect(page.locator("#body")).to_have_text("bad-1")
    page.click('#letter button[data-action="replay"]')
    expect(page.locator("#result")).to_contain_text("1 replayed", timeout=WAIT_MS)
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    wait_for(lambda: "bad-1" in handled.read_text(), 30, message=run.output)
    page.goto(acting.url + "/")
    expect(cell(page, "backlog")).to_have_text("0", timeout=WAIT_MS)
    holds(lambda: handled.read_text().splitlines().count("bad-1") == 1, 1.5, "bad-1 handled twice")

    # 5. Without a token: nothing to press, and the server refuses all the same.
    page.goto(f"{looking.url}/dead-letters?topic={dead}")
    expect(page.locator("#access")).to_contain_text("read-only")
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    rows.first.locator("a").click()
    expect(page.locator("#letter")).to_contain_text("Read-only console")
    expect(page.locator("button[data-action]")).to_have_count(0)
    assert page.locator("#token-form").count() == 0
    status = page.evaluate(
        """async (topic) => (await fetch('/api/dead-letters/purge', {method: 'POST',
            headers: {'Content-Type': 'application/json', 'X-Nsqworker-Console': '1'},
            body: JSON.stringify({topic, all: true})})).status""",
        dead,
    )
    assert status == 403
    page.goto(f"{acting.url}/dead-letters?topic={dead}")
    expect(rows).to_have_count(1)  # the read-only console's purge removed nothing

    # 6. Purge: the ticked ones on NSQ, all of the topic on NATS.
    if transport == "nsq":
        page.check("#select-all")
        page.click('button[data-action="purge"][data-scope="selection"]')
    else:
        page.click('button[data-action="purge"][data-scope="all"]')
    expect(page.locator("#result")).to_contain_text("1 purged", timeout=WAIT_MS)
    expect(page.locator("#dead-letters .empty")).to_contain_text("No dead letters")
    assert "<script>" not in handled.read_text()  # purged, never handled
