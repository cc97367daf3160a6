"""Settings by owner (issue 38): each transport takes only its own section.

A transport package imports only its own settings section module and the core one,
never the whole ``Settings`` (an AST walk of every import, lazy and ``TYPE_CHECKING``
ones too); every ``settings.x`` it reads is a field or method of its section; mypy
refuses a transport given another broker's section; and every field is declared by
exactly one owner's section.
"""

from __future__ import annotations

import ast
import os
import textwrap
from pathlib import Path

import pytest

from nsqworker.settings import (
    ConsoleSettings,
    CoreSettings,
    NatsSettings,
    NsqSettings,
    RpcSettings,
    ScheduleSettings,
    Settings,
    SettingsError,
    SparkSettings,
    StreamSettings,
    WorkerSettings,
)
from nsqworker.settings.base import SettingsBase

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nsqworker"
CORE = "nsqworker.settings.core"
SECTION_OF = {
    "nsqworker.nsq": ("nsqworker.settings.nsq", NsqSettings),
    "nsqworker.nats": ("nsqworker.settings.nats", NatsSettings),
    "nsqworker.streams": ("nsqworker.settings.streams", StreamSettings),
    "nsqworker.memory": (CORE, CoreSettings),
}
"""Each transport's package and the one settings section it takes (with core's)."""
SECTIONS = (
    CoreSettings, NsqSettings, NatsSettings, StreamSettings, WorkerSettings, RpcSettings,
    SparkSettings, ConsoleSettings, ScheduleSettings,
)  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def transport_modules() -> dict[str, tuple[str, str]]:
    """``{module: (its transport package, source)}`` for every transport module."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for package in SECTION_OF:
            if name == package or name.startswith(package + "."):
                found[name] = (package, path.read_text())
    return found


def settings_imports(source: str) -> set[str]:
    """The ``nsqworker.settings`` modules ``source`` imports (absolute imports: the
    transports import settings only that way)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("nsqworker.settings")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "nsqworker.settings"
        ):
            assert node.module is not None
            found.add(node.module)
            if node.module == "nsqworker.settings":  # from nsqworker.settings import nsq
                found |= {f"nsqworker.settings.{a.name}" for a in node.names if a.name.islower()}
    return found


def import_violations(imports: dict[str, tuple[str, set[str]]]) -> list[str]:
    """``module imports X`` for each settings module a transport module may not import."""
    found = []
    for module, (package, deps) in imports.items():
        allowed = {SECTION_OF[package][0], CORE}
        found += [f"{module} imports {dep}" for dep in sorted(deps - allowed)]
    return sorted(found)


def settings_reads(source: str) -> set[str]:
    """The attributes read of anything named ``settings`` (or ``self.settings``,
    ``self._settings``...)."""
    reads = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if name in ("settings", "_settings"):
            reads.add(node.attr)
    return reads


def has(section: type[SettingsBase], attr: str) -> bool:
    """A field or a method of ``section``."""
    return attr in section.model_fields or hasattr(section, attr)


def test_a_transport_imports_only_its_settings_section_and_core() -> None:
    imports = {
        module: (package, settings_imports(source))
        for module, (package, source) in transport_modules().items()
    }
    assert import_violations(imports) == []


def test_a_transport_reads_only_its_sections_fields() -> None:
    wrong = sorted(
        f"{module}: settings.{attr}"
        for module, (package, source) in transport_modules().items()
        for attr in settings_reads(source)
        if not has(SECTION_OF[package][1], attr)
    )
    assert wrong == []


def test_the_rules_catch_the_whole_settings_and_another_brokers_section() -> None:
    imports = {
        "nsqworker.nsq.subscription": ("nsqworker.nsq", {"nsqworker.settings"}),
        "nsqworker.nats.client": ("nsqworker.nats", {CORE, "nsqworker.settings.nsq"}),
        "nsqworker.streams.lag": ("nsqworker.streams", {"nsqworker.settings.streams"}),
    }
    assert import_violations(imports) == [
        "nsqworker.nats.client imports nsqworker.settings.nsq",
        "nsqworker.nsq.subscription imports nsqworker.settings",
    ]
    source = (
        "from nsqworker.settings import Settings\n"
        "def f():\n    from nsqworker.settings.nats import NatsSettings\n"
    )
    assert settings_imports(source) == {"nsqworker.settings", "nsqworker.settings.nats"}
    reads = settings_reads("def f(self, settings):\n    settings.workers\n    self._settings.x\n")
    assert reads == {"workers", "x"}
    assert has(NsqSettings, "client_id") and has(NsqSettings, "model_copy")
    assert not has(NsqSettings, "workers") and not has(NatsSettings, "nsqd_tcp_addresses")


