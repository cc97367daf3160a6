"""The package's layers, checked from the source: no transport (``nsq/``, ``nats/``,
``streams/``, ``memory``) reaches above the transport seam, the task layer imports no transport's internals, ``nsq/``
holds no task policy, no import cycle anywhere in ``nsqworker``, every module under
~600 lines, and no module of the package, its tests or its benchmarks reads or writes
another object's private attributes (``x._name`` for any ``x`` but ``self`` and ``cls``).

An AST walk of every ``import`` and ``from ... import`` (inside functions and
``TYPE_CHECKING`` blocks too: a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nsqworker"
REACH_IN_TREES = ("nsqworker", "tests", "bench")
"""Where no code may reach into another object's private attributes."""
TRANSPORT_MAY_IMPORT = (
    "nsqworker.errors",
    "nsqworker.settings",
    "nsqworker._version",
    # the seam: what every transport implements and hands up
    "nsqworker.transport",
    "nsqworker.message",
    "nsqworker.names",
    "nsqworker.producing",
    # the kit every transport shares
    "nsqworker.reconnect",
    "nsqworker.subscription_kit",
)
"""What a transport may import besides its own package."""
TRANSPORTS = ("nsqworker.nsq", "nsqworker.memory", "nsqworker.nats", "nsqworker.streams")
"""Each transport's own package or module: only the seam and the registry reach them."""
BUILT_ON_NSQ = (
    "nsqworker",  # the public surface re-exports NSQ's Producer and SyncProducer
    "nsqworker.cli",  # `nsqworker publish` and `rpc call` talk to nsqd
    # the RPC-over-NSQ wire format (shared/protocol/rpc-over-nsq.md): its codec, the
    # reply dialer and the clients; the endpoint (a task) goes through replies only
    "nsqworker.rpc.codec",
    "nsqworker.rpc.replies",
    "nsqworker.rpc.client",
    "nsqworker.rpc.sync",
    # RPC on NATS, the caller's side: a NATS connection (the endpoint stays a task)
    "nsqworker.rpc.nats",
    "nsqworker.testing",  # starts real nsqd for users' tests
)
"""Modules that are NSQ features by design, not part of the task layer."""
OPERATOR_TOOLS = ("nsqworker.admin", "nsqworker.spark.streaming")
"""The operator's tools and the Spark streaming sources and sinks, above the task layer:
they read each broker directly (an NSQ channel of their own, JetStream messages by
sequence, a stream from an offset)."""
TASK_POLICY_WORDS = frozenset({
    "max_attempts", "on_reject", "dead_letter", "Backoff", "BackoffPhase", "retry_delay", "Policy",
    "drain_timeout", "backoff_multiplier", "requeue_multiplier", "task_timeout", "DEFERRED",
    "RejectHook", "Dispatcher", "Hooks", "dead_letter_topic", "on_dead_letter",
})  # fmt: skip
"""Names of task policy: none of them may appear in a transport's code."""
MAX_LINES = 600
REACH_INS_ALLOWED = {
    # Not another object's state: CPython's documented function (the sys module's
    # docs list it; the underscore marks it implementation-specific), and the only way
    # to read a blocked thread's stack.
    ("nsqworker.watchdog", "sys._current_frames"),
    # Python 3.11 only: asyncio's own functions that make a Task current for one step
    # (what Task.__step and 3.12's eager start do); nsqworker.eager runs a handler's
    # first step as its Task with them. No public way exists on 3.11.
    ("nsqworker.eager", "asyncio.tasks._enter_task"),
    ("nsqworker.eager", "asyncio.tasks._leave_task"),
}
"""``x._name`` reads allowed where ``x`` is not ``self`` or ``cls``: (module, expression)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def checked_for_reach_ins() -> dict[str, Path]:
    """Every module of :data:`REACH_IN_TREES` (``tests.unit.test_layout``, ``bench.profile``...)."""
    return {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for tree in REACH_IN_TREES
        for p in sorted((ROOT / tree).rglob("*.py"))
    }


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


def under(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """Transport modules that import anything but their own package and the seam."""
    return sorted(
        f"{mod} imports {dep}"
        for mod, deps in edges.items()
        for own in TRANSPORTS
        if under(mod, (own,))
        for dep in deps
        if not under(dep, (own, *TRANSPORT_MAY_IMPORT))
    )


def core_violations(edges: dict[str, set[str]]) -> list[str]:
    """Task-layer modules that import a transport's internals."""
    return sorted(
        f"{mod} imports {dep}"
        for mod, deps in edges.items()
        if not under(mod, TRANSPORTS) and mod != "nsqworker"
        and not any(mod == b or (b != "nsqworker" and mod.startswith(b + ".")) for b in BUILT_ON_NSQ)
        and not under(mod, OPERATOR_TOOLS)
        for dep in deps
        if under(dep, TRANSPORTS)
    )  # fmt: skip


