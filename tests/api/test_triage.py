"""Triage through the API: a risk finding is a safety event at a level, its reply asks a check-in
(in the conversation read model), answered by buttons (``POST …/check-ins/{id}/answers``) or in
words (a message, still stored and answered as one); the answers set the level by the rule; a
newer check-in replaces an older one; refusals are 4xx a person can act on; and withdrawal makes a
check-in awaiting answers unanswered at once, without showing the participant anything more."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from chat import triage
from study.clock import FrozenClock
from study.models import StaffRole
from tests.api.test_chat import detail, post, rows, wellbeing_participant
from tests.api.test_pages import chatting, open_chat, send
from tests.builders import ParticipantHandle, csrf_of, make_staff, say, start_chat

HOPELESS = "I feel hopeless, like I'm falling apart"  # a check-in for a risk to self
HIT = "My boyfriend hits me when he drinks"  # a check-in for danger from someone else
CRISIS = "I want to kill myself"  # an escalation


@pytest.fixture
def chatter(engine: Engine, app_client: TestClient, slug: str, frozen_clock: FrozenClock) -> ParticipantHandle:
    return wellbeing_participant(engine, app_client, slug)


def events(engine: Engine) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in rows(engine, "SELECT id, category, level, page_since IS NOT NULL, answer_due_at "
                                               "IS NOT NULL, unanswered_at IS NOT NULL FROM safety_events ORDER BY id")]


def check_in_of(client: TestClient, who: ParticipantHandle, conversation: int, turn_id: int) -> dict[str, Any]:
    [found] = [turn["check_in"] for turn in detail(client, who, conversation)["turns"] if turn["id"] == turn_id]
    assert found is not None
    return dict(found)


def answer(client: TestClient, who: ParticipantHandle, conversation: int, check_in: int, **answers: str) -> Any:
    return post(client, who, f"{conversation}/check-ins/{check_in}/answers", {"answers": answers})


def staff_events(engine: Engine, client: TestClient, slug: str, query: str = "") -> list[dict[str, Any]]:
    token = make_staff(engine, slug, StaffRole.RESEARCHER, f"r{len(rows(engine, 'SELECT id FROM staff_accounts'))}"
                                                           "@uni.example")
    response = client.get(f"/api/v1/staff/studies/{slug}/safety-events{query}",
                          headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return list(response.json())


def test_a_check_in_is_a_safety_event_awaiting_answers_and_the_reply_asks_it(
        engine: Engine, app_client: TestClient, slug: str, chatter: ParticipantHandle,
        frozen_clock: FrozenClock) -> None:
    conversation = start_chat(app_client, chatter, "concierge")
    reply = say(app_client, chatter, conversation, HOPELESS)
    assert (reply["stance"], reply["concern"]) == ("check_in", "risk_to_self")
    assert reply["crisis_resources"]["text"]  # resources at once
    asked = reply["check_in"]
    assert (asked["kind"], asked["status"], asked["next_question"], asked["next_step"]) == (
        "risk_to_self", "open", "wish_dead", None)
    assert [q["id"] for q in asked["questions"]] == [q.id for q in triage.RISK_TO_SELF]
    assert "safety team reads your answers" in asked["intro"]
    assert check_in_of(app_client, chatter, conversation, reply["id"]) == asked  # in the conversation read model
    # At level check_in, not paging, answers due in the protocol's 30 minutes.
    assert events(engine) == [(1, "risk_to_self", "check_in", False, True, False)]
    assert rows(engine, "SELECT answer_due_at FROM safety_events")[0][0] is not None
    [event] = staff_events(engine, app_client, slug, "?unreviewed=true")  # in the review queue
    assert (event["level"], event["page_since"], event["check_in"]["status"]) == ("check_in", None, "open")
    due = dt.datetime.fromisoformat(event["answer_due_at"].replace("Z", "+00:00"))
    assert due == frozen_clock.now() + dt.timedelta(minutes=30)


def test_buttons_all_no_settle_the_check_in_at_level_check_in_without_paging(
        engine: Engine, app_client: TestClient, slug: str, chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "coach")
    reply = say(app_client, chatter, conversation, HOPELESS)
    check_in = reply["check_in"]["id"]
    first = answer(app_client, chatter, conversation, check_in, wish_dead="no")
    assert (first.status_code, first.json()["next_question"]) == (200, "thoughts")
    second = answer(app_client, chatter, conversation, check_in, thoughts="no")
    assert second.json()["next_question"] == "behaviour"  # the screener's skip: no method, intent or plan
    assert {q["id"]: q["asked"] for q in second.json()["questions"]}["plan"] is False
    done = answer(app_client, chatter, conversation, check_in, behaviour="no").json()
    assert (done["status"], done["next_question"]) == ("answered", None)
    assert "look over this check-in later" in done["next_step"]
    assert events(engine) == [(1, "risk_to_self", "check_in", False, False, False)]  # no deadline, no page
    [event] = staff_events(engine, app_client, slug, "?unreviewed=true")
    assert event["check_in"]["outcome"] == "all no"
    assert [(a["question"], a["answer"], a["given"]) for a in event["check_in"]["answers"] if a["answer"]] == [
        ("wish_dead", "no", "button"), ("thoughts", "no", "button"), ("behaviour", "no", "button")]

    # The same answer again changes nothing; another answer to a question answered is a clear 409.
    again = answer(app_client, chatter, conversation, check_in, behaviour="no")
    assert (again.status_code, again.json()["status"]) == (200, "answered")
    changed = answer(app_client, chatter, conversation, check_in, behaviour="yes")
    assert (changed.status_code, changed.json()["error"]["code"]) == (409, "already_answered")
    assert "already answered" in changed.json()["error"]["message"]
    # A question skipped may still be answered, and a yes to it escalates (a level only rises).
    late = answer(app_client, chatter, conversation, check_in, plan="yes")
    assert late.status_code == 200
    assert events(engine) == [(1, "risk_to_self", "escalation", True, False, False)]
    assert answer(app_client, chatter, conversation, check_in, intent="no").status_code == 200
    assert events(engine)[0][2] == "escalation"


def test_words_right_after_the_check_in_answer_it_and_are_still_a_message(
        engine: Engine, app_client: TestClient, chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "collaborator")
    reply = say(app_client, chatter, conversation, HOPELESS)
    unclear = say(app_client, chatter, conversation, "maybe")
    assert unclear["content"] == triage.UNCLEAR_REPLY  # never counted as a no
    no = say(app_client, chatter, conversation, "nope")
    assert no["content"] == triage.NEXT_QUESTION_REPLY
    asked = check_in_of(app_client, chatter, conversation, reply["id"])
    assert [(q["id"], q["answer"], q["given"]) for q in asked["questions"] if q["answer"]] == [
        ("wish_dead", "no", "words")]
    assert asked["next_question"] == "thoughts"
    say(app_client, chatter, conversation, "not really")
    done = say(app_client, chatter, conversation, "no")
    assert "look over this check-in later" in done["content"]
    # Every message is stored as a message, answered.
    assert rows(engine, "SELECT content, reply_status FROM turns WHERE speaker = 'participant' ORDER BY seq") == [
        (HOPELESS, "answered"), ("maybe", "answered"), ("nope", "answered"), ("not really", "answered"),
        ("no", "answered")]
    assert events(engine) == [(1, "risk_to_self", "check_in", False, False, False)]
    # Once the conversation moved on, a "no" answers nothing more.
    say(app_client, chatter, conversation, "Thanks. Can we talk about my job interview next week? I want to prepare.")
    later = say(app_client, chatter, conversation, "no")
    assert later["content"] != triage.NEXT_QUESTION_REPLY


def test_yes_with_a_plan_in_words_escalates_the_check_ins_event_and_raises_no_other(
        engine: Engine, app_client: TestClient, slug: str, chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "concierge")
    say(app_client, chatter, conversation, HOPELESS)
    plan = say(app_client, chatter, conversation, "yeah i have a plan")
    assert "on-call team is being told" in plan["content"]
    assert events(engine) == [(1, "risk_to_self", "escalation", True, False, False)]  # one event, paging
    [event] = staff_events(engine, app_client, slug)
    answers = {a["question"]: (a["answer"], a["given"]) for a in event["check_in"]["answers"] if a["answer"]}
    assert answers == {"wish_dead": ("yes", "words"), "plan": ("yes", "words")}
    assert event["check_in"]["outcome"] == "intent, plan or recent act"
    actions = [action for (action,) in rows(engine, "SELECT action FROM audit_log ORDER BY seq")]
    assert {"chat.safety_check_in", "chat.check_in_answered", "chat.safety_level_raised"} <= set(actions)


def test_an_escalation_asks_a_check_in_too_and_its_answers_never_lower_it(
        engine: Engine, app_client: TestClient, chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "concierge")
    reply = say(app_client, chatter, conversation, CRISIS)
    assert (reply["stance"], reply["check_in"]["kind"]) == ("escalate", "risk_to_self")
    assert events(engine) == [(1, "risk_to_self", "escalation", True, False, False)]  # no deadline to run
    for question in ("wish_dead", "thoughts", "method", "intent", "plan", "behaviour"):
        assert answer(app_client, chatter, conversation, reply["check_in"]["id"], **{question: "no"}).status_code == 200
    assert events(engine)[0][2] == "escalation"
    assert "on-call team is being told" in check_in_of(app_client, chatter, conversation, reply["id"])["next_step"]


def test_danger_from_others_asks_about_being_safe_now(engine: Engine, app_client: TestClient,
                                                      chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "collaborator")
    reply = say(app_client, chatter, conversation, HIT)
    assert (reply["stance"], reply["concern"]) == ("check_in", "risk_from_others")
    assert "Domestic" in reply["crisis_resources"]["text"] or "Gewalt" in reply["crisis_resources"]["text"]
    asked = reply["check_in"]
    assert ([q["id"] for q in asked["questions"]], asked["next_question"]) == (
        ["safe_now", "person_near", "safe_place"], "safe_now")
    not_safe = say(app_client, chatter, conversation, "no")  # to "Are you safe right now?"
    assert "on-call team is being told" in not_safe["content"]
    assert events(engine) == [(1, "risk_from_others", "escalation", True, False, False)]


def test_a_reviewed_check_in_that_escalates_waits_for_review_again(engine: Engine, app_client: TestClient, slug: str,
                                                                   chatter: ParticipantHandle,
                                                                   frozen_clock: FrozenClock) -> None:
    conversation = start_chat(app_client, chatter, "concierge")
    reply = say(app_client, chatter, conversation, HOPELESS)
    token = make_staff(engine, slug, StaffRole.RESEARCHER, "reviewer@uni.example")
    staff = {"Authorization": f"Bearer {token}"}
    reviewed = app_client.post(f"/api/v1/staff/studies/{slug}/safety-events/1/review", headers=staff,
                               json={"note": "Read; will check the answers later."})
    assert reviewed.json()["reviewed_by"] == "reviewer@uni.example"
    assert app_client.get(f"/api/v1/staff/studies/{slug}/safety-events?unreviewed=true", headers=staff).json() == []
    frozen_clock.advance(dt.timedelta(minutes=5))
    answer(app_client, chatter, conversation, reply["check_in"]["id"], behaviour="yes")
    [waiting] = app_client.get(f"/api/v1/staff/studies/{slug}/safety-events?unreviewed=true", headers=staff).json()
    assert (waiting["id"], waiting["level"], waiting["reviewed_at"]) == (1, "escalation", None)
    assert [review["note"] for review in waiting["reviews"] or []] in ([], ["Read; will check the answers later."])


def test_a_newer_check_in_replaces_the_older_one(engine: Engine, app_client: TestClient,
                                                 chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "collaborator")
    first = say(app_client, chatter, conversation, HOPELESS)
    second = say(app_client, chatter, conversation, "I just feel so hopeless about everything lately")
    assert second["stance"] == "check_in"
    replaced = answer(app_client, chatter, conversation, first["check_in"]["id"], wish_dead="no")
    assert (replaced.status_code, replaced.json()["error"]["code"]) == (409, "check_in_replaced")
    assert check_in_of(app_client, chatter, conversation, first["id"])["status"] == "replaced"
    # The older one waits for nothing any more; the newer one does.
    assert events(engine) == [(1, "risk_to_self", "check_in", False, False, False),
                              (2, "risk_to_self", "check_in", False, True, False)]


def test_refusals_are_4xx_a_person_can_act_on(engine: Engine, app_client: TestClient, slug: str,
                                              chatter: ParticipantHandle) -> None:
    conversation = start_chat(app_client, chatter, "collaborator")
    check_in = say(app_client, chatter, conversation, HOPELESS)["check_in"]["id"]
    path = f"{conversation}/check-ins/{check_in}/answers"
    cases: list[tuple[Any, int, str]] = [
        ({"answers": {"safe_now": "no"}}, 422, "unknown_question"),  # a question of the other check-in
        ({"answers": {"wish_dead": "maybe"}}, 422, "validation_error"),
        ({"answers": {"bogus": "no"}}, 422, "validation_error"),
        ({"answers": {}}, 422, "validation_error"),
        ({"answers": ["no"]}, 422, "validation_error"),
        ({"answers": {"wish_dead": "no\u0000"}}, 422, "validation_error"),
        ({"answers": {"wish_dead": "no"}, "extra": 1}, 422, "validation_error"),
    ]
    for body, status, code in cases:
        response = post(app_client, chatter, path, body)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), body
        assert response.json()["error"]["message"]
    missing = post(app_client, chatter, f"{conversation}/check-ins/99/answers", {"answers": {"wish_dead": "no"}})
    assert missing.status_code == 404
    huge = post(app_client, chatter, f"{conversation}/check-ins/99999999999999999999/answers",
                {"answers": {"wish_dead": "no"}})
    assert huge.status_code == 422
    other = wellbeing_participant(engine, app_client, slug)
    theirs = post(app_client, other, path, {"answers": {"wish_dead": "no"}})
    assert theirs.status_code == 404  # someone else's check-in is not there for them
    unauthenticated = app_client.post(f"/api/v1/me/conversations/{path}", json={"answers": {"wish_dead": "no"}})
    assert unauthenticated.status_code == 401


@pytest.mark.parametrize("level", ["stop_contact", "delete_data"])
def test_withdrawal_makes_a_check_in_awaiting_answers_unanswered_at_once(
        engine: Engine, app_client: TestClient, chatter: ParticipantHandle, level: str) -> None:
    conversation = start_chat(app_client, chatter, "coach")
    reply = say(app_client, chatter, conversation, HOPELESS)
    answer(app_client, chatter, conversation, reply["check_in"]["id"], wish_dead="yes")  # by button
    say(app_client, chatter, conversation, "yes")  # thoughts, in words
    withdrawn = app_client.post("/api/v1/me/withdrawal", headers=chatter.headers,
                                json={"level": level, "confirm": True})
    assert withdrawn.status_code == 200, withdrawn.text
    # The risk was shown: the study follows it up (it pages now), but nothing more is shown to them.
    assert events(engine) == [(1, "risk_to_self", "unanswered", True, True, True)]
    assert rows(engine, "SELECT followed_up_at FROM safety_check_ins") == [(None,)]
    answers = rows(engine, "SELECT turn_id, answers FROM safety_check_ins")[0]
    kept = answers[1] if isinstance(answers[1], dict) else json.loads(answers[1])
    assert {question: given["answer"] for question, given in kept.items()} == {"wish_dead": "yes", "thoughts": "yes"}
    if level == "delete_data":  # a de-identified record: no link to a turn, the answers without their message
        assert answers[0] is None
        assert all("turn_id" not in given for given in kept.values())
        assert rows(engine, "SELECT participant_id, conversation_id, turn_id FROM safety_events") == [
            (None, None, None)]
    else:
        assert answers[0] is not None
        assert kept["thoughts"]["turn_id"] is not None


# The chat page


def test_the_chat_page_asks_one_question_at_a_time_with_three_real_buttons_and_then_says_what_happens_next(
        engine: Engine, app_client: TestClient, slug: str, frozen_clock: FrozenClock) -> None:
    chatting(engine, app_client, slug)
    chat = open_chat(app_client, "concierge")
    html = send(app_client, chat, HOPELESS)
    [card] = re.findall(r'<section class="triage".*?</section>', html, re.DOTALL)
    [legend] = re.findall(r"<legend>([^<]*)</legend>", card)
    assert legend == triage.RISK_TO_SELF[0].text.replace("'", "&#39;")
    buttons = re.findall(r'<button type="submit" name="answer" value="(\w+)" class="choice">([^<]*)</button>', card)
    assert buttons == [("yes", "Yes"), ("no", "No"), ("declined", "Prefer not to say")]
    assert "Question 1 of 6" in card
    action = re.search(r'<form method="post" action="(/chat/\d+/check-ins/\d+)"', card)
    assert action
    answered = app_client.post(action.group(1), data={"csrf": csrf_of(html), "question": "wish_dead", "answer": "no"})
    assert answered.status_code == 200
    assert "<legend>Have you been having thoughts of ending your own life?</legend>" in answered.text
    html = send(app_client, chat, "no")  # in words, from the message box
    assert "Question 3 of 3" in html  # no questions about a method, intent or a plan after no
    assert "(from your message)" in html
    done = app_client.post(action.group(1), data={"csrf": csrf_of(html), "question": "behaviour", "answer": "no"})
    [card] = re.findall(r'<section class="triage".*?</section>', done.text, re.DOTALL)
    assert "<h3>What happens next</h3>" in card
    assert "look over this check-in later" in card
    assert "<button" not in card
    # A refused answer is a page a person can act on, never a 500.
    refused = app_client.post(action.group(1), data={"csrf": csrf_of(done.text), "question": "behaviour",
                                                      "answer": "yes"})
    assert refused.status_code == 409
    assert "already answered" in refused.text
    bogus = app_client.post(action.group(1), data={"csrf": csrf_of(done.text), "question": "mood", "answer": "yes"})
    assert bogus.status_code == 422
