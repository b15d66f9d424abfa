"""Done-means 1: every page renders under AppTest for each role on a simulated study, and the
numbers shown are those ``analysis`` computes (and, for the SQL aggregates, those counted here
independently)."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest
from sqlalchemy import distinct, func, select
from streamlit.testing.v1 import AppTest

from analysis.aggregates import aggregate_tables
from analysis.estimates import StudyData, perma_trajectories
from analysis.report import participant_numbers
from study import clock
from study.db import session_scope
from study.models import ConsentSignature, Participant, StaffRole
from study.safety import SafetyEvent
from tests.dashboard.conftest import ALL_PAGES, EMAILS, VIEWER_PAGES, Simulated, sign_in, visit

pytestmark = pytest.mark.usefixtures("dashboard_env")


def shown(app: AppTest, columns: list[str]) -> pd.DataFrame:
    """The page's table with exactly these columns."""
    found = [frame.value for frame in app.dataframe if list(frame.value.columns) == columns]
    assert len(found) == 1, [list(frame.value.columns) for frame in app.dataframe]
    return found[0].reset_index(drop=True)


@pytest.mark.parametrize("role", [StaffRole.ADMIN, StaffRole.RESEARCHER, StaffRole.VIEWER])
def test_every_page_renders_for_each_role(role: StaffRole) -> None:
    app = sign_in(EMAILS[role])
    assert not app.exception
    assert not app.error
    pages = VIEWER_PAGES if role == StaffRole.VIEWER else ALL_PAGES
    for page in pages:
        visit(app, page)
        assert not app.error, (page, [e.value for e in app.error])
        assert app.title[0].value
        dated = ("Refreshed at 2026-03-30", "Models fitted at 2026-03-30")
        assert any(c.value.startswith(dated) for c in app.caption) or page in ("conversations", "exports")
    for page in sorted(set(ALL_PAGES) - set(pages)):  # not registered for this role at all
        with pytest.raises(ValueError, match="Could not find a navigation page"):
            app.switch_page(f"views/{page}.py")


def test_overview_and_enrollment_show_the_analysis_numbers(simulated: Simulated) -> None:
    app = sign_in(EMAILS[StaffRole.RESEARCHER])
    data = StudyData.load(simulated.engine, simulated.slug)
    with session_scope(simulated.engine, read_only=True) as session:
        deleted = {str(arm): int(n) for arm, n in session.execute(select(Participant.arm, func.count()).where(
            Participant.data_deleted_at.is_not(None), Participant.arm.is_not(None)).group_by(Participant.arm))}
        unreviewed = session.scalar(select(func.count()).select_from(SafetyEvent).where(
            SafetyEvent.reviewed_at.is_(None)))
        invited = session.scalar(select(func.count()).select_from(Participant))
        consented = session.scalar(select(func.count(distinct(ConsentSignature.participant_id))))
        randomized = session.scalar(select(func.count()).where(Participant.arm.is_not(None)))
    expected = participant_numbers(data.panel, deleted)
    visit(app, "overview")
    assert {m.label: m.value for m in app.metric}["Unreviewed safety events"] == str(unreviewed)
    numbers = shown(app, list(expected.columns))
    pd.testing.assert_frame_equal(numbers, expected, check_dtype=False)
    assert numbers.set_index("arm")["enrolled"].to_dict()["all"] == randomized == 60

    visit(app, "enrollment")
    funnel = shown(app, ["stage", "participants"]).set_index("stage")["participants"].to_dict()
    everyone = expected.set_index("arm").loc["all"]
    assert funnel["invited"] == invited
    assert funnel["consented"] == consented
    assert funnel["randomized"] == randomized
    assert (funnel["active"], funnel["completed"]) == (everyone["active"], everyone["completed"])
    assert funnel["invited"] >= funnel["consented"] >= funnel["randomized"] >= funnel["baseline"] > 0


def as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame's cells as text, a missing one as "None" however it is missing (None, NaN, NA):
    a table read back from the page has NaN where the analysis left None."""
    return frame.astype(object).where(frame.notna(), None).astype(str)


def test_followups_and_outcomes_show_the_analysis_numbers(simulated: Simulated) -> None:
    app = sign_in(EMAILS[StaffRole.ADMIN])
    tables = aggregate_tables(simulated.engine, simulated.slug, threshold=0)
    visit(app, "followups")
    expected = tables["followups"]
    page = shown(app, list(expected.columns))
    pd.testing.assert_frame_equal(as_text(page), as_text(expected))
    assert expected["completed"].astype(int).sum() > 0

    visit(app, "outcomes")
    fit = perma_trajectories(StudyData.load(simulated.engine, simulated.slug))
    means = shown(app, list(fit.marginal_means.columns))
    pd.testing.assert_frame_equal(means, fit.marginal_means.reset_index(drop=True), check_dtype=False)

    visit(app, "safety")
    card = tables["conversations"]
    page = shown(app, [*card.columns, "override_share"])
    pd.testing.assert_frame_equal(as_text(page[list(card.columns)]), as_text(card))


def test_the_cache_keeps_figures_until_refreshed(simulated: Simulated, dashboard_env: clock.FrozenClock) -> None:
    app = sign_in(EMAILS[StaffRole.RESEARCHER])
    visit(app, "overview")
    first = next(c.value for c in app.caption if c.value.startswith("Refreshed at"))
    assert first.startswith("Refreshed at 2026-03-30 00:00:00 UTC")
    dashboard_env.advance(dt.timedelta(minutes=2))
    visit(app, "overview")
    assert next(c.value for c in app.caption if c.value.startswith("Refreshed at")) == first  # from the cache
    app.sidebar.button[1].click().run()  # Refresh figures
    visit(app, "overview")
    assert next(c.value for c in app.caption if c.value.startswith("Refreshed at")).startswith(
        "Refreshed at 2026-03-30 00:02:00 UTC")
