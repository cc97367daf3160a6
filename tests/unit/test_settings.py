"""Settings: defaults, environment parsing, files, precedence, errors and masking."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import annotated_types
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from nsqworker.errors import ConfigurationError
from nsqworker.settings import Settings, SettingsError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No NSQWORKER_* variable from the developer's shell leaks into a test."""
    for key in list(os.environ):
        if key.upper().startswith("NSQWORKER_"):
            monkeypatch.delenv(key)


def load_error(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(SettingsError) as info:
        Settings.load(*args, **kwargs)
    return str(info.value)


# ---------------------------------------------------------------- defaults


def test_defaults_are_valid_and_documented() -> None:
    s = Settings.load()
    assert s.nsqd_tcp_addresses == [] and s.lookupd_http_addresses == []
    assert (s.max_in_flight, s.max_attempts, s.workers) == (100, 5, 1)
    assert (s.retry_delay, s.retry_multiplier, s.max_retry_delay) == (5.0, 2.0, 900.0)
    assert (s.msg_timeout, s.heartbeat_interval, s.drain_timeout) == (None, 30.0, 30.0)
    assert (s.log_level, s.log_format, s.compression) == ("info", "auto", "none")
    assert s.client_id and "." not in s.client_id and s.hostname
    assert s.auth_secret is None and s.tls_v1 is False and s.tls_verify is True
    for name, _value, source, description in s.describe():
        assert source == "default", name
        assert description, f"{name} has no description"


def test_numeric_fields_show_their_bounds_in_the_description() -> None:
    described = {name: doc for name, _, _, doc in Settings().describe()}
    assert described["max_in_flight"].endswith("[1..1000000]")
    assert described["output_buffer_timeout"].endswith("[0.025..30]")


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(ValueError):
        s.workers = 3


def test_settings_pickle_for_child_processes() -> None:
    s = Settings.load(workers=3, auth_secret="s")
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and copy.source("workers") == "override"


def test_env_name() -> None:
    assert Settings.env_name("max_in_flight") == "NSQWORKER_MAX_IN_FLIGHT"
    with pytest.raises(ValueError, match="did you mean max_in_flight"):
        Settings.env_name("max_inflight")


# ---------------------------------------------------------------- environment


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("127.0.0.1:4150", ["127.0.0.1:4150"]),
        ("a:4150, b:4150 ,", ["a:4150", "b:4150"]),
        ('["a:4150", "[::1]:4150"]', ["a:4150", "[::1]:4150"]),
        ("", []),
        ("a:4150,a:4150", ["a:4150"]),
    ],
)
def test_nsqd_addresses_from_env(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: list[str]
) -> None:
    monkeypatch.setenv("NSQWORKER_NSQD_TCP_ADDRESSES", raw)
    assert Settings.load().nsqd_tcp_addresses == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("127.0.0.1:4161", ["http://127.0.0.1:4161"]),
        ("http://a:4161/,https://b", ["http://a:4161", "https://b"]),
        (
            '["http://[::1]:4161", "lookupd-0.lookupd:4161"]',
            ["http://[::1]:4161", "http://lookupd-0.lookupd:4161"],
        ),
        ("https://gw.example.com/nsqlookupd/", ["https://gw.example.com/nsqlookupd"]),
    ],
)
def test_lookupd_addresses_from_env(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: list[str]
) -> None:
    monkeypatch.setenv("NSQWORKER_LOOKUPD_HTTP_ADDRESSES", raw)
    assert Settings.load().lookupd_http_addresses == expected


def test_scalars_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "WORKERS": "4",
        "RETRY_DELAY": "0.5",
        "TLS_VERIFY": "false",
        "LOG_LEVEL": "WARN",
        "LOG_FORMAT": "JSON",
        "COMPRESSION": "Deflate",
        "OUTPUT_BUFFER_SIZE": "-1",
        "AUTH_SECRET": "hunter2",
    }.items():
        monkeypatch.setenv(f"NSQWORKER_{key}", value)
    s = Settings.load()
    assert (s.workers, s.retry_delay, s.tls_verify) == (4, 0.5, False)
    assert (s.log_level, s.log_format, s.compression) == ("warning", "json", "deflate")
    assert s.output_buffer_size == -1
    assert isinstance(s.auth_secret, SecretStr) and s.auth_secret.get_secret_value() == "hunter2"
    assert s.source("workers") == "env"


