"""Every install hint names the distribution users can install: ``nsq-worker[...]``.

``pip install nsqworker[...]`` installs an unrelated, abandoned project of that name on
PyPI; the import name is nsqworker, the distribution nsq-worker (pyproject.toml). This
reads the package, the docs, the README, the examples and the chart for both spellings.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRONG = re.compile(r"\bnsqworker\[")
HINT = re.compile(r"nsq-worker\[([a-z0-9_,-]+)\]")
SOURCES = [
    *ROOT.joinpath("nsqworker").rglob("*.py"),
    *ROOT.joinpath("docs").rglob("*.md"),
    *ROOT.joinpath("examples").rglob("*"),
    *ROOT.joinpath("deploy").rglob("*"),
    *ROOT.joinpath("scripts").rglob("*"),
    ROOT / "README.md",
    ROOT / "Dockerfile",
]


def texts() -> dict[Path, str]:
    found = {}
    for path in SOURCES:
        if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".txt", ".tpl", ".json", ""}:
            try:
                found[path] = path.read_text()
            except UnicodeDecodeError:
                continue
    return found


def test_no_hint_names_the_wrong_package() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
        for path, text in texts().items()
        for m in WRONG.finditer(text)
    ]
    assert wrong == [], "write nsq-worker[...], the distribution's name: " + ", ".join(wrong)


def test_every_extra_a_hint_names_exists() -> None:
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    named = {
        extra.strip()
        for text in texts().values()
        for m in HINT.finditer(text)
        for extra in m.group(1).split(",")
    }
    assert named, "no hint found: the check reads nothing"
    assert named <= extras, f"hints name extras that do not exist: {sorted(named - extras)}"


def test_the_check_catches_the_wrong_name() -> None:
    assert WRONG.search("pip install 'nsqworker[spark]'")
    assert not WRONG.search("pip install 'nsq-worker[spark]'")


def _extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"]) - {"dev"}


@pytest.mark.parametrize(
    ("page", "lead"), [("README.md", "Extras:"), ("docs/getting-started.md", "Optional extras:")]
)
def test_the_install_docs_list_every_extra(page: str, lead: str) -> None:
    text = (ROOT / page).read_text()
    start = text.index(lead)
    paragraph = text[start : text.index("\n\n", start)]
    listed = set(re.findall(r"`([a-z0-9-]+)`", paragraph))
    assert _extras() <= listed, f"{page} does not list the extras {sorted(_extras() - listed)}"
