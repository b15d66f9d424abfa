from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from analysis import archive, transcripts
from chat import staff as chat_staff
from scheduler import staff as scheduler_staff
from scheduler.schemas import SchedulePreviewQuery
from study import audit
from study import reads as study_reads
from study.db import session_scope
from study.errors import Forbidden
from study.models import StaffRole
from surveys import staff as surveys_staff
from tests.builders import (
    CONFIRMATIONS,
    ParticipantHandle,
    assign_survey,
    enroll,
    enroll_fully,
    load_study,
    make_invites,
    make_staff,
    put_in_arm,
    say,
    start_chat,
)

# Every participant endpoint, with a request body that would succeed for its owner. A new
# endpoint under /api/v1/me fails test_every_participant_endpoint_is_checked until added here.
PARTICIPANT_CALLS: dict[tuple[str, str], dict | None] = {
    ("GET", "/api/v1/me"): None,
    ("GET", "/api/v1/me/consent"): None,
    ("POST", "/api/v1/me/consent"): {"version": "1.2", "confirmations": CONFIRMATIONS, "typed_signature": "B"},
    ("GET", "/api/v1/me/consent/signed"): None,
    ("PUT", "/api/v1/me/profile"): {"timezone": "Asia/Tokyo"},
    ("PUT", "/api/v1/me/language"): {"language": "en"},
    ("GET", "/api/v1/me/surveys"): None,
    ("GET", "/api/v1/me/surveys/{assignment_id}"): None,
    ("PUT", "/api/v1/me/surveys/{assignment_id}/answers"): {"answers": {"progress": 4}},
    ("POST", "/api/v1/me/surveys/{assignment_id}/submit"): {"answers": {"progress": 4}, "submission_id": "bob-00001"},
    ("GET", "/api/v1/me/chat/roles"): None,
    ("GET", "/api/v1/me/crisis-resources"): None,
    ("POST", "/api/v1/me/conversations"): {"role": "coach"},
    ("GET", "/api/v1/me/conversations"): None,
    ("GET", "/api/v1/me/conversations/{conversation_id}"): None,
    ("PUT", "/api/v1/me/conversations/{conversation_id}/role"): {"role": "coach"},
    ("POST", "/api/v1/me/conversations/{conversation_id}/messages"): {"content": "Hello"},
    ("POST", "/api/v1/me/conversations/{conversation_id}/retry"): None,
    ("POST", "/api/v1/me/conversations/{conversation_id}/turns/{turn_id}/override"): None,
    ("POST", "/api/v1/me/conversations/{conversation_id}/turns/{turn_id}/reconsider"): None,
    ("POST", "/api/v1/me/conversations/{conversation_id}/check-ins/{check_in_id}/answers"): {
        "answers": {"wish_dead": "no"}},
    ("POST", "/api/v1/me/conversations/{conversation_id}/end"): {"rating": 5, "made_decision": False},
    ("GET", "/api/v1/me/followups"): None,
    ("POST", "/api/v1/me/return-code"): None,
    ("POST", "/api/v1/me/withdrawal"): {"level": "stop_contact", "confirm": True},
}
# The owner's own call may rightly be refused for reasons other than ownership.
OWNER_CONFLICTS = {("POST", "/api/v1/me/conversations/{conversation_id}/retry"): "nothing_to_retry"}


def _chat_with_two_challenges(client: TestClient, engine: Engine, who: ParticipantHandle) -> dict[str, int]:
    """Two challenges, each the latest pushback of its own conversation (only the latest can be
    answered): turn_ids holds (conversation, turn) pairs."""
    put_in_arm(engine, who.code, "wellbeing")
    pairs = []
    for framing in ("Nobody ever listens to me, so I'll stop talking in meetings",
                    "He obviously hates me, so I will avoid him"):
        conversation = start_chat(client, who, "coach")
        pairs.append((conversation, say(client, who, conversation, framing)["id"]))
    checking_in = start_chat(client, who, "concierge")  # and a safety check-in, in a conversation of its own
    check_in = say(client, who, checking_in, "I feel hopeless, like I'm falling apart")["check_in"]["id"]
    return {"conversation_id": pairs[0][0], "turn_ids": pairs,
            "check_in_conversation": checking_in, "check_in_id": check_in}


def test_every_participant_endpoint_is_checked(app_client: TestClient) -> None:
    paths = app_client.get("/openapi.json").json()["paths"]
    routes = {(method.upper(), path) for path, operations in paths.items()
              if path.startswith("/api/v1/me") for method in operations}
    assert routes == set(PARTICIPANT_CALLS)


