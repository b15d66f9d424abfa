"""Staff transcript endpoints: conversations produced through the participant API with the
offline provider, read back by study staff."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from chat.roles import system_prompt
from study.models import StaffRole
from tests.builders import (
    FRAMING,
    ParticipantHandle,
    counting_statements,
    enroll_fully,
    load_study,
    make_invites,
    make_staff,
    put_in_arm,
    say,
    start_chat,
)

CRISIS = "I want to kill myself"


@pytest.fixture
def researcher(engine: Engine, slug: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}


def participant(engine: Engine, client: TestClient, slug: str, arm: str = "wellbeing") -> ParticipantHandle:
    [invite] = make_invites(engine, slug)
    who = enroll_fully(client, invite)
    put_in_arm(engine, who.code, arm)
    return who


def me(client: TestClient, who: ParticipantHandle, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    response = client.request(method, f"/api/v1/me/conversations/{path}", headers=who.headers, json=body)
    assert response.status_code < 400, response.text
    return response.json()


def get(client: TestClient, path: str, headers: dict[str, str], **params: Any) -> Any:
    response = client.get(path, headers=headers, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def audit_rows(engine: Engine, action: str) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text(
            "SELECT actor, participant_code, detail FROM audit_log WHERE action = :action ORDER BY seq"),
            {"action": action}).all())


def detail_of(row: Any) -> dict[str, Any]:
    return row.detail if isinstance(row.detail, dict) else json.loads(row.detail)


@pytest.fixture
def three_conversations(engine: Engine, app_client: TestClient, slug: str) -> dict[str, Any]:
    """Alice: a collaborator conversation switched to coach and ended, then an escalation with the
    concierge. Bob (control arm): one standard conversation."""
    alice = participant(engine, app_client, slug)
    switched = start_chat(app_client, alice, "collaborator")
    assert say(app_client, alice, switched, FRAMING)["stance"] == "nudge"
    me(app_client, alice, "PUT", f"{switched}/role", {"role": "coach"})
    assert say(app_client, alice, switched, "He obviously hates me, so I'll avoid him")["stance"] == "challenge"
    me(app_client, alice, "POST", f"{switched}/end", {"rating": 5, "made_decision": False})
    crisis = start_chat(app_client, alice, "concierge")
    assert say(app_client, alice, crisis, CRISIS)["stance"] == "escalate"
    bob = participant(engine, app_client, slug, arm="control")
    control = start_chat(app_client, bob, None)
    say(app_client, bob, control, "Should I ask for a transfer to the Leeds office?")
    return {"alice": alice, "bob": bob, "switched": switched, "crisis": crisis, "control": control}


def test_researcher_lists_and_filters_conversations(
    engine: Engine, app_client: TestClient, slug: str, researcher: dict[str, str], three_conversations: dict[str, Any],
) -> None:
    c = three_conversations
    url = f"/api/v1/staff/studies/{slug}/conversations"
    page = get(app_client, url, researcher)
    assert (page["total"], page["limit"], page["offset"]) == (3, 50, 0)
    assert [item["id"] for item in page["items"]] == [c["control"], c["crisis"], c["switched"]]  # newest first
    items = {item["id"]: item for item in page["items"]}
    switched = items[c["switched"]]
    assert {key: switched[key] for key in ("participant", "arm", "mode", "role", "roles_used", "status", "turn_count",
                                           "has_safety_event")} == {
        "participant": c["alice"].code, "arm": "wellbeing", "mode": "wellbeing", "role": "coach",
        "roles_used": ["collaborator", "coach"], "status": "ended", "turn_count": 4, "has_safety_event": False}
    assert switched["stance_counts"] == {"agree": 0, "nudge": 1, "challenge": 1, "check_in": 0, "decline": 0,
                                         "escalate": 0}
    assert switched["ended_at"] is not None
    assert (items[c["crisis"]]["has_safety_event"], items[c["crisis"]]["stance_counts"]["escalate"]) == (True, 1)
    control = items[c["control"]]
    assert (control["participant"], control["arm"], control["mode"], control["status"], control["ended_at"]) == (
        c["bob"].code, "control", "default", "active", None)

    def ids(**filters: Any) -> list[int]:
        found = get(app_client, url, researcher, **filters)
        assert found["total"] == len(found["items"])
        return [item["id"] for item in found["items"]]

    assert ids(participant=c["bob"].code) == [c["control"]]
    assert ids(participant=c["alice"].code) == [c["crisis"], c["switched"]]
    assert ids(arm="control") == [c["control"]]
    assert ids(role="collaborator") == [c["switched"]]  # the role it started in, before the switch
    assert ids(role="coach") == [c["switched"]]
    assert ids(role="concierge") == [c["crisis"]]
    assert ids(stance="escalate") == [c["crisis"]]
    assert ids(stance="challenge") == [c["switched"]]
    assert ids(stance="nudge", role="coach") == [c["switched"]]
    assert ids(stance="escalate", arm="control") == []
    assert ids(started_from="2000-01-01T00:00:00Z", started_before="2199-01-01T00:00:00+02:00") == [
        c["control"], c["crisis"], c["switched"]]
    assert ids(started_from="2199-01-01T00:00:00Z") == []
    assert ids(started_before="2000-01-02T00:00:00Z") == []

    first = get(app_client, url, researcher, limit=2)
    rest = get(app_client, url, researcher, limit=2, offset=2)
    assert (first["total"], rest["total"]) == (3, 3)
    assert [i["id"] for i in first["items"] + rest["items"]] == [c["control"], c["crisis"], c["switched"]]
    for bad in ({"limit": 201}, {"limit": 0}, {"offset": -1}, {"stance": "flatter"},
                {"started_from": "2026-01-01T00:00:00"}):  # a time without a zone is refused
        assert app_client.get(url, headers=researcher, params=bad).status_code == 422, bad

    listed = audit_rows(engine, "conversations.listed")
    assert {row.actor for row in listed} == {"r@example.org"}
    assert detail_of(listed[0])["conversation_ids"] == [c["control"], c["crisis"], c["switched"]]
    assert detail_of(listed[2])["filters"] == {"participant": c["alice"].code}


def test_staff_filters_refuse_values_the_study_does_not_have(
    engine: Engine, app_client: TestClient, slug: str, researcher: dict[str, str], three_conversations: dict[str, Any],
) -> None:
    """A typo in a filter is a 422 that names the problem, never an empty list that looks like "none"."""
    base = f"/api/v1/staff/studies/{slug}"
    refused = {
        ("conversations", "arm", "contrl"): "unknown arm 'contrl'; this study's arms: control, wellbeing",
        ("conversations", "participant", "PNOBODY1"): "no participant 'PNOBODY1' in this study",
        ("conversations", "role", "butler"): "role",
        ("conversations", "stance", "flatter"): "stance",
        ("followups", "status", "bogus"): "status",
        ("responses", "instrument", "perma-profilr"): "unknown instrument 'perma-profilr'; did you mean 'perma-",
    }
    for (path, name, value), message in refused.items():
        response = app_client.get(f"{base}/{path}", headers=researcher, params={name: value})
        assert response.status_code == 422, (path, name, response.text)
        assert message in response.text, response.text
    for path, name, value in (("conversations", "arm", "control"), ("conversations", "role", "coach"),
                              ("followups", "status", "planned"), ("responses", "instrument", "perma-profiler")):
        assert app_client.get(f"{base}/{path}", headers=researcher, params={name: value}).status_code == 200
    assert get(app_client, f"{base}/followups", researcher, status="completed") == []


def test_a_listing_costs_the_same_statements_for_one_conversation_or_many(
    engine: Engine, app_client: TestClient, slug: str, researcher: dict[str, str], three_conversations: dict[str, Any],
) -> None:
    url = f"/api/v1/staff/studies/{slug}/conversations"
    with counting_statements(engine) as one:
        assert len(get(app_client, url, researcher, participant=three_conversations["bob"].code)["items"]) == 1
    with counting_statements(engine) as three:
        assert len(get(app_client, url, researcher)["items"]) == 3
    assert len(one) == len(three)


def test_researcher_reads_a_whole_transcript(
    engine: Engine, app_client: TestClient, slug: str, researcher: dict[str, str],
) -> None:
    alice = participant(engine, app_client, slug)
    conversation = start_chat(app_client, alice, "coach")
    challenge = say(app_client, alice, conversation, FRAMING)
    overridden = me(app_client, alice, "POST", f"{conversation}/turns/{challenge['id']}/override")["reply"]
    leaning = say(app_client, alice, conversation, "Just tell me what to do")
    assert leaning["stance"] in ("nudge", "challenge")
    me(app_client, alice, "POST", f"{conversation}/turns/{leaning['id']}/reconsider")
    me(app_client, alice, "PUT", f"{conversation}/role", {"role": "collaborator"})
    escalation = say(app_client, alice, conversation, CRISIS)
    [event_id] = [e["id"] for e in get(app_client, f"/api/v1/staff/studies/{slug}/safety-events", researcher)]
    reviewed = app_client.post(f"/api/v1/staff/studies/{slug}/safety-events/{event_id}/review", headers=researcher,
                               json={"note": "Called per protocol."})
    assert reviewed.status_code == 200, reviewed.text
    me(app_client, alice, "POST", f"{conversation}/end",
       {"rating": 3, "made_decision": True, "decision": "Stay in my job for now"})

    transcript = get(app_client, f"/api/v1/staff/studies/{slug}/conversations/{conversation}", researcher)
    assert (transcript["participant"], transcript["status"], transcript["made_decision"]) == (alice.code, "ended", True)
    turns = transcript["turns"]
    assert [t["seq"] for t in turns] == list(range(1, len(turns) + 1))
    assert [t["speaker"] for t in turns] == ["participant", "assistant", "assistant", "participant", "assistant",
                                             "participant", "assistant"]
    assert turns[0]["content"] == FRAMING
    by_id = {t["id"]: t for t in turns}
    shown = by_id[challenge["id"]]
    assert (shown["stance"], shown["concern"], shown["rationale"], shown["response"]) == (
        "challenge", "unsupported_framing", challenge["rationale"], "override")
    assert shown["rationale"]
    assert (shown["role"], shown["prompt_version"], shown["model"]) == (
        "coach", system_prompt("coach").version, "offline/afterward")
    assert (by_id[overridden["id"]]["after_override"], by_id[overridden["id"]]["stance"]) == (True, "agree")
    assert by_id[leaning["id"]]["response"] == "reconsider"
    assert (by_id[escalation["id"]]["stance"], by_id[escalation["id"]]["role"]) == ("escalate", "collaborator")
    assert by_id[escalation["id"]]["prompt_version"] == system_prompt("collaborator").version
    assert [(r["turn_id"], r["action"], r["stance"]) for r in transcript["pushback_responses"]] == [
        (challenge["id"], "override", "challenge"), (leaning["id"], "reconsider", leaning["stance"])]
    assert [(s["from_role"], s["to_role"], s["after_seq"]) for s in transcript["role_switches"]] == [
        ("coach", "collaborator", 5)]
    assert transcript["role_switches"][0]["switched_at"]
    assert transcript["roles_used"] == ["coach", "collaborator"]
    assert transcript["decision"]["text"] == "Stay in my job for now"
    assert transcript["exit_rating"]["rating"] == 3
    assert transcript["stance_counts"] == {"agree": 1, "nudge": int(leaning["stance"] == "nudge"),
                                           "challenge": 1 + int(leaning["stance"] == "challenge"), "check_in": 0,
                                           "decline": 0, "escalate": 1}
    [event] = transcript["safety_events"]
    assert (event["id"], event["category"], event["cue"], event["conversation_id"]) == (
        event_id, "risk_to_self", "i want to kill myself", conversation)
    assert [(r["reviewed_by"], r["note"]) for r in event["reviews"]] == [("r@example.org", "Called per protocol.")]
    assert transcript["has_safety_event"] is True

    [read] = audit_rows(engine, "conversation.read")
    assert (read.actor, read.participant_code, detail_of(read)["conversation_id"]) == (
        "r@example.org", alice.code, conversation)


def test_a_transcript_without_an_exit_check_has_no_rating_or_decision(
    engine: Engine, app_client: TestClient, slug: str, researcher: dict[str, str], three_conversations: dict[str, Any],
) -> None:
    path = f"/api/v1/staff/studies/{slug}/conversations"
    ended = get(app_client, f"{path}/{three_conversations['switched']}", researcher)
    assert (ended["exit_rating"]["rating"], ended["decision"], ended["made_decision"]) == (5, None, False)
    active = get(app_client, f"{path}/{three_conversations['control']}", researcher)
    assert (active["exit_rating"], active["decision"], active["safety_events"], active["role_switches"]) == (
        None, None, [], [])
    assert active["turns"][1]["model"] == "offline/afterward"


def test_a_safety_event_shows_the_turns_around_it(
    engine: Engine, app_client: TestClient, slug: str, researcher: dict[str, str],
) -> None:
    alice = participant(engine, app_client, slug)
    conversation = start_chat(app_client, alice, "concierge")
    for text in ("Help me plan my week", "What should I cook tonight?", "Any tips for sleeping better?"):
        say(app_client, alice, conversation, text)
    trigger = say(app_client, alice, conversation, CRISIS)
    for text in ("Thank you", "I will call them"):
        say(app_client, alice, conversation, text)
    assert trigger["seq"] == 8
    [event_id] = [e["id"] for e in get(app_client, f"/api/v1/staff/studies/{slug}/safety-events", researcher)]

    url = f"/api/v1/staff/studies/{slug}/safety-events/{event_id}"
    context = get(app_client, url, researcher)
    assert (context["event"]["id"], context["event"]["participant"], context["event"]["cue"]) == (
        event_id, alice.code, "i want to kill myself")
    assert (context["conversation_id"], context["trigger_turn_id"]) == (conversation, trigger["id"])
    assert [t["seq"] for t in context["turns"]] == [5, 6, 7, 8, 9, 10, 11]
    assert context["turns"][2]["content"] == CRISIS
    assert context["turns"][3]["stance"] == "escalate"
    assert context["turns"][4]["content"] == "Thank you"
    linked = get(app_client, context["transcript_path"], researcher)
    assert (linked["id"], len(linked["turns"])) == (conversation, 12)
    assert [t["seq"] for t in get(app_client, url, researcher, around=0)["turns"]] == [8]
    assert [t["seq"] for t in get(app_client, url, researcher, around=10)["turns"]] == list(range(1, 13))

    reads = audit_rows(engine, "safety_event.read")
    assert len(reads) == 3
    assert (reads[0].actor, reads[0].participant_code) == ("r@example.org", alice.code)
    assert detail_of(reads[0])["event_id"] == event_id
    assert detail_of(reads[0])["turn_ids"] == [t["id"] for t in context["turns"]]
    missing = app_client.get(f"/api/v1/staff/studies/{slug}/safety-events/{event_id + 1000}", headers=researcher)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_viewers_and_staff_of_another_study_are_refused(
    engine: Engine, app_client: TestClient, slug: str, example_protocol: str, researcher: dict[str, str],
    three_conversations: dict[str, Any],
) -> None:
    other = load_study(engine, example_protocol.replace("id: wellbeing-pilot", "id: other-study", 1))
    outsider = {"Authorization": f"Bearer {make_staff(engine, other, StaffRole.ADMIN, 'o@example.org')}"}
    viewer = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    with engine.connect() as connection:
        event_id = connection.execute(sa.text("SELECT id FROM safety_events")).scalar_one()
    conversation = three_conversations["crisis"]
    for path in ("conversations", f"conversations/{conversation}", f"safety-events/{event_id}"):
        url = f"/api/v1/staff/studies/{slug}/{path}"
        refused = app_client.get(url, headers=viewer)
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "participant_data_forbidden"), path
        refused = app_client.get(url, headers=outsider)
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "no_study_access"), path
        assert three_conversations["alice"].code not in refused.text
        # Through their own study, this study's rows do not exist.
        own = app_client.get(f"/api/v1/staff/studies/{other}/{path}", headers=outsider)
        if path == "conversations":
            assert own.json() == {"total": 0, "limit": 50, "offset": 0, "items": []}
        else:
            assert (own.status_code, own.json()["error"]["code"]) == (404, "not_found"), path
    unknown = app_client.get(f"/api/v1/staff/studies/{slug}/conversations/999999", headers=researcher)
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    out_of_range = app_client.get(f"/api/v1/staff/studies/{slug}/conversations/0", headers=researcher)
    assert out_of_range.status_code == 422
    assert audit_rows(engine, "conversation.read") == []
    assert audit_rows(engine, "safety_event.read") == []
    assert [detail_of(row)["count"] for row in audit_rows(engine, "conversations.listed")] == [0]
