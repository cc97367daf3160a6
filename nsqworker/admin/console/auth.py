"""Who may act: the console's token, its sessions, and the CSRF checks.

Everyone who reaches the console may look. Actions (replay, purge) need ``console_token``
to be set, and then one of:

* a browser session: the page's token form posts the token once to ``/api/session``,
  which sets an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` over TLS) holding a
  signed session: its issue time and a random id, with an HMAC under a key that is
  random per console process and bound to the token (never the token itself). A session
  lasts ``console_session_ttl`` seconds; signing out (``DELETE /api/session``) ends it on
  the server, and a restart or a new token ends them all. Each action then also sends
  the header ``X-Nsqworker-Console: 1`` and comes from the console's own origin
  (``Origin``, or ``Sec-Fetch-Site: same-origin``). Another site cannot send that header
  without a CORS preflight, which the console never answers, nor the cookie
  (``SameSite=Strict``);
* ``Authorization: Bearer <token>`` (scripts; browsers never add it on their own).

Every refused credential (a wrong token, whether Bearer or typed into the form, or a
session cookie that is forged, expired or signed out) is answered after
:data:`WRONG_TOKEN_DELAY` seconds, in one place (:meth:`Guard.refuse`), with
``asyncio.sleep``: it slows guessing without holding up anyone else's request.

The server checks every action itself: a read-only page hides its buttons, but a request
made without them is refused all the same.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

__all__ = [
    "ACTION_HEADER",
    "COOKIE",
    "WRONG_TOKEN_DELAY",
    "Denied",
    "Guard",
    "TrustedProxies",
    "same_origin",
]

COOKIE = "nsqworker_console"
ACTION_HEADER = "x-nsqworker-console"
#: Seconds every refused credential costs (docs/security.md promises half a second).
WRONG_TOKEN_DELAY = 0.5
#: The first field of a session cookie: the format (the v1 cookie was a bare HMAC).
SESSION_FORMAT = "s2"
#: Seconds a session's issue time may lie ahead of this clock (another replica's).
CLOCK_SKEW = 60.0
_KEY_LABEL = b"nsqworker-console-session-v2"

SIGN_IN = "enter the console token first"
TOKEN_REQUIRED = (
    "token required: send Authorization: Bearer <token>, or sign in on the console's page"
)
EXPIRED = "your session expired: enter the console token again"
NOT_VALID = (
    "this session is not valid (signed out, from before the console restarted or its "
    "token changed, or not one of this console's): enter the console token again"
)


@dataclass(frozen=True)
class Denied:
    """Why a request may not act: an HTTP status and a message."""

    status: int
    message: str


class TrustedProxies:
    """The peers whose ``X-Forwarded-Proto`` is believed: IP addresses, CIDR networks,
    or ``*`` for any (``console_forwarded_allow_ips``). Empty: nobody's."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.anyone = False
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            if entry.strip() == "*":
                self.anyone = True
            else:
                self.networks.append(ipaddress.ip_network(entry.strip(), strict=False))

    def __contains__(self, peer: str | None) -> bool:
        if peer is None:
            return False
        if self.anyone:
            return True
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:  # a Unix socket's path, or nothing
            return False
        return any(address in network for network in self.networks)