def test_a_participant_never_sees_or_changes_another_participants_data(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite_a, invite_b] = make_invites(engine, load_study(engine, example_protocol), count=2)
    alice = enroll_fully(app_client, invite_a, email="alice@example.org", timezone="Europe/Berlin")
    bob = enroll_fully(app_client, invite_b, email="bob@example.org", timezone="America/Chicago")
    alices = {"assignment_id": assign_survey(engine, alice.code, "goal-progress"),
              **_chat_with_two_challenges(app_client, engine, alice)}
    bobs = {"assignment_id": assign_survey(engine, bob.code, "goal-progress"),
            **_chat_with_two_challenges(app_client, engine, bob)}
    bobs_turns = list(bobs.pop("turn_ids"))  # type: ignore[call-overload]
    alices_turns = list(alices.pop("turn_ids"))  # type: ignore[call-overload]
    for (method, template), body in PARTICIPANT_CALLS.items():
        path = template
        if "{check_in_id}" in template:
            stolen = app_client.request(method, template.format(
                conversation_id=alices["check_in_conversation"], check_in_id=alices["check_in_id"]),
                headers=bob.headers, json=body)
            assert stolen.status_code == 404, (method, template, stolen.text)
            path = template.format(conversation_id=bobs["check_in_conversation"], check_in_id=bobs["check_in_id"])
        elif "{" in template:
            theirs, their_turn = alices_turns[0]
            stolen = app_client.request(method, template.format(**{**alices, "conversation_id": theirs},
                                                                turn_id=their_turn), headers=bob.headers, json=body)
            assert stolen.status_code == 404, (method, template, stolen.text)
            mine, my_turn = bobs_turns[0] if "{turn_id}" in template else (bobs["conversation_id"], 0)
            path = template.format(**{**bobs, "conversation_id": mine}, turn_id=my_turn)
            if "{turn_id}" in template:
                bobs_turns.pop(0)  # each pushback can be answered once
        response = app_client.request(method, path, headers=bob.headers, json=body)
        if (method, template) in OWNER_CONFLICTS:
            assert response.json()["error"]["code"] == OWNER_CONFLICTS[(method, template)], response.text
        else:
            assert response.status_code < 400, (method, path, response.text)
        assert alice.code not in response.text, (method, path)
        assert "Europe/Berlin" not in response.text, (method, path)
    # Bob's calls changed only Bob.
    alice_now = app_client.get("/api/v1/me", headers=alice.headers).json()
    assert (alice_now["status"], alice_now["timezone"]) == ("enrolled", "Europe/Berlin")
    alices_now = app_client.get(f"/api/v1/me/surveys/{alices['assignment_id']}", headers=alice.headers).json()
    assert (alices_now["status"], alices_now["saved_answers"]) == ("open", {})
    with engine.connect() as connection:
        signers = connection.execute(sa.text(
            "SELECT p.code, count(*) FROM consent_signatures s JOIN participants p ON p.id = s.participant_id "
            "GROUP BY p.code")).all()
    assert dict(signers) == {alice.code: 1, bob.code: 2}
    alices_chat = app_client.get(f"/api/v1/me/conversations/{alices['conversation_id']}", headers=alice.headers).json()
    assert (alices_chat["status"], alices_chat["role"], len(alices_chat["turns"])) == ("active", "coach", 2)
    assert all(turn["response"] is None for turn in alices_chat["turns"])


