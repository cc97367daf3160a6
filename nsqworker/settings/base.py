"""What every section of the settings shares: how values are read, checked and shown.

Values come from, highest precedence first: keyword overrides (``Settings.load(**kw)`` or
``Settings(**kw)``), ``NSQWORKER_*`` environment variables, a config file (TOML, JSON or
dotenv), then the defaults. Durations are float seconds. List fields take a JSON list or
a comma-separated string in the environment. Anything unknown or invalid raises
:class:`~nsqworker.settings.problems.SettingsError`, one line per problem, each naming
the field and where its value came from.

Each section (:mod:`nsqworker.settings.core`, ``.nsq``, ``.nats``...) is a
:class:`SettingsBase` with its owner's fields only; :class:`nsqworker.settings.Settings`
inherits them all. A section loads on its own too (``NsqSettings.load()``), reading only
its fields.

A renamed setting keeps its old name as an alias (``RENAMED``, old -> new): the old
argument, ``NSQWORKER_*`` variable and config-file key still set the new field, each
logging one line that names the new one, and reading the old attribute warns.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from nsqworker.settings.files import (
    ENV_PREFIX,
    did_you_mean,
    file_label,
    read_config_file,
    unknown_env_vars,
)
from nsqworker.settings.problems import (
    FILE_LABEL,
    FILE_VALUES,
    MASK,
    OVERRIDE_NAMES,
    SettingsError,
    number,
)

__all__ = ["Seconds", "SettingsBase", "bounded", "renamed_attribute"]

log = logging.getLogger("nsqworker.settings")

Seconds = float


def bounded(default: float | None, ge: float, le: float, doc: str) -> Any:
    """A numeric field with its default, bounds and doc; the bounds end the doc."""
    return Field(default, ge=ge, le=le, description=f"{doc} [{number(ge)}..{number(le)}]")


def renamed_attribute(old: str, new: str) -> Any:
    """A read-only attribute ``old`` that returns ``new`` and warns (DeprecationWarning)."""

    def read(self: Any) -> Any:
        warnings.warn(
            f"Settings.{old} is deprecated; use Settings.{new}", DeprecationWarning, stacklevel=2
        )
        return getattr(self, new)

    read.__doc__ = f"Deprecated: the old name of ``{new}``."
    return property(read)


class _FileSource(PydanticBaseSettingsSource):
    """The values of the config file ``load()`` is reading, below the environment (old
    names read as their new ones)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        renamed = _renamed(self.settings_cls)
        values = FILE_VALUES.get() or {}
        return {renamed.get(key, key): value for key, value in values.items()}


class _RenamedEnvSource(PydanticBaseSettingsSource):
    """Old ``NSQWORKER_*`` names, below the new ones and above the config file."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        environ = {key.upper(): value for key, value in os.environ.items()}
        return {
            new: environ[ENV_PREFIX + old.upper()]
            for old, new in _renamed(self.settings_cls).items()
            if ENV_PREFIX + old.upper() in environ
        }


def _every_setting() -> list[str]:
    """The names of every section's fields, and their old names."""
    names: dict[str, None] = {}
    sections: list[type[SettingsBase]] = [SettingsBase]
    while sections:
        section = sections.pop()
        names.update(dict.fromkeys([*section.model_fields, *_renamed(section)]))
        sections += section.__subclasses__()
    return list(names)


