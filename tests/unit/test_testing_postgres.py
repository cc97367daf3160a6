"""Where the ``postgres`` fixture finds PostgreSQL, and what it says when it cannot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nsqworker.testing.postgres import POSTGRES_BIN_ENV, find_postgres_bin


def server_in(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for name in ("initdb", "postgres"):
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)
    return directory


@pytest.fixture(autouse=True)
def no_initdb_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(POSTGRES_BIN_ENV, raising=False)


def test_the_newest_debian_version_is_found(tmp_path: Path) -> None:
    debian = tmp_path / "lib" / "postgresql"
    server_in(debian / "9" / "bin")
    newest = server_in(debian / "15" / "bin")
    (debian / "16" / "bin").mkdir(parents=True)  # a client-only install: no server
    assert find_postgres_bin(debian) == newest


def test_the_variable_and_path_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    debian = tmp_path / "lib" / "postgresql"
    server_in(debian / "15" / "bin")
    on_path = server_in(tmp_path / "opt" / "bin")
    monkeypatch.setenv("PATH", str(on_path))
    assert find_postgres_bin(debian) == on_path
    named = server_in(tmp_path / "named")
    monkeypatch.setenv(POSTGRES_BIN_ENV, str(named))
    assert find_postgres_bin(debian) == named


def test_missing_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        find_postgres_bin(tmp_path / "nothing")
    assert "scripts/install-tools postgres" in str(missing.value)
    assert "apt-get install postgresql" in str(missing.value)
    assert os.environ["PATH"].endswith("empty")
