"""Safety-event reviews are an append-only history: a second review never overwrites the first."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from study.clock import FrozenClock
from study.models import StaffRole
from tests.builders import (
    ParticipantHandle,
    enroll_fully,
    load_study,
    make_invites,
    make_staff,
    put_in_arm,
    say,
    start_chat,
)


@pytest.fixture
def escalated(engine: Engine, app_client: TestClient, example_protocol: str) -> tuple[str, ParticipantHandle]:
    """A study with one safety event (a participant's crisis message); returns (slug, participant)."""
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    who = enroll_fully(app_client, invite)
    put_in_arm(engine, who.code, "wellbeing")
    reply = say(app_client, who, start_chat(app_client, who, "concierge"), "I want to kill myself")
    assert reply["stance"] == "escalate"
    return slug, who


def _events(client: TestClient, slug: str, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    response = client.get(f"/api/v1/staff/studies/{slug}/safety-events", headers=headers, params=params)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()
    return events


def test_every_review_is_kept_in_order(engine: Engine, app_client: TestClient, frozen_clock: FrozenClock,
                                       escalated: tuple[str, ParticipantHandle]) -> None:
    slug, who = escalated
    first = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    second = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.ADMIN, 'a@example.org')}"}
    [event] = _events(app_client, slug, first)
    assert (event["reviews"], event["reviewed_at"], event["review_note"]) == ([], None, None)

    notes = [(first, "Called per protocol; participant safe."), (second, "Follow-up call a day later: still safe.")]
    for headers, note in notes:
        reviewed = app_client.post(f"/api/v1/staff/studies/{slug}/safety-events/{event['id']}/review",
                                   headers=headers, json={"note": note})
        assert reviewed.status_code == 200, reviewed.text
        frozen_clock.advance(dt.timedelta(hours=20))
    body = reviewed.json()
    history = [(r["reviewed_by"], r["note"]) for r in body["reviews"]]
    assert history == [("r@example.org", notes[0][1]), ("a@example.org", notes[1][1])]
    assert (body["reviewed_by"], body["review_note"]) == ("a@example.org", notes[1][1])  # the newest, as before

    [listed] = _events(app_client, slug, first)
    assert listed["reviews"] == body["reviews"]
    assert listed["reviewed_at"] == listed["reviews"][1]["reviewed_at"]
    times = [dt.datetime.fromisoformat(r["reviewed_at"]) for r in listed["reviews"]]
    assert times[1] - times[0] == dt.timedelta(hours=20)
    assert _events(app_client, slug, first, unreviewed=True) == []
    with engine.connect() as connection:
        audited = connection.execute(sa.text(
            "SELECT action FROM audit_log WHERE action LIKE 'safety_event%' ORDER BY seq")).scalars().all()
    assert audited == ["safety_events.read", "safety_event.reviewed", "safety_event.reviewed",
                       "safety_events.read", "safety_events.read"]


def test_reviews_cannot_be_edited_or_deleted_and_stay_with_the_de_identified_record(
    engine: Engine, app_client: TestClient, escalated: tuple[str, ParticipantHandle],
) -> None:
    slug, who = escalated
    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    [event] = _events(app_client, slug, staff)
    assert app_client.post(f"/api/v1/staff/studies/{slug}/safety-events/{event['id']}/review", headers=staff,
                           json={"note": "Called per protocol."}).status_code == 200
    for statement in ("UPDATE safety_event_reviews SET note = 'nothing happened'", "DELETE FROM safety_event_reviews"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(sa.text(statement))

    withdrawn = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                                json={"level": "delete_data", "confirm": True})
    assert withdrawn.status_code == 200, withdrawn.text
    assert withdrawn.json()["deleted_rows"]["safety_events"] == 0  # de-identified, not deleted
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT note FROM safety_event_reviews")).scalars().all() == [
            "Called per protocol."]
        assert connection.execute(sa.text("SELECT participant_id FROM safety_events")).scalars().all() == [None]
    for statement in ("UPDATE safety_event_reviews SET note = 'nothing happened'", "DELETE FROM safety_event_reviews"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(sa.text(statement))
