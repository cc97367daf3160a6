"""Every setting keeps its name: each field, its ``NSQWORKER_*`` variable and its
config-file key still work, and the renamed retry settings (``requeue_delay`` ->
``retry_delay``...) still accept their old names, each use logging one deprecation line
that names the new one."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from nsqworker.settings import Settings, SettingsError

# The settings of the release before the sections (issue 38), by the names users wrote.
FIELDS_BEFORE = frozenset(
    """
auth_secret backoff_multiplier client_id compression console_dead_letter_topics
console_forwarded_allow_ips console_host console_session_ttl
console_kubernetes_namespace console_kubernetes_selector console_poll_interval
console_port console_token console_worker_port console_workers deflate_level
dial_timeout drain_timeout health_host health_port heartbeat_interval hostname
kubernetes_namespace log_format log_level log_summary_interval lookupd_allowed_nsqd
lookupd_auth_without_tls lookupd_http_addresses lookupd_poll_interval
lookupd_poll_jitter max_attempts max_backoff_duration max_in_flight max_memory_per_child
max_reconnect_delay max_requeue_delay max_tasks_per_child msg_timeout nats_create
nats_creds_file nats_max_ack_pending nats_nkey_seed nats_password nats_servers
nats_stream nats_stream_max_age nats_stream_replicas nats_stream_retention nats_token
nats_user nsqd_tcp_addresses output_buffer_size output_buffer_timeout
rabbitmq_stream_create rabbitmq_stream_max_age rabbitmq_stream_max_length_bytes
rabbitmq_stream_segment_bytes rabbitmq_stream_uri reconnect_delay requeue_delay
requeue_multiplier rpc_error_details rpc_reply_addresses rpc_reply_subjects
rpc_reply_topics sample_rate
schedule_catchup schedule_kv_bucket schedule_leader schedule_lease_duration
schedule_lease_name schedule_renew_deadline schedule_retry_period slow_handler_after
spark_app_roots spark_app_uris spark_image spark_master spark_namespace spark_remote
spark_runner spark_service_account spark_session_conf spark_session_start spark_ttl
task_timeout timeout_dead_letter_attempts tls_ca_file tls_cert_file tls_key_file
tls_server_name tls_v1 tls_verify trace_parent_mode trace_trust_remote tracing_envelope
transport typed_body_max_bytes uvloop watchdog_timeout workers
""".split()  # noqa: SIM905
)
# Settings added since then (issue 54 and later): new names, nothing renamed.
ADDED_SINCE = frozenset(
    {
        "timeout_action",
        "max_abandoned_threads",
        "schedule_postgres_dsn",
        "spark_driver_template",
        "spark_executor_template",
    }
)
RENAMED = {
    "requeue_delay": "retry_delay",
    "requeue_multiplier": "retry_multiplier",
    "max_requeue_delay": "max_retry_delay",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("NSQWORKER_"):
            monkeypatch.delenv(key)


def as_text(value: Any) -> str:
    """A default as a user would write it in the environment."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is deprecated" in r.getMessage()]


def test_every_name_of_before_is_still_a_setting_or_an_alias() -> None:
    assert Settings.renamed() == RENAMED
    now = set(Settings.model_fields) | set(Settings.renamed())
    assert now >= FIELDS_BEFORE
    assert now - FIELDS_BEFORE == set(RENAMED.values()) | ADDED_SINCE


