"""The package's layers, checked from the source: nothing in ``nsqworker/nsq/`` reaches
above it, no import cycle anywhere in ``nsqworker``, every module under ~600 lines.

An AST walk of every ``import`` and ``from ... import`` (inside functions and
``TYPE_CHECKING`` blocks too: a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nsqworker"
NSQ_MAY_IMPORT = ("nsqworker.nsq", "nsqworker.errors", "nsqworker.settings", "nsqworker._version")
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(source: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The nsqworker modules ``source`` (module ``name``) imports."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "nsqworker")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "nsqworker":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {
        name: imports_of(path.read_text(), name, path.name == "__init__.py", known) - {name}
        for name, path in mods.items()
    }


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{mod} imports {dep}"
        for mod, deps in edges.items()
        if mod == "nsqworker.nsq" or mod.startswith("nsqworker.nsq.")
        for dep in deps
        if not any(dep == ok or dep.startswith(ok + ".") for ok in NSQ_MAY_IMPORT)
    )


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the modules (the root package's re-exports aside)."""
    # The root __init__ imports the public surface by design; a module that imports the
    # root package gets that for free, so edges *into* the root count, edges out do not.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if node == "nsqworker" or dep not in edges:
                continue
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_nsq_imports_nothing_above_it() -> None:
    assert layer_violations(graph()) == []


def test_no_import_cycle() -> None:
    assert find_cycle(graph()) is None


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_size(name: str) -> None:
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (keep modules under ~{MAX_LINES})"


def test_every_module_says_what_it_is_for() -> None:
    missing = [n for n, p in modules().items() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


# --- the checks themselves catch what they are for ---------------------------------------


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    edges = graph()
    edges["nsqworker.nsq.consumer"] = {*edges["nsqworker.nsq.consumer"], "nsqworker.worker"}
    assert "nsqworker.nsq.consumer imports nsqworker.worker" in layer_violations(edges)
    edges["nsqworker.nsq.message"] = {*edges["nsqworker.nsq.message"], "nsqworker.nsq.consumer"}
    cycle = find_cycle(edges)
    assert cycle is not None and cycle[0] == cycle[-1]


def test_imports_are_resolved_in_every_form() -> None:
    known = {"nsqworker.nsq.protocol", "nsqworker.nsq", "nsqworker.worker", "nsqworker.task"}
    source = (
        "import nsqworker.worker\n"
        "from nsqworker.nsq import protocol\n"
        "from . import task\n"
        "def f():\n    from ..worker import Worker\n"
    )
    found = imports_of(source, "nsqworker.nsq.consumer", False, known)
    # "from . import task" names no module of nsq/: it resolves to the package itself.
    assert found == {"nsqworker.worker", "nsqworker.nsq.protocol", "nsqworker.nsq"}
