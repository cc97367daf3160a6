"""The checks behind the settings' address and list fields (the sections of
nsqworker.settings use them in their field types and validators): host:port, lookupd
URLs, host:port patterns, and lists given as JSON or commas."""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator
from pydantic_settings import NoDecode

__all__ = [
    "ReplyAddresses",
    "app_uri_pattern",
    "check_host",
    "check_port",
    "lookupd_address",
    "nsqd_address",
    "reply_address_pattern",
    "reply_pattern",
    "split_list",
]

_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def check_host(host: str) -> None:
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError("write IPv6 addresses in brackets, like [::1]:4150")
    elif not _HOSTNAME.match(host):
        raise ValueError(f"{host!r} is not a host name or IP address")


def check_port(port: str) -> int:
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("the port must be a number from 1 to 65535")
    return int(port)


def nsqd_address(text: str) -> str:
    """Check a ``host:port`` nsqd TCP address (``[::1]:4150`` for IPv6)."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError("must be host:port, like 127.0.0.1:4150")
    check_host(host)
    check_port(port)
    return text


def lookupd_address(text: str) -> str:
    """Check an nsqlookupd HTTP URL; a bare ``host:port`` gets ``http://``."""
    text = text.strip()
    has_scheme = "://" in text
    url = urlsplit(text if has_scheme else f"http://{text}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError("must be http(s)://host:port, like http://127.0.0.1:4161")
    if url.query or url.fragment or url.username:
        raise ValueError("leave out the query, fragment and user of the URL")
    host = url.netloc.rpartition("@")[2]
    name, sep, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if not has_scheme and not sep:
        raise ValueError(f"give a port, like {text}:4161")
    check_host(name if sep else host)
    if sep:
        check_port(port)
    return f"{url.scheme}://{host}{url.path.rstrip('/')}"


def reply_pattern(text: str) -> str:
    """Check an RPC reply pattern: ``host:port`` or a topic, ``*`` and ``?`` allowed."""
    text = text.strip()
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} is not a pattern (no spaces, not empty)")
    return text


def app_uri_pattern(text: str) -> str:
    """Check a Spark app URI pattern: ``scheme://...``, ``*`` and ``?`` allowed."""
    text = text.strip()
    if not re.match(r"^[a-z][a-z0-9+.-]*://\S*$", text):
        raise ValueError(f"{text!r} is not a URI pattern like s3a://my-bucket/jobs/*")
    return text


def reply_address_pattern(text: str) -> str:
    """Check an RPC reply address pattern: ``host:port``, ``*`` and ``?`` allowed."""
    text = reply_pattern(text)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port:
        raise ValueError(f"{text!r} is not host:port (a pattern like 10.0.0.*:4150)")
    return text


def split_list(value: Any) -> Any:
    """Read a list from a JSON list or a comma-separated string; other values pass."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a valid JSON list ({exc.msg})") from None
    return [part.strip() for part in text.split(",") if part.strip()]


ReplyAddresses = Annotated[list[Annotated[str, AfterValidator(reply_address_pattern)]], NoDecode]
"""A list of ``host:port`` patterns (``*`` and ``?`` allowed), from JSON or commas."""
