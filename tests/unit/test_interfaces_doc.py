"""docs/dev/interfaces.md matches the code: every public class of the seam has a block
on the page naming each of its public methods, properties and fields, and every class
and member the page names exists.

The page writes each class as a ``class Name...:`` line in a code block, its members
on the indented lines below it (``name``, ``name(args)``, ``async name(args)``,
``name -> Type``, ``name: Type``, separated by ``;`` or ``,``; ``# comments`` and
argument lists are ignored).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "dev" / "interfaces.md"
SEAM: dict[str, tuple[str, ...]] = {
    "nsqworker.transport": (
        "Flow", "Capabilities", "SubscriptionStats", "Timer", "Receiver", "Subscription",
        "Publisher", "Transport",
    ),
    "nsqworker.message": (
        "Message", "Undecodable", "MessageOwner", "Stage", "Finish", "Retry", "Reject",
    ),
    "nsqworker.dispatch": ("Dispatcher",),
    "nsqworker.policy": ("Policy",),
    "nsqworker.consumer": ("Consumer",),
    "nsqworker.task_runner": ("TaskRunner",),
    "nsqworker.worker": ("Worker",),
}  # fmt: skip
"""The classes whose every public member the page must name."""
ELSEWHERE = ("nsqworker.task", "nsqworker.nsq.options", "nsqworker.nsq.connection")
"""Other modules the page documents classes of (checked one way: what it names exists)."""
FUNCTIONS = ("nsqworker.transport", "nsqworker.dispatch", "nsqworker.message")
"""Modules each of whose ``__all__`` names the page must mention."""

CLASS_LINE = re.compile(r"^(?:@\w+(?:\([^)\n]*\))?\s+)?class (\w+)(?:\([^)\n]*\))?:(.*)$")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def class_blocks(text: str) -> dict[str, str]:
    """Class name -> the text of its block (the header's rest, the indented lines)."""
    found: dict[str, str] = {}
    for block in code_blocks(text):
        current: str | None = None
        for line in block.splitlines():
            match = CLASS_LINE.match(line)
            if match:
                current = match.group(1)
                assert current not in found, f"the page has two blocks for class {current}"
                found[current] = match.group(2) + "\n"
            elif current is not None and line[:1].isspace():
                found[current] += line + "\n"
            elif line.strip():
                current = None
    return found


def member_names(block: str) -> set[str]:
    """The member names a class block lists (see the module docstring)."""
    text = re.sub(r"#[^\n]*", "", block)
    while True:  # argument lists and subscripts, innermost first
        shorter = re.sub(r"\([^()]*\)|\[[^\[\]]*\]", "", text)
        if shorter == text:
            break
        text = shorter
    text = re.sub(r"->[^;,\n]*", "", text)  # return types
    text = re.sub(r":[^;,\n]*", "", text)  # annotations
    text = re.sub(r"=[^;,\n]*", "", text)  # defaults
    names = set()
    for item in re.split(r"[;,\n]", text):
        words = [w for w in item.split() if w != "async"]
        if len(words) == 1 and IDENTIFIER.fullmatch(words[0]):
            names.add(words[0])
    return names


def resolve(name: str) -> type:
    for module in (*SEAM, *ELSEWHERE):
        found = getattr(importlib.import_module(module), name, None)
        if isinstance(found, type):
            return found
    raise LookupError(name)


def own_members(cls: type) -> set[str]:
    """What the page must name: public attributes of the class body, its annotations
    and dataclass fields (not instance attributes set in ``__init__``)."""
    names = {n for n in vars(cls) if not n.startswith("_")}
    names |= {n for n in vars(cls).get("__annotations__", {}) if not n.startswith("_")}
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    if issubclass(cls, enum.Enum):
        names |= set(cls.__members__)
    return names


def instance_attributes(cls: type) -> set[str]:
    """``self.name = ...`` anywhere in the class's own source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and isinstance(node.ctx, ast.Store)
    }


def existing_members(cls: type) -> set[str]:
    """Everything a documented name may refer to, the base classes' included."""
    names = set(dir(cls))
    for base in cls.__mro__:
        names |= set(getattr(base, "__annotations__", {}))
        if base.__module__.startswith("nsqworker"):
            names |= instance_attributes(base)
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names


BLOCKS = class_blocks(PAGE.read_text())


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in SEAM.items() for n in names])
def test_every_public_member_of_the_seam_is_on_the_page(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert name in BLOCKS, f"docs/dev/interfaces.md has no `class {name}` block ({module})"
    missing = own_members(cls) - member_names(BLOCKS[name])
    assert not missing, f"docs/dev/interfaces.md: class {name} does not name {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_every_class_and_member_the_page_names_exists(name: str) -> None:
    try:
        cls = resolve(name)
    except LookupError:
        pytest.fail(f"docs/dev/interfaces.md names class {name}, which no longer exists")
    gone = member_names(BLOCKS[name]) - existing_members(cls) - {name}
    assert not gone, f"docs/dev/interfaces.md: class {name} has no {sorted(gone)}"


@pytest.mark.parametrize("module", FUNCTIONS)
def test_every_exported_name_of_the_seam_is_on_the_page(module: str) -> None:
    text = PAGE.read_text()
    exported = importlib.import_module(module).__all__
    missing = [n for n in exported if not re.search(rf"\b{re.escape(n)}\b", text)]
    assert not missing, f"docs/dev/interfaces.md does not mention {module}'s {missing}"


def test_the_parser_reads_what_the_page_writes() -> None:
    """The checks above can fail: a block's members are read as written, a member that
    does not exist is caught, one left out is caught."""
    block = class_blocks(
        "```python\n@dataclass(frozen=True) class Demo(Base):   # note\n"
        "    alpha, beta(x, y=(1, 2)) -> list[int]; async gamma(); delta: Event\n"
        "    Demo(a, b)  # the constructor\n```\n"
    )
    assert member_names(block["Demo"]) == {"alpha", "beta", "gamma", "delta", "Demo"}
    message = importlib.import_module("nsqworker.message").Message
    assert "no_such_member" not in existing_members(message)
    assert "finish" in own_members(message) - member_names("    retry(); touch()\n")
