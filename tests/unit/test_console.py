"""The console's app without a broker: who may act (token, cookie, CSRF checks), what a
page shows from real health servers (escaped, sorted), and its settings."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from nsqworker.admin.console.app import create_app
from nsqworker.admin.console.discovery import StaticWorkers, discovery_for
from nsqworker.admin.console.fleet import Fleet
from nsqworker.settings import Settings, SettingsError

TOKEN = "s3cret-console-token-1234"
ORIGIN = "http://127.0.0.1:8081"
ACT = {"content-type": "application/json", "x-nsqworker-console": "1", "origin": ORIGIN}
HOSTILE = "<script>window.pwned=1</script><b>bold</b>"


def status(tasks: list[dict[str, Any]], pid: int = 4242) -> dict[str, Any]:
    return {
        "pid": pid, "hostname": "pod-a", "target": "svc", "transport": "nsq", "uptime_s": 12.0,
        "memory_bytes": 50 * 2**20, "restarts": 0, "stopping": False,
        "workers": [{"worker": 1, "pid": pid + 1, "ready": True, "uptime_s": 11.0,
                     "memory_bytes": 60 * 2**20, "in_flight": 1}],
        "tasks": tasks,
    }  # fmt: skip


def task(name: str, **fields: Any) -> dict[str, Any]:
    row = {"task": name, "topic": name, "channel": "c", "system": "nsq", "received": 0,
           "finished": 0, "requeued": 0, "dead_lettered": 0, "in_flight": 0, "subscribed": True,
           "dead_letter_topic": None, "last_error": None}  # fmt: skip
    row.update(fields)
    return row


@contextlib.asynccontextmanager
async def client(urls: list[str], token: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The console app over ``urls``, served in-process (no lifespan: pages read the
    fleet on demand)."""
    settings = Settings(console_workers=urls, console_token=token)
    fleet = Fleet(StaticWorkers(list(settings.console_workers)), None, 0.2)
    transport = httpx.ASGITransport(create_app(settings, fleet))
    try:
        async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as web:
            yield web
    finally:
        await fleet.close()


async def test_without_a_token_every_action_is_refused() -> None:
    async with client([]) as web:
        page = (await web.get("/dead-letters")).text
        assert "read-only" in page and "data-action" not in page and "token-form" not in page
        for action in ("replay", "purge"):
            answer = await web.post(f"/api/dead-letters/{action}", json={"topic": "t", "all": True},
                              headers=ACT)  # fmt: skip
            assert answer.status_code == 403 and "read-only" in answer.json()["error"]
        answer = await web.post("/api/session", json={"token": "x" * 20}, headers=ACT)
        assert answer.status_code == 403
        bearer = {"authorization": f"Bearer {TOKEN}"}
        answer = await web.post("/api/dead-letters/replay", json={"topic": "t", "all": True},
                          headers=bearer)  # fmt: skip
        assert answer.status_code == 403


async def test_actions_need_the_session_the_header_and_the_origin() -> None:
    body = {"topic": "orders.dead"}  # no ids and no all: a BadOrder once past the guard
    async with client([], TOKEN) as web:
        assert (
            await web.post("/api/dead-letters/replay", json=body, headers=ACT)
        ).status_code == 401
        wrong = await web.post("/api/session", json={"token": "wrong-token-but-long"}, headers=ACT)
        assert wrong.status_code == 401 and "nsqworker_console" not in wrong.cookies
        for headers in (
            {**ACT, "origin": "http://evil.example"},
            {"content-type": "application/json", "origin": ORIGIN},  # no console header
            {"content-type": "application/json", "x-nsqworker-console": "1"},  # no origin
        ):
            assert (
                await web.post("/api/session", json={"token": TOKEN}, headers=headers)
            ).status_code == 403
        signed = await web.post("/api/session", json={"token": TOKEN}, headers=ACT)
        assert signed.status_code == 200
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        # Signed in: still refused cross-origin, or without the header (a plain form post).
        evil = {**ACT, "origin": "http://evil.example"}
        assert (
            await web.post("/api/dead-letters/replay", json=body, headers=evil)
        ).status_code == 403
        form = await web.post(
            "/api/dead-letters/replay", data={"topic": "x"}, headers={"origin": ORIGIN}
        )
        assert form.status_code == 403
        answer = await web.post("/api/dead-letters/replay", json=body, headers=ACT)
        assert answer.status_code == 400 and "all" in answer.json()["error"]  # past the guard
        fetch = {**ACT, "sec-fetch-site": "same-origin"}
        del fetch["origin"]
        assert (
            await web.post("/api/dead-letters/purge", json=body, headers=fetch)
        ).status_code == 400
        page = (await web.get("/")).text
        assert "actions enabled" in page and "token-form" not in page
        await web.delete("/api/session", headers=ACT)
        assert (
            await web.post("/api/dead-letters/replay", json=body, headers=ACT)
        ).status_code == 401


