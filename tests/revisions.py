"""A database of its own migrated to an older revision, for tests of one revision up and down:
on PostgreSQL (``AFTERWARD_TEST_DATABASE_URL``) a scratch schema, on SQLite a file."""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path

import sqlalchemy as sa
from alembic.config import Config
from sqlalchemy.engine import Engine

from study.db import make_engine, migrate
from tests.conftest import POSTGRES_URL
from tests.postgres import scratch_schema

ROOT = Path(__file__).resolve().parents[1]


def migrated_to(stack: ExitStack, folder: Path, name: str, revision: str) -> tuple[Engine, Config]:
    """A new database at ``revision`` (dropped or disposed when ``stack`` closes) and the Alembic
    configuration to move it on with ``command.upgrade`` and ``command.downgrade``."""
    url = (stack.enter_context(scratch_schema(POSTGRES_URL, f"afterward_{name}")) if POSTGRES_URL
           else f"sqlite:///{folder / f'{name}.db'}")
    config = Config()
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    migrate(url, revision)
    engine = make_engine(url, timeouts=False)
    stack.callback(engine.dispose)
    return engine, config


def checked_values(engine: Engine, table: str, name: str) -> set[str]:
    """The values the CHECK constraint ``ck_<table>_<name>`` allows (an ``IN (...)`` list)."""
    [check] = [c for c in sa.inspect(engine).get_check_constraints(table) if c["name"] == f"ck_{table}_{name}"]
    return set(re.findall(r"'([a-z_]+)'", check["sqltext"]))
