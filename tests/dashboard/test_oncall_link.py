"""The on-call email's link (``scheduler.oncall.event_link``) in the dashboard, under Streamlit's
AppTest: signed in, a staff member of the event's study lands on the event (its category, the
turns around it, the review form; the read audited), and can review it there; an unknown event, an
event of another study, a malformed link, a viewer and a staff member of another study get a
message and nothing of the event. The browser journey from the email is tests/e2e/test_oncall_link.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

import pytest
import streamlit as st
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.engine import Engine
from streamlit.testing.v1 import AppTest

from dashboard import data
from scheduler.oncall import event_link
from study import staff, studies
from study.db import session_scope
from study.models import AuditEntry, StaffAccount, StaffRole
from study.safety import SafetyEvent, SafetyEventReview
from study.settings import Settings, get_settings
from tests.builders import TEST_ACTOR, ParticipantHandle, load_study, make_staff
from tests.dashboard.conftest import APP, PASSWORD
from tests.scheduler.test_oncall import CRISIS, EARLIER, escalate

RESEARCHER = "clinician@uni.example"
OUTSIDER = "outsider@other.example"


@dataclass(frozen=True)
class Escalated:
    slug: str
    event_id: int
    who: ParticipantHandle


@pytest.fixture
def escalated(engine: Engine, app_client: TestClient, example_protocol: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Escalated]:
    """The example study with one escalation, a researcher of it, and a researcher of another
    study; the dashboard reads this database."""
    slug = load_study(engine, example_protocol)
    who = escalate(engine, app_client, slug)
    other = load_study(engine, example_protocol.replace("id: wellbeing-pilot", "id: other-study", 1)
                       .replace('title: "Well-being mode pilot', 'title: "Another pilot', 1))
    make_staff(engine, slug, StaffRole.RESEARCHER, RESEARCHER)
    also_in(engine, other, RESEARCHER)  # listed first (by slug): the link has to choose the event's study
    make_staff(engine, other, StaffRole.RESEARCHER, OUTSIDER)
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    st.cache_data.clear()
    data._generations.clear()
    with engine.connect() as connection:
        [event_id] = connection.execute(select(SafetyEvent.id)).scalars().all()
    yield Escalated(slug, event_id, who)
    st.cache_data.clear()


def also_in(engine: Engine, slug: str, email: str) -> None:
    """Give a staff member a researcher's role in one more study."""
    with session_scope(engine) as session:
        account = session.scalars(select(StaffAccount).where(StaffAccount.email == email)).one()
        staff.grant(session, account, studies.get_study(session, slug), StaffRole.RESEARCHER, TEST_ACTOR)


def link_params(slug: str, event_id: int) -> dict[str, str]:
    """The query of the on-call email's link, as the dispatcher writes it."""
    url = urlsplit(event_link(Settings(dashboard_url="https://dashboard.example.org"), slug, event_id))
    assert (url.scheme, url.netloc, url.path) == ("https", "dashboard.example.org", "/safety")
    return dict(parse_qsl(url.query, strict_parsing=True))


def signed_in(params: dict[str, str], email: str) -> AppTest:
    """Open the dashboard at the link's address signed out and sign in: the run that follows the link."""
    app = AppTest.from_file(str(APP), default_timeout=120)
    for name, value in params.items():
        app.query_params[name] = value
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    app.text_input[0].input(email)
    app.text_input[1].input(PASSWORD)
    app.button[0].click()
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def follow(params: dict[str, str], email: str) -> AppTest:
    """``signed_in``, on the safety review: a browser stays at the link's /safety while signing in
    (tests/e2e/test_oncall_link.py); AppTest starts at the default page."""
    app = signed_in(params, email)
    app.switch_page("views/safety.py")
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def texts(app: AppTest) -> str:
    return "\n".join(e.value for kind in ("markdown", "text", "caption", "error", "info", "warning", "subheader")
                     for e in getattr(app, kind))


def reads(engine: Engine, email: str) -> list[AuditEntry]:
    with session_scope(engine, read_only=True) as session:
        return list(session.scalars(select(AuditEntry).where(AuditEntry.actor == email,
                                                             AuditEntry.action == "safety_event.read")))


