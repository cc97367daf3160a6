"""Where a consumed message's time goes: ``python -m bench.profile``.

Two ways to drive the hot path, with or without a profiler:

``--feed offline`` (default)
    No nsqd and no socket: message frames encoded beforehand are handed to
    ``Connection.data_received`` in 256 KiB chunks (what uvloop reads at once under
    load), and what the consumer writes back goes to a transport that only counts bytes.
    This is the client's own CPU cost per message, free of the kernel, of nsqd and of
    the machine's other load.
``--feed nsqd``
    A real nsqd with ``--messages`` pre-loaded, consumed as ``make bench`` does, in
    this process.

``--path`` picks the client: ``consumer`` (raw Consumer, callback returns FINISH),
``worker-async`` or ``worker-sync`` (the @task path with a no-op handler), ``lean`` (the
floor, offline only); or the Producer publishing ``--messages`` to a real nsqd:
``pub`` (one PUB at a time), ``concurrent`` (1000 at once), ``mpub`` (MPUB of 100).
``--tracing`` (worker paths) installs an OpenTelemetry SDK as ``make bench``'s
telemetry section does: ``ratio`` (1%) or ``full`` sampling, or ``bare``: no tracing by
the worker, the handler makes one bare SDK span. ``--profiler`` is ``none`` (just time it), ``cprofile`` (exact call counts, per-message
cost of each function, inflated by the profiler) or ``pyinstrument`` (sampling, call
tree). The offline feed builds the NSQ subscription's link, session and connection
itself (``Link``, ``Session``, ``Connection.handshake_done``): it is a diagnostic tool
and may need updating when those change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import pstats
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

from bench.common import BODY_SIZE, CHANNEL, Clock, default_loop, loop_label, run_on
from nsqworker.consumer import Consumer
from nsqworker.message import FINISH, Finish, Message
from nsqworker.nsq import protocol
from nsqworker.nsq.connection import Connection
from nsqworker.nsq.subscription import NsqSubscription
from nsqworker.transport import Receiver

PATHS = ("lean", "consumer", "worker-async", "worker-sync")
PUBLISH_PATHS = ("pub", "concurrent", "mpub")
CHUNK = 256 * 1024
BARE_SPAN: list[Callable[[], None] | None] = [None]
"""What the worker paths' handler calls per message (``--tracing bare``)."""
TOPIC = "profile"


# --- the offline feed -----------------------------------------------------------------


class NullTransport:
    """Stands in for the socket: counts what the client writes and drops it."""

    def __init__(self) -> None:
        self.written = 0
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def encoded_chunks(count: int, size: int = BODY_SIZE, chunk: int = CHUNK) -> list[bytes]:
    """``count`` message frames as nsqd sends them, cut into ``chunk``-byte reads."""
    body = b"x" * size
    stamp = time.time_ns()
    stream = b"".join(
        protocol.encode_frame(protocol.MessageFrame(stamp, 1, b"%016x" % i, body))
        for i in range(count)
    )
    return [stream[i : i + chunk] for i in range(0, len(stream), chunk)]


class OfflineFeed:
    """Patches ``NsqSubscription.start``/``stop``/``close`` so that a consumer's (or a
    Worker task's) subscription gets one fake, already subscribed connection whose bytes
    come from :meth:`feed` instead of nsqd; the dispatcher runs as it does with nsqd."""

    def __init__(self) -> None:
        self.conns: list[Connection] = []
        self.transport = NullTransport()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        # Every consumer and every Worker task is a Dispatcher over a subscription.
        start, stop, close = NsqSubscription.start, NsqSubscription.stop, NsqSubscription.close
        attach = self._attach

        async def fake_start(sub: NsqSubscription, receiver: Receiver) -> None:
            await attach(sub, receiver)

        NsqSubscription.start = fake_start  # type: ignore[method-assign,assignment]
        NsqSubscription.stop = NsqSubscription.close = _nothing  # type: ignore[method-assign]
        try:
            yield
        finally:
            NsqSubscription.start, NsqSubscription.stop = start, stop  # type: ignore[method-assign]
            NsqSubscription.close = close  # type: ignore[method-assign]

    async def _attach(self, sub: NsqSubscription, receiver: Receiver) -> None:
        """``sub.start(receiver)``, with a connection that nsqd has already subscribed."""
        from nsqworker.nsq.links import Link, Session

        sub.bind(receiver)
        connections = sub.connections
        connections.started = True
        link = Link("127.0.0.1:4150", direct=True)
        session = Session(link)
        on_message = partial(sub.on_message, session)
        conn = Connection(link.address, connections.config, on_message=on_message)
        conn.connection_made(self.transport)  # type: ignore[arg-type]
        conn.handshake_done()
        session.conn, session.open, link.session = conn, True, session
        session.slot.rdy = sub.window
        connections.links[link.address] = link
        connections.sessions.append(session)
        self.conns.append(conn)

    async def feed(self, chunks: Sequence[bytes], done: asyncio.Event) -> None:
        """Hand every chunk to the connection, letting the loop run between them."""
        received = self.conns[0].data_received
        for chunk in chunks:
            received(chunk)
            await asyncio.sleep(0)
        await done.wait()