def _renamed(cls: type) -> dict[str, str]:
    """Old name -> new name, for every rename a class and its bases declare."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        found.update(vars(klass).get("RENAMED", {}))
    fields = getattr(cls, "model_fields", {})
    return {old: new for old, new in found.items() if new in fields}


class SettingsBase(BaseSettings):
    """A section of the settings: its fields, loading, where each value came from, and
    the checks across fields (each section declares its own ``_section_conflicts``)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True
    )
    RENAMED: ClassVar[Mapping[str, str]] = {}
    """Old setting name -> its new name, still accepted (with a deprecation line)."""
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        """Build settings from ``values``, the environment and defaults; see ``load``."""
        renamed = _renamed(type(self))
        values, problems, spelled = _rename_arguments(values, renamed)
        environ = {key.upper() for key in os.environ}
        file_values = FILE_VALUES.get() or {}
        problems += _both_given(renamed, environ, file_values)
        names = OVERRIDE_NAMES.set({**spelled, **(OVERRIDE_NAMES.get() or {})})
        try:
            super().__init__(**values)
        except ValidationError as exc:
            error = SettingsError.from_validation_error(
                exc, values, type(self).model_fields, renamed
            )
            problems += error.problems
        finally:
            OVERRIDE_NAMES.reset(names)
        if problems:
            raise SettingsError(problems)
        old_of = {new: old for old, new in renamed.items()}
        for name in type(self).model_fields:
            old = old_of.get(name)
            source = "default"
            if name in values:
                source = "override"
            elif self.env_name(name) in environ or (old and ENV_PREFIX + old.upper() in environ):
                source = "env"
            elif name in file_values or (old and old in file_values):
                source = "file"
            self._sources[name] = source
        _log_renamed(renamed, spelled, environ, file_values)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Overrides, then the environment (old names below new), then the config file."""
        return (
            init_settings,
            env_settings,
            _RenamedEnvSource(settings_cls),
            _FileSource(settings_cls),
        )

    @model_validator(mode="after")
    def _check_together(self) -> Self:
        problems = tuple(self._conflicts())
        if problems:
            summary = "; ".join(f"{field} {message}" for field, message, _ in problems)
            ctx = {"summary": summary, "problems": problems}
            raise PydanticCustomError("settings_conflict", "{summary}", ctx)
        return self

    def _conflicts(self) -> Iterator[tuple[str, str, Any]]:
        """``(field, what to change, value)`` for each pair of settings that disagree: the
        ``_section_conflicts`` each section declares, core's first."""
        for klass in reversed(type(self).__mro__):
            check = vars(klass).get("_section_conflicts")
            if check is not None:
                yield from check(self)

    def _ordered(self, low: str, high: str) -> Iterator[tuple[str, str, Any]]:
        """The problem of ``low`` above ``high`` (a delay above its cap), if it is."""
        if getattr(self, low) > getattr(self, high):
            limit, env = number(getattr(self, high)), self.env_name(high)
            yield low, f"is more than {high} ({limit}); lower it or raise {env}", getattr(self, low)

    @classmethod
    def renamed(cls) -> dict[str, str]:
        """The old names still accepted, each with its new one: ``{"requeue_delay": "retry_delay"}``."""
        return _renamed(cls)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable of ``field``: ``max_in_flight`` -> ``NSQWORKER_MAX_IN_FLIGHT``."""
        if field not in cls.model_fields and field not in _renamed(cls):
            raise ValueError(f"{field} is not a setting" + did_you_mean(field, cls.model_fields))
        return ENV_PREFIX + field.upper()

    @classmethod
    def load(
        cls,
        config_file: str | Path | None = None,
        *,
        override_names: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Self:
        """Read settings: ``overrides`` > ``NSQWORKER_*`` environment > ``config_file`` > defaults.

        ``config_file`` is a ``.toml`` file (top-level keys, or a ``[nsqworker]`` or
        ``[tool.nsqworker]`` table), a ``.json`` file (an object, or one under
        ``"nsqworker"``), or a dotenv file (``.env``, ``*.env``; ``NSQWORKER_*`` keys; other
        keys are ignored, except a setting's bare name like ``max_attempts``, which is an
        error). When it is None, ``NSQWORKER_CONFIG`` may name one. Overrides that are None
        count as not given, so CLI options can be passed straight through;
        ``override_names`` says how the caller spells them in problems (the CLI passes
        ``{"log_format": "--log-format"}``). Raises ``SettingsError`` naming every unknown
        or invalid value and where it came from, including ``NSQWORKER_*`` environment
        variables that are not settings. A section (``NsqSettings.load()``) reads only its
        own fields and leaves the other sections' variables and keys alone.
        """
        known = [*cls.model_fields, *_renamed(cls)]
        every = _every_setting()  # a section's load() leaves the other sections' alone
        problems = unknown_env_vars(os.environ, every)
        if config_file is None and os.environ.get("NSQWORKER_CONFIG"):
            config_file = os.environ["NSQWORKER_CONFIG"]
        file_values: dict[str, Any] = {}
        if config_file is not None:
            file_values, file_problems = read_config_file(Path(config_file), dict.fromkeys(every))
            problems += file_problems
        token = FILE_VALUES.set({k: v for k, v in file_values.items() if k in known})
        label = FILE_LABEL.set(None if config_file is None else file_label(Path(config_file)))
        names = OVERRIDE_NAMES.set(override_names)
        try:
            settings = cls(**{k: v for k, v in overrides.items() if v is not None})
        except SettingsError as exc:
            problems += exc.problems
        finally:
            OVERRIDE_NAMES.reset(names)
            FILE_LABEL.reset(label)
            FILE_VALUES.reset(token)
        if problems:
            raise SettingsError(problems)
        return settings

    def source(self, field: str) -> str:
        """Where ``field``'s value came from: default, env, file or override."""
        return self._sources.get(_renamed(type(self)).get(field, field), "default")

    def describe(self) -> list[tuple[str, str, str, str]]:
        """``(name, value, source, description)`` per field, secrets shown as ``********``."""
        return [
            (name, self.display(name), self.source(name), info.description or "")
            for name, info in type(self).model_fields.items()
        ]

    def display(self, field: str) -> str:
        """``field``'s value as text: lists comma-joined, unset as ``-``, secrets masked."""
        value = getattr(self, _renamed(type(self)).get(field, field))
        if value is None or value == []:
            return "-"
        if isinstance(value, SecretStr):
            return MASK
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, float):
            return number(value)
        if isinstance(value, list):
            return ",".join(value)
        return str(value)