def test_each_field_is_declared_by_exactly_one_section() -> None:
    owners: dict[str, list[str]] = {}
    for section in SECTIONS:
        own = [n for n in vars(section).get("__annotations__", {}) if n in section.model_fields]
        for name in own:
            owners.setdefault(name, []).append(section.__name__)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
    assert set(owners) == set(Settings.model_fields)
    assert all(issubclass(Settings, section) for section in SECTIONS)


def test_a_transports_section_holds_no_task_policy() -> None:
    for section in (NsqSettings, NatsSettings, StreamSettings):
        assert not set(section.model_fields) & set(WorkerSettings.model_fields), section
        assert set(CoreSettings.model_fields) <= set(section.model_fields)
        assert issubclass(section, SettingsBase)


def test_a_section_loads_on_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in [k for k in os.environ if k.upper().startswith("NSQWORKER_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("NSQWORKER_NATS_SERVERS", "127.0.0.1:4222")
    monkeypatch.setenv("NSQWORKER_WORKERS", "0")  # not NATS': not read
    nats = NatsSettings(transport="nats")
    assert nats.nats_servers == ["nats://127.0.0.1:4222"] and nats.source("nats_servers") == "env"
    assert not hasattr(nats, "workers")
    path = tmp_path / "c.toml"
    path.write_text('nats_stream = "ORDERS"\nmax_attempts = 0\n')
    loaded = NatsSettings.load(path, transport="nats")  # the worker's keys are not its own
    assert (loaded.nats_stream, loaded.source("nats_stream")) == ("ORDERS", "file")
    monkeypatch.setenv("NSQWORKER_NATS_SERVRS", "x")
    with pytest.raises(SettingsError, match="NSQWORKER_NATS_SERVRS is not a setting"):
        NatsSettings.load()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_transport_given_another_brokers_section_fails_mypy(tmp_path: Path) -> None:
    """The transports annotate their settings with their section, so mypy refuses
    another broker's section, and a read of a field that is not the section's (about
    40 s of CPU with a cold mypy cache, 2 s with the one ``make lint`` leaves)."""
    from mypy import api

    code = textwrap.dedent("""
        from nsqworker.nats.transport import NatsTransport
        from nsqworker.nsq.transport import NsqTransport
        from nsqworker.settings import Settings
        from nsqworker.settings.nats import NatsSettings
        from nsqworker.settings.nsq import NsqSettings
        from nsqworker.streams.transport import StreamTransport

        def right(nsq: NsqSettings, nats: NatsSettings, everything: Settings) -> None:
            NsqTransport(nsq)
            NatsTransport(nats)
            StreamTransport(everything)

        def wrong(nsq: NsqSettings, nats: NatsSettings) -> None:
            NsqTransport(nats)
            NatsTransport(nsq)
            nsq.workers
    """)
    snippet = tmp_path / "snippet.py"
    snippet.write_text(code)
    out, err, status = api.run([
        "--config-file", str(ROOT / "pyproject.toml"),
        "--cache-dir", str(ROOT / ".mypy_cache"),
        "--no-error-summary",
        str(snippet),
    ])  # fmt: skip
    errors = [line.split(": error: ")[1] for line in out.splitlines() if ": error: " in line]
    assert status == 1, (out, err)
    assert errors == [
        'Argument 1 to "NsqTransport" has incompatible type "NatsSettings"; expected'
        ' "NsqSettings"  [arg-type]',
        'Argument 1 to "NatsTransport" has incompatible type "NsqSettings"; expected'
        ' "NatsSettings"  [arg-type]',
        '"NsqSettings" has no attribute "workers"  [attr-defined]',
    ], out
