"""Where settings come from besides arguments: settings files (TOML, JSON, .env) and
``NSQWORKER_*`` names, with a suggestion for each name that is not a setting."""

from __future__ import annotations

import difflib
import io
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_PREFIX",
    "RESERVED_ENV_VARS",
    "did_you_mean",
    "file_label",
    "read_config_file",
    "unknown_env_vars",
]

ENV_PREFIX = "NSQWORKER_"
#: ``NSQWORKER_*`` variables that are not settings, which the docs give for other uses,
#: so a shell that sets them can still run a worker: ``NSQWORKER_CONFIG`` names the
#: config file ``Settings.load()`` reads when it is given none; ``NSQWORKER_TOOLS_BIN``
#: and ``NSQWORKER_RABBITMQ_ROOTFS`` tell the test fixtures and ``nsqworker dev broker``
#: where the brokers are (docs/testing.md); ``NSQWORKER_IMAGE`` is the base image a
#: service's Dockerfile builds on (docs/kubernetes.md); ``NSQWORKER_TEST_SLACK`` widens
#: the tests' time windows (docs/testing.md); ``NSQWORKER_DEV_CONTAINER``,
#: ``NSQWORKER_DEV_NSQ_MIRROR`` and ``NSQWORKER_DEV_NSQ_SHA256`` steer where
#: ``nsqworker dev broker`` gets NSQ from (docs/getting-started.md).
RESERVED_ENV_VARS = frozenset(
    {
        "NSQWORKER_CONFIG", "NSQWORKER_TOOLS_BIN", "NSQWORKER_RABBITMQ_ROOTFS",
        "NSQWORKER_IMAGE", "NSQWORKER_TEST_SLACK", "NSQWORKER_DEV_CONTAINER",
        "NSQWORKER_DEV_NSQ_MIRROR", "NSQWORKER_DEV_NSQ_SHA256",
    }
)  # fmt: skip


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest of ``choices``, else ``""``."""
    by_lower = {c.lower(): c for c in choices}
    match = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return f"; did you mean {by_lower[match[0]]}?" if match else ""


def unknown_env_vars(environ: Mapping[str, str], fields: Iterable[str]) -> list[str]:
    """A problem for each ``NSQWORKER_*`` variable that names no setting."""
    known = {ENV_PREFIX + f.upper() for f in fields} | RESERVED_ENV_VARS
    return [
        f"{key} is not a setting" + did_you_mean(key, sorted(known - RESERVED_ENV_VARS))
        for key in sorted(environ)
        if key.upper().startswith(ENV_PREFIX) and key.upper() not in known
    ]


def _is_dotenv(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".env") or name.startswith(".env")


def file_label(path: Path) -> str:
    """A format string naming a field of ``path`` in problems ({field}, {env})."""
    return ("{env}" if _is_dotenv(path) else "{field}") + f" in config file {path}"


def read_config_file(path: Path, fields: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The settings in ``path`` by field name, and the problems found reading it."""
    name, dotenv = path.name.lower(), False
    try:
        text = path.read_text(encoding="utf-8")
        if name.endswith(".toml"):
            data = _section(tomllib.loads(text))
        elif name.endswith(".json"):
            data = _section(json.loads(text))
        elif dotenv := _is_dotenv(path):
            data, bare = _dotenv_settings(text, fields)
            if bare:
                return {}, [
                    f"config file {path}: {key} is not read here; "
                    f"did you mean {ENV_PREFIX}{key.upper()}? (.env keys need the prefix)"
                    for key in bare
                ]
        else:
            return {}, [f"config file {path}: use a .toml, .json or .env file"]
    except OSError as exc:
        return {}, [f"config file {path}: cannot be read ({exc.strerror or exc})"]
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError, JSONDecodeError
        return {}, [f"config file {path}: not valid {path.suffix[1:].upper()} ({exc})"]
    if not isinstance(data, dict):
        return {}, [f"config file {path}: must hold a table/object of settings"]
    shown = {f: ENV_PREFIX + f.upper() if dotenv else f for f in [*fields, *data]}
    unknown = [
        f"config file {path}: {shown[key]} is not a setting"
        + did_you_mean(shown[key], [shown[f] for f in fields])
        for key in data
        if key not in fields
    ]
    return data, unknown


def _section(data: Any) -> Any:
    """The ``nsqworker`` or ``tool.nsqworker`` table of a document, else the document."""
    for path in (("nsqworker",), ("tool", "nsqworker")):
        table = data
        for key in path:
            table = table.get(key) if isinstance(table, dict) else None
        if isinstance(table, dict):
            return table
    return data


def _dotenv_settings(text: str, fields: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """``NSQWORKER_*`` keys of a dotenv file as field names, and the keys that are a
    setting's bare name (``max_attempts=3``: a mistake); other keys are ignored."""
    from dotenv import dotenv_values  # installed with pydantic-settings

    items = dotenv_values(stream=io.StringIO(text)).items()
    known = {field.lower() for field in fields}
    bare = [key for key, _ in items if key.lower() in known]
    values = {
        key[len(ENV_PREFIX) :].lower(): value or ""
        for key, value in items
        if key.upper().startswith(ENV_PREFIX) and key.upper() not in RESERVED_ENV_VARS
    }
    return values, bare
