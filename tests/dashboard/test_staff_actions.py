"""Done-means 3 and the staff side's other writes: a researcher reviews a safety event in the
dashboard (stored, audited, gone from the queue); transcript reads and exports are audited; sign-in
is limited like the API's and sessions expire."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select

from analysis.transcripts import get_transcript
from dashboard import auth
from study import audit, clock
from study.db import session_scope
from study.models import AuditEntry, StaffRole, StaffToken, Study
from study.safety import SafetyEvent, SafetyEventReview
from study.security import token_digest
from tests.builders import make_staff
from tests.dashboard.conftest import EMAILS, PASSWORD, Simulated, open_app, sign_in, visit

pytestmark = pytest.mark.usefixtures("dashboard_env")


def audited(simulated: Simulated, action: str, actor: str) -> list[AuditEntry]:
    with session_scope(simulated.engine, read_only=True) as session:
        return list(session.scalars(select(AuditEntry).where(AuditEntry.action == action, AuditEntry.actor == actor)
                                    .order_by(AuditEntry.seq)))


def test_a_researcher_reviews_a_safety_event(simulated: Simulated) -> None:
    email = EMAILS[StaffRole.RESEARCHER]
    with session_scope(simulated.engine, read_only=True) as session:
        queue = list(session.scalars(select(SafetyEvent.id).where(SafetyEvent.reviewed_at.is_(None))
                                     .order_by(SafetyEvent.created_at.desc(), SafetyEvent.id.desc())))
    assert queue, "the simulated study has unreviewed safety events"
    app = sign_in(email)
    visit(app, "overview")
    assert {m.label: m.value for m in app.metric}["Unreviewed safety events"] == str(len(queue))
    visit(app, "safety")
    chooser = app.selectbox(key="safety-event")
    assert chooser.options
    assert len(chooser.options) == len(queue)
    event_id = queue[0]
    assert chooser.value == event_id
    assert any("triggered the event" in m.value for m in app.markdown)  # the turns around it are shown
    app.text_area[0].input("Called the participant per protocol; safe, resources given.")
    app.button(key=f"FormSubmitter:review-{event_id}-Record review").click()
    app.run()
    assert not app.exception
    assert [s.value for s in app.success][0] == f"review of event #{event_id} recorded"
    with session_scope(simulated.engine, read_only=True) as session:
        review = session.scalars(select(SafetyEventReview).where(SafetyEventReview.safety_event_id == event_id)).one()
        left = session.scalar(select(func.count()).select_from(SafetyEvent).where(SafetyEvent.reviewed_at.is_(None)))
    assert (review.reviewed_by, review.note) == (email, "Called the participant per protocol; safe, "
                                                        "resources given.")
    entry = audited(simulated, "safety_event.reviewed", email)[-1]
    assert entry.detail["event_id"] == event_id
    assert entry.detail["review_id"] == review.id
    # Read before it was reviewed (then the page shows, and reads, the next event of the queue).
    assert event_id in [entry.detail["event_id"] for entry in audited(simulated, "safety_event.read", email)]
    remaining = app.selectbox(key="safety-event").options if left else []
    assert event_id not in [int(o.split(" ")[0].lstrip("#")) for o in remaining]
    assert left == len(queue) - 1
    visit(app, "overview")
    assert {m.label: m.value for m in app.metric}["Unreviewed safety events"] == str(len(queue) - 1)


def test_reading_a_transcript_is_audited(simulated: Simulated) -> None:
    email = EMAILS[StaffRole.ADMIN]
    app = sign_in(email)
    visit(app, "conversations")
    listed = audited(simulated, "conversations.listed", email)
    assert listed
    assert listed[-1].detail["count"] == len(app.dataframe[0].value) > 0
    first = int(app.dataframe[0].value["id"].iloc[0])
    app.selectbox(key="conversation-open").select(first).run()
    assert not app.exception
    with session_scope(simulated.engine) as session:
        study_id = session.scalars(select(Study.id).where(Study.slug == simulated.slug)).one()
        expected = get_transcript(session, audit.Actor("staff", EMAILS[StaffRole.RESEARCHER]), study_id, first)
    read = audited(simulated, "conversation.read", email)
    assert [e.detail["conversation_id"] for e in read] == [first]
    assert read[0].participant_code == expected.participant
    assert [t.value for t in app.text] == [turn.content for turn in expected.turns]
    app.run()  # a rerun shows the same transcript without reading (or auditing) it again
    assert len(audited(simulated, "conversation.read", email)) == 1


@pytest.mark.parametrize("role", [StaffRole.VIEWER, StaffRole.RESEARCHER])
def test_exports_are_offered_by_role_and_audited(simulated: Simulated, role: StaffRole) -> None:
    email = EMAILS[role]
    app = sign_in(email)
    visit(app, "exports")
    options = app.radio(key="export-format").options
    assert (options == ["aggregates: aggregate tables, every cell under 5 participants suppressed"]) == (
        role == StaffRole.VIEWER)
    app.button(key="export-prepare").click().run()
    assert not app.exception
    assert not app.error
    entry = audited(simulated, "study.export", email)[-1]
    assert entry.detail["format"] == "aggregates"
    assert app.get("download_button")  # the zip is offered


def test_a_prepared_export_stays_with_who_prepared_it(simulated: Simulated) -> None:
    """A researcher's row-level export is not offered to a viewer who signs in on the same tab."""
    app = sign_in(EMAILS[StaffRole.RESEARCHER])
    visit(app, "exports")
    app.radio(key="export-format").set_value("csv").run()
    app.button(key="export-prepare").click().run()
    assert not app.exception
    assert app.get("download_button")
    app.button(key="sign-out").click().run()
    app.text_input[0].input(EMAILS[StaffRole.VIEWER])
    app.text_input[1].input(PASSWORD)
    app.button[0].click().run()
    visit(app, "exports")
    assert not app.get("download_button")


