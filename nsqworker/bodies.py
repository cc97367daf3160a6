"""Typed message bodies: a handler that declares a model gets the body validated into it.

::

    class Click(BaseModel):
        id: int
        url: str

    @task("clicks", channel="archive")
    async def archive(click: Click) -> None: ...          # the body, validated

    @task("clicks", channel="audit")
    def audit(msg: Message, click: Click) -> None: ...    # the message and the body

The body is JSON, validated with pydantic's ``TypeAdapter`` of the annotated type (a
``BaseModel``, a dataclass, a ``TypedDict``, ``list[int]``... anything pydantic can
validate). A body that does not validate is rejected at once, with pydantic's first
errors as the dead-letter reason: retrying cannot fix it. A handler that takes
``msg: Message`` (or an unannotated parameter) costs nothing here.

What a hostile body may cost is bounded by its size, not by how many errors it holds:
lists, tuples, sets and dicts stop at their first invalid item (pydantic's ``fail_fast``,
set throughout the type's schema), the reason is built from the first few errors and the
count, and a body over ``typed_body_max_bytes`` is refused before it is parsed.
Validation runs where the handler runs: in its thread for a plain ``def``, on the event
loop for an ``async def``. A thread would not free the loop there: pydantic-core holds
the GIL while it validates (measured: a 1 MiB ``list[int]`` blocked the loop as long in a
thread as inline); the size cap is what bounds the loop's pause (docs/tasks.md has the
figures).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsqworker.message import Message
from nsqworker.safe_text import one_line

__all__ = [
    "BodySpec",
    "body_spec",
    "fail_fast_schema",
    "oversized_reason",
    "type_name",
    "typed_handler",
    "validation_reason",
]

MAX_REASON = 1000
"""Characters of pydantic's errors kept in a dead-letter reason."""
SHOWN_ERRORS = 3
"""Errors a dead-letter reason lists; it counts the rest."""
LISTED_ERRORS = 1000
"""Up to this many errors, the first ones are read for the reason (reading them all costs
microseconds each); above it the reason gives only their count."""
_CONTAINERS = frozenset(
    ("list", "tuple", "set", "frozenset", "dict", "deque", "frozendict", "ordered-dict", "counter")
)


@dataclass(frozen=True)
class BodySpec:
    """How a handler wants its message: the body's type, and whether ``msg`` comes first."""

    type: Any
    with_message: bool

    @property
    def name(self) -> str:
        """The type's name, for ``nsqworker tasks`` and errors: ``Click``,
        ``list[int]``, ``dict[str, Click]``, ``Click | None``."""
        return type_name(self.type)


def type_name(annotation: Any) -> str:
    """A type as its annotation is written, without module paths."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is None or not args:
        if isinstance(annotation, type):
            return annotation.__name__
        return repr(annotation).replace("typing.", "")
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join("None" if a is type(None) else type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
    return f"{type_name(origin)}[{inner}]"


def _is_message(annotation: Any) -> bool:
    """No annotation, ``Any``, or a type a Message is an instance of (``Message``,
    ``object``): the parameter takes the message, not its body."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    try:
        return isinstance(annotation, type) and issubclass(Message, annotation)
    except TypeError:  # a TypedDict refuses class checks: it is a body type
        return False


def body_spec(func: Callable[..., Any]) -> BodySpec | str | None:
    """What ``func``'s positional parameters ask for: None (the message only), a
    :class:`BodySpec`, or a problem to report (a string)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without a signature: the message only
        return None
    params = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(params) not in (1, 2):
        return None
    hints = _hints(func)
    annotations = [hints.get(p.name, p.annotation) for p in params]
    for i, annotation in enumerate(annotations):
        if isinstance(annotation, str):  # a name that is not defined (yet)
            if annotation.rpartition(".")[2] != "Message":
                return (
                    f"cannot resolve the annotation {annotation!r} of its parameter "
                    f"{params[i].name!r}; define or import it before the handler"
                )
            annotations[i] = Message
    if len(params) == 1:
        return None if _is_message(annotations[0]) else BodySpec(annotations[0], False)
    if not _is_message(annotations[0]):
        return "with two parameters, the first is the message: (msg: Message, body: Model)"
    if annotations[1] is inspect.Parameter.empty or _is_message(annotations[1]):
        return "with two parameters, annotate the second with the body's type, like Click"
    return BodySpec(annotations[1], True)


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    """Resolved annotations of a function, or of a callable object's ``__call__``."""
    for target in (func, getattr(func, "__call__", None)):  # noqa: B004
        try:
            return typing.get_type_hints(target)
        except Exception:  # not a function, or a name that is not defined (yet)
            continue
    return {}


