"""Every ```python and ```console block in README.md, docs/ and examples/*/README.md runs.

Sybil finds the blocks and the ``<!-- skip: next "why" -->`` markers; this module runs
them, one test per page, in the page's order, against a real nsqd and nsqlookupd. The
rules are written for authors in docs/dev/doc-samples.md; in short:

* A python block runs in one namespace per page, with a fresh project directory as the
  current directory (first on ``sys.path``). A block whose first line is a file name
  comment (``# myservice/tasks.py``) is written to that file instead of run; more such
  comments in the block start more files (``# conftest.py`` ... ``# test_tasks.py``).
  ```toml and ```env blocks that start with such a comment are written the same way.
* A console block is commands after ``$ `` (a trailing ``\\`` continues one), each shown
  with its output. They run in one bash, in that project directory, with the project's
  ``.venv/bin`` and ``.tools/bin`` first on ``PATH`` and this checkout importable (so
  ``examples.quickstart.tasks`` works). Each must exit 0, unless the next command is
  ``echo $?``, whose shown output must then be the exit code. Other output is not compared.
* The documented addresses are the real servers': ``127.0.0.1:4150``/``4151`` are the
  nsqd's TCP/HTTP ports, ``127.0.0.1:4160``/``4161`` the nsqlookupd's.
* ``<!-- skip: next "illustrative: why" -->`` before a block marks it illustrative (it
  is not run, and the reason is required). Output-only blocks are ```text, not console.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from nsqworker.testing import NsqBinaries, NsqdFactory, NsqlookupdProcess

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/*/README.md")])
#: Fence languages that would hide a runnable sample from the rules above.
WRONG_LANGUAGES = {"py", "python3", "pycon", "bash", "sh", "shell", "zsh", "shell-session"}
FILE_HEADER = re.compile(r"^# ([\w./-]+\.(?:py|toml|env)|\.env)\s*$")
SKIP_WITHOUT_REASON = re.compile(r"<!--\s*skip:\s*(next|start)\s*-->")
BLOCK_TIMEOUT = 60.0

pytestmark = pytest.mark.integration


@dataclass
class Page:
    """What the blocks of one page share: a project directory and the real addresses."""

    path: Path
    project: Path
    addresses: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)

    def localize(self, text: str) -> str:
        # One pass: a real port may begin with another documented one (41603 after 4160).
        if not self.addresses:
            return text
        pattern = "|".join(re.escape(a) for a in sorted(self.addresses, key=len, reverse=True))
        return re.sub(pattern, lambda m: self.addresses[m.group(0)], text)


def _page(example: Example) -> Page:
    page: Page = example.namespace["__page__"]
    return page


def write_files(example: Example) -> bool:
    """Write a block that starts with a ``# name`` comment into the project; True if so."""
    page = _page(example)
    files = _files(str(example.parsed))
    for name, text in files.items():
        target = page.project / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return bool(files)


def write_settings_file(example: Example) -> None:
    write_files(example)


def run_python(example: Example) -> None:
    """Write a file block into the project, or run the block in the page's namespace."""
    if write_files(example):
        return
    page = _page(example)
    source = str(example.parsed)
    code = compile("\n" * example.line + page.localize(source), str(page.path), "exec")
    exec(code, example.namespace)


def _files(source: str) -> dict[str, str]:
    """``{name: text}`` when the block starts with a ``# file.py`` comment, else empty."""
    lines = source.splitlines(keepends=True)
    if not lines or not FILE_HEADER.match(lines[0]):
        return {}
    files: dict[str, str] = {}
    name = ""
    for line in lines:
        header = FILE_HEADER.match(line)
        if header:
            name = header.group(1)
            files[name] = ""
        else:
            files[name] += line
    return files


@dataclass
class Command:
    text: str
    output: list[str]


def parse_console(source: str) -> list[Command]:
    """The ``$`` commands of a console block, each with the output shown under it."""
    commands: list[Command] = []
    continuing = False
    for line in source.splitlines():
        if continuing:
            commands[-1].text += "\n" + line
        elif line.startswith("$ "):
            commands.append(Command(line[2:], []))
        elif commands:
            commands[-1].output.append(line)
        else:
            raise AssertionError(f"output before any $ command: {line!r}; use a text block")
        continuing = line.rstrip().endswith("\\")
    if not commands:
        raise AssertionError("a console block needs $ commands; use a text block for output")
    return commands


def run_console(example: Example) -> None:
    """Run a console block's commands in one bash; check exit codes as described above."""
    page = _page(example)
    commands = parse_console(str(example.parsed))
    with tempfile.TemporaryDirectory() as scratch:
        statuses = Path(scratch) / "statuses"
        script = ["set +e"]
        for index, command in enumerate(commands):
            if command.text.strip() == "echo $?":
                continue
            script.append(page.localize(command.text))
            script.append(f"__s=$?; echo {index} $__s >> {shlex.quote(str(statuses))}")
        done = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=page.project,
            env=page.env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
        codes = dict(line.split() for line in statuses.read_text().splitlines())
    output = f"\n--- output ---\n{done.stdout}{done.stderr}"
    for index, command in enumerate(commands):
        if command.text.strip() == "echo $?":
            continue
        code = codes.get(str(index))
        assert code is not None, f"$ {command.text} did not finish{output}"
        following = commands[index + 1] if index + 1 < len(commands) else None
        if following is not None and following.text.strip() == "echo $?":
            shown = following.output[0].strip() if following.output else "?"
            assert code == shown, f"$ {command.text}: exit {code}, the page shows {shown}{output}"
        else:
            assert code == "0", f"$ {command.text}: exit code {code}{output}"


