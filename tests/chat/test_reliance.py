"""Growing reliance on the assistant over days (``chat.drift``, issue 25): a participant who asks
the assistant to decide for them on 3 different days of a week gets a reason that says so; the same
number of requests within one day, or a single one, gets the per-message reason; other
participants' messages and those of a participant who withdrew do not count. The count is read from
the features stored with earlier messages (nothing is encoded again), on the injected clock, and
comes out the same through the API, the simulation's driver, ``afterward simulate`` and the
evaluations' ``MemoryStore``."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.engine import Engine

from analysis.simulation.driver import Driver
from analysis.simulation.population import Effects
from analysis.simulation.simulate import load_simulated_study, simulate
from api.app import create_app
from chat import drift, semantic, turn
from chat.gateway import Gateway
from chat.models import Turn
from chat.policy import Assessment, History, StanceDecision, decide, directive
from chat.roles import ROLE_SPECS, RoleName, system_prompt
from study.clock import FrozenClock, set_clock
from study.db import session_scope
from study.models import Participant
from study.settings import Settings
from tests.builders import ParticipantHandle, enroll_fully, make_invites, put_in_arm, say, start_chat

ASK = "Just tell me what to do about the job offer, you decide."
OVER_DAYS = "Over the past week you've asked me to decide for you, or leaned on me, on {} different days."
PER_MESSAGE = {"challenge": "I notice you're asking me to decide for you.",  # coach; collaborator on a repeat
               "nudge": "I'm glad to help, and I'd also like you to have people"}  # collaborator
START = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # 10:00 in Berlin, the participants' time zone
DAY = dt.timedelta(days=1)


@pytest.fixture
def clock() -> Iterator[FrozenClock]:
    frozen = FrozenClock(START)
    previous = set_clock(frozen)
    yield frozen
    set_clock(previous)


def test_the_rule_counts_days_of_the_last_week_in_the_participants_time_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    at = dt.datetime(2026, 3, 9, 12, 0, tzinfo=dt.UTC)
    same_day = [at - dt.timedelta(hours=h) for h in (0, 1, 2, 3, 4)]
    assert drift.reliance_days(same_day, at, berlin) == 1  # any number within one day is one day
    spread = [at, at - 2 * DAY, at - 5 * DAY]
    assert drift.reliance_days(spread, at, berlin) == 3
    assert drift.reliance_growing(3)
    assert not drift.reliance_growing(2)
    assert drift.reliance_days([at, at - 2 * DAY, at - 7 * DAY], at, berlin) == 2  # a week ago is outside
    assert drift.reliance_days([], at, berlin) == 0
    # 23:30 and 00:30 in Berlin are two of the participant's days (one UTC day: 22:30 and 23:30).
    evening = dt.datetime(2026, 3, 8, 22, 30, tzinfo=dt.UTC)
    night = evening + dt.timedelta(hours=1)
    assert drift.reliance_days([evening, night], night, berlin) == 2
    assert drift.reliance_days([evening, night], night, drift.UTC) == 1
    assert all(drift.window_start(at) <= when for when in spread)
    assert drift.zone("Nowhere/Atlantis") == drift.zone(None) == drift.UTC


@pytest.mark.parametrize("role", ["collaborator", "coach"])
def test_only_collaborator_and_coach_name_the_days_and_a_models_own_reason_does_not_replace_them(
        role: RoleName) -> None:
    spec = ROLE_SPECS[role]
    leaning = Assessment(message=ASK, dependence_cue="tell me what to do", reliance_days=4)
    required = directive(spec, leaning, History())
    assert required.rationale.startswith(OVER_DAYS.format(4))
    model = StanceDecision(required.stance, "dependence", "You keep asking me to choose.", source="model")
    assert decide(spec, required, model, History(), ASK).rationale == required.rationale
    # Per message (two days), a model's more specific reason for the same concern is kept, as before.
    two_days = directive(spec, Assessment(message=ASK, dependence_cue="tell me what to do", reliance_days=2), History())
    assert not two_days.rationale.startswith("Over the past week")
    assert decide(spec, two_days, model, History(), ASK).rationale == "You keep asking me to choose."
    for other in ("standard", "concierge"):  # roles that do not raise dependence stay quiet, days or not
        assert directive(ROLE_SPECS[other], leaning, History()).stance == "agree"


def participant(engine: Engine, client: TestClient, slug: str) -> ParticipantHandle:
    [invite] = make_invites(engine, slug)
    who = enroll_fully(client, invite)  # Europe/Berlin
    put_in_arm(engine, who.code, "wellbeing")
    return who


def stored(engine: Engine, code: str) -> list[tuple[int, bool]]:
    """(reliance_days, reliance_drift) of each of the participant's messages, oldest first."""
    with session_scope(engine, read_only=True) as session:
        features = session.scalars(select(Turn.features).join(Participant, Participant.id == Turn.participant_id)
                                   .where(Participant.code == code, Turn.speaker == "participant")
                                   .order_by(Turn.id)).all()
    return [(f["reliance_days"], f["reliance_drift"]) for f in features]