class Guard:
    """Checks actions against ``token`` (None: the console is read-only) and keeps the
    sessions of signed-in browsers for ``session_ttl`` seconds."""

    def __init__(
        self,
        token: str | None,
        session_ttl: float = 12 * 3600.0,
        trusted_proxies: Iterable[str] = (),
        *,
        wrong_token_delay: float = WRONG_TOKEN_DELAY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._token = token
        # random per process and bound to the token: a restart or a new token ends every
        # session, and nothing in a cookie helps find the token
        self._key = (
            hmac.new(secrets.token_bytes(32), _KEY_LABEL + token.encode(), hashlib.sha256).digest()
            if token
            else None
        )
        self.session_ttl = session_ttl
        self.proxies = TrustedProxies(trusted_proxies)
        self.wrong_token_delay = wrong_token_delay
        self._clock = clock
        self._signed_out: dict[str, float] = {}
        """Session ids signed out before they expire, with their expiry."""

    @property
    def actions_enabled(self) -> bool:
        """True when a token is set, so that actions are possible at all."""
        return self._token is not None

    def token_matches(self, given: str) -> bool:
        """Constant-time comparison of ``given`` with the token (no delay: see
        :meth:`check_token`)."""
        return self._token is not None and hmac.compare_digest(given.encode(), self._token.encode())

    async def refuse(self, message: str, status: int = 401) -> Denied:
        """A refused credential: answered after :data:`WRONG_TOKEN_DELAY` seconds, without
        holding up other requests."""
        deadline = time.monotonic() + self.wrong_token_delay
        while (left := deadline - time.monotonic()) > 0:  # uvloop's timers may fire early
            await asyncio.sleep(left)
        return Denied(status, message)

    async def check_token(self, given: str) -> Denied | None:
        """None when ``given`` is the token; else (after the delay) why not."""
        return None if self.token_matches(given) else await self.refuse("wrong token")

    # -- sessions -----------------------------------------------------------------------

    def new_session(self) -> str:
        """A new session's cookie value: ``s2.<issued ms>.<random id>.<hmac>``."""
        assert self._key is not None
        payload = f"{SESSION_FORMAT}.{int(self._clock() * 1000)}.{secrets.token_urlsafe(18)}"
        return f"{payload}.{self._mac(payload)}"

    def _mac(self, payload: str) -> str:
        assert self._key is not None
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def session_problem(self, cookie: str) -> str | None:
        """None when ``cookie`` is a live session of this console; else what to tell."""
        if self._key is None:
            return NOT_VALID
        payload, _, mac = cookie.rpartition(".")
        fields = payload.split(".")
        if (
            len(fields) != 3
            or fields[0] != SESSION_FORMAT
            or not (fields[1].isascii() and fields[1].isdigit())
            or not hmac.compare_digest(mac.encode(), self._mac(payload).encode())
        ):
            return NOT_VALID  # an old v1 cookie, a forgery, another process's
        now, issued = self._clock(), int(fields[1]) / 1000
        if issued > now + CLOCK_SKEW or fields[2] in self._signed_out:
            return NOT_VALID
        if now - issued >= self.session_ttl:
            return EXPIRED
        return None

    def signed_in(self, request: Request) -> bool:
        """True when the request carries a live session cookie."""
        cookie = request.cookies.get(COOKIE)
        return cookie is not None and self.session_problem(cookie) is None

    def secure(self, request: Request) -> bool:
        """Whether the browser reached the console over TLS: the request's own scheme, or
        ``X-Forwarded-Proto: https`` from a peer in ``console_forwarded_allow_ips``."""
        if request.url.scheme == "https":
            return True
        peer = request.client.host if request.client is not None else None
        if peer not in self.proxies:
            return False
        said = ",".join(request.headers.getlist("x-forwarded-proto"))
        return "https" in (part.strip().lower() for part in said.split(","))

    def start_session(self, request: Request, response: Response) -> None:
        """Set a new session's cookie on ``response``."""
        response.set_cookie(
            COOKIE, self.new_session(), max_age=int(self.session_ttl), path="/",
            httponly=True, samesite="strict", secure=self.secure(request),
        )  # fmt: skip

    def end_session(self, request: Request, response: Response) -> None:
        """Sign out: the request's session is refused from now on, and its cookie cleared."""
        cookie = request.cookies.get(COOKIE, "")
        if self.session_problem(cookie) is None:
            now = self._clock()
            issued = int(cookie.split(".")[1]) / 1000
            self._signed_out = {k: v for k, v in self._signed_out.items() if v > now}
            self._signed_out[cookie.split(".")[2]] = issued + self.session_ttl + CLOCK_SKEW
        response.delete_cookie(
            COOKIE, path="/", httponly=True, samesite="strict", secure=self.secure(request)
        )

    # -- checks -------------------------------------------------------------------------

    async def check_action(self, request: Request) -> Denied | None:
        """None when ``request`` may act; else why not (a refused credential after the
        delay)."""
        if self._token is None:
            return Denied(
                403, "this console is read-only: start it with a console_token to allow actions"
            )
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return await self.check_token(auth[7:].strip())
        cookie = request.cookies.get(COOKIE)
        from_page = same_origin(request) and request.headers.get(ACTION_HEADER) == "1"
        if cookie is None:  # no credential at all: say which one is missing
            return Denied(401, SIGN_IN if from_page else TOKEN_REQUIRED)
        if not same_origin(request):
            return Denied(403, "cross-origin request refused")
        if request.headers.get(ACTION_HEADER) != "1":
            return Denied(403, f"missing the {ACTION_HEADER} header")
        problem = self.session_problem(cookie)
        return None if problem is None else await self.refuse(problem)

    def check_origin(self, request: Request) -> Denied | None:
        """For the sign-in itself: only from the console's own pages."""
        if not same_origin(request) or request.headers.get(ACTION_HEADER) != "1":
            return Denied(403, "cross-origin request refused")
        return None


def same_origin(request: Request) -> bool:
    """The request comes from a page of this console: its ``Origin`` is this host, or
    the browser says ``Sec-Fetch-Site: same-origin``; a request with neither is refused."""
    origin = request.headers.get("origin")
    host = request.headers.get("host")
    if origin is not None and origin != "null":
        return host is not None and origin in (f"http://{host}", f"https://{host}")
    return request.headers.get("sec-fetch-site") == "same-origin"