def test_cookie_sessions_need_the_csrf_token_for_changes(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    enrolled = app_client.post("/api/v1/enrollment", json={"invite_code": invite}).json()
    consent = {"version": "1.2", "confirmations": CONFIRMATIONS, "typed_signature": "C"}
    assert app_client.get("/api/v1/me").status_code == 200  # the cookie alone reads
    forged = app_client.post("/api/v1/me/consent", json=consent)
    assert forged.status_code == 403
    assert "reload the page" in forged.json()["error"]["message"]
    wrong = app_client.post("/api/v1/me/consent", json=consent, headers={"X-CSRF-Token": "0" * 64})
    assert wrong.status_code == 403
    ok = app_client.post("/api/v1/me/consent", json=consent, headers={"X-CSRF-Token": enrolled["csrf_token"]})
    assert ok.status_code == 201


def test_unknown_or_missing_credentials_are_401(app_client: TestClient) -> None:
    assert app_client.get("/api/v1/me", headers={"Authorization": "Bearer nonsense"}).status_code == 401
    assert app_client.get("/api/v1/staff/studies").status_code == 401


def test_viewer_sees_aggregates_only_and_researcher_reads_are_audited(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug = load_study(engine, example_protocol)
    invites = make_invites(engine, slug, count=3)
    for invite in invites[:2]:
        enroll_fully(app_client, invite, email="private@example.org")
    enroll(app_client, invites[2])
    viewer = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    researcher = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}

    summary = app_client.get(f"/api/v1/staff/studies/{slug}/summary", headers=viewer)
    assert summary.status_code == 200
    # A viewer sees counts under 5 suppressed (of the participants assigned to an arm, as the aggregate
    # tables count them); a researcher sees them.
    assert summary.json()["participants_by_status"] == {"enrolled": "< 5", "withdrawn": "< 5"}
    plain = app_client.get(f"/api/v1/staff/studies/{slug}/summary", headers=researcher).json()
    assert plain["participants_by_status"] == {"enrolled": 2, "invited": 1}
    for method, path in (("GET", f"/api/v1/staff/studies/{slug}/participants"),
                         ("POST", f"/api/v1/staff/studies/{slug}/invites")):
        denied = app_client.request(method, path, headers=viewer, json={"count": 1})
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "participant_data_forbidden"

    listed = app_client.get(f"/api/v1/staff/studies/{slug}/participants", headers=researcher)
    assert listed.status_code == 200
    assert len(listed.json()) == 3
    assert "private@example.org" not in listed.text
    assert "contact" not in listed.text
    assert {p["consent_version"] for p in listed.json()} == {"1.2", None}
    with engine.connect() as connection:
        entry = connection.execute(sa.text(
            "SELECT actor, detail FROM audit_log WHERE action = 'participants.listed'")).one()
    assert entry.actor == "r@example.org"

    assert app_client.get("/api/v1/staff/studies/other-study/summary", headers=researcher).status_code == 403


# Every staff endpoint of one study: whether a viewer may call it (aggregates only) and a body
# that would succeed for a researcher. A new endpoint under /api/v1/staff/studies fails
# test_every_staff_study_endpoint_is_checked until added here.
STAFF_STUDY_CALLS: dict[tuple[str, str], tuple[bool, dict | None]] = {
    ("GET", "/api/v1/staff/studies/{slug}/summary"): (True, None),
    ("GET", "/api/v1/staff/studies/{slug}/participants"): (False, None),
    ("POST", "/api/v1/staff/studies/{slug}/invites"): (False, {"count": 1}),
    ("GET", "/api/v1/staff/studies/{slug}/responses"): (False, None),
    ("GET", "/api/v1/staff/studies/{slug}/followups"): (False, None),
    ("GET", "/api/v1/staff/studies/{slug}/followups/preview"): (False, None),
    ("GET", "/api/v1/staff/studies/{slug}/safety-events"): (False, None),
    ("GET", "/api/v1/staff/studies/{slug}/safety-events/{event_id}"): (False, None),
    ("POST", "/api/v1/staff/studies/{slug}/safety-events/{event_id}/review"): (False, {"note": "Called."}),
    ("GET", "/api/v1/staff/studies/{slug}/conversations"): (False, None),
    ("GET", "/api/v1/staff/studies/{slug}/conversations/{conversation_id}"): (False, None),
    ("GET", "/api/v1/staff/studies/{slug}/exports"): (False, None),
    # Recruitment control last, in this order: each succeeds from the state the one before left.
    ("GET", "/api/v1/staff/studies/{slug}/invites"): (False, None),
    ("POST", "/api/v1/staff/studies/{slug}/invites/revoke"): (False, {"invite_id": 1}),
    ("POST", "/api/v1/staff/studies/{slug}/pause"): (False, None),
    ("POST", "/api/v1/staff/studies/{slug}/resume"): (False, None),
    ("POST", "/api/v1/staff/studies/{slug}/close"): (False, {"stop_followups": True}),
    ("POST", "/api/v1/staff/studies/{slug}/archive"): (False, None),
}
# Endpoints that refuse a viewer for another reason than participant-level data.
VIEWER_REFUSALS = {("POST", f"/api/v1/staff/studies/{{slug}}/{action}"): "recruitment_forbidden"
                   for action in ("invites/revoke", "pause", "resume", "close", "archive")}
# Endpoints whose rule depends on a query parameter: what a viewer may still ask for there.
VIEWER_QUERIES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/api/v1/staff/studies/{slug}/exports"): {"format": "aggregates"},  # suppressed tables
}
# Query parameters an endpoint needs before it can answer at all.
REQUIRED_QUERIES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/api/v1/staff/studies/{slug}/followups/preview"): {"enrolled_at": "2026-03-28T09:00",
                                                                 "timezone": "Europe/London"},
}


