"""A safety record survives the participant's withdrawal with data deletion: de-identified (no
participant, conversation, turn or message text), still in the review queue and the study summary,
marked "participant withdrew and deleted data", with its staff reviews."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import zipfile
from typing import Any

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

CRISIS = "I want to kill myself"
MARKER = "participant withdrew and deleted data"


def _get(client: TestClient, path: str, headers: dict[str, str], **params: Any) -> Any:
    response = client.get(path, headers=headers, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _escalated(engine: Engine, client: TestClient, slug: str) -> ParticipantHandle:
    [invite] = make_invites(engine, slug)
    who = enroll_fully(client, invite)
    put_in_arm(engine, who.code, "wellbeing")
    conversation = start_chat(client, who, "concierge")
    # (not "I keep thinking about my job": the classifier reads that as the start of a disclosure,
    # score 0.20, and checks in; chat/crisis_data/READING.md, "What it misses")
    say(client, who, conversation, "Can you help me plan my week around two deadlines?")
    assert say(client, who, conversation, CRISIS)["stance"] == "escalate"
    return who


def _unzip(response: Any) -> dict[str, str]:
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as bundle:
        return {name.rsplit("/", 1)[-1]: bundle.read(name).decode() for name in bundle.namelist()}


def test_an_escalated_participant_who_deletes_their_data_leaves_a_de_identified_safety_record(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, example_protocol)
    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    who = _escalated(engine, app_client, slug)
    other = _escalated(engine, app_client, slug)  # stays in the study: untouched by the other's deletion
    events = f"/api/v1/staff/studies/{slug}/safety-events"
    before = {event["participant"]: event for event in _get(app_client, events, staff)}
    event = before[who.code]
    assert (event["cue"], event["participant_data_deleted"], event["marker"]) == ("i want to kill myself", False, None)
    reviewed = app_client.post(f"{events}/{event['id']}/review", headers=staff, json={"note": "Tried to call."})
    assert reviewed.status_code == 200, reviewed.text

    # Ten seconds after the escalation: withdraw, deleting the data.
    frozen_clock.advance(dt.timedelta(seconds=10))
    withdrawn = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                                json={"level": "delete_data", "confirm": True})
    assert withdrawn.status_code == 200, withdrawn.text
    assert withdrawn.json()["deleted_rows"]["turns"] == 4
    assert withdrawn.json()["deleted_rows"]["safety_events"] == 0  # none is theirs any more: de-identified first

    # The review queue: the record is there, marked, with its review and without anything that
    # would lead back to the participant or what they wrote.
    listed = _get(app_client, events, staff)
    [record] = [e for e in listed if e["id"] == event["id"]]
    assert record["participant"] is None
    assert record["conversation_id"] is None
    assert record["cue"] is None
    assert (record["participant_data_deleted"], record["marker"]) == (True, MARKER)
    assert (record["category"], record["source"], record["created_at"]) == (
        event["category"], event["source"], event["created_at"])
    assert [(r["reviewed_by"], r["note"]) for r in record["reviews"]] == [("r@example.org", "Tried to call.")]
    text = json.dumps(record)
    for trace in (who.code, CRISIS, "kill myself", "my job"):
        assert trace not in text
    # The other participant's event is as it was.
    [kept] = [e for e in listed if e["participant"] == other.code]
    assert (kept["cue"], kept["participant_data_deleted"]) == ("i want to kill myself", False)

    # A de-identified record can still be reviewed; the queue of unreviewed events shows it until then.
    unreviewed = _get(app_client, events, staff, unreviewed="true")
    assert {e["id"] for e in unreviewed} == {kept["id"]}
    assert app_client.post(f"{events}/{kept['id']}/review", headers=staff, json={"note": "Safe."}).status_code == 200

    # The summary counts it, marked.
    summary = _get(app_client, f"/api/v1/staff/studies/{slug}/summary", staff)
    assert (summary["safety_events_total"], summary["safety_events_unreviewed"],
            summary["safety_events_participant_deleted"], summary["safety_events_unreviewed_participant_deleted"]
            ) == (2, 0, 1, 0)

    # Its context (the turns around it) is gone, and says why.
    gone = app_client.get(f"{events}/{event['id']}", headers=staff)
    assert gone.status_code == 410, gone.text
    assert gone.json()["error"]["code"] == "participant_data_deleted"
    assert who.code not in gone.text

    # Nothing in the database links the record to the participant.
    with engine.connect() as connection:
        row = connection.execute(sa.text(
            "SELECT participant_id, conversation_id, turn_id, cue, participant_data_deleted FROM safety_events "
            "WHERE id = :id"), {"id": event["id"]}).one()
        remaining_turns = connection.execute(sa.text(
            "SELECT count(*) FROM turns t JOIN participants p ON p.id = t.participant_id WHERE p.code = :c"),
            {"c": who.code}).scalar_one()
    assert tuple(row[:4]) == (None, None, None, None)
    assert bool(row[4]) is True
    assert remaining_turns == 0


def test_a_record_of_a_participant_who_deleted_their_data_unreviewed_in_the_summary_and_exports(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.ADMIN, 'a@example.org')}"}
    who = _escalated(engine, app_client, slug)
    assert app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                           json={"level": "delete_data", "confirm": True}).status_code == 200

    [record] = _get(app_client, f"/api/v1/staff/studies/{slug}/safety-events", staff, unreviewed="true")
    assert (record["participant"], record["marker"]) == (None, MARKER)
    summary = _get(app_client, f"/api/v1/staff/studies/{slug}/summary", staff)
    assert (summary["safety_events_unreviewed"], summary["safety_events_unreviewed_participant_deleted"]) == (1, 1)

    # The exports keep the record without a participant (dates shifted or not), and nothing else of theirs.
    for shift in ("false", "true"):
        files = _unzip(app_client.get(f"/api/v1/staff/studies/{slug}/exports", headers=staff,
                                      params={"format": "csv", "turns": "true", "shift_dates": shift}))
        [row] = list(csv.DictReader(io.StringIO(files["safety_events.csv"])))
        assert (row["participant_code"], row["conversation_id"], row["turn_id"]) == ("", "", "")
        assert (row["category"], row["review_status"], row["participant_data_deleted"]) == (
            "risk_to_self", "unreviewed", "true")
        assert bool(row["created_at"]) is (shift == "false")  # a shifted export cannot shift it with anyone's
        assert list(csv.DictReader(io.StringIO(files["turns.csv"]))) == []
        # The participant's code stays only where the consent and withdrawal record is (kept by design).
        assert {name for name, text in files.items() if who.code in text} <= {"participants.csv", "consents.csv"}
        assert all("kill myself" not in text for text in files.values())
    aggregates = _unzip(app_client.get(f"/api/v1/staff/studies/{slug}/exports", headers=staff,
                                       params={"format": "aggregates"}))
    rows = {row["month"]: row for row in csv.DictReader(io.StringIO(aggregates["safety_events.csv"]))}
    assert rows["all"]["total"] == "< 5"  # counted, and suppressed like any count under 5 participants
    # The transcripts listing has nothing of theirs and does not trip over the record.
    page = _get(app_client, f"/api/v1/staff/studies/{slug}/conversations", staff)
    assert page["total"] == 0

    # Reviewed after the deletion: the review is kept, and its audit entry names no participant.
    reviewed = app_client.post(f"/api/v1/staff/studies/{slug}/safety-events/{record['id']}/review", headers=staff,
                               json={"note": "Participant unreachable after deleting their data; noted."})
    assert reviewed.status_code == 200, reviewed.text
    assert (reviewed.json()["participant"], reviewed.json()["marker"], len(reviewed.json()["reviews"])) == (
        None, MARKER, 1)
    summary = _get(app_client, f"/api/v1/staff/studies/{slug}/summary", staff)
    assert (summary["safety_events_unreviewed"], summary["safety_events_participant_deleted"]) == (0, 1)
    with engine.connect() as connection:
        audited = connection.execute(sa.text(
            "SELECT participant_code FROM audit_log WHERE action = 'safety_event.reviewed'")).scalars().all()
    assert audited == [None]
