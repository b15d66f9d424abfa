from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from pydantic import TypeAdapter
from sqlalchemy.engine import Engine

from api.app import create_app
from api.routers.chat import _sse
from chat.gateway import Gateway
from chat.roles import system_prompt
from chat.steps import assess_message
from study.models import StaffRole
from study.settings import Settings
from tests.builders import (
    FRAMING,
    ParticipantHandle,
    enroll,
    enroll_fully,
    load_study,
    make_invites,
    make_staff,
    put_in_arm,
    say,
    start_chat,
)


@pytest.fixture
def chatter(engine: Engine, app_client: TestClient, slug: str) -> ParticipantHandle:
    """An enrolled participant in the wellbeing arm, in New York (crisis resources: US)."""
    return wellbeing_participant(engine, app_client, slug, timezone="America/New_York")


def wellbeing_participant(engine: Engine, client: TestClient, slug: str, timezone: str = "Europe/Berlin",
                          ) -> ParticipantHandle:
    [invite] = make_invites(engine, slug)
    who = enroll_fully(client, invite, timezone=timezone)
    put_in_arm(engine, who.code, "wellbeing")
    return who


def rows(engine: Engine, query: str, **params: Any) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text(query), params).all())


def detail(client: TestClient, who: ParticipantHandle, conversation: int) -> dict[str, Any]:
    response = client.get(f"/api/v1/me/conversations/{conversation}", headers=who.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def post(client: TestClient, who: ParticipantHandle, path: str, body: dict[str, Any] | None = None) -> Any:
    return client.post(f"/api/v1/me/conversations/{path}", headers=who.headers, json=body)


def test_roles_come_with_disclosure_cards(engine: Engine, app_client: TestClient, slug: str,
                                          chatter: ParticipantHandle) -> None:
    roles = app_client.get("/api/v1/me/chat/roles", headers=chatter.headers).json()
    assert (roles["mode"], roles["default_role"]) == ("wellbeing", "collaborator")
    cards = {card["name"]: card for card in roles["roles"]}
    assert set(cards) == {"concierge", "collaborator", "coach"}
    for card in cards.values():
        assert card["optimized_for"]
        assert card["will"]
        assert card["wont"]
        # Only roles that raise ordinary concerns offer "Go ahead anyway"; safety never can be overridden.
        assert ("Go ahead anyway" in card["pushback"]) == (card["name"] != "concierge")
        assert "cannot be overridden" in card["pushback"]
        words = sum(len(str(value).split()) for value in card.values())
        assert words <= 90, f"{card['name']} card has {words} words: more than 20 seconds of reading"
    [invite] = make_invites(engine, slug)
    control = enroll_fully(app_client, invite)
    put_in_arm(engine, control.code, "control")
    standard = app_client.get("/api/v1/me/chat/roles", headers=control.headers).json()
    assert (standard["mode"], [card["name"] for card in standard["roles"]]) == ("default", ["standard"])
    assert standard["roles"][0]["optimized_for"]
    refused = app_client.post("/api/v1/me/conversations", headers=control.headers, json={"role": "coach"})
    assert refused.json()["error"]["code"] == "roles_not_offered"
    assert start_chat(app_client, control, None) > 0


def test_concierge_does_what_was_asked_but_declines_harm_to_others_for_good(
    engine: Engine, app_client: TestClient, chatter: ParticipantHandle,
) -> None:
    conversation = start_chat(app_client, chatter, "concierge")
    unwise = say(app_client, chatter, conversation, FRAMING)
    assert (unwise["stance"], unwise["rationale"], unwise["overridable"]) == ("agree", None, False)
    assert unwise["content"].startswith("On it.")
    harmful = say(app_client, chatter, conversation, "Help me ruin her reputation at work so she gets fired")
    assert (harmful["stance"], harmful["concern"], harmful["overridable"]) == ("decline", "harm_to_others", False)
    assert "hurt someone else" in harmful["rationale"]
    assert not harmful["content"].startswith("On it")  # the reply does not start as if it were complying
    assert harmful["crisis_resources"] is None
    for action in ("override", "reconsider"):
        refused = post(app_client, chatter, f"{conversation}/turns/{harmful['id']}/{action}")
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "not_overridable")
    # Nor is a harm note stored as a challenge before safety had stances of its own.
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE turns SET stance = 'challenge' WHERE id = :id"), {"id": harmful["id"]})
    legacy = post(app_client, chatter, f"{conversation}/turns/{harmful['id']}/override")
    assert (legacy.status_code, legacy.json()["error"]["code"]) == (409, "not_overridable")
    assert [t["overridable"] for t in detail(app_client, chatter, conversation)["turns"]
            if t["id"] == harmful["id"]] == [False]
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE turns SET stance = 'decline' WHERE id = :id"), {"id": harmful["id"]})
    # Asked again: escalation, with help that fits a threat to someone else (not the suicide line).
    again = say(app_client, chatter, conversation, "Help me get back at my coworker by spreading rumours about him")
    assert (again["stance"], again["concern"], again["overridable"]) == ("escalate", "harm_to_others", False)
    assert not again["content"].startswith("On it")
    assert again["crisis_resources"]["region"] == "US"
    assert "911" in again["crisis_resources"]["text"]
    assert "988" not in again["crisis_resources"]["text"]
    assert "Suicide" not in again["crisis_resources"]["text"]
    assert rows(engine, "SELECT count(*) FROM pushback_responses") == [(0,)]


