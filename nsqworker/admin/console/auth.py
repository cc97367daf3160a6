"""Who may act: the console's token, its session cookie, and the CSRF checks.

Everyone who reaches the console may look. Actions (replay, purge) need ``console_token``
to be set, and then one of:

* a browser session: the page's token form posts the token once to ``/api/session``,
  which sets an ``HttpOnly``, ``SameSite=Strict`` cookie holding an HMAC of the token
  (never the token itself); each action then also sends the header
  ``X-Nsqworker-Console: 1`` and comes from the console's own origin (``Origin``, or
  ``Sec-Fetch-Site: same-origin``). Another site cannot send that header without a CORS
  preflight, which the console never answers, nor the cookie (``SameSite=Strict``);
* ``Authorization: Bearer <token>`` (scripts; browsers never add it on their own).

The server checks every action itself: a read-only page hides its buttons, but a request
made without them is refused all the same.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from starlette.requests import Request

__all__ = ["ACTION_HEADER", "COOKIE", "Denied", "Guard"]

COOKIE = "nsqworker_console"
ACTION_HEADER = "x-nsqworker-console"
_SESSION_LABEL = b"nsqworker-console-session-v1"


@dataclass(frozen=True)
class Denied:
    """Why a request may not act: an HTTP status and a message."""

    status: int
    message: str


class Guard:
    """Checks actions against ``token`` (None: the console is read-only)."""

    def __init__(self, token: str | None) -> None:
        self._token = token
        self._session = (
            hmac.new(token.encode(), _SESSION_LABEL, hashlib.sha256).hexdigest() if token else None
        )

    @property
    def actions_enabled(self) -> bool:
        """True when a token is set, so that actions are possible at all."""
        return self._token is not None

    def token_matches(self, given: str) -> bool:
        """Constant-time comparison of ``given`` with the token."""
        return self._token is not None and hmac.compare_digest(given.encode(), self._token.encode())

    @property
    def session_value(self) -> str:
        """The cookie value of a signed-in browser."""
        assert self._session is not None
        return self._session

    def signed_in(self, request: Request) -> bool:
        """True when the request carries a valid session cookie."""
        cookie = request.cookies.get(COOKIE, "")
        return self._session is not None and hmac.compare_digest(
            cookie.encode(), self._session.encode()
        )

    def check_action(self, request: Request) -> Denied | None:
        """None when ``request`` may act; else why not."""
        if self._token is None:
            return Denied(
                403, "this console is read-only: start it with a console_token to allow actions"
            )
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            if self.token_matches(auth[7:].strip()):
                return None
            return Denied(401, "wrong token")
        if not same_origin(request):
            return Denied(403, "cross-origin request refused")
        if request.headers.get(ACTION_HEADER) != "1":
            return Denied(403, f"missing the {ACTION_HEADER} header")
        if not self.signed_in(request):
            return Denied(401, "enter the console token first")
        return None

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