async def test_a_bearer_token_acts_without_a_browser_session() -> None:
    body = {"topic": "orders.dead", "ids": []}
    async with client([], TOKEN) as web:
        web.cookies.clear()
        bad = await web.post("/api/dead-letters/replay", json=body,
                       headers={"authorization": "Bearer wrong"})  # fmt: skip
        assert bad.status_code == 401
        good = await web.post("/api/dead-letters/replay", json=body,
                        headers={"authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert good.status_code == 400 and "ids" in good.json()["error"]


async def test_pages_show_bodies_and_errors_as_text(health: Callable[..., str]) -> None:
    error = {"error": f"ValueError: {HOSTILE}", "id": "0a", "attempts": 2, "at": 1.0,
             "outcome": "retry"}  # fmt: skip
    url = health(
        status([task(HOSTILE, last_error=error)]),
        [{"task": HOSTILE, "id": HOSTILE, "attempts": 1, "age_s": 3.5, "state": "running",
          "handler": "-", "pid": 4243, "worker": 1}],
    )  # fmt: skip
    async with client([url]) as web:
        for path in ("/", "/workers", "/?partial=1", "/workers?partial=1"):
            page = await web.get(path)
            assert "<script>window" not in page.text and "<b>bold" not in page.text
            assert "&lt;script&gt;window.pwned=1&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;" in page.text
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        dead = (await web.get("/dead-letters?topic=%3Cscript%3E")).text
        assert "&lt;script&gt;" in dead and "<script>" not in dead


async def test_tasks_sort_and_sum_over_supervisors(health: Callable[..., str]) -> None:
    a = health(status([task("a", in_flight=1, received=5), task("b", in_flight=7)]), [])
    b = health(status([task("a", in_flight=2, received=6)], pid=5000), [])
    async with client([a, b]) as web:
        fleet = (await web.get("/api/fleet")).json()
        rows = {t["task"]: t for t in fleet["tasks"]}
        assert (rows["a"]["in_flight"], rows["a"]["received"], rows["a"]["supervisors"]) == (
            3,
            11,
            2,
        )
        page = (await web.get("/?sort=in_flight&order=desc")).text
        assert page.index('data-task="b"') < page.index('data-task="a"')
        page = (await web.get("/?sort=in_flight&order=asc")).text
        assert page.index('data-task="a"') < page.index('data-task="b"')
        workers = (await web.get("/workers")).text
        assert workers.count('class="supervisor"') == 2 and "60.0 MiB" in workers


async def test_odd_answers_are_shown_not_fatal(health: Callable[..., str]) -> None:
    sparse = health({"tasks": [task("a", received="many", last_error={"at": "x"}),
                               task("b", last_error={"at": 5, "error": "E"})],
                     "workers": [{"pid": 7}]}, [])  # fmt: skip
    twice = health({"tasks": [task("a", last_error={"at": 9, "error": "E2"})]}, [])
    hostile = health({"tasks": "all of them", "workers": 3}, [])
    async with client([sparse, hostile, twice]) as web:
        for path in ("/", "/workers", "/?sort=error", "/?sort=error&order=asc"):
            page = await web.get(path)
            assert page.status_code == 200 and "malformed /status" in page.text
        assert 'data-task="a"' in (await web.get("/")).text


async def test_an_unreachable_worker_is_shown_not_fatal(health: Callable[..., str]) -> None:
    from nsqworker.testing import free_port

    good = health(status([task("a")]), [])
    async with client([good, f"http://127.0.0.1:{free_port()}"]) as web:
        page = (await web.get("/")).text
        assert 'data-task="a"' in page and "unreachable" in page


async def test_bound_to_loopback_it_answers_only_loopback_names() -> None:
    async with client([]) as web:
        for host in ("127.0.0.1:8081", "localhost:8081", "LOCALHOST", "[::1]:8081"):
            assert (await web.get("/livez", headers={"host": host})).status_code == 200
        for host in ("evil.example:8081", "127.0.0.1.evil.example", "", "localhost.evil:80"):
            answer = await web.get("/", headers={"host": host})
            assert answer.status_code == 400, host  # a DNS-rebinding page reads nothing
    settings = Settings(console_host="0.0.0.0")
    fleet = Fleet(StaticWorkers([]), None, 0.2)
    transport = httpx.ASGITransport(create_app(settings, fleet))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.shop:8081") as web:
        assert (await web.get("/livez")).status_code == 200  # reached by its service name
    await fleet.close()


def test_console_settings() -> None:
    with pytest.raises(SettingsError, match="at least 16 characters"):
        Settings(console_token="short")
    assert Settings(console_token="").console_token is None
    settings = Settings(console_token=TOKEN, console_workers="10.0.0.1:8080,http://b:9/x")
    assert settings.console_workers == ["http://10.0.0.1:8080", "http://b:9"]
    assert settings.display("console_token") == "********"
    assert settings.console_host == "127.0.0.1"  # safe by default
    with pytest.raises(SettingsError, match="console_workers"):
        Settings(console_workers="ftp://x:1")
    with pytest.raises(ValueError, match="--worker"):
        discovery_for(Settings())
    with pytest.raises(ValueError, match="namespace"):
        discovery_for(Settings(console_kubernetes_selector="app=x"))


def run_console(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    return subprocess.run(
        [sys.executable, "-m", "nsqworker", "console", *args],
        env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_command_says_what_is_missing() -> None:
    nothing = run_console()
    assert nothing.returncode == 2 and "--worker http://HOST:PORT" in nothing.stderr
    short = run_console("--worker", "127.0.0.1:8080", NSQWORKER_CONSOLE_TOKEN="tooshort-secret")
    assert short.returncode == 2 and "at least 16 characters" in short.stderr
    assert "tooshort-secret" not in short.stderr + short.stdout  # never printed
    bad = run_console("--worker", "ftp://x")
    assert bad.returncode == 2 and "--worker" in bad.stderr


async def test_actions_are_logged_with_their_peer(log_lines: Callable[[], list[Any]]) -> None:
    async with client([], TOKEN) as web:
        await web.post("/api/dead-letters/purge", json={"topic": "t", "all": True}, headers=ACT)
    (line,) = [x for x in log_lines() if x["event"] == "console purge refused"]
    assert line["reason"] == "enter the console token first" and line["peer"] == "127.0.0.1"