def test_asking_the_assistant_to_decide_on_several_days_gets_the_over_days_reason(
        engine: Engine, slug: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch) -> None:
    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        leaning, one_day, once, withdrawn = (participant(engine, client, slug) for _ in range(4))
        reasons: list[str] = []
        encoded: list[str] = []
        verdict = semantic._verdict

        def encoding(text: str) -> Any:
            encoded.append(text)
            return verdict(text)

        for day in range(3):
            # Others ask the same on the same days: the participant who will withdraw on days 1 and 2,
            # another three times in one day, another once.
            if day < 2:
                say(client, withdrawn, start_chat(client, withdrawn, "coach"), ASK)
            if day == 1:
                conversation = start_chat(client, one_day, "coach")
                one_day_reasons = [say(client, one_day, conversation, ASK)["rationale"] for _ in range(3)]
                once_reason = say(client, once, start_chat(client, once, "coach"), ASK)["rationale"]
            if day == 2:  # nothing earlier is encoded again: the count comes from the stored features
                semantic._recent.clear()
                monkeypatch.setattr(semantic, "_verdict", encoding)
            reply = say(client, leaning, start_chat(client, leaning, "coach"), ASK)  # a new conversation each day
            assert (reply["stance"], reply["concern"]) == ("challenge", "dependence")
            reasons.append(reply["rationale"])
            clock.advance(DAY)
        assert encoded == [ASK]
        withdrew = client.post("/api/v1/me/withdrawal", headers=withdrawn.headers,
                               json={"level": "stop_contact", "confirm": True})
        assert withdrew.status_code == 200, withdrew.text
        again = participant(engine, client, slug)  # the same person enrolling again is a new participant
        again_reason = say(client, again, start_chat(client, again, "coach"), ASK)["rationale"]

    assert [reason.startswith(PER_MESSAGE["challenge"]) for reason in reasons] == [True, True, False]
    assert reasons[2].startswith(OVER_DAYS.format(3)), reasons[2]
    assert "what would you choose if I weren't here?" in reasons[2]
    assert stored(engine, leaning.code) == [(1, False), (2, False), (3, True)]
    for reason in [*one_day_reasons, once_reason, again_reason]:
        assert reason.startswith(PER_MESSAGE["challenge"]), reason
    assert stored(engine, one_day.code) == [(1, False)] * 3
    assert stored(engine, once.code) == [(1, False)]
    assert stored(engine, again.code) == [(1, False)]


