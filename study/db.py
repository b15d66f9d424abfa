"""Database engine, sessions and the declarative base shared by every package's models.

The edge owns the transaction: an HTTP request or a scheduler job opens one session with
``session_scope()`` (or the API's dependency), services only ``flush()``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import fcntl
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import JSON, DateTime, Dialect, MetaData, Table, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes in and out, on SQLite (which stores naive text) and PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use study.clock.now()")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


T = TypeVar("T")
READ_ONLY = "afterward_read_only"  # execution option: a unit of work that only reads


class DatabaseBusy(SQLAlchemyError):
    """The database stayed locked by another writer for longer than the lock timeout."""


class DatabaseWorkOnEventLoop(RuntimeError):
    """Raised when a statement runs on a thread that is running an asyncio event loop: a lock
    wait there stops every other request of the process (run the work in the thread pool)."""


def _forbid_on_event_loop(engine: Engine) -> None:
    @event.listens_for(engine, "before_cursor_execute")
    def _check(*_args: Any) -> None:
        # Inside a task of a running loop: a coroutine (an endpoint) doing blocking work. (Code
        # that merely shares its thread with an idle loop, as Playwright's sync API makes the
        # browser tests do, runs outside any task.)
        loop = asyncio._get_running_loop()
        if loop is not None and asyncio.current_task(loop) is not None:
            raise DatabaseWorkOnEventLoop(
                "database work on the event loop; use a sync endpoint or api.deps.run_unit")


class _WriterQueue:
    """SQLite admits one writer at a time, and its busy handler polls with growing sleeps, so under
    load a waiter can starve past its timeout while others keep getting in (seen with 50
    concurrent chats). Writers queue here instead: first among this process's threads (a lock that
    wakes the next waiter at once), then among processes (an exclusive lock on a file beside the
    database, polled every few milliseconds). Held from BEGIN IMMEDIATE to COMMIT or ROLLBACK."""

    def __init__(self, database: str | None, timeout_ms: int) -> None:
        self.timeout = timeout_ms / 1000
        self.threads = threading.Lock()
        self.file = (os.open(f"{database}-writer-lock", os.O_RDWR | os.O_CREAT, 0o600)
                     if database and database != ":memory:" else None)
        if self.file is not None:
            weakref.finalize(self, os.close, self.file)  # closed with its engine

    def acquire(self) -> float:
        """Wait for our turn; returns the seconds left of the lock timeout."""
        deadline = time.monotonic() + self.timeout
        if not self.threads.acquire(timeout=self.timeout):
            raise DatabaseBusy(f"another writer held the database for more than {self.timeout:g} s")
        while self.file is not None:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.threads.release()
                    raise DatabaseBusy(f"another process held the database for more than {self.timeout:g} s"
                                       ) from None
                time.sleep(0.002)
        return max(0.0, deadline - time.monotonic())

    def release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
        self.threads.release()


def _configure_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        # Writers outside the queue (another tool, a migration) are waited for this long, then the
        # request answers 503 with Retry-After (api/errors.py).
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.close()

    # pysqlite's own transaction handling defers BEGIN and cannot upgrade a read to a write safely
    # under concurrency; a unit of work that may write queues, then takes the write lock up front
    # (BEGIN IMMEDIATE); one that only reads takes no lock at all (WAL readers never wait).
    queue = _WriterQueue(engine.url.database, busy_timeout_ms)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
            return
        left = queue.acquire()
        conn.info[_WRITER] = queue
        try:
            # A writer outside the queue (another tool) gets what is left of the same budget.
            conn.exec_driver_sql(f"PRAGMA busy_timeout={max(1, int(left * 1000))}")
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            _release_writer(conn.info)
            raise

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _on_end(conn: Any) -> None:
        _release_writer(conn.info)

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        _release_writer(record.info)  # in case a transaction ended without either event


_WRITER = "afterward_writer_queue"


def _release_writer(info: dict[str, Any]) -> None:
    queue = info.pop(_WRITER, None)
    if queue is not None:
        queue.release()


def _configure_postgres(engine: Engine, lock_ms: int, statement_ms: int, idle_ms: int) -> None:
    # Nothing waits forever: a lock wait, a statement and a transaction left open all have limits.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET lock_timeout = {int(lock_ms)}")
            cursor.execute(f"SET statement_timeout = {int(statement_ms)}")
            cursor.execute(f"SET idle_in_transaction_session_timeout = {int(idle_ms)}")
            # No JIT: on the analysis' grouped reads it spent 4 s compiling a 3.5 s query
            # (bench/dashboard.py, 100,000 participants), and the service's queries are too short for it.
            cursor.execute("SET jit = off")
        dbapi_connection.commit()


def make_engine(url: str, *, timeouts: bool = True, **kwargs: Any) -> Engine:
    """An engine with the platform's limits: lock, statement and idle-in-transaction timeouts on
    PostgreSQL, a bounded busy wait on SQLite, a bounded wait for a pooled connection, and no
    database work on an event loop. ``timeouts=False`` is for migrations."""
    from study.settings import Settings

    settings = Settings()  # read now, not cached: an engine is made rarely, and tests change the environment
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False}, **kwargs)
        _configure_sqlite(engine, settings.db_lock_timeout_ms if timeouts else 60_000)
    else:
        kwargs.setdefault("pool_size", 20)
        kwargs.setdefault("max_overflow", 20)
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_timeout", settings.db_pool_timeout_seconds)
        engine = create_engine(url, **kwargs)
        if timeouts:
            _configure_postgres(engine, settings.db_lock_timeout_ms, settings.db_statement_timeout_ms,
                                settings.db_idle_in_transaction_timeout_ms)
    _forbid_on_event_loop(engine)
    return engine


# PostgreSQL SQLSTATEs of contention: lock_not_available, query_canceled (statement timeout),
# deadlock_detected, serialization_failure, idle_in_transaction_session_timeout.
_RETRYABLE_SQLSTATES = {"55P03", "57014", "40P01", "40001", "25P03"}


def is_contention(exc: BaseException) -> bool:
    """Whether a database error means "busy, try again" (a lock or time limit, a full pool)
    rather than a bug: such errors answer 503 with Retry-After, never 500."""
    if isinstance(exc, PoolTimeout | DatabaseBusy):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _RETRYABLE_SQLSTATES:
        return True
    message = str(orig).lower()
    if "database is locked" in message or "database table is locked" in message or "busy" in message:
        return True
    # The server ended the session (idle-in-transaction timeout, restart): the next try reconnects.
    return bool(exc.connection_invalidated)


def retrying(work: Callable[[], T], *, within: float = 120.0) -> T:
    """Run ``work`` (whole units of work), again after a growing pause while the database answers
    busy (``is_contention``), for up to ``within`` seconds, then let the last error through. For
    batch work that must not lose what it has done (an evaluation cell a provider was paid for);
    a request answers 503 instead and its client retries."""
    deadline = time.monotonic() + within
    pause = 0.05
    while True:
        try:
            return work()
        except SQLAlchemyError as exc:
            if not is_contention(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 2.0)


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    return make_engine(url)


def get_engine() -> Engine:
    from study.settings import get_settings

    return engine_for(get_settings().database_url)


def session_factory(engine: Engine | None = None, *, read_only: bool = False) -> sessionmaker[Session]:
    bind = engine or get_engine()
    if read_only:
        bind = bind.execution_options(**{READ_ONLY: True})
    return sessionmaker(bind=bind, expire_on_commit=False)


def table_of(model: type[Base]) -> Table:
    """The Core table of a mapped class, for set-based statements that skip per-row ORM work."""
    return cast(Table, model.__table__)


def bulk_insert(session: Session, model: type[Base], rows: list[dict[str, Any]]) -> None:
    """Insert many rows in the session's transaction: COPY on PostgreSQL (an order of magnitude
    faster than row-by-row inserts), an executemany elsewhere. Every column must be given."""
    if not rows:
        return
    table = table_of(model)
    if not is_postgres(session):
        session.execute(table.insert(), rows)
        return
    columns = list(rows[0])
    driver = session.connection().connection.driver_connection
    assert driver is not None
    names = ", ".join(f'"{name}"' for name in columns)
    types = _copy_types(table, columns, driver.adapters.types, session.get_bind().dialect)
    if types is not None:  # binary: each value dumped by its column's type, in C (JSON by psycopg)
        with driver.cursor() as cursor, cursor.copy(
                f'COPY "{table.name}" ({names}) FROM STDIN (FORMAT BINARY)') as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row([row[c] for c in columns])
        return
    json_columns = {c.name for c in table.columns if isinstance(c.type, JSON)}
    with driver.cursor() as cursor, cursor.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row([json.dumps(row[c]) if c in json_columns and row[c] is not None else row[c]
                            for c in columns])


_PG_TYPE_NAMES = {"float": "float8"}  # what SQLAlchemy's Float compiles to, as psycopg names it


def _copy_types(table: Table, columns: list[str], known: Any, dialect: Dialect) -> list[str] | None:
    """The PostgreSQL type of each column for a binary COPY, or None if psycopg lacks one of them."""
    types = []
    for column in columns:
        name = table.c[column].type.compile(dialect=dialect).split("(")[0].strip().lower()
        name = _PG_TYPE_NAMES.get(name, name)
        if known.get(name) is None:
            return None
        types.append(name)
    return types


@contextmanager
def session_scope(engine: Engine | None = None, *, read_only: bool = False) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on error. Every request, page and job opens
    its transaction here (requests on a worker thread, never on the event loop). ``read_only``
    units do not take SQLite's write lock."""
    session = session_factory(engine, read_only=read_only)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def migrate(url: str, revision: str = "head") -> None:
    """Bring the schema at ``url`` to ``revision`` by running the Alembic migrations."""
    from alembic import command
    from alembic.config import Config

    root = Path(__file__).resolve().parent.parent
    config = Config()
    config.set_main_option("script_location", str(root / "migrations"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(config, revision)