async def _nothing(self: NsqSubscription) -> None:
    """The fake connection has nothing to stop or close."""


# --- the clients ------------------------------------------------------------------------


def lean_receiver(
    handler: Callable[[bytes, bytes], None], transport: NullTransport
) -> Callable[[bytes], None]:
    """The floor: decode message frames, call the handler, one write of FINs per read.

    No Message object, no flow control, no error handling: what any client must do
    at least, on this machine, today.
    """
    header = struct.Struct(">iI").unpack_from
    message = struct.Struct(">qH16s").unpack_from
    rest = b""

    def data_received(data: bytes) -> None:
        nonlocal rest
        if rest:
            data = rest + data
        pos, end, fins = 0, len(data), []
        while end - pos >= 8:
            size, kind = header(data, pos)
            stop = pos + 4 + size
            if stop > end:
                break
            if kind == protocol.FRAME_MESSAGE:
                _, _, message_id = message(data, pos + 8)
                handler(message_id, data[pos + 34 : stop])
                fins.append(b"FIN " + message_id + b"\n")
            pos = stop
        rest = data[pos:]
        if fins:
            transport.write(b"".join(fins))

    return data_received


async def consume_lean(count: int, chunks: Sequence[bytes]) -> float:
    clock = Clock(count)
    hit = clock.hit

    def handler(message_id: bytes, body: bytes) -> None:
        hit()

    received = lean_receiver(handler, NullTransport())
    for chunk in chunks:
        received(chunk)
        await asyncio.sleep(0)
    return clock.last - clock.first


async def consume(
    path: str, count: int, source: Callable[[Any], Any], address: str, topic: str = TOPIC
) -> float:
    """Consume ``count`` messages with the client ``path``; return the seconds taken
    from the first message to the last. ``source(done)`` delivers them."""
    from nsqworker.logging import configure_logging
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    settings = Settings(nsqd_tcp_addresses=[address], log_level="warning")
    configure_logging("warning", "console")
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    clock = Clock(count, lambda: loop.call_soon_threadsafe(done.set))
    hit = clock.hit
    if path == "consumer":

        def callback(msg: Message) -> Finish:
            hit()
            return FINISH

        consumer = Consumer(topic, CHANNEL, callback, settings, max_in_flight=2500)
        await consumer.start()
        await source(done)
        await consumer.stop()
    else:
        registry = Registry()
        declare = registry.task(topic, channel=CHANNEL, max_in_flight=2500, name="profile")

        bare_span = BARE_SPAN[0]

        async def handle(msg: Message) -> None:
            if bare_span is not None:
                bare_span()
            hit()

        def handle_sync(msg: Message) -> None:
            if bare_span is not None:
                bare_span()
            hit()

        declare(handle if path == "worker-async" else handle_sync)
        async with Worker(registry, settings):
            await source(done)
    return clock.last - clock.first


def run_offline(
    path: str, count: int, loop: str, wrap: Callable[[Callable[[], float]], float]
) -> float:
    chunks = encoded_chunks(count)
    feed = OfflineFeed()

    def go() -> float:
        if path == "lean":
            return run_on(loop, consume_lean(count, chunks))
        with feed.installed():
            return run_on(loop, consume(path, count, partial(feed.feed, chunks), "127.0.0.1:4150"))

    return wrap(go)


