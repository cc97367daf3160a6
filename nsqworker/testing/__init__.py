"""The pytest plugin: real nsqd and nsqlookupd for a test, and the helpers tests import.

Enable the fixtures in a test suite with either of::

    # conftest.py
    pytest_plugins = ["nsqworker.testing"]

    $ pytest -p nsqworker.testing

Fixtures (function scope; every process they start is stopped at teardown, also when
the test fails):

``nsqlookupd``
    one running :class:`NsqlookupdProcess`.
``nsqd``
    one running :class:`NsqdProcess`, standalone (not registered with a lookupd).
``nsqd_factory``
    ``nsqd_factory(lookupd=None, extra_args=())`` starts another :class:`NsqdProcess`.
``nsqlookupd_factory``
    ``nsqlookupd_factory(extra_args=())`` starts another :class:`NsqlookupdProcess`.
``nsq_cluster``
    an :class:`NsqCluster`: one nsqlookupd and two nsqd registered with it.
``nats_server``
    one running :class:`~nsqworker.testing.nats.NatsServerProcess` with JetStream.
``nats_cluster``
    a running :class:`~nsqworker.testing.nats.NatsCluster`: three routed servers.
``rabbitmq``
    (session scope) the stream URI of a RabbitMQ 4.0 with streams:
    :class:`~nsqworker.testing.rabbitmq.RabbitMQProcess` from a root filesystem (see
    :func:`~nsqworker.testing.rabbitmq.find_rootfs`), or ``RABBITMQ_STREAM_TEST_URI``.
``postgres``
    one running :class:`~nsqworker.testing.postgres.PostgresProcess` (``postgres.dsn``).

docs/testing.md lists every fixture with what you use of it (``nats_server.url``...).

``async def`` tests just work: the plugin runs each on a fresh asyncio event loop, with
no other plugin and no configuration. Tests that pytest-asyncio (``asyncio_mode = "auto"``
or ``@pytest.mark.asyncio``) or anyio take are left to them; async *fixtures* need one
of those plugins.

Binaries are found by :func:`find_binary` (``--nsqd-bin-dir``, ``$NSQWORKER_TOOLS_BIN``,
``PATH``, ``~/.local/share/nsqworker/bin``, then ``.tools/bin`` of the enclosing checkout:
:mod:`nsqworker.testing.locations`), from any project. When they are missing the tests
that need them are skipped with the command that installs them, except under ``CI=true``
(or ``CI=1``), where they fail.

The processes themselves (:mod:`.processes`, :mod:`.ports`) work without pytest::

    with NsqlookupdProcess() as lookupd, NsqdProcess(lookupd=[lookupd]) as nsqd:
        nsqd.publish("clicks", b'{"id": 1}')
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from nsqworker.testing.locations import TOOLS_BIN_ENV
from nsqworker.testing.ports import free_port, free_ports, port_is_free
from nsqworker.testing.processes import (
    NsqCluster,
    NsqdProcess,
    NsqHttpError,
    NsqlookupdProcess,
    NsqProcessError,
    find_binary,
)
from nsqworker.testing.server import ServerProcess, ServerProcessError

# pytest loads these plugins' fixtures too: kube_control_plane (etcd + kube-apiserver),
# kube_cluster (a real one-node cluster: nsqworker.testing.kube_cluster_plugin), postgres
pytest_plugins = [
    "nsqworker.testing.kube",
    "nsqworker.testing.kube_cluster_plugin",
    "nsqworker.testing.postgres",
]

try:
    import pytest
except ImportError:  # pragma: no cover - the helpers work without pytest installed
    _HAVE_PYTEST = False
else:
    _HAVE_PYTEST = True

if TYPE_CHECKING:
    from nsqworker.message import Message

__all__ = [
    "NsqBinaries",
    "NsqCluster",
    "NsqHttpError",
    "NsqProcessError",
    "NsqdFactory",
    "NsqdProcess",
    "NsqlookupdFactory",
    "NsqlookupdProcess",
    "ServerProcess",
    "ServerProcessError",
    "find_binary",
    "free_port",
    "free_ports",
    "make_message",
    "port_is_free",
    "wait_for",
    "wait_until",
]

T = TypeVar("T")
_ids = itertools.count(1)


def make_message(
    body: bytes | str | Any = b"{}",
    *,
    topic: str = "test",
    channel: str = "test",
    attempts: int = 1,
    id: str | None = None,
    timestamp: int | None = None,
    address: str = "127.0.0.1:4150",
) -> Message:
    """A :class:`~nsqworker.Message` for calling a handler directly in a unit test.

    ``body`` is bytes, str or a pydantic model (its JSON). Nothing delivered it, so
    ``finish()``/``requeue()`` only mark it answered (``msg.responded``); to run the
    whole worker (retries, dead letters, hooks) use the memory transport
    (docs/testing.md).
    """
    import time as _time

    from nsqworker.message import Message
    from nsqworker.nsq.publishing import to_bytes

    message_id = id if id is not None else f"{next(_ids):016x}"
    stamp = timestamp if timestamp is not None else _time.time_ns()
    return Message(
        message_id.encode("ascii"), to_bytes(body), stamp, attempts, topic, channel, address
    )


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Args:
        predicate: called every ``interval`` seconds; exceptions propagate.
        timeout: seconds before giving up.
        interval: seconds between calls.
        message: text of the error, or a callable that builds it at timeout (to show
            the last observed state).

    Raises:
        AssertionError: ``predicate`` stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise _timed_out(message, timeout)
        time.sleep(interval)


async def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    message: str | Callable[[], str] = "condition not met",
    *,
    interval: float = 0.02,
) -> T:
    """:func:`wait_for` for async tests: the loop keeps running between the calls.

    ``await wait_until(lambda: consumer.subscribed, 5, "subscribed")``; returns the
    first truthy result of ``predicate``, raises AssertionError after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise _timed_out(message, timeout)
        await asyncio.sleep(interval)


