"""A study simulated through the real services (60 participants over 4 weeks, as the report's
tests use), shared by the dashboard tests, with staff of every role; and the dashboard under
Streamlit's AppTest, signed in."""

from __future__ import annotations

import datetime as dt
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
import streamlit as st
from sqlalchemy.engine import Engine
from streamlit.testing.v1 import AppTest

from analysis import fits
from analysis.simulation.simulate import load_simulated_study, simulate
from dashboard import data
from study import audit, clock
from study.db import make_engine, migrate, session_scope
from study.models import StaffRole, Study
from study.settings import get_settings
from tests.builders import make_staff
from tests.conftest import EXAMPLE, POSTGRES_URL

START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
WEEKS = 4
NOW = START + dt.timedelta(weeks=WEEKS)
APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
PASSWORD = "correct horse battery"  # tests.builders.make_staff's
EMAILS = {StaffRole.ADMIN: "admin@uni.example", StaffRole.RESEARCHER: "researcher@uni.example",
          StaffRole.VIEWER: "viewer@uni.example"}
ALL_PAGES = ["overview", "enrollment", "followups", "outcomes", "conversation_outcomes", "safety", "conversations",
             "data_quality", "exports"]
VIEWER_PAGES = ["overview", "enrollment", "followups", "outcomes", "exports"]


@dataclass(frozen=True)
class Simulated:
    engine: Engine
    slug: str
    url: str


@contextmanager
def empty_database(database_template: str, folder: Path) -> Iterator[Engine]:
    """A migrated database of the simulated study's own: on PostgreSQL a schema of its own, since
    the per-test ``engine`` (which tests of this folder take too) empties the template's schema."""
    if not POSTGRES_URL:
        shutil.copy(database_template, folder / "dashboard.db")
        engine = make_engine(f"sqlite:///{folder / 'dashboard.db'}")
        yield engine
        engine.dispose()
        return
    schema = f"afterward_dashboard_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = sa.engine.make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    migrate(url.render_as_string(hide_password=False))
    engine = make_engine(url.render_as_string(hide_password=False), pool_size=5, max_overflow=5)
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def simulated_study(engine: Engine, participants: int = 60) -> str:
    """The example study simulated through the real services over ``WEEKS`` weeks, staff of every
    role, its models fitted as of its end; its slug."""
    slug = load_simulated_study(engine, EXAMPLE.read_text(encoding="utf-8"))
    with session_scope(engine) as session:  # the arms come from the study's randomization: fix it
        session.execute(sa.update(Study).where(Study.slug == slug).values(allocation_seed="report-e2e"))
    simulate(engine, slug, participants=participants, weeks=WEEKS, seed=11, start=START, tick_minutes=120)
    for role, email in EMAILS.items():
        make_staff(engine, slug, role, email)
    previous = clock.set_clock(clock.FrozenClock(NOW))  # the models as fitted at the study's end
    try:
        fit_id = fits.request_fit(engine, slug, requested_by=audit.Actor("staff", EMAILS[StaffRole.RESEARCHER]))
        assert fit_id is not None
        fits.run_fit(engine, fit_id)
    finally:
        clock.set_clock(previous)
    return slug


@pytest.fixture(scope="session")
def simulated(database_template: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulated]:
    with empty_database(database_template, tmp_path_factory.mktemp("dashboard")) as engine:
        slug = simulated_study(engine)
        yield Simulated(engine, slug, engine.url.render_as_string(hide_password=False))


@pytest.fixture
def dashboard_env(simulated: Simulated, monkeypatch: pytest.MonkeyPatch) -> Iterator[clock.FrozenClock]:
    """The dashboard reads the simulated study, at the study's end, with an empty cache."""
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", simulated.url)
    get_settings.cache_clear()
    st.cache_data.clear()
    data._generations.clear()  # no test's refresh of the study holds back another's
    frozen = clock.FrozenClock(NOW)
    previous = clock.set_clock(frozen)
    yield frozen
    clock.set_clock(previous)
    st.cache_data.clear()


def open_app() -> AppTest:
    app = AppTest.from_file(str(APP), default_timeout=120)
    app.run()
    return app


def sign_in(email: str, password: str = PASSWORD) -> AppTest:
    app = open_app()
    app.text_input[0].input(email)
    app.text_input[1].input(password)
    app.button[0].click()
    app.run()
    return app


def visit(app: AppTest, page: str) -> AppTest:
    app.switch_page(f"views/{page}.py")
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app
