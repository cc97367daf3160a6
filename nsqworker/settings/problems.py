"""Where a bad setting came from: :class:`SettingsError`, one line per problem, each
naming the argument (``Settings(workers=...)``, or the command-line flag the caller named
for it), the ``NSQWORKER_*`` environment variable, or the config file its value was read
from, the problem, and the value (secrets masked).

:mod:`nsqworker.settings.base` sets the context variables below while it loads, so a
problem found deep in pydantic's validation can still say where its value came from.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import annotated_types
from pydantic import SecretStr, ValidationError

from nsqworker.errors import ConfigurationError
from nsqworker.settings.files import ENV_PREFIX, did_you_mean

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

__all__ = ["MASK", "SettingsError", "number", "origin", "secret_fields"]

MASK = "********"
#: The config file being loaded, by its keys as written (old names too); read by the
#: file source and by :func:`origin`.
FILE_VALUES: ContextVar[Mapping[str, Any] | None] = ContextVar("nsqw_file", default=None)
#: How the config file being loaded names a key in problems: "workers in config file x.toml".
FILE_LABEL: ContextVar[str | None] = ContextVar("nsqw_file_label", default=None)
#: How the caller of Settings.load spells each override, e.g. {"log_format": "--log-format"}.
OVERRIDE_NAMES: ContextVar[Mapping[str, str] | None] = ContextVar("nsqw_names", default=None)


class SettingsError(ConfigurationError):
    """Raised when settings are unknown or invalid; ``str()`` has one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("\n".join(self.problems))

    @classmethod
    def from_validation_error(
        cls,
        exc: ValidationError,
        overrides: Iterable[str] = (),
        fields: Mapping[str, FieldInfo] | None = None,
        renamed: Mapping[str, str] | None = None,
    ) -> SettingsError:
        """Turn pydantic's errors into ``<origin> (<field>): <problem>; got <value>`` lines.

        The origin is where the value came from: an argument in ``overrides`` (or the CLI
        flag the caller named for it), an ``NSQWORKER_*`` variable, or the config file.
        ``fields`` are the settings class's fields (for bounds, secrets and suggestions);
        ``renamed`` maps old setting names to their new ones.
        """
        given = frozenset(overrides)
        fields = fields or {}
        secrets = secret_fields(fields)
        old_of = {new: old for old, new in (renamed or {}).items()}
        lines: list[str] = []
        for err in exc.errors():
            ctx = err.get("ctx") or {}
            if err["type"] == "settings_conflict":
                lines += [_problem(f, msg, v, given, old_of) for f, msg, v in ctx["problems"]]
                continue
            loc = [str(p) for p in err["loc"]]
            field = loc[0] if loc else "?"
            where = field + "".join(f"[{p}]" for p in loc[1:])
            value = MASK if field in secrets else err.get("input")
            message = _message(err["type"], err["msg"], field, fields)
            lines.append(_problem(field, message, value, given, old_of, where))
        return cls(lines)


def secret_fields(fields: Mapping[str, FieldInfo]) -> frozenset[str]:
    """The fields typed ``SecretStr``: shown as ``********`` in problems and tables."""
    return frozenset(
        name
        for name, info in fields.items()
        if info.annotation is SecretStr or SecretStr in getattr(info.annotation, "__args__", ())
    )


def _problem(
    field: str,
    message: str,
    value: Any,
    overrides: frozenset[str],
    old_of: Mapping[str, str],
    where: str | None = None,
) -> str:
    shown = value if value == MASK else _shorten(repr(value))
    came_from = origin(field, overrides, old_of.get(field))
    where = where or field
    named = where == field and came_from.startswith((f"Settings({field}=", f"{field} in "))
    return f"{came_from if named else f'{came_from} ({where})'}: {message}; got {shown}"


def origin(field: str, overrides: Iterable[str], old: str | None = None) -> str:
    """Where ``field``'s value came from, as the user wrote it (``old``: the field's
    former name, still read from the environment and config files)."""
    if field in overrides:
        return (OVERRIDE_NAMES.get() or {}).get(field) or f"Settings({field}=...)"
    environ = {key.upper() for key in os.environ}
    env = ENV_PREFIX + field.upper()
    if env in environ:
        return env
    if old is not None and ENV_PREFIX + old.upper() in environ:
        return ENV_PREFIX + old.upper()
    label = FILE_LABEL.get()
    file_values = FILE_VALUES.get() or {}
    if label is not None:
        for name in (field, old):
            if name is not None and name in file_values:
                return label.format(field=name, env=ENV_PREFIX + name.upper())
    return env


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _message(kind: str, msg: str, field: str, fields: Mapping[str, FieldInfo]) -> str:
    if kind == "extra_forbidden":
        return "is not a setting" + did_you_mean(field, fields)
    bounds = (
        _bounds(fields.get(field)) if kind in ("greater_than_equal", "less_than_equal") else None
    )
    if bounds is not None:
        return f"must be from {number(bounds[0])} to {number(bounds[1])}"
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return msg.replace("Input should be", "must be")


def _bounds(info: FieldInfo | None) -> tuple[float, float] | None:
    """A field's ``(ge, le)`` bounds as declared in its ``Field``, or None."""
    metadata = info.metadata if info is not None else []
    low: list[Any] = [m.ge for m in metadata if isinstance(m, annotated_types.Ge)]
    high: list[Any] = [m.le for m in metadata if isinstance(m, annotated_types.Le)]
    return (float(low[0]), float(high[0])) if low and high else None


def number(value: float) -> str:
    """A bound or a value as people write it: ``60``, ``0.25``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