def test_every_staff_study_endpoint_is_checked(app_client: TestClient) -> None:
    paths = app_client.get("/openapi.json").json()["paths"]
    routes = {(method.upper(), path) for path, operations in paths.items()
              if path.startswith("/api/v1/staff/studies/{slug}") for method in operations}
    assert routes == set(STAFF_STUDY_CALLS)


def staff_entries(engine: Engine) -> int:
    with engine.connect() as connection:
        query = sa.text("SELECT count(*) FROM audit_log WHERE actor_type = 'staff'")
        return int(connection.execute(query).scalar_one())


def _two_studies_and_an_escalation(engine: Engine, app_client: TestClient,
                                   example_protocol: str) -> tuple[str, str, ParticipantHandle, int, int]:
    """A study with one participant whose conversation escalated, and another study: (slug, the
    other's slug, the participant, the conversation's id, the safety event's id)."""
    slug = load_study(engine, example_protocol)
    other = load_study(engine, example_protocol.replace("id: wellbeing-pilot", "id: other-study", 1))
    [invite] = make_invites(engine, slug)
    who = enroll_fully(app_client, invite, email="private@example.org")
    put_in_arm(engine, who.code, "wellbeing")
    conversation = start_chat(app_client, who, "concierge")
    assert say(app_client, who, conversation, "I want to kill myself")["stance"] == "escalate"
    with engine.connect() as connection:
        event_id = connection.execute(sa.text("SELECT id FROM safety_events")).scalar_one()
    return slug, other, who, conversation, event_id