def policy_in_transport(sources: dict[str, str]) -> list[str]:
    """``module: name`` for each task-policy name used in a transport's package."""
    found = []
    for mod, source in sources.items():
        if not under(mod, TRANSPORTS):
            continue
        for node in ast.walk(ast.parse(source)):
            name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
            if isinstance(name, str) and name in TASK_POLICY_WORDS:
                found.append(f"{mod}: {name}")
    return sorted(set(found))


NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


def reach_ins(name: str, source: str) -> list[str]:
    """``module:line: x._name`` for each private attribute of anything but ``self`` or
    ``cls`` (dunders aside) that ``source`` (module ``name``) reads or writes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        if node.attr in NAMEDTUPLE_API:  # public, underscored so no field can clash
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if _is_super_call(node.value):  # an override calling what it overrides
            continue
        expression = ast.unparse(node)
        if (name, expression) not in REACH_INS_ALLOWED:
            found.append(f"{name}:{node.lineno}: {expression}")
    return found


def _is_super_call(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "super"
        and not node.args
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


def test_no_transport_imports_anything_above_the_seam() -> None:
    assert layer_violations(graph()) == []


def test_the_task_layer_imports_no_transport_internals() -> None:
    assert core_violations(graph()) == []


def test_no_task_policy_in_a_transport() -> None:
    sources = {name: path.read_text() for name, path in modules().items()}
    assert policy_in_transport(sources) == []


def test_no_import_cycle() -> None:
    assert find_cycle(graph()) is None


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_size(name: str) -> None:
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (keep modules under ~{MAX_LINES})"


def test_no_private_reach_ins() -> None:
    """A module that needs another object's ``_state`` asks that object for a method; a
    test or a benchmark goes through public behaviour too."""
    checked = checked_for_reach_ins()
    assert {"nsqworker.watchdog", "tests.unit.test_layout", "bench.profile"} <= set(checked)
    found = [hit for name, path in checked.items() for hit in reach_ins(name, path.read_text())]
    assert found == []


def test_every_module_says_what_it_is_for() -> None:
    missing = [n for n, p in modules().items() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


# --- the checks themselves catch what they are for ---------------------------------------


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    edges = graph()
    sub = "nsqworker.nsq.subscription"
    edges[sub] = {*edges[sub], "nsqworker.worker"}
    assert f"{sub} imports nsqworker.worker" in layer_violations(edges)
    edges["nsqworker.memory"] = {*edges["nsqworker.memory"], "nsqworker.nats.client"}
    assert "nsqworker.memory imports nsqworker.nats.client" in layer_violations(edges)
    edges["nsqworker.message"] = {*edges["nsqworker.message"], sub}
    cycle = find_cycle(edges)
    assert cycle is not None and cycle[0] == cycle[-1]


def test_the_checks_catch_a_reach_into_a_transport_and_policy_in_one() -> None:
    edges = graph()
    edges["nsqworker.dispatch"] = {*edges["nsqworker.dispatch"], "nsqworker.nsq.links"}
    assert "nsqworker.dispatch imports nsqworker.nsq.links" in core_violations(edges)
    source = "def ack(msg, max_attempts):\n    return msg.attempts > max_attempts\n"
    assert policy_in_transport({"nsqworker.nsq.x": source}) == ["nsqworker.nsq.x: max_attempts"]


def test_imports_are_resolved_in_every_form() -> None:
    known = {"nsqworker.nsq.protocol", "nsqworker.nsq", "nsqworker.worker", "nsqworker.task"}
    source = (
        "import nsqworker.worker\n"
        "from nsqworker.nsq import protocol\n"
        "from . import task\n"
        "def f():\n    from ..worker import Worker\n"
    )
    found = imports_of(source, "nsqworker.nsq.consumer", False, known)  # any module of nsq/
    # "from . import task" names no module of nsq/: it resolves to the package itself.
    assert found == {"nsqworker.worker", "nsqworker.nsq.protocol", "nsqworker.nsq"}


def test_the_reach_in_rule_catches_what_it_is_for() -> None:
    source = (
        "class A:\n"
        "    def f(self, other):\n"
        "        self._ok = other.__class__\n"
        "        other._state = 1\n"
        "        return self.conn._transport, type(self)._cache, cls._fine\n"
    )
    assert reach_ins("nsqworker.x", source) == [
        "nsqworker.x:4: other._state",
        "nsqworker.x:5: self.conn._transport",
        "nsqworker.x:5: type(self)._cache",
    ]
    assert reach_ins("nsqworker.watchdog", "sys._current_frames()\n") == []
    assert reach_ins("nsqworker.nats.client", "client._process_info\n") != []
    assert reach_ins("nsqworker.nats.client", "super()._process_info()\n") == []
    assert reach_ins("tests.unit.test_x", "sub._deliver = deliver\n") == [
        "tests.unit.test_x:1: sub._deliver"
    ]
