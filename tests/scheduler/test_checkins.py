"""The dispatcher's check-in phase: a check-in not answered by the protocol's deadline becomes
unanswered exactly once however many dispatchers poll, and the protocol's ``on_unanswered``
applies (the on-call contacts paged in the same poll, a follow-up shown to the participant);
answered check-ins and check-ins before their deadline are left alone; only the levels the
protocol lists page, rounds counted from when the event started to page; a withdrawn
participant's check-in still reaches staff, and is never followed up with them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from chat import triage
from study.clock import FrozenClock
from tests.builders import ParticipantHandle, enroll_fully, load_study, make_invites, put_in_arm, say, start_chat
from tests.mail import Inbox, smtp_server
from tests.scheduler.test_oncall import ONCALL, assert_no_content, at_once, body_of, dispatcher

HOPELESS = "I feel hopeless, like I'm falling apart"
DEADLINE = dt.timedelta(minutes=30)  # the example protocol's unanswered_after


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as served:
        yield served


def checked_in(engine: Engine, client: TestClient, slug: str) -> tuple[ParticipantHandle, int, dict[str, Any]]:
    """A participant whose message got a risk-to-self check-in: them, the conversation, the reply."""
    [invite] = make_invites(engine, slug)
    who = enroll_fully(client, invite, email="participant@example.org")
    put_in_arm(engine, who.code, "wellbeing")
    conversation = start_chat(client, who, "concierge")
    reply = say(client, who, conversation, HOPELESS)
    assert reply["stance"] == "check_in"
    return who, conversation, reply


def event(engine: Engine) -> dict[str, Any]:
    with engine.connect() as connection:
        [row] = connection.execute(sa.text(
            "SELECT e.level, e.page_since, e.unanswered_at, c.followed_up_at, c.answered_at FROM safety_events e "
            "JOIN safety_check_ins c ON c.safety_event_id = e.id")).mappings().all()
    return dict(row)


def shown(client: TestClient, who: ParticipantHandle, conversation: int, reply: dict[str, Any]) -> dict[str, Any]:
    turns = client.get(f"/api/v1/me/conversations/{conversation}", headers=who.headers).json()["turns"]
    [check_in] = [turn["check_in"] for turn in turns if turn["id"] == reply["id"]]
    return dict(check_in)


def checked_in_under(engine: Engine, client: TestClient, example: str,
                     triage_yaml: str) -> tuple[ParticipantHandle, int, dict[str, Any]]:
    """``checked_in``, in a study whose protocol's ``safety.triage`` is ``triage_yaml``."""
    old = ("  triage:\n    page: [escalation, unanswered]\n    unanswered_after: PT30M\n"
           "    on_unanswered: [page, follow_up]\n")
    assert old in example
    return checked_in(engine, client, load_study(engine, example.replace(old, f"  triage:\n{triage_yaml}")))


