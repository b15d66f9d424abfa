"""Database engine, sessions and the declarative base shared by every package's models.

The edge owns the transaction: an HTTP request or a scheduler job opens one session with
``session_scope()`` (or the API's dependency), services only ``flush()``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from sqlalchemy import JSON, DateTime, Dialect, MetaData, Table, create_engine, event
from sqlalchemy.engine import Engine, make_url
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


def _configure_sqlite(engine: Engine) -> None:
    # pysqlite's own transaction handling defers BEGIN and cannot upgrade a read to a write
    # safely under concurrency; take the write lock up front (BEGIN IMMEDIATE) instead.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, **kwargs: Any) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False}, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_size", 20)
    kwargs.setdefault("max_overflow", 20)
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    return make_engine(url)


def get_engine() -> Engine:
    from study.settings import get_settings

    return engine_for(get_settings().database_url)


def session_factory(engine: Engine | None = None) -> sessionmaker[Session]:
    return sessionmaker(bind=engine or get_engine(), expire_on_commit=False)


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
    json_columns = {c.name for c in table.columns if isinstance(c.type, JSON)}
    driver = session.connection().connection.driver_connection
    assert driver is not None
    names = ", ".join(f'"{name}"' for name in columns)
    with driver.cursor() as cursor, cursor.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row([json.dumps(row[c]) if c in json_columns and row[c] is not None else row[c]
                            for c in columns])


@contextmanager
def session_scope(engine: Engine | None = None) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on error."""
    session = session_factory(engine)()
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