def run_nsqd(
    path: str, count: int, loop: str, wrap: Callable[[Callable[[], float]], float]
) -> float:
    from bench.env import Broker, cleanup

    broker = Broker()
    try:
        topic = broker.fresh_topic("profile")
        if path in PUBLISH_PATHS:
            return wrap(lambda: run_on(loop, publish(path, count, broker.tcp_address, topic)))
        broker.preload(topic, count + 5000)

        async def source(done: asyncio.Event) -> None:
            await asyncio.wait_for(done.wait(), 300)

        address = broker.tcp_address
        return wrap(lambda: run_on(loop, consume(path, count, source, address, topic)))
    finally:
        cleanup()


async def publish(path: str, count: int, address: str, topic: str) -> float:
    """Publish ``count`` messages with our Producer in the shape ``path``; seconds taken."""
    from nsqworker.nsq.producer import Producer

    body = b"x" * BODY_SIZE
    async with Producer([address], envelope=False, timeout=30) as producer:
        started = time.perf_counter()
        if path == "pub":
            for _ in range(count):
                await producer.publish(topic, body)
        elif path == "concurrent":
            for _ in range(count // 1000):
                await asyncio.gather(*(producer.publish(topic, body) for _ in range(1000)))
        else:
            for _ in range(count // 100):
                await producer.publish_many(topic, [body] * 100)
        return time.perf_counter() - started


# --- profilers --------------------------------------------------------------------------


def plain(run: Callable[[], float]) -> float:
    return run()


def with_cprofile(count: int, top: int) -> Callable[[Callable[[], float]], float]:
    def wrap(run: Callable[[], float]) -> float:
        profile = cProfile.Profile()
        profile.enable()
        try:
            return run()
        finally:
            profile.disable()
            print_per_message(pstats.Stats(profile), count, top)

    return wrap


def print_per_message(stats: pstats.Stats, count: int, top: int) -> None:
    """The functions with the most own time, as microseconds per message."""
    rows = []
    for (file, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((own, cumulative, calls, f"{_short(file)}:{line}({name})"))
    rows.sort(reverse=True)
    print(f"{'own us/msg':>10} {'cum us/msg':>10} {'calls/msg':>9}  function")
    for own, cumulative, calls, where in rows[:top]:
        print(
            f"{own / count * 1e6:10.3f} {cumulative / count * 1e6:10.3f} {calls / count:9.3f}  {where}"
        )


def _short(file: str) -> str:
    for marker in ("/nsqworker/", "/bench/", "/site-packages/", "/lib/python3"):
        if marker in file:
            return file[file.index(marker) + 1 :]
    return file


def with_pyinstrument(wrap_interval: float) -> Callable[[Callable[[], float]], float]:
    def wrap(run: Callable[[], float]) -> float:
        from pyinstrument import Profiler

        profiler = Profiler(interval=wrap_interval)
        profiler.start()
        try:
            return run()
        finally:
            profiler.stop()
            out = io.StringIO()
            out.write(profiler.output_text(unicode=False, color=False))
            print(out.getvalue())

    return wrap


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--path", choices=PATHS + PUBLISH_PATHS, default="consumer")
    parser.add_argument("--feed", choices=("offline", "nsqd"), default="offline")
    parser.add_argument("--profiler", choices=("none", "cprofile", "pyinstrument"), default="none")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default=default_loop())
    parser.add_argument("--tracing", choices=("off", "ratio", "full", "bare"), default="off")
    parser.add_argument("--top", type=int, default=25, help="cProfile rows to print")
    parser.add_argument("--interval", type=float, default=0.001, help="pyinstrument, seconds")
    args = parser.parse_args(argv)
    wrap = {
        "none": plain,
        "cprofile": with_cprofile(args.messages, args.top),
        "pyinstrument": with_pyinstrument(args.interval),
    }[args.profiler]
    if args.tracing != "off":
        from bench.clients.consume import tracing

        BARE_SPAN[0] = tracing(args.tracing)
    if args.path in PUBLISH_PATHS:
        args.feed = "nsqd"
    runner = run_offline if args.feed == "offline" else run_nsqd
    elapsed = runner(args.path, args.messages, args.loop, wrap)
    rate = (args.messages - 1) / elapsed
    print(
        f"{args.path} ({args.feed} feed, {loop_label(args.loop)}, profiler {args.profiler}, "
        f"tracing {args.tracing}): "
        f"{args.messages} messages in {elapsed:.3f}s = {rate:,.0f} msgs/s, "
        f"{elapsed / args.messages * 1e6:.2f} us/message"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
