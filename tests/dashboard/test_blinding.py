"""The dashboard of a blinded study (the simulated study, its protocol asking for
``blinding: {outcomes_until_plan_frozen: true}`` in a new version): the outcome pages pool the means
over the arms and show no model (nor start a fit) until the plan is frozen, while follow-up
completion keeps its arms; an admin may unblind a page with a reason, audited each time it comes into
view; once the plan is frozen the pages show the arms again."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pandas as pd
import pytest
import streamlit as st
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from streamlit.testing.v1 import AppTest

from analysis.plan import UNBLINDED_READ, freeze_plan
from analysis.simulation.simulate import load_simulated_study
from analysis.tables import ModelFit
from dashboard import data
from study import audit, clock
from study.db import make_engine, session_scope
from study.models import AuditEntry, StaffRole
from study.settings import get_settings
from tests.conftest import EXAMPLE, POSTGRES_URL
from tests.dashboard.conftest import EMAILS, NOW, Simulated, empty_database, sign_in, simulated_study, visit

BLINDING = "\nblinding:\n  outcomes_until_plan_frozen: true\n"
NOTICE = "is blinded until its analysis plan is frozen"
REASON = "data manager's check of the week-4 wave"


def _copy(simulated: Simulated, tmp_path: Path) -> Engine:
    """SQLite: a copy of the simulated study's file (fits included)."""
    copy = tmp_path / "blinded.db"
    source, target = sqlite3.connect(str(simulated.engine.url.database)), sqlite3.connect(copy)
    with target:
        source.backup(target)
    source.close()
    target.close()
    return make_engine(f"sqlite:///{copy}")


def _simulated_again(stack: ExitStack, database_template: str, tmp_path: Path) -> tuple[Engine, str]:
    """PostgreSQL: the simulated study made again, smaller, in a schema of its own."""
    engine = stack.enter_context(empty_database(database_template, tmp_path))
    return engine, simulated_study(engine, participants=30)


@pytest.fixture
def blinded(simulated: Simulated, database_template: str, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulated]:
    """The simulated study (a copy of its SQLite file; on PostgreSQL a smaller one made again), its
    protocol asking for blinding in a new version, and the dashboard reading it at the study's end
    with an empty cache."""
    stack = ExitStack()
    engine, slug = (_simulated_again(stack, database_template, tmp_path) if POSTGRES_URL
                    else (_copy(simulated, tmp_path), simulated.slug))
    load_simulated_study(engine, EXAMPLE.read_text(encoding="utf-8") + BLINDING, slug)
    url = engine.url.render_as_string(hide_password=False)
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", url)
    get_settings.cache_clear()
    st.cache_data.clear()
    data._generations.clear()
    previous = clock.set_clock(clock.FrozenClock(NOW))
    yield Simulated(engine, slug, url)
    clock.set_clock(previous)
    st.cache_data.clear()
    engine.dispose()
    stack.close()


def frames(app: AppTest) -> list[pd.DataFrame]:
    return [frame.value for frame in app.dataframe]


def with_column(app: AppTest, name: str) -> list[pd.DataFrame]:
    return [frame for frame in frames(app) if name in frame.columns]


def notices(app: AppTest) -> str:
    return " ".join(element.value for element in app.info)


def fits(blinded: Simulated) -> int:
    with session_scope(blinded.engine, read_only=True) as session:
        return int(session.scalar(select(func.count()).select_from(ModelFit)) or 0)


def unblinded_reads(blinded: Simulated) -> list[AuditEntry]:
    with session_scope(blinded.engine, read_only=True) as session:
        return list(session.scalars(select(AuditEntry).where(AuditEntry.action == UNBLINDED_READ)
                                    .order_by(AuditEntry.seq)))


def test_outcome_pages_hide_the_arm_until_the_plan_is_frozen(blinded: Simulated) -> None:
    stored = fits(blinded)
    app = sign_in(EMAILS[StaffRole.RESEARCHER])
    visit(app, "outcomes")
    assert NOTICE in notices(app)
    [wellbeing] = with_column(app, "arm")  # and regret's by starting role
    assert set(wellbeing["arm"]) == {"all"}
    assert len(wellbeing) > 1  # baseline and the PERMA waves
    assert set(with_column(app, "starting_role")[0]["starting_role"]) == {"all"}
    assert not with_column(app, "group")  # no model's means by arm
    assert not any(c.value.startswith("Models fitted at") for c in app.caption)
    assert "unblind-reason" not in [t.key for t in app.text_input]  # researchers cannot unblind

    visit(app, "conversation_outcomes")
    assert NOTICE in notices(app)
    assert not frames(app)
    assert fits(blinded) == stored  # no fit started for a blinded page

    visit(app, "followups")  # follow-up completion keeps its arms
    assert {"wellbeing", "control"} <= set(with_column(app, "arm")[0]["arm"])

    viewer = sign_in(EMAILS[StaffRole.VIEWER])
    visit(viewer, "outcomes")
    assert NOTICE in notices(viewer)
    assert all(set(frame["arm"]) == {"all"} for frame in with_column(viewer, "arm"))

    with session_scope(blinded.engine) as session:
        plan = EXAMPLE.with_name("wellbeing-pilot.plan.yaml").read_text(encoding="utf-8")
        freeze_plan(session, blinded.slug, plan.replace("study: wellbeing-pilot", f"study: {blinded.slug}", 1),
                    "plan.yaml", audit.Actor.system("tests"))
    visit(app, "outcomes")
    assert NOTICE not in notices(app)
    [means] = with_column(app, "group")
    assert {"wellbeing", "control"} <= set(means["group"])
    visit(viewer, "outcomes")
    assert {"wellbeing", "control"} <= {arm for frame in with_column(viewer, "arm") for arm in frame["arm"]}
    assert unblinded_reads(blinded) == []


def test_an_admin_unblinds_a_page_with_a_reason_audited_each_time_it_comes_into_view(blinded: Simulated) -> None:
    app = sign_in(EMAILS[StaffRole.ADMIN])
    visit(app, "outcomes")
    assert NOTICE in notices(app)
    app.button(key="FormSubmitter:unblind-Unblind this page (admins)").click().run()  # no reason given
    assert [e.value for e in app.error] == ["say why this page must be unblinded: the reason is recorded in the "
                                            "audit log"]
    assert unblinded_reads(blinded) == []

    app.text_input(key="unblind-reason").input(REASON)
    app.button(key="FormSubmitter:unblind-Unblind this page (admins)").click().run()
    assert not app.exception
    [means] = with_column(app, "group")
    assert {"wellbeing", "control"} <= set(means["group"])
    assert any(REASON in warning.value for warning in app.warning)
    [entry] = unblinded_reads(blinded)
    assert (entry.actor, entry.detail) == (EMAILS[StaffRole.ADMIN], {"view": "the Outcomes page", "reason": REASON})

    app.run()  # still in view: no new record
    assert with_column(app, "group")
    assert len(unblinded_reads(blinded)) == 1
    visit(app, "overview")
    visit(app, "outcomes")  # into view again: recorded again
    assert with_column(app, "group")
    assert len(unblinded_reads(blinded)) == 2

    visit(app, "conversation_outcomes")  # another page: blinded until unblinded on its own
    assert NOTICE in notices(app)
    assert not frames(app)

    visit(app, "outcomes")
    app.button(key="blind-again").click().run()
    assert NOTICE in notices(app)
    assert not with_column(app, "group")
    assert len(unblinded_reads(blinded)) == 3