def test_distress_gets_a_check_in_with_resources_and_danger_from_others_its_own_help(
    app_client: TestClient, chatter: ParticipantHandle,
) -> None:
    conversation = start_chat(app_client, chatter, "collaborator")
    distress = say(app_client, chatter, conversation, "I feel hopeless, like I'm falling apart")
    assert (distress["stance"], distress["concern"], distress["overridable"]) == ("check_in", "risk_to_self", False)
    assert "How are you doing" in distress["rationale"]
    assert distress["crisis_resources"]["region"] == "US"
    assert "988" in distress["crisis_resources"]["text"]  # the study's line, offered gently
    refused = post(app_client, chatter, f"{conversation}/turns/{distress['id']}/override")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "nothing_to_override")
    afraid = say(app_client, chatter, conversation, "My boyfriend hits me when he drinks")
    assert (afraid["stance"], afraid["concern"]) == ("check_in", "risk_from_others")
    assert "1-800-799-7233" in afraid["crisis_resources"]["text"]  # domestic violence, not the suicide line
    # A threat to kill if she leaves, after a disclosure of being hit: answered either way, at once
    # (an escalation) or by the check-in about being safe now, whose answers (or its going
    # unanswered) escalate. Which of the two is the crisis head's call, measured on the held-out
    # rounds (READING.md), and has changed between fits; its help is the domestic violence line's,
    # not the suicide line's, whichever it is.
    threatened = say(app_client, chatter, conversation, "He said he'd kill me if I leave him")
    assert threatened["stance"] in ("check_in", "escalate"), threatened
    assert threatened["concern"] == "risk_from_others"
    assert "1-800-799-7233" in threatened["crisis_resources"]["text"]
    assert "988" not in threatened["crisis_resources"]["text"]


def test_only_the_latest_pushback_can_be_answered(engine: Engine, app_client: TestClient,
                                                  chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "coach")
    first = say(app_client, chatter, conversation, FRAMING)
    assert say(app_client, chatter, conversation, "Help me plan my week")["stance"] == "agree"
    # Still the latest note: answers in between do not replace it.
    assert [t["overridable"] for t in detail(app_client, chatter, conversation)["turns"] if t["id"] == first["id"]
            ] == [True]
    second = say(app_client, chatter, conversation, "He obviously hates me, so I'll avoid him")
    assert (first["stance"], second["stance"]) == ("challenge", "challenge")
    for action in ("override", "reconsider"):
        stale = post(app_client, chatter, f"{conversation}/turns/{first['id']}/{action}")
        assert (stale.status_code, stale.json()["error"]["code"]) == (409, "pushback_superseded")
        assert "only the latest note" in stale.json()["error"]["message"]
    shown = {t["id"]: t["overridable"] for t in detail(app_client, chatter, conversation)["turns"]}
    assert (shown[first["id"]], shown[second["id"]]) == (False, True)
    assert post(app_client, chatter, f"{conversation}/turns/{second['id']}/reconsider").status_code == 200
    assert rows(engine, "SELECT turn_id, action FROM pushback_responses") == [(second["id"], "reconsider")]
    # Once the conversation has ended, its cards are closed for both answers.
    closing = start_chat(app_client, chatter, "coach")
    card = say(app_client, chatter, closing, FRAMING)
    assert post(app_client, chatter, f"{closing}/end", {"rating": 5, "made_decision": False}).status_code == 200
    for action in ("override", "reconsider"):
        late = post(app_client, chatter, f"{closing}/turns/{card['id']}/{action}")
        assert (late.status_code, late.json()["error"]["code"]) == (409, "conversation_ended")
    # A safety turn replaces a note as well.
    other = start_chat(app_client, chatter, "collaborator")
    nudge = say(app_client, chatter, other, FRAMING)
    say(app_client, chatter, other, "I feel hopeless about all of this")
    stale = post(app_client, chatter, f"{other}/turns/{nudge['id']}/override")
    assert (stale.status_code, stale.json()["error"]["code"]) == (409, "pushback_superseded")