# Unset by default, and "" does not unset them: a value of each (as text, as read).
SAMPLES: dict[str, tuple[str, Any]] = {
    "msg_timeout": ("30", 30.0),
    "output_buffer_size": ("-1", -1),
    "task_timeout": ("5", 5.0),
    "spark_image": ("img", "img"),
    "spark_driver_template": ("/etc/driver.yaml", "/etc/driver.yaml"),
    "spark_executor_template": ("/etc/executor.yaml", "/etc/executor.yaml"),
    "spark_remote": ("sc://h:15002", "sc://h:15002"),
}


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_read_from_its_variable_and_its_file_key(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    default = getattr(Settings(), name)
    text, value = SAMPLES.get(name, ("" if default is None else as_text(default), default))
    monkeypatch.setenv(Settings.env_name(name), text)
    from_env = Settings.load()  # "" unsets the others that are unset by default
    assert from_env.source(name) == "env"
    assert getattr(from_env, name) == value
    monkeypatch.delenv(Settings.env_name(name))
    if value is None:
        return
    path = tmp_path / "c.json"
    written = value.get_secret_value() if isinstance(value, SecretStr) else value
    path.write_text(json.dumps({name: written}))
    from_file = Settings.load(path)
    assert from_file.source(name) == "file"
    assert getattr(from_file, name) == value


# ---------------------------------------------------------------- the old names


@pytest.mark.parametrize(("old", "new"), RENAMED.items())
def test_old_argument_sets_the_new_field_and_says_so(
    old: str, new: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="nsqworker.settings"):
        s = Settings(**{old: 7})
    assert getattr(s, new) == 7.0
    assert s.source(new) == "override" and s.source(old) == "override"
    assert deprecations(caplog) == [
        f"Settings({old}=...) is deprecated: {old} was renamed {new}; use {new}"
    ]


@pytest.mark.parametrize(("old", "new"), RENAMED.items())
def test_old_variable_sets_the_new_field_and_says_so(
    old: str, new: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"NSQWORKER_{old.upper()}", "7")
    with caplog.at_level(logging.WARNING, logger="nsqworker.settings"):
        s = Settings.load()  # no "is not a setting"
    assert getattr(s, new) == 7.0 and s.source(new) == "env"
    assert deprecations(caplog) == [
        f"NSQWORKER_{old.upper()} is deprecated: {old} was renamed {new};"
        f" use NSQWORKER_{new.upper()}"
    ]


@pytest.mark.parametrize(("old", "new"), RENAMED.items())
@pytest.mark.parametrize("kind", ["toml", "env"])
def test_old_file_key_sets_the_new_field_and_says_so(
    old: str, new: str, kind: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    if kind == "toml":
        path, key, use = tmp_path / "c.toml", old, new
        path.write_text(f"{old} = 7\n")
    else:
        path, key, use = tmp_path / ".env", f"NSQWORKER_{old.upper()}", f"NSQWORKER_{new.upper()}"
        path.write_text(f"{key}=7\n")
    with caplog.at_level(logging.WARNING, logger="nsqworker.settings"):
        s = Settings.load(path)
    assert getattr(s, new) == 7.0 and s.source(new) == "file"
    assert deprecations(caplog) == [
        f"{key} in config file {path} is deprecated: {old} was renamed {new}; use {use}"
    ]


@pytest.mark.parametrize(("old", "new"), RENAMED.items())
def test_old_attribute_reads_the_new_one_with_a_warning(old: str, new: str) -> None:
    s = Settings(**{new: 8})
    with pytest.warns(
        DeprecationWarning, match=f"Settings.{old} is deprecated; use Settings.{new}"
    ):
        assert getattr(s, old) == 8.0
    assert Settings.env_name(old) == f"NSQWORKER_{old.upper()}"
    assert old not in {name for name, *_ in s.describe()}


def test_the_new_names_log_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NSQWORKER_RETRY_MULTIPLIER", "3")
    with caplog.at_level(logging.WARNING, logger="nsqworker.settings"):
        s = Settings.load(retry_delay=1)
    assert (s.retry_delay, s.retry_multiplier) == (1.0, 3.0)
    assert deprecations(caplog) == []


def test_an_old_argument_outranks_the_new_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQWORKER_RETRY_DELAY", "2")
    assert Settings.load(requeue_delay=3).retry_delay == 3.0


def test_the_new_variable_outranks_the_old_file_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("requeue_delay = 3\n")
    monkeypatch.setenv("NSQWORKER_RETRY_DELAY", "2")
    assert Settings.load(path).retry_delay == 2.0


def test_both_names_in_one_place_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(SettingsError) as info:
        Settings(requeue_delay=1, retry_delay=2)
    assert info.value.problems == (
        "Settings(requeue_delay=...): is the old name of retry_delay, given too;"
        " give only retry_delay",
    )
    monkeypatch.setenv("NSQWORKER_REQUEUE_MULTIPLIER", "2")
    monkeypatch.setenv("NSQWORKER_RETRY_MULTIPLIER", "3")
    with pytest.raises(SettingsError) as info:
        Settings.load()
    assert info.value.problems == (
        "NSQWORKER_REQUEUE_MULTIPLIER: is the old name of NSQWORKER_RETRY_MULTIPLIER, set too;"
        " unset it",
    )
    monkeypatch.delenv("NSQWORKER_REQUEUE_MULTIPLIER")
    monkeypatch.delenv("NSQWORKER_RETRY_MULTIPLIER")
    path = tmp_path / "c.toml"
    path.write_text("max_requeue_delay = 60\nmax_retry_delay = 90\n")
    with pytest.raises(SettingsError) as info:
        Settings.load(path)
    assert info.value.problems == (
        f"max_requeue_delay in config file {path}: is the old name of max_retry_delay, set too;"
        " remove it",
    )


def test_a_bad_value_under_an_old_name_is_blamed_on_that_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NSQWORKER_REQUEUE_DELAY", "-1")
    with pytest.raises(SettingsError) as info:
        Settings.load()
    assert info.value.problems == (
        "NSQWORKER_REQUEUE_DELAY (retry_delay): must be from 0 to 3600; got '-1'",
    )
    monkeypatch.delenv("NSQWORKER_REQUEUE_DELAY")
    path = tmp_path / "c.toml"
    path.write_text('requeue_multiplier = "fast"\n')
    with pytest.raises(SettingsError) as info:
        Settings.load(path)
    assert info.value.problems[0].startswith(
        f"requeue_multiplier in config file {path} (retry_multiplier): must be a valid number"
    )
    with pytest.raises(SettingsError) as info:
        Settings(max_requeue_delay=4000)
    assert info.value.problems == (
        "Settings(max_requeue_delay=...) (max_retry_delay): must be from 0 to 3600; got 4000",
    )


def test_a_misspelt_old_name_is_still_an_unknown_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NSQWORKER_REQUEUE_DELAYS", "1")
    with pytest.raises(SettingsError) as info:
        Settings.load()
    assert info.value.problems[0].startswith("NSQWORKER_REQUEUE_DELAYS is not a setting")
