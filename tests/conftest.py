"""Test database and app fixtures.

The schema is built by running the Alembic migrations. By default the suite runs on SQLite;
with AFTERWARD_TEST_DATABASE_URL=postgresql+psycopg://... it runs the same tests on PostgreSQL
(in a schema of its own, dropped at the end) and fails at once if that server is unreachable.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

os.environ["AFTERWARD_ENVIRONMENT"] = "test"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.pop("AFTERWARD_DATABASE_URL", None)

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from study import clock
from study.db import make_engine, migrate, session_factory
from study.settings import get_settings
from tests.builders import load_study

POSTGRES_URL = os.environ.get("AFTERWARD_TEST_DATABASE_URL", "")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "wellbeing-pilot.yaml"


def pytest_report_header() -> str:
    return f"database: {'PostgreSQL ' + POSTGRES_URL if POSTGRES_URL else 'SQLite'}"


@pytest.fixture(scope="session")
def database_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database: a SQLite file to copy, or a fresh PostgreSQL schema."""
    if not POSTGRES_URL:
        path = tmp_path_factory.mktemp("db") / "template.db"
        migrate(f"sqlite:///{path}")
        yield str(path)
        return
    schema = f"afterward_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL)
    try:
        with admin.begin() as connection:
            connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    except sa.exc.OperationalError as exc:
        pytest.exit(f"PostgreSQL was expected at {POSTGRES_URL} but is unreachable: {exc}", returncode=3)
    url = sa.engine.make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    rendered = url.render_as_string(hide_password=False)
    migrate(rendered)
    yield rendered
    with admin.begin() as connection:
        connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture
def engine(database_template: str, tmp_path: Path) -> Iterator[Engine]:
    """An empty, migrated database for one test."""
    if not POSTGRES_URL:
        path = tmp_path / "afterward.db"
        shutil.copy(database_template, path)
        engine = make_engine(f"sqlite:///{path}")
    else:
        engine = make_engine(database_template, pool_size=5, max_overflow=5)
        with engine.begin() as connection:
            tables = connection.execute(sa.text(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "AND tablename <> 'alembic_version'")).scalars().all()
            if tables:
                connection.execute(sa.text(
                    "TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE"))
    yield engine
    engine.dispose()


def module_database(database_template: str, folder: Path) -> Engine:
    """A migrated, empty database for a module-scoped fixture (the per-test ``engine`` is
    function-scoped): a copy of the template on SQLite, the template's schema emptied on PostgreSQL."""
    if not POSTGRES_URL:
        shutil.copy(database_template, folder / "module.db")
        return make_engine(f"sqlite:///{folder / 'module.db'}")
    return emptied(make_engine(database_template, pool_size=5, max_overflow=5))


def emptied(engine: Engine) -> Engine:
    """``engine``'s PostgreSQL schema with every table but Alembic's emptied."""
    with engine.begin() as connection:
        tables = connection.execute(sa.text(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename <> 'alembic_version'")).scalars().all()
        connection.execute(sa.text("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE"))
    return engine


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    """A session whose work the test commits itself (like a job would)."""
    with session_factory(engine)() as session:
        yield session


@pytest.fixture
def frozen_clock() -> Iterator[clock.FrozenClock]:
    frozen = clock.FrozenClock(dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC))
    previous = clock.set_clock(frozen)
    yield frozen
    clock.set_clock(previous)


@pytest.fixture(autouse=True)
def _fresh_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Audit anchors of a test go to its own file, never a developer's var/audit-anchors.jsonl.
    monkeypatch.setenv("AFTERWARD_AUDIT_ANCHOR_PATH", str(tmp_path / "audit-anchors.jsonl"))
    # And its evaluation runs' Inspect logs to its own folder.
    monkeypatch.setenv("AFTERWARD_EVAL_LOG_DIR", str(tmp_path / "inspect-logs"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def app_client(engine: Engine) -> Iterator[TestClient]:
    from api.app import create_app

    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def example_protocol() -> str:
    return EXAMPLE.read_text(encoding="utf-8")


@pytest.fixture
def slug(engine: Engine, example_protocol: str) -> str:
    """The example protocol loaded; its study's slug."""
    return load_study(engine, example_protocol)