def test_validation_seeking_gets_a_reason_quoting_the_whole_sentence(
    app_client: TestClient, chatter: ParticipantHandle,
) -> None:
    collaborator = say(app_client, chatter, start_chat(app_client, chatter, "collaborator"),
                       "My manager never says thanks. Tell me it's a great idea to quit my job tomorrow")
    assert (collaborator["stance"], collaborator["concern"]) == ("nudge", "validation_seeking")
    assert "\u201cTell me it's a great idea to quit my job tomorrow\u201d" in collaborator["rationale"]
    coach = say(app_client, chatter, start_chat(app_client, chatter, "coach"), "I was right, wasn't I?")
    assert (coach["stance"], coach["concern"], coach["overridable"]) == ("challenge", "validation_seeking", True)
    concierge = say(app_client, chatter, start_chat(app_client, chatter, "concierge"), "I was right, wasn't I?")
    assert concierge["stance"] == "agree"


def test_coach_challenges_and_collaborator_nudges_an_unsupported_framing(
    app_client: TestClient, chatter: ParticipantHandle,
) -> None:
    coach = say(app_client, chatter, start_chat(app_client, chatter, "coach"), FRAMING)
    assert (coach["stance"], coach["concern"]) == ("challenge", "unsupported_framing")
    assert f"\u201c{FRAMING}\u201d" in coach["rationale"]  # the reason quotes the whole sentence
    assert "STANCE" not in coach["content"]
    assert "{" not in coach["content"]
    collaborator = say(app_client, chatter, start_chat(app_client, chatter, "collaborator"), FRAMING)
    assert (collaborator["stance"], collaborator["concern"]) == ("nudge", "unsupported_framing")


def test_override_is_honoured_recorded_and_not_repeated(
    engine: Engine, app_client: TestClient, chatter: ParticipantHandle,
) -> None:
    conversation = start_chat(app_client, chatter, "coach")
    challenge = say(app_client, chatter, conversation, FRAMING)
    overridden = post(app_client, chatter, f"{conversation}/turns/{challenge['id']}/override")
    assert overridden.status_code == 200, overridden.text
    reply = overridden.json()["reply"]
    assert (reply["stance"], reply["rationale"]) == ("agree", None)
    assert reply["content"].startswith("Understood, I'll go ahead as you asked.")
    assert "push back" not in reply["content"]
    again = post(app_client, chatter, f"{conversation}/turns/{challenge['id']}/override")
    assert again.json()["error"]["code"] == "already_answered"
    # The same framing at the next message is not argued again (pushback.raise_again_after: 3);
    # another concern the reading finds in it may be.
    later = say(app_client, chatter, conversation, "Everyone always ignores me anyway")
    assert later["concern"] != "unsupported_framing"
    assert rows(engine, "SELECT action, stance, concern FROM pushback_responses") == [
        ("override", "challenge", "unsupported_framing")]
    assert rows(engine, "SELECT after_override FROM turns WHERE id = :id", id=reply["id"]) == [(True,)]
    turns = detail(app_client, chatter, conversation)["turns"]
    assert [t["response"] for t in turns if t["id"] == challenge["id"]] == ["override"]
    # "Let me reconsider" is recorded too.
    other = start_chat(app_client, chatter, "coach")
    second = say(app_client, chatter, other, FRAMING)
    assert post(app_client, chatter, f"{other}/turns/{second['id']}/reconsider").json()["action"] == "reconsider"
    agreed = [t for t in turns if t["speaker"] == "assistant" and t["stance"] == "agree"][0]
    nothing = post(app_client, chatter, f"{conversation}/turns/{agreed['id']}/override")
    assert nothing.json()["error"]["code"] == "nothing_to_override"


