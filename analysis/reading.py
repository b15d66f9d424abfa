"""How the read side reads: a connection from whatever the caller has (an engine, a connection or
a session), whole results or chunks as pandas DataFrames, and a study given by id or slug.

An engine gives a read-only unit of work (on SQLite it takes no write lock however long it
reads); chunks come from server-side cursors on PostgreSQL, so memory stays flat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pandas as pd
from sqlalchemy import String, select, type_coerce
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from study.db import READ_ONLY, UTCDateTime
from study.models import Study

Source = Engine | Connection | Session


@contextmanager
def connect(source: Source) -> Iterator[Connection]:
    if isinstance(source, Session):
        yield source.connection()
    elif isinstance(source, Connection):
        yield source
    else:
        with source.execution_options(**{READ_ONLY: True}).connect() as connection:
            yield connection


def concurrently(connection: Connection, *reads: Callable[[Connection], Any]) -> list[Any]:
    """The results of ``reads``, run at the same time: the first in ``connection``, each other in a
    read-only connection of its own from the same engine, on a thread (the database does the work;
    SQLite and psycopg let other threads run meanwhile, so two cores serve two reads). Each read
    sees the data as committed when it starts; an in-memory SQLite database (one connection) reads
    one after the other."""
    engine = connection.engine
    if len(reads) < 2 or (engine.dialect.name == "sqlite" and engine.url.database in (None, "", ":memory:")):
        return [read(connection) for read in reads]

    def apart(read: Callable[[Connection], Any]) -> Any:
        with connect(engine) as own:
            return read(own)

    with ThreadPoolExecutor(max_workers=len(reads) - 1) as pool:
        others = [pool.submit(apart, read) for read in reads[1:]]
        first = reads[0](connection)
        return [first, *(future.result() for future in others)]


def resolve_study_id(connection: Connection, study: int | str) -> int:
    if isinstance(study, int):
        return study
    found = connection.scalar(select(Study.id).where(Study.slug == study))
    if found is None:
        raise LookupError(f"no study {study!r}")
    return int(found)


def rows_frame(rows: Sequence[Any], columns: list[str]) -> pd.DataFrame:
    """A DataFrame of result rows, column by column: handing pandas the Row objects themselves
    costs it a failed attribute lookup per row (a quarter of the features' time)."""
    if not rows:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in columns})
    return pd.DataFrame(dict(zip(columns, (list(values) for values in zip(*rows, strict=True)), strict=True)))


def read_frame(connection: Connection, query: Any) -> pd.DataFrame:
    result = connection.execute(query)
    return rows_frame(result.all(), list(result.keys()))


def _datetimes_as_text(connection: Connection, query: Any) -> Any:
    """On SQLite, UTC datetime columns come back as their stored text, for pandas to parse a
    whole column at once (SQLAlchemy's per-value parsing costs ~10 µs a value); elsewhere the
    driver's datetimes are already fast."""
    if connection.dialect.name != "sqlite":
        return query
    columns = [type_coerce(column, String).label(column.key) if isinstance(column.type, UTCDateTime) else column
               for column in query.selected_columns]
    return query.with_only_columns(*columns, maintain_column_froms=True)


def stream_frames(connection: Connection, query: Any, chunk_rows: int) -> Iterator[pd.DataFrame]:
    """The result in DataFrames of at most ``chunk_rows`` rows (a server-side cursor where the
    database has one). Datetime columns may hold text on SQLite: read them with
    ``pd.to_datetime(values, utc=True)`` (the export's normalization does)."""
    query = _datetimes_as_text(connection, query)
    result = connection.execution_options(stream_results=True, yield_per=chunk_rows).execute(query)
    columns = list(result.keys())
    for rows in result.partitions():
        yield rows_frame(rows, columns)