def test_wrong_passwords_are_limited_like_the_api(simulated: Simulated) -> None:
    email = "locked@uni.example"  # an account of its own: its failures stay recent under the frozen clock
    make_staff(simulated.engine, simulated.slug, StaffRole.VIEWER, email)
    app = sign_in(email, "not the password")
    assert [e.value for e in app.error] == [auth.WRONG]
    for _ in range(4):
        app = sign_in(email, "not the password")
    app = sign_in(email, "not the password")
    assert app.error[0].value.startswith(f"too many failed sign-ins for {email} from your address: wait")
    app = sign_in(email)  # even the right password waits
    assert app.error[0].value.startswith("too many failed sign-ins")
    assert auth.SESSION_KEY not in app.session_state


def test_sessions_expire_and_their_token_is_revoked(simulated: Simulated, dashboard_env: clock.FrozenClock) -> None:
    app = sign_in(EMAILS[StaffRole.ADMIN])
    visit(app, "overview")
    held = app.session_state[auth.SESSION_KEY]
    dashboard_env.advance(dt.timedelta(minutes=auth.IDLE_MINUTES - 1))
    app.run()
    assert app.title[0].value == "Overview"  # still signed in: each view restarts the idle time
    dashboard_env.advance(dt.timedelta(minutes=auth.IDLE_MINUTES + 1))
    app.run()
    assert app.title[0].value == "Afterward staff dashboard"  # the sign-in page
    assert "without activity" in app.info[0].value
    with session_scope(simulated.engine, read_only=True) as session:
        revoked = session.scalars(select(StaffToken.revoked_at).where(
            StaffToken.token_sha256 == token_digest(held.token))).one()
    assert revoked is not None
    fresh = open_app()
    assert fresh.title[0].value == "Afterward staff dashboard"
    assert not fresh.sidebar.selectbox