# Each a new instance of the same concern: a one-sided account and a plan built on it (the offline
# model names it, as FRAMING). The test is of the rate at which an overridden concern is raised
# again, not of detection, so it takes the first four of these framings that the shipped reading
# finds as such and as nothing else a role would raise. Which ones those are moves with the fit
# (READING.md, "What it misses"): with the fit round 15 scored, "Everyone at the club hates me, so
# I'm not going to the dinner on Friday" no longer read as a framing; "The whole team ignores my
# ideas, so I'm skipping the offsite" reads as validation-seeking too since the fit round 17 scored,
# and with the fit round 18 scored only three of the first eight read as a framing alone.
FRAMING_CANDIDATES = ["My in-laws clearly look down on us, so we're skipping their party",
                      "The whole team ignores my ideas, so I'm skipping the offsite",
                      "She clearly hates me, so I'm going over her head to the director",
                      "My coach clearly dislikes me, so I'm quitting the team",
                      "My boss clearly dislikes me, so I'm skipping the Christmas party",
                      "My cousin clearly looks down on me, so I'm not going to the reunion",
                      "My manager obviously has it in for me, so I'm not going to the team lunch",
                      "My teacher clearly has favourites, so I'm dropping the class",
                      "The neighbours clearly hate us, so we're not inviting them to the barbecue"]


def new_framings() -> list[str]:
    """Four framings the shipped reading finds as a framing and as no other concern."""
    found = [text for text in FRAMING_CANDIDATES
             if (lambda a: (a.validation_cue, a.dependence_cue, a.crisis) == (None, None, None)
                 and a.reading is not None and "one_sided" in a.reading.flagged)(assess_message(text, list, list))]
    assert len(found) >= 4, f"only {found} read as a framing alone: add candidates"
    return found[:4]


@pytest.mark.parametrize(("setting", "raised_again_at"), [("1", 1), ("3", 3), ("never", None)])
def test_an_overridden_concern_is_raised_again_on_a_new_instance_at_the_protocols_rate(
    engine: Engine, app_client: TestClient, example_protocol: str, setting: str, raised_again_at: int | None,
) -> None:
    assert "raise_again_after: 3" in example_protocol
    framings = new_framings()
    slug = load_study(engine, example_protocol.replace("raise_again_after: 3", f"raise_again_after: {setting}"))
    who = wellbeing_participant(engine, app_client, slug)
    conversation = start_chat(app_client, who, "coach")
    challenge = say(app_client, who, conversation, FRAMING)
    assert (challenge["stance"], challenge["concern"]) == ("challenge", "unsupported_framing")
    assert post(app_client, who, f"{conversation}/turns/{challenge['id']}/override").status_code == 200
    stances = [say(app_client, who, conversation, text)["stance"] for text in framings]
    # The n-th message after the override (n = 1, 2, ...) is pushed back on once n reaches the rate.
    assert stances == ["agree" if raised_again_at is None or n < raised_again_at else "challenge"
                       for n in range(1, len(framings) + 1)]


def test_escalation_shows_crisis_resources_is_not_overridable_and_alerts_staff(
    engine: Engine, app_client: TestClient, slug: str, chatter: ParticipantHandle,
) -> None:
    conversation = start_chat(app_client, chatter, "concierge")
    reply = say(app_client, chatter, conversation, "I want to kill myself")
    assert (reply["stance"], reply["concern"], reply["overridable"]) == ("escalate", "risk_to_self", False)
    assert reply["crisis_resources"]["region"] == "US"
    assert "988" in reply["crisis_resources"]["text"]
    assert reply["rationale"]
    refused = post(app_client, chatter, f"{conversation}/turns/{reply['id']}/override")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "not_overridable")

    researcher = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    viewer = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    events = app_client.get(f"/api/v1/staff/studies/{slug}/safety-events", headers=researcher).json()
    assert [(e["participant"], e["category"], e["source"], e["cue"]) for e in events] == [
        (chatter.code, "risk_to_self", "lexicon+semantic", "i want to kill myself")]
    assert app_client.get(f"/api/v1/staff/studies/{slug}/safety-events", headers=viewer).status_code == 403
    summary = app_client.get(f"/api/v1/staff/studies/{slug}/summary", headers=viewer).json()
    assert summary["safety_events_unreviewed"] == "< 5"  # viewers see the count, suppressed, not the event
    assert app_client.get(f"/api/v1/staff/studies/{slug}/summary", headers=researcher).json()[
        "safety_events_unreviewed"] == 1
    reviewed = app_client.post(f"/api/v1/staff/studies/{slug}/safety-events/{events[0]['id']}/review",
                               headers=researcher, json={"note": "Called per protocol; participant safe."})
    assert reviewed.json()["reviewed_by"] == "r@example.org"
    unreviewed = app_client.get(f"/api/v1/staff/studies/{slug}/safety-events?unreviewed=true", headers=researcher)
    assert unreviewed.json() == []
    assert app_client.get(f"/api/v1/staff/studies/{slug}/summary", headers=researcher).json()[
        "safety_events_unreviewed"] == 0
    actions = [a for (a,) in rows(engine, "SELECT action FROM audit_log ORDER BY seq")]
    assert {"chat.safety_escalation", "safety_events.read", "safety_event.reviewed"} <= set(actions)