def _timed_out(message: str | Callable[[], str], timeout: float) -> AssertionError:
    text = message() if callable(message) else message
    return AssertionError(f"{text} (waited {timeout:g}s)")


class NsqdFactory(Protocol):
    """Type of the ``nsqd_factory`` fixture."""

    def __call__(
        self,
        lookupd: NsqlookupdProcess | Iterable[NsqlookupdProcess | str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> NsqdProcess:
        """Start an nsqd, registered with ``lookupd`` if given."""
        ...


class NsqlookupdFactory(Protocol):
    """Type of the ``nsqlookupd_factory`` fixture."""

    def __call__(self, extra_args: Sequence[str] = ()) -> NsqlookupdProcess:
        """Start an nsqlookupd."""
        ...


@dataclass(frozen=True)
class NsqBinaries:
    """Paths of the nsqd and nsqlookupd executables the fixtures run."""

    nsqd: str
    nsqlookupd: str


def _stop_all(processes: Iterable[NsqdProcess | NsqlookupdProcess]) -> None:
    """Stop every process, newest first, even if stopping one of them fails."""
    errors: list[BaseException] = []
    for proc in reversed(list(processes)):
        try:
            proc.close()
        except Exception as exc:  # keep stopping the others
            errors.append(exc)
    if errors:
        raise errors[0]


def _in_ci() -> bool:
    from nsqworker.testing.ci import in_ci

    return in_ci()


_MISSING: set[str] = set()  # why fixtures skipped: a binary or package missing


def _skip_missing(reason: str) -> NoReturn:
    """Skip for a missing binary (fail under CI=true is the caller's), remembered for the
    summary at the end of the run."""
    _MISSING.add(reason)
    pytest.skip(reason)


# ---------------------------------------------------------------------------- pytest plugin

if _HAVE_PYTEST:

    def pytest_addoption(parser: pytest.Parser) -> None:
        """Add ``--nsqd-bin-dir`` and ``--nsqworker-shell-env``."""
        group = parser.getgroup("nsqworker", "nsqworker test processes")
        group.addoption(
            "--nsqworker-shell-env",
            action="store_true",
            default=False,
            help="keep the shell's NSQWORKER_* settings for the tests (set aside by default)",
        )
        group.addoption(
            "--nsqd-bin-dir",
            default=None,
            metavar="DIR",
            help=(
                "directory with nsqd and nsqlookupd, searched before "
                f"${TOOLS_BIN_ENV}, PATH and .tools/bin"
            ),
        )

    _SHELL_ENV = pytest.StashKey[dict[str, str]]()

    def pytest_configure(config: pytest.Config) -> None:
        """Set the shell's ``NSQWORKER_*`` settings aside for the run
        (:mod:`nsqworker.testing.shell_env`), unless ``--nsqworker-shell-env``."""
        from nsqworker.testing.shell_env import set_aside

        keep = config.getoption("nsqworker_shell_env", default=False)
        config.stash[_SHELL_ENV] = {} if keep else set_aside()

    def pytest_unconfigure(config: pytest.Config) -> None:
        """Put the shell's settings back."""
        from nsqworker.testing.shell_env import restore

        restore(config.stash.get(_SHELL_ENV, {}))

    def pytest_report_header(config: pytest.Config) -> str | None:
        """Name the variables set aside, if any."""
        taken = config.stash.get(_SHELL_ENV, {})
        if not taken:
            return None
        return (
            f"nsqworker.testing: set aside the shell's {', '.join(taken)} for the run"
            " (tests make their own settings; --nsqworker-shell-env keeps them)"
        )

    @pytest.fixture
    def shell_settings_env(pytestconfig: pytest.Config) -> dict[str, str]:
        """The shell's ``NSQWORKER_*`` settings the plugin set aside (name -> value), for
        a test that wants them (``monkeypatch.setenv`` each)."""
        taken: dict[str, str] = pytestconfig.stash.get(_SHELL_ENV, {})
        return dict(taken)

    def pytest_terminal_summary(terminalreporter: Any) -> None:
        """Say why tests were skipped for a missing binary (``pytest -q`` shows only ``s``).

        Counted from the skipped reports: a session fixture skips once, and pytest reuses
        that skip for every test that asks for it."""
        counts: dict[str, int] = {}
        for report in terminalreporter.stats.get("skipped", []):
            longrepr = getattr(report, "longrepr", None)
            text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""
            reason = str(text).removeprefix("Skipped: ")
            if reason in _MISSING:
                counts[reason] = counts.get(reason, 0) + 1
        if counts:
            terminalreporter.write_sep("-", "nsqworker.testing")
        for reason, count in counts.items():
            terminalreporter.write_line(f"{count} test(s) skipped: {reason}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
        """Run an ``async def`` test on a fresh event loop, unless an async plugin took it
        (pytest-asyncio and anyio hand pytest a synchronous wrapper, or mark the test)."""
        test = pyfuncitem.obj
        if not inspect.iscoroutinefunction(test) or any(
            pyfuncitem.get_closest_marker(name) for name in ("asyncio", "anyio", "trio")
        ):
            return None
        funcargs = pyfuncitem.funcargs
        args = {p: funcargs[p] for p in inspect.signature(test).parameters if p in funcargs}
        with asyncio.Runner() as runner:
            runner.run(test(**args))
        return True

    @pytest.fixture(scope="session")
    def nsq_binaries(pytestconfig: pytest.Config) -> NsqBinaries:
        """The nsqd and nsqlookupd executables; skips (fails under CI) when missing."""
        bin_dir = pytestconfig.getoption("nsqd_bin_dir")
        try:
            return NsqBinaries(
                nsqd=find_binary("nsqd", bin_dir), nsqlookupd=find_binary("nsqlookupd", bin_dir)
            )
        except FileNotFoundError as exc:
            if _in_ci():
                pytest.fail(f"CI=true and NSQ binaries are missing: {exc}", pytrace=False)
            _skip_missing(str(exc))

    @pytest.fixture
    def nsqlookupd_factory(
        nsq_binaries: NsqBinaries, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[NsqlookupdFactory]:
        """Start nsqlookupd processes on demand; all are stopped at teardown."""
        started: list[NsqlookupdProcess] = []

        def factory(extra_args: Sequence[str] = ()) -> NsqlookupdProcess:
            proc = NsqlookupdProcess(
                extra_args=extra_args,
                data_path=tmp_path_factory.mktemp("nsqlookupd"),
                binary=nsq_binaries.nsqlookupd,
            )
            started.append(proc)
            return proc.start()

        try:
            yield factory
        finally:
            _stop_all(started)

    @pytest.fixture
    def nsqd_factory(
        nsq_binaries: NsqBinaries, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[NsqdFactory]:
        """Start nsqd processes on demand; all are stopped at teardown."""
        started: list[NsqdProcess] = []

        def factory(
            lookupd: NsqlookupdProcess | Iterable[NsqlookupdProcess | str] | None = None,
            extra_args: Sequence[str] = (),
        ) -> NsqdProcess:
            if lookupd is None:
                lookupd = []
            elif isinstance(lookupd, NsqlookupdProcess):
                lookupd = [lookupd]
            proc = NsqdProcess(
                lookupd,
                extra_args=extra_args,
                data_path=tmp_path_factory.mktemp("nsqd"),
                binary=nsq_binaries.nsqd,
            )
            started.append(proc)
            return proc.start()

        try:
            yield factory
        finally:
            _stop_all(started)

    @pytest.fixture(scope="session")
    def nats_server_binary(pytestconfig: pytest.Config) -> str:
        """The nats-server executable; skips (fails under CI) when missing."""
        from nsqworker.testing.nats import find_nats_server

        given = pytestconfig.getoption("nsqd_bin_dir")
        rooted = pytestconfig.rootpath / ".tools" / "bin"  # found even after a chdir
        try:
            if given is None and (rooted / "nats-server").is_file():
                return str(rooted / "nats-server")
            return find_nats_server(given)
        except FileNotFoundError as exc:
            if _in_ci():
                pytest.fail(f"CI=true and nats-server is missing: {exc}", pytrace=False)
            _skip_missing(str(exc))

    @pytest.fixture
    def nats_server(nats_server_binary: str) -> Iterator[Any]:
        """One nats-server with JetStream on free loopback ports, stopped at teardown."""
        from nsqworker.testing.nats import NatsServerProcess

        with NatsServerProcess(binary=nats_server_binary) as server:
            yield server

    @pytest.fixture
    def nats_cluster(nats_server_binary: str) -> Iterator[Any]:
        """Three nats-servers routed to each other (JetStream, replicas 3 possible)."""
        from nsqworker.testing.nats import NatsCluster

        with NatsCluster(3, binary=nats_server_binary) as cluster:
            yield cluster

    @pytest.fixture(scope="session")
    def rabbitmq_server(pytestconfig: pytest.Config) -> Iterator[Any]:
        """The session's RabbitMQProcess (None with RABBITMQ_STREAM_TEST_URI); skips,
        or fails under CI, when it cannot be started."""
        from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

        if os.environ.get("RABBITMQ_STREAM_TEST_URI"):
            yield None
            return
        try:
            server = RabbitMQProcess(find_rootfs(pytestconfig.rootpath)).start()
        except (FileNotFoundError, NsqProcessError) as exc:
            if _in_ci():
                pytest.fail(f"CI=true and RabbitMQ cannot start: {exc}", pytrace=False)
            _skip_missing(str(exc).splitlines()[0])
        try:
            yield server
        finally:
            server.close()

    # Named apart from the fixture: importing nsqworker.testing.rabbitmq sets this
    # package's attribute ``rabbitmq`` to that module, which would hide a function of
    # that name from pytest (a conftest importing RabbitMQProcess lost the fixture).
    @pytest.fixture(scope="session", name="rabbitmq")
    def rabbitmq_uri(rabbitmq_server: Any) -> str:
        """A ``rabbitmq-stream://`` URI of the session's RabbitMQ (see ``rabbitmq_server``)."""
        if rabbitmq_server is None:
            return os.environ["RABBITMQ_STREAM_TEST_URI"]
        return str(rabbitmq_server.uri)

    @pytest.fixture
    def nsqlookupd(nsqlookupd_factory: NsqlookupdFactory) -> NsqlookupdProcess:
        """One running nsqlookupd."""
        return nsqlookupd_factory()

    @pytest.fixture
    def nsqd(nsqd_factory: NsqdFactory) -> NsqdProcess:
        """One running standalone nsqd (not registered with any nsqlookupd)."""
        return nsqd_factory()

    @pytest.fixture
    def nsq_cluster(nsqlookupd_factory: NsqlookupdFactory, nsqd_factory: NsqdFactory) -> NsqCluster:
        """One nsqlookupd and two nsqd registered with it."""
        lookupd = nsqlookupd_factory()
        return NsqCluster(lookupd, [nsqd_factory(lookupd), nsqd_factory(lookupd)])
