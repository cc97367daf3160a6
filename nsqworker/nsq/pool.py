"""A producer's nsqd connections: one per address, kept up in the background.

:class:`NodePool` dials every address with a keeper task that redials a lost connection
with exponential backoff and jitter (reset once a connection lived a second), and hands
out the next healthy node in turn (round-robin), waiting for one to come up when none
is. It knows nothing of publishing: :class:`~nsqworker.nsq.producer.Producer` sends its
commands on the connections it is handed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from nsqworker.errors import ConnectionClosed, NoConnection
from nsqworker.nsq.connection import Connection, ConnectionConfig
from nsqworker.nsq.handshake import connect_adapting
from nsqworker.reconnect import reconnect_delay

__all__ = ["STABLE_AFTER", "Node", "NodePool"]

log = logging.getLogger("nsqworker.nsq.producer")

STABLE_AFTER: Final = 1.0
"""Seconds a connection must live for the next redial to start the backoff afresh."""


class Node:
    """One nsqd address: its live connection (if any) and the task that keeps it up."""

    __slots__ = ("address", "conn", "last_error", "task")

    def __init__(self, address: str) -> None:
        self.address = address
        self.conn: Connection | None = None
        self.last_error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def healthy(self) -> bool:
        """True while its connection is up (a connection is only connected while open)."""
        return self.conn is not None and self.conn.connected


class NodePool:
    """Connections to ``addresses``, each redialled after ``reconnect_base`` seconds,
    doubling up to ``reconnect_cap``, while the pool is open."""

    def __init__(
        self,
        addresses: list[str],
        config: ConnectionConfig,
        reconnect_base: float,
        reconnect_cap: float,
    ) -> None:
        self.nodes = [Node(a) for a in addresses]
        self.config = config
        self.reconnect_base = reconnect_base
        self.reconnect_cap = reconnect_cap
        self.started = False
        self.closed = False
        """True once :meth:`begin_close` was called: calls waiting for a connection fail."""
        self._next = 0
        self._changed: asyncio.Event | None = None

    def __repr__(self) -> str:
        up = sum(n.healthy for n in self.nodes)
        return f"<NodePool connected={up}/{len(self.nodes)}>"

    @property
    def connected(self) -> list[str]:
        """Addresses of the nsqd with a live connection right now."""
        return [n.address for n in self.nodes if n.healthy]

    def start(self) -> None:
        """Begin connecting: a keeper task per address (idempotent)."""
        if self.closed:
            raise ConnectionClosed("the producer is closed")
        if self.started:
            return
        self.started = True
        self._changed = asyncio.Event()
        for node in self.nodes:
            node.task = asyncio.create_task(self._keep(node), name=f"nsq-producer {node.address}")

    def begin_close(self) -> None:
        """Calls waiting for a connection fail at once (live ones are still handed out,
        for the publishes in flight while the producer closes)."""
        self.closed = True
        self._notify()

    async def close(self, timeout: float) -> None:
        """Stop the keepers and close every connection (bounded by ``timeout``)."""
        self.begin_close()
        tasks = [n.task for n in self.nodes if n.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        conns = [n.conn for n in self.nodes if n.conn is not None]
        await asyncio.gather(*(c.close(timeout) for c in conns), return_exceptions=True)
        self._notify()

    def choose(self, avoid: Node | None) -> Node | None:
        """The next node with a live connection (round-robin), preferring one not
        ``avoid``; None while none is up."""
        nodes = self.nodes
        if len(nodes) == 1:
            conn = nodes[0].conn  # healthy, inlined: this runs once per publish
            return nodes[0] if conn is not None and conn.connected else None
        healthy = [n for n in nodes if n.healthy]
        if not healthy:
            return None
        choices = [n for n in healthy if n is not avoid] or healthy
        self._next += 1
        return choices[self._next % len(choices)]

    async def pick(self, deadline: float, avoid: Node | None, timeout: float) -> Node:
        """:meth:`choose`, waiting up to ``deadline`` (loop time) for a connection.

        Raises:
            NoConnection: none came up in time, or the pool is closed; it names each
                address with its last error (``timeout`` is the caller's, for the text).
        """
        loop = asyncio.get_running_loop()
        while True:
            node = self.choose(avoid)
            if node is not None:
                return node
            remaining = deadline - loop.time()
            changed = self._changed
            if self.closed or remaining <= 0 or changed is None:
                raise self._no_connection(timeout)
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                raise self._no_connection(timeout) from None

    def _no_connection(self, timeout: float) -> NoConnection:
        if self.closed:
            return NoConnection("the producer is closed")
        tried = "; ".join(f"{n.address}: {n.last_error or 'not connected yet'}" for n in self.nodes)
        return NoConnection(f"no nsqd reachable within {timeout:g} s (tried {tried})")

    def _notify(self) -> None:
        """Wake every call waiting for a connection to come up."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _keep(self, node: Node) -> None:
        """Keep ``node`` connected: dial, wait for the close, redial with backoff."""
        loop = asyncio.get_running_loop()
        attempt = 0
        while not self.closed:
            if attempt:
                await asyncio.sleep(
                    reconnect_delay(attempt, self.reconnect_base, self.reconnect_cap)
                )
            conn = await self._dial(node, attempt)
            if conn is None:
                attempt += 1
                continue
            node.conn = conn
            self._notify()
            since = loop.time()
            await conn.wait_closed()
            if node.conn is conn:
                node.conn = None
            if not self.closed:
                log.warning(
                    "producer lost nsqd at %s (%s); redialling", node.address, node.last_error
                )
            attempt = 0 if loop.time() - since >= STABLE_AFTER else attempt + 1

    async def _dial(self, node: Node, attempt: int) -> Connection | None:
        """A connected Connection to ``node``, or None (the error kept in ``last_error``)."""
        conn: Connection | None = None
        try:
            on_close = self._on_close(node)
            conn = await connect_adapting(
                node.address, self.config, lambda c: Connection(node.address, c, on_close=on_close)
            )
        except BaseException as exc:
            if conn is not None:
                conn.abort()
            if not isinstance(exc, Exception):
                raise
            node.last_error = exc
            log.log(
                logging.WARNING if attempt == 0 else logging.DEBUG,
                "producer cannot reach nsqd at %s (attempt %d): %s",
                node.address,
                attempt + 1,
                exc,
            )
            return None
        if attempt:
            log.info("producer reconnected to nsqd at %s", node.address)
        return conn

    @staticmethod
    def _on_close(node: Node) -> Callable[[Connection, ConnectionClosed], None]:
        def on_close(conn: Connection, exc: ConnectionClosed) -> None:
            if node.conn is conn:
                node.conn = None
                node.last_error = exc

        return on_close