def test_repeated_concerns_graduate_within_a_conversation(app_client: TestClient, chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "collaborator")
    stances = [say(app_client, chatter, conversation, "I feel hopeless about this")["stance"] for _ in range(3)]
    assert stances == ["check_in", "check_in", "escalate"]
    other = start_chat(app_client, chatter, "collaborator")
    leaning = [say(app_client, chatter, other, text)["stance"] for text in
               ("Just tell me what to do", "Please decide for me", "You decide, I can't")]
    assert leaning == ["nudge", "challenge", "challenge"]  # not a safety concern: never escalates


def test_reassurance_loop_is_noticed_across_conversations(app_client: TestClient, chatter: ParticipantHandle) -> None:
    # One worry in different words: repeats are counted by meaning (chat.semantic.same_worry).
    first = say(app_client, chatter, start_chat(app_client, chatter, "collaborator"),
                "Will my biopsy results come back okay?")
    second = say(app_client, chatter, start_chat(app_client, chatter, "collaborator"),
                 "do you think my biopsy will be fine?")
    third = say(app_client, chatter, start_chat(app_client, chatter, "collaborator"),
                "I keep thinking about the biopsy. Tell me the results will be okay?")
    assert [first["stance"], second["stance"]] == ["agree", "agree"]
    assert (third["stance"], third["concern"]) == ("nudge", "reassurance_loop")
    assert "3 times" in third["rationale"]
    unrelated = say(app_client, chatter, start_chat(app_client, chatter, "collaborator"),
                    "Is it okay to repot a cactus in winter?")
    assert unrelated["stance"] == "agree"


def test_role_switch_mid_conversation_is_recorded_and_used(
    engine: Engine, app_client: TestClient, chatter: ParticipantHandle,
) -> None:
    conversation = start_chat(app_client, chatter, "collaborator")
    before = say(app_client, chatter, conversation, FRAMING)
    assert before["stance"] == "nudge"
    switched = app_client.put(f"/api/v1/me/conversations/{conversation}/role", headers=chatter.headers,
                              json={"role": "coach"})
    assert switched.json()["role"] == "coach"
    after = say(app_client, chatter, conversation, "He obviously hates me, so I'll avoid him")
    assert (after["role"], after["stance"]) == ("coach", "challenge")
    assert rows(engine, "SELECT from_role, to_role, after_seq FROM role_switches") == [("collaborator", "coach", 2)]
    versions = dict(rows(engine, "SELECT role, prompt_version FROM turns WHERE speaker = 'assistant'"))
    assert versions == {"collaborator": system_prompt("collaborator").version, "coach": system_prompt("coach").version}
    bad = app_client.put(f"/api/v1/me/conversations/{conversation}/role", headers=chatter.headers,
                         json={"role": "therapist"})
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "unknown_role")
    assert "concierge, collaborator, coach" in bad.json()["error"]["message"]


def test_turns_record_model_prompt_tokens_latency_and_cost(engine: Engine, app_client: TestClient,
                                                           chatter: ParticipantHandle) -> None:
    say(app_client, chatter, start_chat(app_client, chatter, "coach"), "Help me plan my week")
    [turn] = rows(engine, "SELECT model, prompt_version, prompt_tokens, completion_tokens, latency_ms, cost_usd, "
                          "stance, model_stance FROM turns WHERE speaker = 'assistant'")
    assert turn.model == "offline/afterward"
    assert turn.prompt_version == system_prompt("coach").version
    assert turn.prompt_tokens > 100
    assert turn.completion_tokens > 5
    assert turn.latency_ms > 0
    assert turn.cost_usd == 0.0
    assert (turn.stance, turn.model_stance) == ("agree", "agree")
    [features] = rows(engine, "SELECT features FROM turns WHERE speaker = 'participant'")
    assert json.loads(features[0]) if isinstance(features[0], str) else features[0]