SYBIL = Sybil(
    parsers=[
        SkipParser(),
        CodeBlockParser(language="python", evaluator=run_python),
        CodeBlockParser(language="console", evaluator=run_console),
        # Settings files: written when they start with "# name", else only shown.
        CodeBlockParser(language="toml", evaluator=write_settings_file),
        CodeBlockParser(language="env", evaluator=write_settings_file),
    ],
)


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _runs_something(path: Path) -> bool:
    return any(e.region.evaluator in (run_python, run_console) for e in SYBIL.parse(path))


#: The pages with python or console blocks: one test each (a page with neither has
#: nothing to run; the fence rules below still read every page).
RUNNABLE = [path for path in PAGES if _runs_something(path)]


NATS_ADDRESS = "127.0.0.1:4222"
"""The documented NATS server; a page that names it gets a real one."""
STREAM_ADDRESS = "127.0.0.1:5552"
"""The documented RabbitMQ stream listener; a page that names it gets the session's."""


@pytest.fixture
def page_env(nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory) -> dict[str, str]:
    """The documented addresses mapped to a real nsqlookupd and an nsqd registered with it."""
    nsqd = nsqd_factory(lookupd=nsqlookupd)
    lookupd_http = nsqlookupd.http_address.removeprefix("http://")
    nsqd_http = nsqd.http_address.removeprefix("http://")
    return {
        "127.0.0.1:4150": nsqd.tcp_address,
        "127.0.0.1:4151": nsqd_http,
        "127.0.0.1:4160": nsqlookupd.tcp_address,
        "127.0.0.1:4161": lookupd_http,
    }


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's project directory: the current directory, first on sys.path; what the
    page imported from it is forgotten afterwards, and the default registry restored."""
    import nsqworker

    registry = nsqworker.default_registry
    saved = dict(vars(registry))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    try:
        yield tmp_path
    finally:
        for name in set(sys.modules) - before:
            module = sys.modules[name]
            if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
                del sys.modules[name]
        vars(registry).clear()
        vars(registry).update(saved)


def _console_env(project: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    bins = [os.path.dirname(sys.executable), str(ROOT / ".tools" / "bin")]
    env["PATH"] = os.pathsep.join([*bins, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT)])
    env.update(COLUMNS="200", NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1")
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


@pytest.mark.parametrize("path", RUNNABLE, ids=_relative)
def test_page_samples_run(
    path: Path,
    nsq_binaries: NsqBinaries,  # session scope: found before `project` changes directory
    request: pytest.FixtureRequest,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    document = SYBIL.parse(path)
    for key in [k for k in os.environ if k.startswith("NSQWORKER_")]:
        monkeypatch.delenv(key)
    addresses: dict[str, str] = request.getfixturevalue("page_env")
    text = path.read_text()
    if NATS_ADDRESS in text:  # the page's NATS samples reach a real nats-server
        server = request.getfixturevalue("nats_server")
        addresses[NATS_ADDRESS] = server.url.removeprefix("nats://")
    if STREAM_ADDRESS in text:  # and its RabbitMQ samples a real RabbitMQ
        uri = request.getfixturevalue("rabbitmq")
        addresses[STREAM_ADDRESS] = uri.split("@", 1)[1].rstrip("/").split("/")[0]
    document.namespace["__page__"] = Page(path, project, addresses, _console_env(project))
    document.namespace["__name__"] = "__doc_sample__"
    for example in document:
        try:
            example.evaluate()
        except SkipTest:
            continue
        except Exception as exc:
            raise AssertionError(
                f"{_relative(path)}, the block at line {example.line}: {type(exc).__name__}: {exc}"
            ) from exc


def _fences(text: str) -> Iterator[tuple[int, str]]:
    """``(line, language)`` of each opening fence."""
    inside = ""
    for number, line in enumerate(text.splitlines(), 1):
        match = re.match(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)", line)
        if not match:
            continue
        if inside and match.group(1).startswith(inside) and not match.group(2):
            inside = ""
        elif not inside:
            inside = match.group(1)
            yield number, match.group(2).lower()


def test_every_runnable_block_is_python_or_console_and_every_skip_says_why() -> None:
    problems = []
    for path in PAGES:
        text = path.read_text()
        for line, language in _fences(text):
            if language in WRONG_LANGUAGES:
                problems.append(
                    f"{_relative(path)}:{line}: ```{language}: write ```python or ```console "
                    "(with $ prompts) so the block runs, or ```text for output"
                )
        for match in SKIP_WITHOUT_REASON.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            problems.append(
                f'{_relative(path)}:{line}: say why: <!-- skip: {match.group(1)} "illustrative: ..." -->'
            )
    assert not problems, "\n".join(problems)