def test_staff_study_endpoints_refuse_viewers_and_staff_of_other_studies(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    slug, other, who, conversation, event_id = _two_studies_and_an_escalation(engine, app_client, example_protocol)
    ids = {"slug": slug, "event_id": event_id, "conversation_id": conversation}
    viewer = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    outsider = {"Authorization": f"Bearer {make_staff(engine, other, StaffRole.ADMIN, 'o@example.org')}"}
    researcher = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    for (method, template), (viewers_too, body) in STAFF_STUDY_CALLS.items():
        path = template.format(**ids)
        foreign = app_client.request(method, path, headers=outsider, json=body)
        assert (foreign.status_code, foreign.json()["error"]["code"]) == (403, "no_study_access"), path
        as_viewer = app_client.request(method, path, headers=viewer, json=body)
        if viewers_too:
            assert as_viewer.status_code == 200, (path, as_viewer.text)
        else:
            assert (as_viewer.status_code, as_viewer.json()["error"]["code"]) == (
                403, VIEWER_REFUSALS.get((method, template), "participant_data_forbidden")), path
        assert who.code not in as_viewer.text, path
        if (method, template) in VIEWER_QUERIES:
            query = VIEWER_QUERIES[(method, template)]
            assert "aggregates" in as_viewer.json()["error"]["message"], path
            foreign = app_client.request(method, path, headers=outsider, params=query)
            assert (foreign.status_code, foreign.json()["error"]["code"]) == (403, "no_study_access"), path
            assert app_client.request(method, path, headers=viewer, params=query).status_code == 200, path
        entries_before = staff_entries(engine)
        allowed = app_client.request(method, path, headers=researcher, json=body,
                                     params=REQUIRED_QUERIES.get((method, template)))
        assert allowed.status_code < 400, (path, allowed.text)
        if not viewers_too:  # participant-level: every call leaves an audit entry
            assert staff_entries(engine) > entries_before, path
        assert "private@example.org" not in allowed.text, path
    with engine.connect() as connection:
        readers = {(actor, action) for actor, action in connection.execute(sa.text(
            "SELECT actor, action FROM audit_log WHERE actor_type = 'staff'"))}
    # Refused calls leave no trace of a read; the viewer's one entry is the aggregates export.
    assert {actor for actor, _ in readers} == {"r@example.org", "v@example.org"}
    assert {action for actor, action in readers if actor == "v@example.org"} == {"study.export"}


def test_staff_login_is_rate_limited(engine: Engine, app_client: TestClient, example_protocol: str) -> None:
    make_staff(engine, load_study(engine, example_protocol), StaffRole.ADMIN, "a@example.org")
    good = {"email": "a@example.org", "password": "correct horse battery"}
    token = app_client.post("/api/v1/staff/login", json=good).json()["token"]
    mine = app_client.get("/api/v1/staff/studies", headers={"Authorization": f"Bearer {token}"}).json()
    assert mine[0]["role"] == "admin"
    for _ in range(5):
        assert app_client.post("/api/v1/staff/login", json={**good, "password": "guess"}).status_code == 403
    limited = app_client.post("/api/v1/staff/login", json=good)
    assert limited.status_code == 429
    assert int(limited.headers["Retry-After"]) > 0
    assert limited.json()["error"]["code"] == "too_many_attempts"


# The audited staff reads (and the review), as the staff API and the dashboard call them: each
# checks the actor's role in the study and writes its audit entry itself. A new public function of
# a read-service module fails test_every_staff_read_service_is_checked until added here (or, when
# it reads no participant-level data of a study, to NOT_STUDY_READS with the reason).
READ_SERVICES = [chat_staff, transcripts, study_reads, surveys_staff, scheduler_staff, archive]
StaffRead = Callable[[Engine, audit.Actor, dict[str, Any]], object]


def _unit(read: Callable[..., object], *args: Any, **kwargs: Any) -> StaffRead:
    """``read(session, actor, study_id, *args)`` in a committed unit of its own."""
    def run(engine: Engine, actor: audit.Actor, ids: dict[str, Any]) -> object:
        with session_scope(engine) as session:
            named = [ids[a] if isinstance(a, str) and a in ids else a for a in args]
            return read(session, actor, ids["study_id"], *named, **kwargs)
    return run


STAFF_READS: dict[Callable[..., object], StaffRead] = {
    chat_staff.safety_events: _unit(chat_staff.safety_events),
    chat_staff.review_safety_event: _unit(chat_staff.review_safety_event, "event_id", "Called."),
    transcripts.list_conversations: _unit(transcripts.list_conversations, transcripts.ConversationFilters(),
                                          limit=10),
    transcripts.get_transcript: _unit(transcripts.get_transcript, "conversation_id"),
    transcripts.safety_event_context: _unit(transcripts.safety_event_context, "event_id"),
    study_reads.participants: _unit(study_reads.participants),
    surveys_staff.responses: _unit(surveys_staff.responses),
    scheduler_staff.followups: _unit(scheduler_staff.followups),
    scheduler_staff.preview: _unit(scheduler_staff.preview, SchedulePreviewQuery(
        enrolled_at="2026-03-28T09:00", timezone="Europe/London")),
    archive.export_archive: lambda engine, actor, ids: archive.export_archive(
        engine, actor, ids["study_id"], ids["folder"], "csv"),
}
NOT_STUDY_READS = {
    scheduler_staff.channel_alerts: "delivery channels serve every study and carry no participant data",
    scheduler_staff.resolve_alert: "a change to a channel alert (audited), open to researchers of any study",
}


def test_every_staff_read_service_is_checked() -> None:
    public = {function for module in READ_SERVICES for name, function in inspect.getmembers(module, inspect.isfunction)
              if function.__module__ == module.__name__ and not name.startswith("_")}
    assert public == set(STAFF_READS) | set(NOT_STUDY_READS)


def test_staff_reads_refuse_viewers_and_staff_of_other_studies_and_audit_every_read(
    engine: Engine, app_client: TestClient, example_protocol: str, tmp_path: Path,
) -> None:
    slug, other, _, conversation, event_id = _two_studies_and_an_escalation(engine, app_client, example_protocol)
    with engine.connect() as connection:
        study_id = connection.execute(sa.text("SELECT id FROM studies WHERE slug = :s"), {"s": slug}).scalar_one()
    make_staff(engine, slug, StaffRole.VIEWER, "v@example.org")
    make_staff(engine, other, StaffRole.ADMIN, "o@example.org")
    make_staff(engine, slug, StaffRole.RESEARCHER, "r@example.org")
    ids = {"study_id": study_id, "event_id": event_id, "conversation_id": conversation}
    refused = {"o@example.org": "no_study_access", "v@example.org": "participant_data_forbidden"}
    for number, (function, read) in enumerate(STAFF_READS.items()):
        ids["folder"] = tmp_path / str(number)
        ids["folder"].mkdir()
        for email, code in refused.items():
            entries_before = staff_entries(engine)
            with pytest.raises(Forbidden) as refusal:
                read(engine, audit.Actor("staff", email), ids)
            assert refusal.value.code == code, function.__qualname__
            assert staff_entries(engine) == entries_before, function.__qualname__
        entries_before = staff_entries(engine)
        read(engine, audit.Actor("staff", "r@example.org"), ids)
        assert staff_entries(engine) > entries_before, function.__qualname__
