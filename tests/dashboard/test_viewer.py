"""Done-means 2: a viewer sees aggregates only, every cell resting on fewer than 5 participants
is "< 5", and no hidden cell can be worked out from a total; the pages with participant-level
data refuse a viewer even when run directly; and the staff API's study summary suppresses the
same way for viewers."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pandas as pd
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from streamlit.testing.v1 import AppTest

from analysis.aggregates import SUPPRESSED, aggregate_tables
from api.app import create_app
from dashboard import auth
from scheduler.models import FollowUp
from study import staff
from study.db import session_scope
from study.models import Participant, StaffRole
from study.safety import SafetyEvent
from tests.analysis.attacker import summary_cells, summary_sums
from tests.dashboard.conftest import APP, EMAILS, PASSWORD, VIEWER_PAGES, Simulated, sign_in, visit

pytestmark = pytest.mark.usefixtures("dashboard_env")
LOW = "< 5"
# Which columns of each aggregate table count participants, and the sums a viewer knows.
PARTICIPANT_COUNTS = {"enrollment": ["enrolled", "withdrawn", "withdrawn_kept_data", "withdrawn_data_deleted",
                                     "participants"],
                      "wellbeing": ["n"], "conversations": ["participants"]}


def codes(simulated: Simulated) -> set[str]:
    with session_scope(simulated.engine, read_only=True) as session:
        return set(session.scalars(select(Participant.code)))


def everything_shown(app: AppTest) -> str:
    parts = [frame.value.to_csv(index=False) for frame in app.dataframe]
    parts += [e.value for kind in ("markdown", "caption", "text", "title", "info", "warning", "success")
              for e in getattr(app, kind)]
    return "\n".join(str(p) for p in parts)


def test_a_viewer_sees_only_the_suppressed_aggregate_tables(simulated: Simulated) -> None:
    expected = aggregate_tables(simulated.engine, simulated.slug)  # the rule's threshold: 5
    whole = aggregate_tables(simulated.engine, simulated.slug, threshold=0)
    known = codes(simulated)
    app = sign_in(EMAILS[StaffRole.VIEWER])
    seen: set[str] = set()
    for page in VIEWER_PAGES:
        visit(app, page)
        assert not app.metric  # no live participant-level counts
        text = everything_shown(app)
        assert not known & set(re.findall(r"\bP[0-9A-Z]{7}\b", text)), page  # no participant code anywhere
        for frame in app.dataframe:
            value = frame.value.reset_index(drop=True)
            name = next((n for n, t in expected.items() if list(t.columns) == list(value.columns)), None)
            assert name is not None, (page, list(value.columns))  # every table shown is an aggregate table
            pd.testing.assert_frame_equal(value.astype(str), expected[name].astype(str))
            seen.add(name)
    assert seen == {"enrollment", "followups", "wellbeing", "regret", "safety_events", "safety_reviews"}
    for name, columns in PARTICIPANT_COUNTS.items():
        for column in columns:
            for shown, true in zip(expected[name][column], whole[name][column], strict=True):
                if int(true) < 5:
                    assert shown == LOW
                else:
                    assert shown in (int(true), SUPPRESSED)
    # The study makes both markers appear, so the checks above have something to check.
    cells = pd.concat([t.astype(str) for t in expected.values()]).to_numpy().ravel().tolist()
    assert LOW in cells
    assert SUPPRESSED in cells


def test_no_hidden_cell_follows_from_a_total(simulated: Simulated) -> None:
    """Each arm row adds up to the 'all' row and each enrollment row's parts to its participants:
    a sum never has exactly one hidden cell (it would be the total minus the others)."""
    tables = aggregate_tables(simulated.engine, simulated.slug)
    app = sign_in(EMAILS[StaffRole.VIEWER])
    visit(app, "enrollment")
    enrollment = next(f.value for f in app.dataframe if "withdrawn_kept_data" in f.value.columns)
    pd.testing.assert_frame_equal(enrollment.astype(str), tables["enrollment"].astype(str))
    hidden = enrollment.drop(columns="arm").isin([LOW, SUPPRESSED])
    for column in hidden.columns:
        assert hidden[column].sum() != 1, column
    for _, row in hidden.iterrows():
        assert row.sum() != 1
    followups = tables["followups"]
    for wave, rows in followups.groupby("wave"):
        for column in ("due", "completed", "expired", "pending"):
            assert rows[column].isin([LOW, SUPPRESSED]).sum() != 1, (wave, column)
        for _, row in rows.iterrows():
            parts = [row[c] in (LOW, SUPPRESSED) for c in ("completed", "expired", "pending", "due")]
            assert sum(parts) != 1, (wave, row["arm"])


@pytest.mark.parametrize("page", ["safety", "conversations", "conversation_outcomes", "data_quality"])
def test_participant_level_pages_refuse_a_viewer_run_directly(simulated: Simulated, page: str) -> None:
    with session_scope(simulated.engine, read_only=True) as session:
        study_id = session.scalar(select(Participant.study_id).limit(1))
    assert study_id is not None
    app = AppTest.from_file(str(APP.parent / "views" / f"{page}.py"), default_timeout=60)
    app.session_state[auth.CONTEXT_KEY] = auth.Context(EMAILS[StaffRole.VIEWER], simulated.slug, "t", study_id,
                                                       StaffRole.VIEWER, simulated.url)
    app.run()
    assert [e.value for e in app.error] == ["your role in this study (viewer) sees aggregate figures only"]
    assert not app.dataframe
    assert not app.exception


@pytest.fixture
def api(simulated: Simulated) -> Iterator[TestClient]:
    with TestClient(create_app(simulated.engine), raise_server_exceptions=False) as client:
        yield client


def _token(simulated: Simulated, role: StaffRole) -> dict[str, str]:
    with session_scope(simulated.engine) as session:
        token = staff.login(session, email=EMAILS[role], password=PASSWORD, client="tests")
    return {"Authorization": f"Bearer {token}"}


def test_the_study_summary_is_suppressed_for_viewers(simulated: Simulated, api: TestClient) -> None:
    """Researchers get the counts; a viewer gets cells of the suppressed aggregate tables, the same
    cells the dashboard and the aggregate export show."""
    with session_scope(simulated.engine, read_only=True) as session:
        statuses = dict(session.execute(select(Participant.status, func.count()).group_by(Participant.status)).all())
        followups = dict(session.execute(select(FollowUp.status, func.count()).group_by(FollowUp.status)).all())
        events = session.scalar(select(func.count()).select_from(SafetyEvent))
    url = f"/api/v1/staff/studies/{simulated.slug}/summary"
    researcher = api.get(url, headers=_token(simulated, StaffRole.RESEARCHER)).json()
    assert researcher["participants_by_status"] == statuses
    assert researcher["followups_by_status"] == followups
    assert researcher["safety_events_total"] == events
    viewer = api.get(url, headers=_token(simulated, StaffRole.VIEWER)).json()
    tables = aggregate_tables(simulated.engine, simulated.slug)
    cells = summary_cells(viewer)
    places = [(summary, parts[0]) for summary, parts in summary_sums(viewer, tables)]
    assert len(places) == len(cells) > 10
    for summary, (name, row, column) in places:
        assert cells[summary] == tables[name].iloc[row][column], summary
    for status, shown in viewer["participants_by_status"].items():  # all 60 were assigned an arm
        if shown == LOW:  # fewer than 5 people: the cell's own marker
            assert statuses[status] < 5, status
        else:
            assert shown in (statuses[status], SUPPRESSED), status
    assert set(viewer["followups_by_wave"]) == set(tables["followups"]["wave"])
    # Every risk finding is an event (check-ins too): shown once they rest on 5 people or more.
    with session_scope(simulated.engine, read_only=True) as session:
        people = session.scalar(select(func.count(SafetyEvent.participant_id.distinct())))
    assert viewer["safety_events_total"] == (events if (people or 0) >= 5 else LOW)