def test_the_count_spans_conversations_and_the_simulations_driver_reads_it_on_its_clock(
        engine: Engine, slug: str, clock: FrozenClock) -> None:
    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        who = participant(engine, client, slug)
    with session_scope(engine, read_only=True) as session:
        participant_id = session.scalars(select(Participant.id).where(Participant.code == who.code)).one()
    reasons: list[str] = []
    with asyncio.Runner() as runner:
        driver = Driver(engine, Gateway(Settings()), clock, runner, model=None)
        conversation = driver.start(participant_id, "collaborator")
        for day in (0, 3, 6, 7):  # the fourth day falls a week after the first: still three days in the window
            clock.set(START + day * DAY)
            reply = driver.send(participant_id, conversation, ASK, f"m{day}")
            with session_scope(engine, read_only=True) as session:
                reasons.append(session.get(Turn, reply.turn_id).rationale or "")  # type: ignore[union-attr]
            if day == 3:  # another conversation: every conversation of the participant counts
                conversation = driver.start(participant_id, "collaborator")
    assert reasons[0].startswith(PER_MESSAGE["nudge"])
    assert reasons[1].startswith(PER_MESSAGE["challenge"])  # the second day: raised again in the conversation
    assert reasons[2].startswith(OVER_DAYS.format(3)), reasons[2]  # a nudge: the first raised in this conversation
    assert "who else could you talk this through with?" in reasons[2]
    assert reasons[3].startswith(OVER_DAYS.format(3)), reasons[3]  # days 3, 6 and 7; day 0 left the window
    assert "what would you choose if I weren't here?" in reasons[3]  # raised again here: a challenge
    assert stored(engine, who.code) == [(1, False), (2, False), (3, True), (3, True)]


async def _memory(role: RoleName, clock: FrozenClock, steps: list[dt.timedelta]) -> list[dict[str, Any]]:
    store = turn.MemoryStore(role, system_prompt(role).text)
    for step in steps:
        clock.advance(step)
        await turn.answer(store, Gateway(Settings()), await store.accept(ASK))
    return store.replies


@pytest.mark.parametrize("role", ["collaborator", "coach"])
def test_the_evaluations_memory_store_counts_days_on_the_same_clock(role: RoleName, clock: FrozenClock) -> None:
    over_days = asyncio.run(_memory(role, clock, [dt.timedelta(0), DAY, DAY]))
    assert [r["concern"] for r in over_days] == ["dependence"] * 3
    assert over_days[-1]["rationale"].startswith(OVER_DAYS.format(3))
    assert "several days" in over_days[-1]["reply"]  # the offline model's reply follows the reason
    one_day = asyncio.run(_memory(role, clock, [DAY, dt.timedelta(hours=1), dt.timedelta(hours=1)]))
    assert not any(r["rationale"].startswith("Over the past week") for r in one_day)


def test_a_simulated_study_counts_reliance_on_its_own_clock(engine: Engine, example_protocol: str) -> None:
    """``afterward simulate`` runs weeks in the past on a frozen clock: the days counted are the
    simulation's, as the stored features and the reasons show."""
    slug = load_simulated_study(engine, example_protocol)
    leaning = Effects(framing_share=0.0, reassurance_share=0.0, distress_share=0.0, dependence_share=1.0,
                      conversations_per_week=7.0, extra_messages_mean=0.5)
    simulate(engine, slug, participants=4, weeks=2, seed=3, effects=leaning, start=START, tick_minutes=240)
    with session_scope(engine, read_only=True) as session:
        said = session.execute(select(Turn.participant_id, Turn.created_at, Turn.features, Participant.timezone)
                               .join(Participant, Participant.id == Turn.participant_id)
                               .where(Turn.speaker == "participant").order_by(Turn.id)).all()
        reasons = [r or "" for r in session.scalars(select(Turn.rationale).where(Turn.concern == "dependence"))]
    assert said
    earlier: dict[int, list[dt.datetime]] = {}
    for who, at, features, timezone in said:
        at = at.astimezone(dt.UTC)
        flagged = earlier.setdefault(who, [])
        if features["dependence_signal"]:
            flagged.append(at)
        assert features["reliance_days"] == drift.reliance_days(flagged, at, drift.zone(timezone))
    assert max(f["reliance_days"] for _, _, f, _ in said) >= drift.RELIANCE_MIN_DAYS
    assert any(reason.startswith("Over the past week") for reason in reasons)
    assert any(not reason.startswith("Over the past week") for reason in reasons)
