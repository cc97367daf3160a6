"""The console's sessions and refusals: a wrong credential costs half a second (Bearer,
the sign-in form or a bad cookie alike) without holding up anyone else; a session
expires after ``console_session_ttl``, ends on sign-out, and an old-format cookie is
refused; the cookie is ``Secure`` over TLS or behind a proxy the console is told to
believe; a script without the token is told the token is what it lacks.

The app is served in-process, as in test_console.py (no lifespan: pages read the fleet
on demand), from a peer address of the test's choosing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from nsqworker.admin.console.app import create_app
from nsqworker.admin.console.auth import COOKIE, WRONG_TOKEN_DELAY
from nsqworker.admin.console.discovery import StaticWorkers
from nsqworker.admin.console.fleet import Fleet
from nsqworker.settings import Settings, SettingsError

TOKEN = "s3cret-console-token-1234"
BODY = {"topic": "orders.dead"}  # no ids and no all: a 400 once past the guard


def page_headers(origin: str) -> dict[str, str]:
    return {"content-type": "application/json", "x-nsqworker-console": "1", "origin": origin}


@contextlib.asynccontextmanager
async def console(
    base_url: str = "http://127.0.0.1:8081", peer: str = "127.0.0.1", **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The console app with ``console_token`` set, reached from ``peer``."""
    s = Settings(console_token=TOKEN, console_host="0.0.0.0", **settings)
    fleet = Fleet(StaticWorkers([]), None, 0.2)
    transport = httpx.ASGITransport(create_app(s, fleet), client=(peer, 40000))
    try:
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as web:
            yield web
    finally:
        await fleet.close()


async def sign_in(web: httpx.AsyncClient, origin: str = "http://127.0.0.1:8081") -> httpx.Response:
    answer = await web.post("/api/session", json={"token": TOKEN}, headers=page_headers(origin))
    assert answer.status_code == 200, answer.text
    return answer