def validation_reason(spec: BodySpec, exc: Exception) -> str:
    """A dead-letter reason: the body's type and pydantic's first errors, one line, its
    cost bounded whatever the number of errors (``error_count()`` counts the rest)."""
    count_errors = getattr(exc, "error_count", None)
    errors = getattr(exc, "errors", None)
    if not callable(count_errors) or not callable(errors):
        return one_line(f"body is not a valid {spec.name}: {exc}", MAX_REASON)
    count = count_errors()
    if count > LISTED_ERRORS:
        return f"body is not a valid {spec.name}: {count} errors"
    parts = []
    first = errors(include_url=False, include_context=False, include_input=False)
    for err in first[:SHOWN_ERRORS]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg', '?')}")
    text = "; ".join(parts)
    if count > len(parts):
        text += f"; and {count - len(parts)} more"
    return one_line(f"body is not a valid {spec.name}: {text}", MAX_REASON)


def oversized_reason(spec: BodySpec, size: int, cap: int) -> str:
    """A dead-letter reason for a body over the ``typed_body_max_bytes`` cap."""
    return (
        f"body of {size} bytes is over typed_body_max_bytes ({cap}); not validated as "
        f"{spec.name}; raise NSQWORKER_TYPED_BODY_MAX_BYTES to accept bodies this large"
    )


def fail_fast_schema(schema: Any) -> Any:
    """A copy of a pydantic core schema whose lists, tuples, sets and dicts stop at their
    first invalid item: what a valid body validates into is the same, and an invalid one
    costs one error per container instead of one per item. Only dicts and lists are
    copied; classes, functions and other values in the schema are shared."""
    if isinstance(schema, dict):
        copy = {key: fail_fast_schema(value) for key, value in schema.items()}
        if copy.get("type") in _CONTAINERS:
            copy["fail_fast"] = True
        return copy
    if isinstance(schema, list):
        return [fail_fast_schema(item) for item in schema]
    return schema


def _validator(annotation: Any) -> Callable[[bytes], Any]:
    """``validate_json`` of ``annotation``'s fail-fast validator (pydantic's own one when
    its schema cannot be rebuilt)."""
    from pydantic import TypeAdapter
    from pydantic_core import SchemaValidator

    adapter = TypeAdapter(annotation)
    try:
        validator = SchemaValidator(fail_fast_schema(adapter.core_schema))
    except Exception:  # a schema pydantic-core will not take back: validate as pydantic does
        return adapter.validate_json
    return validator.validate_json


def typed_handler(
    func: Callable[..., Any],
    spec: BodySpec,
    reject: Callable[[str], BaseException],
    max_bytes: int = 0,
) -> Callable[[Message], Any]:
    """``func`` as a handler of the message: the body validated first (``reject(reason)``
    is raised when it does not validate, or when it is over ``max_bytes``, 0 = no cap).
    For an async ``func`` the wrapper returns its coroutine, so the worker still runs it
    eagerly."""
    from pydantic import ValidationError

    validate = _validator(spec.type)

    def decode(msg: Message) -> Any:
        body = msg.body
        if max_bytes and len(body) > max_bytes:
            raise reject(oversized_reason(spec, len(body), max_bytes))
        try:
            return validate(body)
        except ValidationError as exc:
            raise reject(validation_reason(spec, exc)) from None

    if spec.with_message:

        def with_message(msg: Message) -> Any:
            return func(msg, decode(msg))

        return with_message

    def body_only(msg: Message) -> Any:
        return func(decode(msg))

    return body_only