def test_empty_env_unsets_optional_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQWORKER_TLS_SERVER_NAME", "")
    monkeypatch.setenv("NSQWORKER_AUTH_SECRET", " ")
    s = Settings.load()
    assert s.tls_server_name is None and s.auth_secret is None


def test_unknown_env_var_is_named_with_a_suggestion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQWORKER_MAX_INFLIGHT", "10")
    monkeypatch.setenv("NSQWORKER_CONFIG", "")  # reserved, not a setting, not an error
    message = load_error()
    assert message == (
        "NSQWORKER_MAX_INFLIGHT is not a setting; did you mean NSQWORKER_MAX_IN_FLIGHT?"
    )


def test_every_nsqworker_variable_the_docs_give_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 39: NSQWORKER_TOOLS_BIN, set in a shell for the test fixtures, made every
    worker refuse to start. Each NSQWORKER_* name the docs, examples and chart give is a
    setting or a documented non-setting, and never an error."""
    import re

    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *root.glob("docs/**/*.md"), *root.glob("examples/**/*")]
    pages += [p for p in (root / "deploy").rglob("*") if p.is_file()]
    names: set[str] = set()
    for page in pages:
        if page.is_file() and page.suffix not in {".png", ".pyc"}:
            names |= set(
                re.findall(r"NSQWORKER_[A-Z0-9_]*[A-Z0-9]", page.read_text(errors="replace"))
            )
    fields = {"NSQWORKER_" + f.upper() for f in Settings.model_fields}
    others = names - fields
    assert {"NSQWORKER_TOOLS_BIN", "NSQWORKER_RABBITMQ_ROOTFS", "NSQWORKER_CONFIG"} <= others
    for name in sorted(others - {"NSQWORKER_CONFIG"}):
        monkeypatch.setenv(name, "/somewhere")
    Settings.load()  # no "is not a setting"


def test_unknown_env_and_bad_values_are_reported_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQWORKER_WORKER", "2")
    monkeypatch.setenv("NSQWORKER_WORKERS", "0")
    lines = load_error().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("NSQWORKER_WORKER is not a setting; did you mean NSQWORKER_WORKERS")
    assert lines[1] == "NSQWORKER_WORKERS (workers): must be from 1 to 256; got '0'"


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("field", "raw", "problem"),
    [
        ("max_in_flight", "0", "must be from 1 to 1000000"),
        ("max_in_flight", "many", "must be a valid integer"),
        ("lookupd_poll_jitter", "1.5", "must be from 0 to 1"),
        ("msg_timeout", "901", "must be from 1 to 900"),
        ("output_buffer_size", "10", "must be -1 (no buffering) or from 64 to 65536"),
        ("output_buffer_timeout", "0.01", "must be from 0.025 to 30"),
        ("log_level", "loud", "must be 'debug', 'info', 'warning', 'error' or 'critical'"),
        ("log_format", "xml", "must be 'auto', 'console' or 'json'"),
        ("compression", "gzip", "must be 'none', 'deflate' or 'snappy'"),
        ("trace_parent_mode", "child", "must be 'link' or 'parent'"),
        ("tls_v1", "maybe", "must be a valid boolean"),
        ("tls_ca_file", "/no/such/ca.pem", "Path does not point to a file"),
        ("nsqd_tcp_addresses", "[1, 2", "not a valid JSON list"),
    ],
)
def test_bad_value_names_its_field(
    monkeypatch: pytest.MonkeyPatch, field: str, raw: str, problem: str
) -> None:
    monkeypatch.setenv(Settings.env_name(field), raw)
    message = load_error()
    assert message.startswith(f"{Settings.env_name(field)} ({field}")
    assert problem in message
    assert message.endswith(f"got {raw!r}")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("localhost", "must be host:port"),
        (":4150", "must be host:port"),
        ("::1:4150", "write IPv6 addresses in brackets"),
        ("[::g]:4150", "is not an IPv6 address"),
        ("host:0", "the port must be a number from 1 to 65535"),
        ("host:70000", "the port must be a number from 1 to 65535"),
        ("ho st:4150", "is not a host name or IP address"),
    ],
)
def test_bad_nsqd_address(raw: str, problem: str) -> None:
    message = load_error(nsqd_tcp_addresses=["ok:4150", raw])
    assert message.startswith("Settings(nsqd_tcp_addresses=...) (nsqd_tcp_addresses[1]): ")
    assert problem in message


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("ftp://h:4161", "must be http(s)://host:port"),
        ("lookupd", "give a port, like lookupd:4161"),
        ("http://h:4161/?x=1", "leave out the query"),
        ("http://h:x", "the port must be a number"),
    ],
)
def test_bad_lookupd_address(raw: str, problem: str) -> None:
    message = load_error(lookupd_http_addresses=raw)
    assert message.startswith("Settings(lookupd_http_addresses=...) (lookupd_http_addresses[0]): ")
    assert problem in message


def test_cross_field_problems_say_what_to_change(tmp_path: Path) -> None:
    pem = tmp_path / "c.pem"
    pem.write_text("x")
    lines = load_error(
        retry_delay=1000, reconnect_delay=61, tls_cert_file=pem, tls_server_name="nsqd"
    ).splitlines()
    assert lines == [  # by section: core's, then NSQ's, then the worker's
        "Settings(reconnect_delay=...): is more than max_reconnect_delay (60); "
        "lower it or raise NSQWORKER_MAX_RECONNECT_DELAY; got 61.0",
        "Settings(tls_cert_file=...): needs tls_key_file too; "
        f"set NSQWORKER_TLS_KEY_FILE; got '{pem}'",
        "Settings(tls_cert_file=...): needs tls_v1; "
        f"set NSQWORKER_TLS_V1=true or unset this one; got '{pem}'",
        "Settings(tls_server_name=...): needs tls_v1; "
        "set NSQWORKER_TLS_V1=true or unset this one; got 'nsqd'",
        "Settings(retry_delay=...): is more than max_retry_delay (900); "
        "lower it or raise NSQWORKER_MAX_RETRY_DELAY; got 1000.0",
    ]


def test_tls_files_are_accepted_with_tls_v1(tmp_path: Path) -> None:
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    s = Settings.load(
        tls_v1=True,
        tls_ca_file=tmp_path / "ca.pem",
        tls_cert_file=str(tmp_path / "cert.pem"),
        tls_key_file=tmp_path / "key.pem",
    )
    assert s.tls_cert_file == tmp_path / "cert.pem"


def test_settings_error_is_a_configuration_error() -> None:
    with pytest.raises(SettingsError) as info:
        Settings(workers=0)
    assert isinstance(info.value, ConfigurationError) and isinstance(info.value, ValueError)
    assert info.value.problems == ("Settings(workers=...): must be from 1 to 256; got 0",)


def test_unknown_override_is_named() -> None:
    assert load_error(max_inflight=3) == (
        "Settings(max_inflight=...): is not a setting; did you mean max_in_flight?; got 3"
    )


# ---------------------------------------------------------------- files and precedence


def test_toml_file_top_level_and_tables(tmp_path: Path) -> None:
    flat = tmp_path / "flat.toml"
    flat.write_text('workers = 3\nnsqd_tcp_addresses = ["a:4150"]\n')
    table = tmp_path / "table.toml"
    table.write_text("[other]\nx = 1\n[nsqworker]\nworkers = 4\n")
    tool = tmp_path / "pyproject.toml"
    tool.write_text("[project]\nname = 'x'\n[tool.nsqworker]\nworkers = 5\n")
    assert Settings.load(flat).nsqd_tcp_addresses == ["a:4150"]
    assert Settings.load(flat).source("workers") == "file"
    assert Settings.load(str(table)).workers == 4
    assert Settings.load(tool).workers == 5


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "conf.json"
    path.write_text(json.dumps({"nsqworker": {"max_attempts": 9, "log_format": "json"}}))
    s = Settings.load(path)
    assert (s.max_attempts, s.log_format) == (9, "json")


def test_dotenv_file(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text(
        "DATABASE_URL=postgres://x\n"  # not ours: ignored
        "NSQWORKER_LOOKUPD_HTTP_ADDRESSES=a:4161,b:4161\n"
        "NSQWORKER_AUTH_SECRET='s3cr3t'\n"
    )
    s = Settings.load(path)
    assert s.lookupd_http_addresses == ["http://a:4161", "http://b:4161"]
    assert s.auth_secret is not None and s.auth_secret.get_secret_value() == "s3cr3t"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "c.toml",
            "max_inflight = 1\n",
            "max_inflight is not a setting; did you mean max_in_flight?",
        ),
        ("c.json", '{"wokers": 2}', "wokers is not a setting; did you mean workers?"),
        (
            "prod.env",
            "NSQWORKER_DRAIN_TIMOUT=5\n",
            "NSQWORKER_DRAIN_TIMOUT is not a setting; did you mean NSQWORKER_DRAIN_TIMEOUT?",
        ),
    ],
)
def test_unknown_key_in_file_is_named(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert load_error(path) == f"config file {path}: {expected}"


def test_bad_value_in_file_names_its_field(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('workers = "many"\n')
    assert load_error(path).startswith(f"workers in config file {path}: must be a valid integer")


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("c.toml", "workers = ", "not valid TOML"),
        ("c.json", "{", "not valid JSON"),
        ("c.json", "[1]", "must hold a table/object of settings"),
        ("c.yaml", "workers: 1", "use a .toml, .json or .env file"),
    ],
)
def test_unreadable_config_file(tmp_path: Path, name: str, text: str, problem: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert problem in load_error(path)


def test_missing_config_file(tmp_path: Path) -> None:
    assert "cannot be read" in load_error(tmp_path / "nope.toml")


def test_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.toml"
    path.write_text("workers = 7\n")
    monkeypatch.setenv("NSQWORKER_CONFIG", str(path))
    assert Settings.load().workers == 7


def test_precedence_override_env_file_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("workers = 2\nmax_attempts = 2\nmax_in_flight = 2\n")
    monkeypatch.setenv("NSQWORKER_WORKERS", "3")
    monkeypatch.setenv("NSQWORKER_MAX_ATTEMPTS", "3")
    s = Settings.load(path, workers=4, drain_timeout=None)  # None means "not given"
    assert (s.workers, s.max_attempts, s.max_in_flight, s.drain_timeout) == (4, 3, 2, 30.0)
    sources = {name: source for name, _, source, _ in s.describe()}
    assert sources["workers"] == "override"
    assert sources["max_attempts"] == "env"
    assert sources["max_in_flight"] == "file"
    assert sources["drain_timeout"] == "default"


# ---------------------------------------------------------------- masking


def test_secret_is_masked_everywhere(tmp_path: Path) -> None:
    s = Settings.load(auth_secret="hunter2")
    values = {name: value for name, value, _, _ in s.describe()}
    assert values["auth_secret"] == "********"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s)
    path = tmp_path / "c.toml"
    path.write_text("auth_secret = 12345\n")  # wrong type: the error still hides it
    message = load_error(path)
    assert message.startswith(f"auth_secret in config file {path}: ")
    assert message.endswith("got ********") and "12345" not in message


def test_display_values() -> None:
    s = Settings(nsqd_tcp_addresses=["a:1", "b:2"], retry_delay=0.5, tls_verify=False)
    values = {name: value for name, value, _, _ in s.describe()}
    assert values["nsqd_tcp_addresses"] == "a:1,b:2"
    assert values["lookupd_http_addresses"] == "-"
    assert values["retry_delay"] == "0.5"
    assert values["max_retry_delay"] == "900"
    assert values["tls_verify"] == "false"
    assert values["tls_ca_file"] == "-"


# ---------------------------------------------------------------- property: env round trip


def _bounds(name: str) -> tuple[Any, Any]:
    metadata = Settings.model_fields[name].metadata
    low = next(m.ge for m in metadata if isinstance(m, annotated_types.Ge))
    high = next(m.le for m in metadata if isinstance(m, annotated_types.Le))
    return low, high


def _strategy(name: str) -> st.SearchStrategy[Any]:
    annotation = Settings.model_fields[name].annotation
    low, high = _bounds(name)
    if name == "output_buffer_size":
        return st.one_of(st.just(-1), st.integers(64, high))
    if annotation is int:
        return st.integers(low, high)
    return st.floats(low, high, allow_nan=False)


NUMERIC = [
    name
    for name, info in Settings.model_fields.items()
    if any(isinstance(m, annotated_types.Ge) for m in info.metadata)
]
# Values at both ends of each ordered pair so any in-bounds value of the other one is valid.
BASELINE = {
    "NSQWORKER_RETRY_DELAY": "0",
    "NSQWORKER_MAX_RETRY_DELAY": "3600",
    "NSQWORKER_RECONNECT_DELAY": "0.01",
    "NSQWORKER_MAX_RECONNECT_DELAY": "3600",
}


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    with mock.patch.dict(os.environ, values):
        yield


@settings(max_examples=200)
@given(
    st.lists(st.sampled_from(NUMERIC), min_size=1, max_size=6, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: _strategy(n) for n in names})
    )
)
def test_in_bounds_values_round_trip_through_env(values: dict[str, Any]) -> None:
    for low, high in (
        ("retry_delay", "max_retry_delay"),
        ("reconnect_delay", "max_reconnect_delay"),
    ):
        assume(values.get(low, 0) <= values.get(high, 3600))
    env = {**BASELINE, **{Settings.env_name(k): repr(v) for k, v in values.items()}}
    with environ(env):
        s = Settings.load()
    for name, value in values.items():
        assert getattr(s, name) == value
        assert s.source(name) == "env"


@settings(max_examples=100)
@given(
    st.sampled_from(NUMERIC).flatmap(
        lambda n: st.tuples(st.just(n), st.sampled_from(_bounds(n)), st.booleans())
    )
)
def test_out_of_bounds_values_name_their_field(case: tuple[str, Any, bool]) -> None:
    name, bound, above = case
    step = 1 if isinstance(bound, int) else 0.001
    value = bound + step if above else bound - step
    low, high = _bounds(name)
    assume(not low <= value <= high)
    with (
        environ({**BASELINE, Settings.env_name(name): repr(value)}),
        pytest.raises(SettingsError) as info,
    ):
        Settings.load()
    assert str(info.value).startswith(f"{Settings.env_name(name)} ({name}): must be from ")


# ---------------------------------------------------------------- where a bad value came from


def test_problem_names_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQWORKER_LOG_FORMAT", "yaml")
    assert load_error().startswith("NSQWORKER_LOG_FORMAT (log_format): must be ")


def test_problem_names_the_flag_the_caller_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQWORKER_WORKERS", "2")  # fine, and not blamed
    with pytest.raises(SettingsError) as info:
        Settings.load(log_format="yaml", override_names={"log_format": "--log-format"})
    assert info.value.problems == (
        "--log-format (log_format): must be 'auto', 'console' or 'json'; got 'yaml'",
    )


def test_unknown_argument_is_not_blamed_on_the_environment() -> None:
    with pytest.raises(SettingsError) as info:
        Settings(nsqd_tcp_address="127.0.0.1:4150")
    assert info.value.problems == (
        "Settings(nsqd_tcp_address=...): is not a setting; did you mean nsqd_tcp_addresses?;"
        " got '127.0.0.1:4150'",
    )


def test_bad_value_in_dotenv_names_its_variable_and_file(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text("NSQWORKER_WORKERS=lots\n")
    assert load_error(path).startswith(
        f"NSQWORKER_WORKERS in config file {path} (workers): must be a valid integer"
    )


def test_bare_setting_name_in_dotenv_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text("DATABASE_URL=postgres://x\nmax_attempts=3\nNSQWORKER_WORKERS=2\n")
    assert load_error(path) == (
        f"config file {path}: max_attempts is not read here; did you mean "
        "NSQWORKER_MAX_ATTEMPTS? (.env keys need the prefix)"
    )