async def timed(request: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = await request
    return answer, time.monotonic() - started


@pytest.mark.both_loops
async def test_every_wrong_credential_costs_half_a_second_and_blocks_nobody() -> None:
    act = "/api/dead-letters/replay"
    page = page_headers("http://127.0.0.1:8081")
    async with console() as web:
        wrong, took = await timed(
            web.post(act, json=BODY, headers={"authorization": "Bearer wrong-token-0123456"})
        )
        assert wrong.status_code == 401 and wrong.json()["error"] == "wrong token"
        assert took >= WRONG_TOKEN_DELAY
        right, took = await timed(
            web.post(act, json=BODY, headers={"authorization": f"Bearer {TOKEN}"})
        )
        assert right.status_code == 400 and took < WRONG_TOKEN_DELAY  # past the guard at once
        form, took = await timed(web.post("/api/session", json={"token": "x" * 20}, headers=page))
        assert form.status_code == 401 and took >= WRONG_TOKEN_DELAY
        web.cookies.set(COOKIE, "s2.1.forged.00")
        forged, took = await timed(web.post(act, json=BODY, headers=page))
        assert forged.status_code == 401 and took >= WRONG_TOKEN_DELAY
        web.cookies.clear()
        # while three wrong guesses wait, a right token and a page are answered at once
        guesses = [
            timed(web.post(act, json=BODY, headers={"authorization": f"Bearer guess-{i:012d}"}))
            for i in range(3)
        ]
        others = [
            timed(web.post(act, json=BODY, headers={"authorization": f"Bearer {TOKEN}"})),
            timed(web.get("/livez")),
        ]
        results = await asyncio.gather(*guesses, *others)
        assert all(a.status_code == 401 and t >= WRONG_TOKEN_DELAY for a, t in results[:3])
        assert all(a.status_code in (200, 400) and t < WRONG_TOKEN_DELAY for a, t in results[3:])


async def test_a_session_expires_after_console_session_ttl() -> None:
    page = page_headers("http://127.0.0.1:8081")
    async with console(console_session_ttl=1) as web:
        signed = await sign_in(web)
        assert "Max-Age=1" in signed.headers["set-cookie"]
        cookie = signed.cookies[COOKIE]
        assert TOKEN not in cookie
        assert (
            await web.post("/api/dead-letters/replay", json=BODY, headers=page)
        ).status_code == 400

        async def expired() -> bool:
            web.cookies.set(COOKIE, cookie)  # as a browser that kept it past Max-Age
            answer = await web.post("/api/dead-letters/replay", json=BODY, headers=page)
            if answer.status_code == 400:  # still signed in
                return False
            assert answer.status_code == 401, answer.text
            assert answer.json()["error"] == "your session expired: enter the console token again"
            return True

        deadline = time.monotonic() + 10
        while not await expired():
            assert time.monotonic() < deadline, "the session never expired"
            await asyncio.sleep(0.05)
        assert "token-form" in (await web.get("/")).text  # the page asks for the token again
        web.cookies.clear()  # as the browser does after Max-Age
        await sign_in(web)
        assert (
            await web.post("/api/dead-letters/replay", json=BODY, headers=page)
        ).status_code == 400
    with pytest.raises(SettingsError, match="console_session_ttl"):
        Settings(console_session_ttl=0)


async def test_signing_out_ends_the_session_on_the_server() -> None:
    page = page_headers("http://127.0.0.1:8081")
    async with console() as web:
        cookie = (await sign_in(web)).cookies[COOKIE]
        assert (
            await web.post("/api/dead-letters/replay", json=BODY, headers=page)
        ).status_code == 400
        out = await web.delete("/api/session", headers=page)
        assert out.status_code == 200 and f'{COOKIE}=""' in out.headers["set-cookie"]
        web.cookies.set(COOKIE, cookie)  # a copy of the cookie kept from before
        again = await web.post("/api/dead-letters/replay", json=BODY, headers=page)
        assert again.status_code == 401 and "signed out" in again.json()["error"]
        web.cookies.clear()
        other = (await sign_in(web)).cookies[COOKIE]  # a new sign-in is a new session
        assert other != cookie
        assert (
            await web.post("/api/dead-letters/replay", json=BODY, headers=page)
        ).status_code == 400


async def test_an_old_format_cookie_is_refused() -> None:
    """The v1 cookie: a fixed HMAC of the token, valid forever."""
    v1 = hmac.new(TOKEN.encode(), b"nsqworker-console-session-v1", hashlib.sha256).hexdigest()
    page = page_headers("http://127.0.0.1:8081")
    async with console() as web:
        web.cookies.set(COOKIE, v1)
        answer = await web.post("/api/dead-letters/purge", json=BODY, headers=page)
        assert answer.status_code == 401
        assert "enter the console token again" in answer.json()["error"]
        assert "token-form" in (await web.get("/")).text


async def test_the_cookie_is_secure_over_tls_or_from_a_believed_proxy() -> None:
    proxied = {**page_headers("http://console.shop:8081"), "x-forwarded-proto": "https"}

    async def cookie_of(web: httpx.AsyncClient, headers: dict[str, str]) -> str:
        answer = await web.post("/api/session", json={"token": TOKEN}, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.headers["set-cookie"]

    async with console("https://console.shop") as web:  # TLS all the way to the console
        assert "Secure" in await cookie_of(web, page_headers("https://console.shop"))
    async with console("http://console.shop:8081", peer="10.1.2.3") as web:
        cookie = await cookie_of(web, proxied)  # no proxy believed: anyone may say https
        assert "Secure" not in cookie and "HttpOnly" in cookie
    believed = {"console_forwarded_allow_ips": "10.0.0.0/8"}
    async with console("http://console.shop:8081", peer="10.1.2.3", **believed) as web:
        assert "Secure" in await cookie_of(web, proxied)
        assert "Secure" not in await cookie_of(web, page_headers("http://console.shop:8081"))
        out = await web.delete("/api/session", headers=proxied)
        assert "Secure" in out.headers["set-cookie"]
    async with console("http://console.shop:8081", peer="192.168.7.7", **believed) as web:
        assert "Secure" not in await cookie_of(web, proxied)  # not from the proxy
    with pytest.raises(SettingsError, match="console_forwarded_allow_ips"):
        Settings(console_forwarded_allow_ips="proxy.example")


async def test_a_script_without_the_token_is_told_it_needs_the_token() -> None:
    async with console() as web:
        answer = await web.post(
            "/api/dead-letters/replay", json=BODY, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 401
        assert answer.json()["error"].startswith("token required: send Authorization: Bearer")
        cross = await web.post(
            "/api/dead-letters/replay", json=BODY, headers=page_headers("http://evil.example")
        )
        assert cross.status_code == 401 and "token required" in cross.json()["error"]
        await sign_in(web)  # with a session, another origin is still refused as such
        cross = await web.post(
            "/api/dead-letters/replay", json=BODY, headers=page_headers("http://evil.example")
        )
        assert cross.status_code == 403 and cross.json()["error"] == "cross-origin request refused"
