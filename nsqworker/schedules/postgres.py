"""The ``postgres`` schedule leader: one row of a PostgreSQL table the team already runs.

The table ``nsqworker_schedule_leases`` (created on first use, :data:`CREATE_TABLE`) holds
one row per lease name (``schedule_lease_name``): the holder, a **fencing token**, the row's
version, the lease duration, the times *of the database's clock* (``clock_timestamp()``:
acquired, renewed, expires), and the last tick fired per task (``fired``, JSON) with the
token of the leader that wrote it (``fired_token``).

Every write is one ``UPDATE ... WHERE name = $1 AND token = $2 AND version = $3``: a
compare-and-set on what the candidate read, as a Kubernetes Lease's resourceVersion or a
KV entry's revision, so :class:`~nsqworker.schedules.lease.Elector` runs on it unchanged
(the version it holds is ``"<token>:<version>"``). On top of that:

* the token goes up by one each time a new holder takes the row; a writer holding an
  older token (a leader paused or cut off while another took over) matches no row, so
  its renewal or its recorded tick is refused and it stops firing;
* a takeover (a new holder) is also refused while the database's own clock says the
  holder's lease has not expired (``expires_at``, set at each write to the database's
  time plus the holder's duration): besides the follower's own monotonic wait, the
  database must agree. An ``expires_at`` further ahead than one lease duration (the
  database's clock stepped back) does not block. The workers' wall clocks are never
  used.

The connection (psycopg 3, ``autocommit``, no server-side prepared statements so that
PgBouncer in transaction mode works) is opened on first use and again after any failure.
``schedule_postgres_dsn`` carries the password: no log line or error shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger
from nsqworker.schedules.lease import Conflict, LeaseDenied, LeaseRecord

if TYPE_CHECKING:
    from nsqworker.settings.schedules import ScheduleSettings

__all__ = ["CREATE_TABLE", "MASK", "TABLE", "PostgresLeaseStore", "dsn_secrets", "scrub"]

log = get_logger("nsqworker.schedules")
T = TypeVar("T")

TABLE: Final = "nsqworker_schedule_leases"
MASK: Final = "********"

CREATE_TABLE: Final = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    name text PRIMARY KEY,
    holder text,
    token bigint NOT NULL,
    version bigint NOT NULL,
    lease_duration double precision NOT NULL,
    acquire_time timestamptz,
    renew_time timestamptz,
    expires_at timestamptz,
    transitions integer NOT NULL DEFAULT 0,
    fired jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    fired_token bigint NOT NULL DEFAULT 0
)"""
"""The table, as the store creates it (a DBA may create it beforehand: docs/schedules.md)."""

_SELECT = f"""
SELECT holder, token, version, lease_duration, acquire_time, renew_time, transitions, fired
FROM {TABLE} WHERE name = %(name)s"""

_INSERT = f"""
INSERT INTO {TABLE} (name, holder, token, version, lease_duration, acquire_time,
                     renew_time, expires_at, transitions, fired, fired_token)
VALUES (%(name)s, %(holder)s::text, 1, 1, %(duration)s, clock_timestamp(), clock_timestamp(),
        clock_timestamp() + make_interval(secs => %(duration)s), %(transitions)s,
        %(fired)s, 1)
ON CONFLICT (name) DO NOTHING
RETURNING token, version"""

# In SET, a column names its value before the update. The new token: one more when the
# row passes to another holder, else the same.
_NEW_TOKEN = "token + (%(holder)s::text IS NOT NULL AND holder IS DISTINCT FROM %(holder)s)::int"
_UPDATE = f"""
UPDATE {TABLE} SET
    token = {_NEW_TOKEN},
    version = version + 1,
    holder = %(holder)s::text,
    lease_duration = %(duration)s,
    acquire_time = CASE WHEN holder IS DISTINCT FROM %(holder)s::text
                        THEN clock_timestamp() ELSE acquire_time END,
    renew_time = clock_timestamp(),
    expires_at = clock_timestamp()
                 + make_interval(secs => CASE WHEN %(holder)s::text IS NULL THEN 0
                                              ELSE %(duration)s END),
    transitions = %(transitions)s,
    fired = %(fired)s,
    fired_token = CASE WHEN fired IS DISTINCT FROM %(fired)s
                       THEN {_NEW_TOKEN} ELSE fired_token END
WHERE name = %(name)s AND token = %(token)s AND version = %(version)s
  AND (%(holder)s::text IS NULL OR holder IS NULL OR holder = %(holder)s::text
       OR expires_at <= clock_timestamp()
       OR expires_at > clock_timestamp() + make_interval(secs => lease_duration))
RETURNING token, version"""


