"""A throwaway PostgreSQL schema, for the contract stage and the benches."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa


@contextmanager
def scratch_schema(url: str, prefix: str = "afterward_scratch") -> Iterator[str]:
    """A new, empty schema (dropped afterwards); yields a URL whose connections use it."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        scoped = sa.engine.make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield scoped.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