def _rename_arguments(
    values: dict[str, Any], renamed: Mapping[str, str]
) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """``values`` with old names as their new ones, the problems (both given), and how
    each renamed argument was spelled (``{"retry_delay": "Settings(requeue_delay=...)"}``)."""
    out = dict(values)
    problems: list[str] = []
    spelled: dict[str, str] = {}
    for old, new in renamed.items():
        if old not in out:
            continue
        if new in out:
            problems.append(
                f"Settings({old}=...): is the old name of {new}, given too; give only {new}"
            )
            out.pop(old)
            continue
        out[new] = out.pop(old)
        spelled[new] = f"Settings({old}=...)"
    return out, problems, spelled


def _both_given(
    renamed: Mapping[str, str], environ: set[str], file_values: Mapping[str, Any]
) -> list[str]:
    """A problem for each setting set under both its old and new name in one place."""
    problems = []
    for old, new in renamed.items():
        old_env, new_env = ENV_PREFIX + old.upper(), ENV_PREFIX + new.upper()
        if old_env in environ and new_env in environ:
            problems.append(f"{old_env}: is the old name of {new_env}, set too; unset it")
        if old in file_values and new in file_values:
            label = (FILE_LABEL.get() or "{field} in config file").format(field=old, env=old_env)
            problems.append(f"{label}: is the old name of {new}, set too; remove it")
    return problems


def _log_renamed(
    renamed: Mapping[str, str],
    spelled: Mapping[str, str],
    environ: set[str],
    file_values: Mapping[str, Any],
) -> None:
    """One line per old name used: where it was used and the new name to use instead."""
    for old, new in renamed.items():
        places = []
        if new in spelled:
            places.append((spelled[new], new))
        if ENV_PREFIX + old.upper() in environ:
            places.append((ENV_PREFIX + old.upper(), ENV_PREFIX + new.upper()))
        if old in file_values:
            label = (FILE_LABEL.get() or "{field} in config file").format(
                field=old, env=ENV_PREFIX + old.upper()
            )
            places.append(
                (label, ENV_PREFIX + new.upper() if label.startswith(ENV_PREFIX) else new)
            )
        for where, instead in places:
            log.warning("%s is deprecated: %s was renamed %s; use %s", where, old, new, instead)