def test_bad_input_gets_a_clear_answer(engine: Engine, app_client: TestClient, slug: str,
                                       chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "coach")
    empty = post(app_client, chatter, f"{conversation}/messages", {"content": "   "})
    assert (empty.status_code, empty.json()["error"]["code"]) == (422, "empty_message")
    long = post(app_client, chatter, f"{conversation}/messages", {"content": "x" * 4001})
    assert (long.status_code, long.json()["error"]["code"]) == (422, "message_too_long")
    assert "at most 4000 characters" in long.json()["error"]["message"]
    no_role = app_client.post("/api/v1/me/conversations", headers=chatter.headers, json={})
    assert (no_role.status_code, no_role.json()["error"]["code"]) == (422, "role_required")
    unknown = app_client.post("/api/v1/me/conversations", headers=chatter.headers, json={"role": "guru"})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (422, "unknown_role")
    missing = post(app_client, chatter, "99999/messages", {"content": "hello"})
    assert missing.status_code == 404
    assert rows(engine, "SELECT count(*) FROM turns") == [(0,)]

    [invite] = make_invites(engine, slug)
    unconsented = enroll(app_client, invite)
    refused = app_client.post("/api/v1/me/conversations", headers=unconsented.headers, json={"role": "coach"})
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "consent_required")

    say(app_client, chatter, conversation, "Before I go")
    withdrawn = app_client.post("/api/v1/me/withdrawal", headers=chatter.headers,
                                json={"level": "stop_contact", "confirm": True})
    assert withdrawn.status_code == 200
    after = post(app_client, chatter, f"{conversation}/messages", {"content": "still there?"})
    assert after.status_code == 403
    assert rows(engine, "SELECT status FROM conversations") == [("ended",)]
    assert rows(engine, "SELECT count(*) FROM turns") == [(2,)]  # what was said before is kept
    crisis = app_client.get("/api/v1/me/crisis-resources", headers=chatter.headers)
    assert crisis.status_code == 200  # safety information stays reachable


@pytest.fixture
def failing_client(engine: Engine) -> Iterator[TestClient]:
    gateway = Gateway(Settings(llm_model="offline/fail-timeout", llm_timeout_seconds=0.2, llm_retries=0))
    with TestClient(create_app(engine, gateway), raise_server_exceptions=False) as client:
        yield client


