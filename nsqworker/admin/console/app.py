"""The console's ASGI app: three pages, their live fragments, and the two actions.

Pages render from :class:`~.fleet.Fleet`'s latest read with Jinja2, autoescaping
everything (a message body is text, never HTML), under a Content-Security-Policy that
allows only the console's own script and style. The page script polls each page's
fragment (``?partial=1``) to keep it live; no front-end build, nothing from a CDN.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nsqworker.admin.console import actions
from nsqworker.admin.console.auth import Guard
from nsqworker.admin.console.fleet import (
    RATE_WINDOW,
    RECENT_WINDOW,
    Fleet,
    FleetView,
    TaskRow,
    error_time,
)
from nsqworker.admin.dead_letters import replay_plan, replay_sources
from nsqworker.logging import get_logger

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["SORT_KEYS", "create_app"]

log = get_logger("nsqworker.console")

HERE = Path(__file__).parent
#: Columns of the tasks table that sort, by the name used in ``?sort=``.
SORT_KEYS: dict[str, Callable[[TaskRow], Any]] = {
    "task": lambda r: r.task,
    "transport": lambda r: (r.system, r.task),
    "topic": lambda r: (r.topic, r.channel),
    "backlog": lambda r: r.backlog if r.backlog is not None else -1,
    "in_flight": lambda r: r.in_flight,
    "rate": lambda r: r.rate,
    "retries": lambda r: r.retries_recent,
    "dead": lambda r: r.dead_recent,
    "error": lambda r: error_time(r.last_error),
}
#: The part of a page the script refreshes (``?partial=1``).
LIVE = {"tasks.html": "tasks_live.html", "workers.html": "workers_live.html"}
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
     b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]  # fmt: skip


#: Listen addresses that only this machine reaches, and the host names it is reached by.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})


def host_name(header: str) -> str:
    """``Host`` without its port: ``127.0.0.1:8081`` -> ``127.0.0.1``, ``[::1]:80`` -> ``[::1]``."""
    if header.startswith("["):
        return header[: header.find("]") + 1]
    return header.rpartition(":")[0] if ":" in header else header


class _SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response; with ``loopback_only``, answers
    400 to a request whose ``Host`` is not a loopback name (a DNS-rebinding page that
    reaches 127.0.0.1 under its own name cannot read the console)."""

    def __init__(self, app: ASGIApp, loopback_only: bool) -> None:
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.loopback_only and scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            host = host_name(headers.get(b"host", b"").decode("latin-1").lower())
            if host not in LOOPBACK_NAMES:
                response = JSONResponse({"error": "this console answers only to 127.0.0.1 "
                                         "and localhost"}, 400)  # fmt: skip
                await response(scope, receive, send)
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: bodies are text
        undefined=jinja2.ChainableUndefined,  # a field an older worker lacks: blank
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(duration=duration, mib=mib, when=when, pretty=pretty)
    return env


def duration(seconds: Any) -> str:
    """``0.4s``, ``12s``, ``5m 03s``, ``2h 01m``, ``3d 4h``."""
    try:
        s = float(seconds)
    except (TypeError, ValueError, jinja2.UndefinedError):
        return "-"
    if s < 10:
        return f"{s:.1f}s"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def mib(value: Any) -> str:
    try:
        return f"{int(value) / 2**20:.1f} MiB"
    except (TypeError, ValueError, jinja2.UndefinedError):
        return "-"