def test_the_link_lands_a_researcher_on_the_event_with_its_turns_and_the_review_form(
        engine: Engine, escalated: Escalated) -> None:
    slug, event_id = escalated.slug, escalated.event_id
    app = AppTest.from_file(str(APP), default_timeout=120)
    for name, value in link_params(slug, event_id).items():
        app.query_params[name] = value
    app.run()
    assert [i.value for i in app.info] == [f"Sign in to open safety event #{event_id}."]

    app = follow(link_params(slug, event_id), RESEARCHER)
    assert app.selectbox(key="afterward_study").value == slug
    shown = texts(app)
    assert f"Safety event #{event_id}" in shown
    assert "**Category:** risk to self" in shown
    assert "Not reviewed yet." in shown
    said = [t.value for t in app.text]
    assert EARLIER in said  # the participant's turns: before the flagged reply,
    assert CRISIS in said  # and the one it answered
    assert "⚠ triggered the event" in shown
    assert not [s for s in app.selectbox if s.key == "safety-event"]  # the event alone, not the queue
    [entry] = reads(engine, RESEARCHER)
    assert entry.detail["event_id"] == event_id
    assert len(entry.detail["turn_ids"]) >= 3

    app.text_area[0].input("Phoned the participant per protocol; safe.")
    app.button(key=f"FormSubmitter:review-{event_id}-Record review").click()
    app.run()
    assert not app.exception
    assert [s.value for s in app.success] == [f"review of event #{event_id} recorded"]
    assert "Phoned the participant per protocol; safe." in texts(app)  # still on the event, now reviewed
    with session_scope(engine, read_only=True) as session:
        review = session.scalars(select(SafetyEventReview)).one()
    assert (review.safety_event_id, review.reviewed_by) == (event_id, RESEARCHER)

    app.button(key="safety-queue").click()
    app.run()
    assert "No safety event waits for review." in [s.value for s in app.success]
    assert dict(app.query_params) == {}


def test_a_researcher_of_another_study_sees_nothing_of_the_event(engine: Engine, escalated: Escalated) -> None:
    slug, event_id = escalated.slug, escalated.event_id
    app = signed_in(link_params(slug, event_id), OUTSIDER)
    [error] = [e.value for e in app.error]
    assert error.startswith(f"The safety event in this link is in a study where your account ({OUTSIDER}) has no "
                            "role")
    assert dict(app.query_params) == {}  # the link is dropped: their own safety review shows their queue
    app.switch_page("views/safety.py")
    app.run()
    shown = texts(app)
    assert f"Safety event #{event_id}" not in shown
    assert EARLIER not in shown
    assert CRISIS not in shown
    assert reads(engine, OUTSIDER) == []

    # Their own study's slug with this event's id: not an event of their study.
    app = follow(link_params("other-study", event_id), OUTSIDER)
    [error] = [e.value for e in app.error]
    assert error.startswith(f"No safety event {event_id} in this study (")
    assert CRISIS not in texts(app)
    assert reads(engine, OUTSIDER) == []


def test_a_de_identified_event_says_why_its_turns_are_gone_and_can_still_be_reviewed(
        engine: Engine, app_client: TestClient, escalated: Escalated) -> None:
    withdrawn = app_client.post("/api/v1/me/withdrawal", headers=escalated.who.headers,
                                json={"level": "delete_data", "confirm": True})
    assert withdrawn.status_code == 200, withdrawn.text
    app = follow(link_params(escalated.slug, escalated.event_id), RESEARCHER)
    [info] = [i.value for i in app.info]
    assert info.startswith(f"safety event {escalated.event_id} is a de-identified record")
    assert CRISIS not in texts(app)
    app.text_area[0].input("Known to the team; closed.")
    app.button(key=f"FormSubmitter:review-{escalated.event_id}-Record review").click()
    app.run()
    assert [s.value for s in app.success] == [f"review of event #{escalated.event_id} recorded"]


def test_a_link_to_an_unknown_event_says_so(engine: Engine, escalated: Escalated) -> None:
    slug = escalated.slug
    app = follow(link_params(slug, 999_999), RESEARCHER)
    [error] = [e.value for e in app.error]
    assert error.startswith("No safety event 999999 in this study (Well-being mode pilot")
    assert CRISIS not in texts(app)
    assert reads(engine, RESEARCHER) == []


@pytest.mark.parametrize("params", [{"event": "abc"}, {"event": "-1"}, {"event": "99999999999999999999"},
                                    {"event": "1.5"}, {"study": ""}])
def test_a_malformed_link_says_so(escalated: Escalated, params: dict[str, str]) -> None:
    slug, event_id = escalated.slug, escalated.event_id
    app = signed_in({**link_params(slug, event_id), **params}, RESEARCHER)
    [error] = [e.value for e in app.error]
    assert error.startswith("This address does not name a safety event")
    assert dict(app.query_params) == {}


def test_a_viewer_is_told_the_event_is_for_researchers(engine: Engine, escalated: Escalated) -> None:
    slug, event_id = escalated.slug, escalated.event_id
    make_staff(engine, slug, StaffRole.VIEWER, "viewer@uni.example")
    app = signed_in(link_params(slug, event_id), "viewer@uni.example")
    [error] = [e.value for e in app.error]
    assert "where your role (viewer) sees aggregate figures only" in error
    assert CRISIS not in texts(app)
    assert reads(engine, "viewer@uni.example") == []
