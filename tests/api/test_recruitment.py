"""Recruitment control through the staff API: invites and their use, revoking, and pausing,
resuming, closing and archiving a study; what participants see when enrollment is refused."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler import planner
from scheduler.channels import InAppChannel
from scheduler.dispatcher import Dispatcher
from study import studies
from study.clock import now
from study.db import session_scope
from study.errors import Conflict
from study.models import Participant, StaffRole
from study.settings import Settings
from tests.builders import TEST_ACTOR, enroll, enroll_fully, load_study, make_invites, make_staff

RESEARCHER = "researcher@example.org"


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _staff(engine: Engine, slug: str, role: StaffRole = StaffRole.RESEARCHER,
           email: str = RESEARCHER) -> dict[str, str]:
    return _headers(make_staff(engine, slug, role, email))


def _audit(engine: Engine, prefix: str) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT actor, action, detail FROM audit_log WHERE action LIKE :p ORDER BY seq"), {"p": prefix + "%"})
        return [{"actor": actor, "action": action, "detail": detail if isinstance(detail, dict) else json.loads(detail)}
                for actor, action, detail in rows]


def _followup_statuses(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return sorted(connection.execute(sa.text("SELECT status FROM followups")).scalars())


def _join_page(client: TestClient, invite: str) -> Any:
    landing = client.get("/")
    pre = re.search(r'name="pre" value="([^"]+)"', landing.text)
    assert pre
    return client.post("/join", data={"pre": pre.group(1), "invite_code": invite}, follow_redirects=False)


def test_invites_list_shows_use_and_revoked_invites_are_refused(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    staff = _staff(engine, slug)
    created = app_client.post(f"/api/v1/staff/studies/{slug}/invites", headers=staff,
                              json={"count": 3, "label": "wave 1"})
    assert created.status_code == 201, created.text
    first, second, third = created.json()["codes"]
    who = enroll_fully(app_client, first, email="private@example.org")

    listed = app_client.get(f"/api/v1/staff/studies/{slug}/invites", headers=staff)
    assert listed.status_code == 200, listed.text
    invites = listed.json()
    assert [i["status"] for i in invites] == ["used", "unused", "unused"]
    assert all(i["label"] == "wave 1" and i["created_at"] for i in invites)
    assert invites[0]["use_count"] == 1
    assert [u["participant_code"] for u in invites[0]["uses"]] == [who.code]
    assert invites[0]["uses"][0]["at"]
    assert "private@example.org" not in listed.text  # never contact details
    used = app_client.get(f"/api/v1/staff/studies/{slug}/invites", headers=staff, params={"status": "used"}).json()
    assert [i["id"] for i in used] == [invites[0]["id"]]
    bogus = app_client.get(f"/api/v1/staff/studies/{slug}/invites", headers=staff, params={"status": "bogus"})
    assert bogus.status_code == 422
    assert bogus.json()["error"]["fields"][0]["field"] == "status"

    by_code = app_client.post(f"/api/v1/staff/studies/{slug}/invites/revoke", headers=staff, json={"code": second})
    assert by_code.status_code == 200, by_code.text
    assert by_code.json()["status"] == "revoked"
    assert by_code.json()["revoked_at"]
    by_id = app_client.post(f"/api/v1/staff/studies/{slug}/invites/revoke", headers=staff,
                            json={"invite_id": invites[2]["id"]})
    assert by_id.json()["status"] == "revoked"
    again = app_client.post(f"/api/v1/staff/studies/{slug}/invites/revoke", headers=staff, json={"code": second})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "invite_already_revoked"
    both = app_client.post(f"/api/v1/staff/studies/{slug}/invites/revoke", headers=staff,
                           json={"code": second, "invite_id": 1})
    assert both.status_code == 422
    unknown = app_client.post(f"/api/v1/staff/studies/{slug}/invites/revoke", headers=staff,
                              json={"code": "ZZZZ-ZZZZ-ZZZZ"})
    assert unknown.status_code == 404
    revoked = app_client.get(f"/api/v1/staff/studies/{slug}/invites", headers=staff, params={"status": "revoked"})
    assert len(revoked.json()) == 2

    refused = app_client.post("/api/v1/enrollment", json={"invite_code": second})
    assert refused.status_code == 410
    assert refused.json()["error"]["code"] == "invite_revoked"
    page = _join_page(app_client, third)
    assert 400 <= page.status_code < 500
    assert "withdrawn by the study team" in page.text

    revokes = _audit(engine, "invite.revoked")
    assert [(e["actor"], e["detail"]["invite_id"]) for e in revokes] == [
        (RESEARCHER, invites[1]["id"]), (RESEARCHER, invites[2]["id"])]
    assert [e["detail"]["count"] for e in _audit(engine, "invites.listed")] == [3, 1, 2]


def test_viewers_cannot_list_revoke_or_change_status(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    viewer = _staff(engine, slug, StaffRole.VIEWER, "viewer@example.org")
    [code] = make_invites(engine, slug)
    assert app_client.get(f"/api/v1/staff/studies/{slug}/invites", headers=viewer).status_code == 403
    revoke = app_client.post(f"/api/v1/staff/studies/{slug}/invites/revoke", headers=viewer, json={"code": code})
    assert revoke.status_code == 403
    pause = app_client.post(f"/api/v1/staff/studies/{slug}/pause", headers=viewer)
    assert pause.status_code == 403
    assert pause.json()["error"]["code"] == "recruitment_forbidden"
    assert app_client.post(f"/api/v1/staff/studies/{slug}/pause").status_code == 401
    other = _staff(engine, load_study(engine, example_protocol.replace("id: wellbeing-pilot", "id: other-study")),
                   email="elsewhere@example.org")
    assert app_client.post(f"/api/v1/staff/studies/{slug}/pause", headers=other).status_code == 403
    assert {e["action"] for e in _audit(engine, "study.")} == {"study.created"}
    assert [e["action"] for e in _audit(engine, "invite")] == ["invites.created"]


def test_pause_refuses_new_enrollment_and_resume_reopens(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    staff = _staff(engine, slug)
    first, second = make_invites(engine, slug, count=2)
    who = enroll_fully(app_client, first)

    paused = app_client.post(f"/api/v1/staff/studies/{slug}/pause", headers=staff)
    assert paused.status_code == 200, paused.text
    assert paused.json()["status"] == "paused"
    assert paused.json()["status_changed_at"]
    refused = app_client.post("/api/v1/enrollment", json={"invite_code": second})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "enrollment_paused"
    assert "not taking new participants at the moment" in refused.json()["error"]["message"]
    page = _join_page(app_client, second)
    assert 400 <= page.status_code < 500
    assert "not taking new participants at the moment" in page.text
    assert app_client.get("/api/v1/me", headers=who.headers).status_code == 200  # the enrolled go on

    again = app_client.post(f"/api/v1/staff/studies/{slug}/pause", headers=staff)
    assert again.status_code == 409
    assert again.json()["error"] == {"code": "invalid_transition", "message": f"study '{slug}' is already paused"}
    archive = app_client.post(f"/api/v1/staff/studies/{slug}/archive", headers=staff)
    assert archive.status_code == 409
    assert "only a closed study can be archived" in archive.json()["error"]["message"]

    resumed = app_client.post(f"/api/v1/staff/studies/{slug}/resume", headers=staff)
    assert resumed.json()["status"] == "open"
    enroll(app_client, second)
    assert app_client.post(f"/api/v1/staff/studies/{slug}/resume", headers=staff).status_code == 409
    assert [(e["actor"], e["action"], e["detail"]["from_status"], e["detail"]["to_status"])
            for e in _audit(engine, "study.") if e["action"] != "study.created"] == [
        (RESEARCHER, "study.paused", "open", "paused"), (RESEARCHER, "study.resumed", "paused", "open")]


def test_close_keeps_followups_then_stop_and_archive(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    staff = _staff(engine, slug)
    first, second = make_invites(engine, slug, count=2)
    enroll_fully(app_client, first)
    assert _followup_statuses(engine) == ["planned", "planned"]

    closed = app_client.post(f"/api/v1/staff/studies/{slug}/close", headers=staff)
    assert closed.status_code == 200, closed.text
    assert closed.json() | {"status_changed_at": None} == {
        "study": slug, "status": "closed", "status_changed_at": None, "followups_stopped_at": None,
        "followups_cancelled": 0}
    assert _followup_statuses(engine) == ["planned", "planned"]  # enrolled participants go on
    refused = app_client.post("/api/v1/enrollment", json={"invite_code": second})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "enrollment_closed"
    assert "recruitment has ended" in _join_page(app_client, second).text
    resume = app_client.post(f"/api/v1/staff/studies/{slug}/resume", headers=staff)
    assert resume.status_code == 409
    assert "a closed study cannot take new participants again" in resume.json()["error"]["message"]
    new_invites = app_client.post(f"/api/v1/staff/studies/{slug}/invites", headers=staff, json={"count": 1})
    assert new_invites.status_code == 409
    assert new_invites.json()["error"]["code"] == "study_closed"
    pending = app_client.post(f"/api/v1/staff/studies/{slug}/archive", headers=staff)
    assert pending.status_code == 409
    assert pending.json()["error"]["code"] == "followups_pending"
    assert f"afterward study close {slug} --stop-followups" in pending.json()["error"]["message"]

    stopped = app_client.post(f"/api/v1/staff/studies/{slug}/close", headers=staff, json={"stop_followups": True})
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["followups_cancelled"] == 2
    assert stopped.json()["followups_stopped_at"]
    assert _followup_statuses(engine) == ["cancelled", "cancelled"]
    twice = app_client.post(f"/api/v1/staff/studies/{slug}/close", headers=staff, json={"stop_followups": True})
    assert twice.status_code == 409

    archived = app_client.post(f"/api/v1/staff/studies/{slug}/archive", headers=staff)
    assert archived.status_code == 200, archived.text
    assert archived.json()["status"] == "archived"
    assert app_client.get("/api/v1/staff/studies", headers=staff).json() == []
    listed = app_client.get("/api/v1/staff/studies", headers=staff, params={"include_archived": True}).json()
    assert [(s["study"], s["status"]) for s in listed] == [(slug, "archived")]
    # Read-only: no status change, no invite change, no new protocol version.
    for action in ("pause", "resume", "close", "archive"):
        refused_change = app_client.post(f"/api/v1/staff/studies/{slug}/{action}", headers=staff)
        assert refused_change.status_code == 409
        assert "archived and read-only" in refused_change.json()["error"]["message"]
    revoke = app_client.post(f"/api/v1/staff/studies/{slug}/invites/revoke", headers=staff, json={"code": second})
    assert revoke.json()["error"]["code"] == "study_archived"
    assert app_client.post(f"/api/v1/staff/studies/{slug}/invites", headers=staff, json={}).status_code == 409
    with session_scope(engine) as session, pytest.raises(Conflict, match="archived and read-only") as refusal:
        studies.load_protocol(session, example_protocol.replace("weight: 1", "weight: 2", 1), TEST_ACTOR)
    assert refusal.value.code == "study_archived"
    assert app_client.get(f"/api/v1/staff/studies/{slug}/invites", headers=staff).status_code == 200  # reads go on

    changes = [(e["action"], e["detail"]["stop_followups"], e["detail"]["followups_cancelled"])
               for e in _audit(engine, "study.") if e["action"] != "study.created"]
    assert changes == [("study.closed", False, 0), ("study.followups_stopped", True, 2),
                       ("study.archived", False, 0)]


def test_close_with_stop_followups_cancels_what_is_pending_and_plans_nothing_more(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol.replace("channels: [email, in_app]", "channels: [in_app]"))
    staff = _staff(engine, slug)
    first, second = make_invites(engine, slug, count=2)
    who = enroll_fully(app_client, first, email=None)
    enroll_fully(app_client, second, email=None)
    with engine.connect() as connection:
        opened_id = connection.execute(sa.text(
            "SELECT f.id FROM followups f JOIN participants p ON p.id = f.participant_id "
            "WHERE p.code = :c AND f.followup_key = 'perma-week-1'"), {"c": who.code}).scalar_one()
    report = Dispatcher(engine, Settings(), name="test", channels={"in_app": InAppChannel()}).send_now(opened_id)
    assert report.opened == 1
    assert _followup_statuses(engine) == ["planned", "planned", "planned", "sent"]

    closed = app_client.post(f"/api/v1/staff/studies/{slug}/close", headers=staff, json={"stop_followups": True})
    assert closed.status_code == 200, closed.text
    assert closed.json()["followups_cancelled"] == 4
    assert _followup_statuses(engine) == ["cancelled"] * 4
    with engine.connect() as connection:
        assignment = connection.execute(sa.text(
            "SELECT a.status FROM survey_assignments a JOIN followups f ON f.assignment_id = a.id "
            "WHERE f.id = :f"), {"f": opened_id}).scalar_one()
        deliveries = set(connection.execute(sa.text(
            "SELECT status FROM deliveries WHERE followup_id = :f AND status <> 'sent'"), {"f": opened_id}).scalars())
        reasons = set(connection.execute(sa.text("SELECT end_reason FROM followups")).scalars())
    assert assignment == "cancelled"
    assert deliveries <= {"cancelled"}
    assert reasons == {"the study's follow-ups were stopped"}
    assert app_client.get("/api/v1/me/surveys", headers=who.headers).status_code == 200

    # A decision reported afterwards plans no follow-up.
    with session_scope(engine) as session:
        participant = session.scalars(sa.select(Participant).where(Participant.code == who.code)).one()
        assert planner.on_decision(session, participant, 1, now(), "move") == 0
    [entry] = _audit(engine, "study.closed")
    assert entry["actor"] == RESEARCHER
    assert entry["detail"] == {"from_status": "open", "to_status": "closed", "stop_followups": True,
                               "followups_cancelled": 4}