def when(unix: Any) -> str:
    """A Unix time as UTC, to the second."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(unix))) if unix else "-"
    except (TypeError, ValueError, OverflowError, OSError, jinja2.UndefinedError):
        return "-"


def pretty(doc: Any) -> str:
    """JSON for people; the template escapes it like any text."""
    return json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True, default=str)


class Console:
    """The request handlers, over one fleet and one guard."""

    def __init__(self, settings: Settings, fleet: Fleet, guard: Guard) -> None:
        self.settings = settings
        self.fleet = fleet
        self.guard = guard
        self.env = _environment()

    def render(self, request: Request, name: str, **context: Any) -> HTMLResponse:
        partial = request.query_params.get("partial") == "1" and name in LIVE
        template = self.env.get_template(LIVE[name] if partial else name)
        context.update(
            request=request,
            actions_enabled=self.guard.actions_enabled,
            signed_in=self.guard.signed_in(request),
            interval=self.fleet.interval,
            partial=partial,
        )
        return HTMLResponse(template.render(context))

    # -- pages --------------------------------------------------------------------------

    async def tasks(self, request: Request) -> Response:
        view = await self.fleet.view()
        sort = request.query_params.get("sort", "backlog")
        if sort not in SORT_KEYS:
            sort = "backlog"
        order = request.query_params.get("order", "desc" if sort != "task" else "asc")
        rows = sorted(view.tasks, key=SORT_KEYS[sort], reverse=order == "desc")
        return self.render(
            request, "tasks.html", view=view, rows=rows, sort=sort, order=order,
            rate_window=RATE_WINDOW, recent_minutes=int(RECENT_WINDOW // 60),
        )  # fmt: skip

    async def workers(self, request: Request) -> Response:
        view = await self.fleet.view()
        return self.render(request, "workers.html", view=view)

    async def dead_letters(self, request: Request) -> Response:
        view = await self.fleet.view()
        topics = self.readable_topics(view)
        topic = request.query_params.get("topic") or (topics[0] if topics else "")
        notes: list[str] = []
        letters: list[Any] = []
        plan = None
        if topic and topic not in topics:
            problem: str | None = unknown_topic(topic, topics)
        else:
            letters, problem = await actions.list_letters(self.settings, topic, notes)
            if letters:
                plan = replay_plan(self.settings, topic, letters, replay_sources(view.tasks, topic))
        chosen = request.query_params.get("id")
        selected = next((x for x in letters if x.id == chosen), None)
        return self.render(
            request, "dead_letters.html", view=view, topics=topics, topic=topic,
            letters=letters, problem=problem, notes=notes, selected=selected, chosen=chosen,
            transport=self.settings.transport, plan=plan, list_limit=actions.LIST_LIMIT,
        )  # fmt: skip

    def readable_topics(self, view: FleetView) -> list[str]:
        """The dead-letter topics the console reads: its tasks' and the configured ones."""
        configured = self.settings.console_dead_letter_topics
        return sorted(set(dead_letter_topics(view)) | set(configured))

    async def fleet_json(self, request: Request) -> Response:
        view = await self.fleet.view()
        return JSONResponse(fleet_document(view))

    # -- sign-in and actions ------------------------------------------------------------

    async def session(self, request: Request) -> Response:
        """``POST /api/session`` signs in with the token (a session of
        ``console_session_ttl`` seconds); ``DELETE`` signs out (that session ends)."""
        if request.method == "DELETE":
            response = JSONResponse({"signed_in": False})
            self.guard.end_session(request, response)
            return response
        denied = self.guard.check_origin(request)
        if denied is None and not self.guard.actions_enabled:
            denied = await self.guard.check_action(request)  # says: read-only
        if denied is None:  # a wrong token is answered after the guard's delay
            denied = await self.guard.check_token(str((await _json(request)).get("token") or ""))
        if denied is not None:
            return JSONResponse({"error": denied.message}, denied.status)
        response = JSONResponse({"signed_in": True, "expires_in": self.guard.session_ttl})
        self.guard.start_session(request, response)
        return response

    async def act(self, request: Request) -> Response:
        what = request.path_params["action"]
        denied = await self.guard.check_action(request)
        if denied is not None:
            log.warning(f"console {what} refused", reason=denied.message, peer=_peer(request))
            return JSONResponse({"error": denied.message}, denied.status)
        try:
            order = actions.Order.parse(what, await _json(request))
        except actions.BadOrder as exc:
            return JSONResponse({"error": str(exc)}, 400)
        view = await self.fleet.view()
        topics = self.readable_topics(view)
        if order.topic not in topics:
            return JSONResponse({"error": unknown_topic(order.topic, topics)}, 400)
        chosen = "all" if order.ids is None else len(order.ids)
        try:
            sources = replay_sources(view.tasks, order.topic)
            result = await actions.perform(self.settings, order, sources)
        except Exception as exc:  # the broker refused or is away: say so, keep serving
            log.error(f"console {what} failed", topic=order.topic, chosen=chosen,
                      error=str(exc), peer=_peer(request))  # fmt: skip
            return JSONResponse({"error": f"{what} failed: {type(exc).__name__}: {exc}"}, 502)
        counts = {k: v for k, v in result.items() if isinstance(v, int)}
        log.warning(f"console {what}", topic=order.topic, chosen=chosen, peer=_peer(request),
                    **counts)  # fmt: skip
        return JSONResponse(result)


def _peer(request: Request) -> str:
    return request.client.host if request.client is not None else "?"


async def _json(request: Request) -> dict[str, Any]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise actions.BadOrder("send JSON (Content-Type: application/json)")
    try:
        doc = await request.json()
    except ValueError:
        raise actions.BadOrder("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise actions.BadOrder("the body must be a JSON object")
    return doc


def dead_letter_topics(view: FleetView) -> list[str]:
    """The dead-letter topics the tasks name, sorted."""
    return sorted({t.dead_letter_topic for t in view.tasks if t.dead_letter_topic})


def unknown_topic(topic: str, topics: list[str]) -> str:
    """Why the console does not read ``topic``: no task dead-letters there."""
    known = ", ".join(topics) or "none yet"
    return (
        f"{topic!r} is not a dead-letter topic of the workers' tasks (those: {known}); the"
        " console reads no other topic (console_dead_letter_topics adds some)"
    )


def fleet_document(view: FleetView) -> dict[str, Any]:
    """The view as JSON: ``GET /api/fleet``."""
    return {
        "at": view.at,
        "discovery_error": view.discovery_error,
        "tasks": [{**vars(t)} for t in view.tasks],
        "supervisors": [
            {"url": s.endpoint.url, "name": s.endpoint.name, "error": s.error,
             "status": s.status, "inflight": s.inflight}
            for s in view.supervisors
        ],
    }  # fmt: skip


def create_app(settings: Settings, fleet: Fleet) -> ASGIApp:
    """The console over ``fleet``, which the app starts and closes with its lifespan."""
    token = settings.console_token
    guard = Guard(
        token.get_secret_value() if token is not None else None,
        settings.console_session_ttl,
        settings.console_forwarded_allow_ips,
    )
    console = Console(settings, fleet, guard)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        fleet.start()
        try:
            yield
        finally:
            await fleet.close()

    def bad_order(handler: Callable[[Request], Awaitable[Response]]) -> Any:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except actions.BadOrder as exc:
                return JSONResponse({"error": str(exc)}, 400)

        return wrapped

    async def livez(request: Request) -> Response:
        return JSONResponse({"live": True})

    routes = [
        Route("/livez", livez),
        Route("/", console.tasks),
        Route("/workers", console.workers),
        Route("/dead-letters", console.dead_letters),
        Route("/api/fleet", console.fleet_json),
        Route("/api/session", bad_order(console.session), methods=["POST", "DELETE"]),
        Route("/api/dead-letters/{action:str}", console.act, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    loopback = settings.console_host in LOOPBACK
    return _SecurityHeaders(Starlette(routes=routes, lifespan=lifespan), loopback_only=loopback)