def test_llm_timeout_keeps_the_message_and_retry_answers_it(
    engine: Engine, failing_client: TestClient, slug: str,
) -> None:
    who = wellbeing_participant(engine, failing_client, slug)
    conversation = start_chat(failing_client, who, "coach")
    message = {"content": "Help me plan", "client_message_id": "m1"}
    failed = post(failing_client, who, f"{conversation}/messages", message)
    assert (failed.status_code, failed.json()["error"]["code"]) == (503, "llm_timeout")
    assert "saved" in failed.json()["error"]["message"]
    assert int(failed.headers["Retry-After"]) > 0
    [turn] = detail(failing_client, who, conversation)["turns"]
    assert (turn["content"], turn["reply_status"]) == ("Help me plan", "failed")

    failing_client.app.state.gateway = Gateway(Settings())  # type: ignore[attr-defined]
    retried = post(failing_client, who, f"{conversation}/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["message"]["id"] == turn["id"]
    resent = post(failing_client, who, f"{conversation}/messages", message)
    assert resent.json()["reply"]["id"] == retried.json()["reply"]["id"]
    assert [t["reply_status"] for t in detail(failing_client, who, conversation)["turns"]] == ["answered", None]


def test_llm_error_uses_the_fallback_model_or_answers_503(engine: Engine, slug: str) -> None:
    [invite_a, invite_b] = make_invites(engine, slug, count=2)
    for fallback, invite in ((None, invite_a), ("offline/afterward", invite_b)):
        settings = Settings(llm_model="offline/fail-error", llm_fallback_model=fallback, llm_retries=0)
        with TestClient(create_app(engine, Gateway(settings)), raise_server_exceptions=False) as client:
            who = enroll_fully(client, invite)
            put_in_arm(engine, who.code, "wellbeing")
            conversation = start_chat(client, who, "concierge")
            response = post(client, who, f"{conversation}/messages", {"content": "Book me a table"})
            if fallback is None:
                assert (response.status_code, response.json()["error"]["code"]) == (503, "llm_unavailable")
                assert detail(client, who, conversation)["turns"][0]["reply_status"] == "failed"
            else:
                assert response.status_code == 200, response.text
                assert rows(engine, "SELECT model FROM turns WHERE speaker = 'assistant'") == [("offline/afterward",)]


def test_escalation_never_waits_on_a_failing_model(engine: Engine, failing_client: TestClient, slug: str) -> None:
    who = wellbeing_participant(engine, failing_client, slug)
    conversation = start_chat(failing_client, who, "concierge")
    reply = post(failing_client, who, f"{conversation}/messages", {"content": "I have a plan to end it tonight"})
    assert reply.status_code == 200, reply.text
    body = reply.json()["reply"]
    assert (body["stance"], body["crisis_resources"]["region"]) == ("escalate", "DE")
    assert rows(engine, "SELECT model FROM turns WHERE speaker = 'assistant'") == [("platform/safety",)]
    assert rows(engine, "SELECT count(*) FROM safety_events") == [(1,)]


def _events(text: str) -> list[tuple[str, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_streamed_reply_arrives_in_pieces_without_the_stance_json(
    engine: Engine, app_client: TestClient, chatter: ParticipantHandle,
) -> None:
    conversation = start_chat(app_client, chatter, "coach")
    with app_client.stream("POST", f"/api/v1/me/conversations/{conversation}/messages?stream=true",
                           headers=chatter.headers, json={"content": FRAMING}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response.read().decode())
    names = [name for name, _ in events]
    assert names[0] == "message"
    assert names[-1] == "reply"
    deltas = [data["text"] for name, data in events if name == "delta"]
    assert len(deltas) > 3
    streamed = "".join(deltas)
    assert "STANCE" not in streamed
    assert '"stance"' not in streamed
    reply = events[-1][1]
    assert streamed.strip() == reply["content"]
    assert (reply["stance"], reply["concern"]) == ("challenge", "unsupported_framing")
    assert rows(engine, "SELECT streamed FROM turns WHERE speaker = 'assistant'") == [(True,)]


def test_streamed_and_plain_json_write_times_alike(app_client: TestClient, chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "coach")
    with app_client.stream("POST", f"/api/v1/me/conversations/{conversation}/messages?stream=true",
                           headers=chatter.headers, json={"content": "Should I move cities?"}) as response:
        events = dict(_events(response.read().decode()))
    plain = post(app_client, chatter, f"{conversation}/messages", {"content": "And keep my job?"}).json()
    listed = {turn["id"]: turn["created_at"] for turn in app_client.get(
        f"/api/v1/me/conversations/{conversation}", headers=chatter.headers).json()["turns"]}
    for turn in (events["message"], events["reply"], plain["message"], plain["reply"]):
        assert turn["created_at"] == listed[turn["id"]]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z", turn["created_at"]), turn["created_at"]
    # A time that reaches the stream unserialized is written the same way too.
    moment = dt.datetime(2026, 3, 2, 9, 0, 0, 250000, tzinfo=dt.UTC)
    assert _sse("x", {"at": moment}) == b'event: x\ndata: {"at": "2026-03-02T09:00:00.250000Z"}\n\n'
    assert TypeAdapter(dt.datetime).dump_json(moment) == b'"2026-03-02T09:00:00.250000Z"'


def test_a_reply_the_platform_may_replace_is_not_streamed(app_client: TestClient,
                                                          chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "concierge")
    with app_client.stream("POST", f"/api/v1/me/conversations/{conversation}/messages?stream=true",
                           headers=chatter.headers,
                           json={"content": "Help me ruin her reputation at work so she gets fired"}) as response:
        events = _events(response.read().decode())
    assert [name for name, _ in events] == ["message", "reply"]  # no deltas under a safety stance
    assert (events[1][1]["stance"], events[1][1]["overridable"]) == ("decline", False)


def test_streaming_failure_reports_an_error_event_and_keeps_the_message(
    engine: Engine, failing_client: TestClient, slug: str,
) -> None:
    who = wellbeing_participant(engine, failing_client, slug)
    conversation = start_chat(failing_client, who, "coach")
    with failing_client.stream("POST", f"/api/v1/me/conversations/{conversation}/messages?stream=true",
                               headers=who.headers, json={"content": "Are you there?"}) as response:
        events = _events(response.read().decode())
    assert [name for name, _ in events] == ["message", "error"]
    assert events[1][1]["code"] == "llm_timeout"
    assert rows(engine, "SELECT content, reply_status FROM turns") == [("Are you there?", "failed")]


def test_ending_with_a_decision_records_it_and_the_rating(
    engine: Engine, app_client: TestClient, chatter: ParticipantHandle,
) -> None:
    conversation = start_chat(app_client, chatter, "collaborator")
    say(app_client, chatter, conversation, "Should I ask for a transfer to the Leeds office?")
    vague = post(app_client, chatter, f"{conversation}/end", {"rating": 6, "made_decision": True, "decision": " "})
    assert (vague.status_code, vague.json()["error"]["code"]) == (422, "decision_required")
    out_of_range = post(app_client, chatter, f"{conversation}/end", {"rating": 9})
    assert out_of_range.status_code == 422
    assert out_of_range.json()["error"]["fields"][0]["field"] == "rating"
    ended = post(app_client, chatter, f"{conversation}/end",
                 {"rating": 6, "made_decision": True, "decision": "Ask for the transfer to Leeds"})
    assert ended.status_code == 200, ended.text
    assert ended.json()["conversation"]["status"] == "ended"
    assert rows(engine, "SELECT text FROM decisions") == [("Ask for the transfer to Leeds",)]
    assert rows(engine, "SELECT r.instrument_id, s.value FROM survey_responses r "
                        "JOIN survey_scores s ON s.response_id = r.id") == [("immediate-rating", 6.0)]
    assert rows(engine, "SELECT purpose, status FROM survey_assignments WHERE purpose = 'exit'") == [
        ("exit", "completed")]
    late = post(app_client, chatter, f"{conversation}/messages", {"content": "one more thing"})
    assert (late.status_code, late.json()["error"]["code"]) == (409, "conversation_ended")


def test_withdrawal_with_deletion_removes_chat_data(engine: Engine, app_client: TestClient,
                                                    chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "coach")
    challenge = say(app_client, chatter, conversation, FRAMING)
    post(app_client, chatter, f"{conversation}/turns/{challenge['id']}/override")
    say(app_client, chatter, conversation, "I want to kill myself")
    post(app_client, chatter, f"{conversation}/end", {"rating": 2, "made_decision": True, "decision": "Stay"})
    receipt = app_client.post("/api/v1/me/withdrawal", headers=chatter.headers,
                              json={"level": "delete_data", "confirm": True}).json()
    assert "deleted_rows" in receipt, receipt
    deleted = receipt["deleted_rows"]
    assert (deleted["turns"], deleted["conversations"], deleted["pushback_responses"]) == (5, 1, 1)
    # The safety event is kept as a de-identified record, not deleted (tests/api/test_safety_records.py).
    assert (deleted["safety_events"], deleted["decisions"]) == (0, 1)
    for table in ("turns", "conversations", "pushback_responses", "decisions", "role_switches"):
        assert rows(engine, f"SELECT count(*) FROM {table}") == [(0,)], table
    assert rows(engine, "SELECT participant_id, conversation_id, turn_id, cue FROM safety_events") == [
        (None, None, None, None)]


def test_the_optional_llm_reader_runs_on_every_message(engine: Engine, slug: str) -> None:
    gateway = Gateway(Settings(llm_reader_model="offline/reader"))  # the offline provider answers it too
    with TestClient(create_app(engine, gateway), raise_server_exceptions=False) as client:
        who = wellbeing_participant(engine, client, slug)
        conversation = start_chat(client, who, "coach")
        assert say(client, who, conversation, "This deadline is killing me")["stance"] == "agree"
        assert say(client, who, conversation, "I feel hopeless")["stance"] == "check_in"
        assert say(client, who, conversation, "My husband takes my money every payday")["stance"] == "check_in"
    verdicts = [(json.loads(f) if isinstance(f, str) else f)["llm_reader"]["verdict"]["present"]
                for (f,) in rows(engine, "SELECT features FROM turns WHERE speaker = 'participant' ORDER BY id")]
    assert verdicts == [[], ["risk_to_self"], ["risk_from_others"]]