def test_a_check_in_unanswered_past_the_deadline_pages_once_across_two_dispatchers_and_is_followed_up(
    engine: Engine, app_client: TestClient, slug: str, frozen_clock: FrozenClock, inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    who, conversation, reply = checked_in(engine, app_client, slug)
    left, right = dispatcher(engine, port, "left"), dispatcher(engine, port, "right")
    assert left.tick().notified == 0  # a check-in pages nobody by default
    frozen_clock.advance(DEADLINE - dt.timedelta(seconds=1))
    report = left.tick()
    assert (report.unanswered, report.notified, report.errors) == (0, 0, [])  # the poll ran; not due yet
    assert event(engine)["level"] == "check_in"

    frozen_clock.advance(dt.timedelta(seconds=2))
    reports = at_once(left, right)
    assert sum(r.unanswered for r in reports.values()) == 1
    assert sum(r.notified for r in reports.values()) == 1  # paged within the same poll
    [message] = messages.to(ONCALL)
    assert str(message["Subject"]).startswith("Unanswered safety check-in (risk to self)")
    assert "Level: unanswered" in body_of(message)
    assert_no_content(message, who)
    for _ in range(2):
        assert left.tick().unanswered == right.tick().unanswered == 0
    assert len(messages.to(ONCALL)) == 1
    row = event(engine)
    assert row["level"] == "unanswered"
    assert row["page_since"] is not None
    assert row["unanswered_at"] is not None
    assert row["followed_up_at"] is not None  # on_unanswered: follow_up
    asked = shown(app_client, who, conversation, reply)
    assert (asked["status"], asked["follow_up"], asked["next_question"]) == ("unanswered", triage.FOLLOW_UP,
                                                                            "wish_dead")

    # A late answer is taken, and can raise the level, never lower it.
    late = app_client.post(f"/api/v1/me/conversations/{conversation}/check-ins/{reply['check_in']['id']}/answers",
                           headers=who.headers, json={"answers": {"wish_dead": "no", "thoughts": "no",
                                                                  "behaviour": "no"}})
    assert (late.status_code, late.json()["status"]) == (200, "answered")
    assert event(engine)["level"] == "unanswered"


def test_an_answered_check_in_never_goes_unanswered(
    engine: Engine, app_client: TestClient, slug: str, frozen_clock: FrozenClock, inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    who, conversation, reply = checked_in(engine, app_client, slug)
    for text in ("no", "no", "no"):
        say(app_client, who, conversation, text)
    frozen_clock.advance(DEADLINE * 3)
    report = dispatcher(engine, port).tick()
    assert (report.unanswered, report.notified, report.errors) == (0, 0, [])
    assert event(engine)["level"] == "check_in"
    assert event(engine)["answered_at"] is not None
    assert messages.to(ONCALL) == []


def test_partly_answered_is_unanswered_at_the_deadline(
    engine: Engine, app_client: TestClient, slug: str, frozen_clock: FrozenClock, inbox: tuple[Inbox, int],
) -> None:
    _, port = inbox
    who, conversation, _ = checked_in(engine, app_client, slug)
    say(app_client, who, conversation, "yes")  # a wish to be dead; nothing more
    frozen_clock.advance(DEADLINE)
    assert dispatcher(engine, port).tick().unanswered == 1
    assert event(engine)["level"] == "unanswered"


def test_the_protocol_decides_which_levels_page_and_what_an_unanswered_check_in_does(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    # Unanswered check-ins page nobody here: the event only waits for review; no follow-up either.
    who, conversation, reply = checked_in_under(engine, app_client, example_protocol,
                                                "    page: [escalation]\n    unanswered_after: PT10M\n")
    frozen_clock.advance(dt.timedelta(minutes=10))
    report = dispatcher(engine, port).tick()
    assert (report.unanswered, report.notified) == (1, 0)
    row = event(engine)
    assert (row["level"], row["page_since"], row["followed_up_at"]) == ("unanswered", None, None)
    assert shown(app_client, who, conversation, reply)["follow_up"] is None
    assert messages.to(ONCALL) == []


def test_a_protocol_may_page_check_ins_too_and_an_escalation_counts_its_rounds_from_when_it_pages(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    who, conversation, reply = checked_in_under(engine, app_client, example_protocol,
                                                "    page: [check_in, escalation]\n    unanswered_after: PT24H\n")
    dispatch = dispatcher(engine, port)
    assert dispatch.tick().notified == 1
    [first] = messages.to(ONCALL)
    assert str(first["Subject"]).startswith("Safety check-in (risk to self)")
    frozen_clock.advance(dt.timedelta(hours=5))  # past one renotify period (PT4H) of the check-in
    assert dispatch.tick().notified == 1  # round 1 of the check-in
    answered = app_client.post(f"/api/v1/me/conversations/{conversation}/check-ins/{reply['check_in']['id']}/answers",
                               headers=who.headers, json={"answers": {"behaviour": "yes"}})
    assert answered.status_code == 200
    assert dispatch.tick().notified == 1  # the escalation, at once: its own round 0
    escalation = messages.to(ONCALL)[-1]
    assert str(escalation["Subject"]) == ("Safety escalation (risk to self) in Well-being mode pilot: "
                                          "does honest pushback leave people better off?")
    with engine.connect() as connection:
        rounds = connection.execute(sa.text("SELECT round, idempotency_key FROM safety_notifications "
                                            "ORDER BY id")).all()
    assert [r for r, _ in rounds] == [0, 1, 0]
    assert rounds[2][1].startswith("safety-1-0-email-")  # an escalation's key, as before levels
    assert rounds[0][1].startswith("safety-1-check_in-0-email-")


def test_a_withdrawn_participants_check_in_still_reaches_staff_and_is_never_followed_up(
    engine: Engine, app_client: TestClient, slug: str, frozen_clock: FrozenClock, inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    # on_unanswered: page and follow up
    who, _, _ = checked_in(engine, app_client, slug)
    withdrawn = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                                json={"level": "stop_contact", "confirm": True})
    assert withdrawn.status_code == 200, withdrawn.text
    # Not waiting for a deadline that can never be met: unanswered now, paged within the next poll.
    report = dispatcher(engine, port).tick()
    assert (report.unanswered, report.notified) == (0, 1)
    [message] = messages.to(ONCALL)
    assert str(message["Subject"]).startswith("Unanswered safety check-in")
    assert messages.to("participant@example.org") == []
    row = event(engine)
    assert (row["level"], row["followed_up_at"]) == ("unanswered", None)
    frozen_clock.advance(DEADLINE * 2)
    assert dispatcher(engine, port).tick().unanswered == 0  # done once, at withdrawal


def test_a_check_in_that_cannot_be_marked_raises_an_alert_and_the_others_go_on(
    engine: Engine, app_client: TestClient, slug: str, frozen_clock: FrozenClock, inbox: tuple[Inbox, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, port = inbox
    checked_in(engine, app_client, slug)
    checked_in(engine, app_client, slug)
    frozen_clock.advance(DEADLINE)
    import scheduler.checkins as phase
    real = phase._unanswered

    def poisoned(session: Any, event_id: int, study_id: int) -> bool:
        if event_id == 1:
            raise RuntimeError("poisoned row")
        return real(session, event_id, study_id)

    monkeypatch.setattr(phase, "_unanswered", poisoned)
    report = dispatcher(engine, port).tick()
    assert report.unanswered == 1
    assert any("safety event 1" in error for error in report.errors)
    with engine.connect() as connection:
        alerts = connection.execute(sa.text("SELECT channel, problem, raised_at IS NOT NULL FROM channel_alerts")).all()
        levels = connection.execute(sa.text("SELECT id, level FROM safety_events ORDER BY id")).all()
    assert [tuple(a) for a in alerts] == [("scheduler", "unanswered_failed", True)]
    assert [tuple(row) for row in levels] == [(1, "check_in"), (2, "unanswered")]
    monkeypatch.setattr(phase, "_unanswered", real)
    assert dispatcher(engine, port).tick().unanswered == 1  # tried again at the next poll