def dsn_secrets(dsn: str) -> list[str]:
    """What of ``dsn`` must never be shown: the whole string and its password (as
    written and decoded), longest first. Pure: works on a malformed ``dsn`` too."""
    found = {dsn, dsn.strip()}
    if "://" in dsn:
        with contextlib.suppress(ValueError):
            url = urlsplit(dsn.strip())
            if url.password:
                found |= {url.password, unquote(url.password)}
            found |= {value for key, value in parse_qsl(url.query) if key == "password"}
    for match in re.finditer(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn):
        value = match.group(1)
        found |= {value, value.strip("'").replace("\\'", "'")}
    with contextlib.suppress(Exception):
        from psycopg.conninfo import conninfo_to_dict

        found.add(str(conninfo_to_dict(dsn).get("password") or ""))
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by :data:`MASK`."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def _where(dsn: str) -> str:
    """``host:port/dbname`` of ``dsn`` for logs, never its password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(dsn)
    except Exception:
        return "PostgreSQL"
    # a password with an unencoded @ ends up in libpq's host: keep what follows it
    host = str(params.get("host") or params.get("hostaddr") or "localhost").rpartition("@")[2]
    port = str(params.get("port") or 5432)
    dbname = str(params.get("dbname") or params.get("user") or "")
    return f"{host}:{port}/{dbname}"


class PostgresLeaseStore:
    """The row ``name`` of :data:`TABLE` in the database of ``dsn``."""

    def __init__(self, dsn: str, name: str, timeout: float) -> None:
        self._dsn = dsn
        self._secrets = dsn_secrets(dsn)
        self.name = name
        self.timeout = timeout
        self.description = scrub(f"PostgreSQL {_where(dsn)} {TABLE}/{name}", self._secrets)
        self._conn: Any = None
        self._token: int | None = None

    @classmethod
    def from_settings(cls, settings: ScheduleSettings, name: str) -> PostgresLeaseStore:
        """The store of ``settings``; ``ConfigurationError`` names what is missing."""
        if importlib.util.find_spec("psycopg") is None:
            raise ConfigurationError(
                "schedule_leader postgres needs psycopg: pip install 'nsq-worker[postgres]'"
            )
        if settings.schedule_postgres_dsn is None:
            raise ConfigurationError(
                "schedule_leader postgres needs schedule_postgres_dsn: set "
                f"{settings.env_name('schedule_postgres_dsn')}="
                "postgresql://user:password@host:5432/dbname"
            )
        dsn = settings.schedule_postgres_dsn.get_secret_value()
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(dsn)
        except Exception as exc:
            raise ConfigurationError(
                f"schedule_postgres_dsn is not a connection string libpq reads: "
                f"{scrub(str(exc), dsn_secrets(dsn))}"
            ) from None
        return cls(dsn, name, max(0.5, settings.schedule_renew_deadline / 2))

    @property
    def token(self) -> int | None:
        """The fencing token of the last row read or written, None before that."""
        return self._token

    async def get(self) -> tuple[LeaseRecord, str] | None:
        """The row as a record, and ``"<token>:<version>"``; None when there is none."""
        row = await self._run("read", lambda conn: _fetch(conn, _SELECT, {"name": self.name}))
        if row is None:
            return None
        holder, token, version, duration, acquired, renewed, transitions, fired = row
        self._token = int(token)
        record = LeaseRecord(
            holder=holder or None,
            lease_duration=float(duration),
            acquire_time=acquired,
            renew_time=renewed,
            transitions=int(transitions or 0),
            fired=_fired(fired),
        )
        return record, f"{token}:{version}"

    async def create(self, record: LeaseRecord) -> str:
        """Insert the row, token 1; :class:`Conflict` if it exists."""
        params = self._params(record)
        row = await self._run("create", lambda conn: _fetch(conn, _INSERT, params))
        if row is None:
            raise Conflict("the row exists")
        return self._written(record, row)

    async def update(self, record: LeaseRecord, version: str) -> str:
        """Replace the row if its token and version are still those of ``version``, and,
        for a new holder, if the database's clock says the lease expired."""
        try:
            token, number = (int(part) for part in version.split(":"))
        except ValueError:
            raise Conflict(f"version {version!r} is not ours") from None
        params = {**self._params(record), "token": token, "version": number}
        row = await self._run("update", lambda conn: _fetch(conn, _UPDATE, params))
        if row is None:
            raise Conflict(
                f"token {token}, version {number} is not current (or, for a new holder, the"
                " lease has not expired by the database's clock)"
            )
        return self._written(record, row)

    async def close(self) -> None:
        """Close the connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), self.timeout)

    # -- inside ------------------------------------------------------------------------

    def _params(self, record: LeaseRecord) -> dict[str, Any]:
        from psycopg.types.json import Jsonb

        duration = record.lease_duration
        return {
            "name": self.name,
            "holder": record.holder or None,
            "duration": float(duration) if math.isfinite(duration) and duration > 0 else 15.0,
            "transitions": int(record.transitions),
            "fired": Jsonb(dict(sorted(record.fired.items()))),
        }

    def _written(self, record: LeaseRecord, row: tuple[Any, ...]) -> str:
        token, number = int(row[0]), int(row[1])
        if token != self._token and record.holder:
            log.info(f"schedules: {record.holder} holds {self.description}, fencing token {token}")
        self._token = token
        return f"{token}:{number}"

    async def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            import psycopg

            conn = await psycopg.AsyncConnection.connect(
                self._dsn,
                autocommit=True,
                prepare_threshold=None,
                connect_timeout=max(2, math.ceil(self.timeout)),
                application_name="nsqworker-schedules",
            )
            try:
                timeout_ms = max(1, int(self.timeout * 1000))
                await conn.execute(f"SET statement_timeout = {timeout_ms}")
                await _create_table(conn)
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.close()
                raise
            self._conn = conn
        return self._conn

    async def _run(self, verb: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """``call(connection)`` within the timeout; errors say what failed without the
        password, and drop the connection (the next call opens another)."""
        import psycopg
        from psycopg import errors

        async def attempt() -> T:
            return await call(await self._connection())

        try:
            return await asyncio.wait_for(attempt(), self.timeout)
        except (errors.InsufficientPrivilege, errors.InvalidAuthorizationSpecification) as exc:
            await self.close()
            raise LeaseDenied(
                f"the database user may not {verb} {self.description} "
                f"({self._scrub(exc)}); grant it SELECT, INSERT and UPDATE on {TABLE} "
                f"(and CREATE on the schema, or create the table: docs/schedules.md)"
            ) from None
        except TimeoutError:
            await self.close()
            raise RuntimeError(
                f"{self.description}: {verb} took longer than {self.timeout:g} s"
            ) from None
        except (psycopg.Error, OSError) as exc:
            await self.close()
            raise RuntimeError(f"{self.description}: {verb} failed: {self._scrub(exc)}") from None

    def _scrub(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split()) or type(exc).__name__
        return scrub(text, self._secrets)


async def _fetch(conn: Any, query: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    cursor = await conn.execute(query, params)
    row: tuple[Any, ...] | None = await cursor.fetchone()
    return row


async def _create_table(conn: Any) -> None:
    """Create the table unless it exists (two candidates at once: one wins, the other
    finds it made)."""
    from psycopg import errors

    exists = await conn.execute("SELECT to_regclass(%s)", (TABLE,))
    found = await exists.fetchone()
    if found is not None and found[0] is not None:
        return
    try:
        await conn.execute(CREATE_TABLE)
    except (errors.UniqueViolation, errors.DuplicateTable):
        pass  # created by another candidate between the check and ours


def _fired(value: Any) -> dict[str, str]:
    """The ``fired`` column as task -> tick; anything else (edited by hand) as nothing."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}
