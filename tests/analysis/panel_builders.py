"""Builder steps the panel tests need on top of ``StudyBuilder``: answering a survey, withdrawing,
and running the real dispatcher's tick (which opens and expires follow-ups) at the frozen time;
and small studies described person by person (``Person``, ``populate``) for the disclosure tests."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from chat.service import review_safety_event
from scheduler.dispatcher import Dispatcher
from study import participants
from study.clock import FrozenClock
from study.db import session_scope
from study.models import WithdrawalLevel
from study.safety import SafetyEvent
from study.settings import Settings
from surveys import service as surveys
from surveys.models import SurveyAssignment
from tests.analysis.builders import StudyBuilder
from tests.builders import TEST_ACTOR

PERMA_DOMAINS = {"P": "positive_emotion", "E": "engagement", "R": "relationships", "M": "meaning",
                 "A": "accomplishment", "N": "negative_emotion", "H": "health"}


def perma_answers(domains: dict[str, int], loneliness: int, happiness: int) -> dict[str, int]:
    """Every PERMA-Profiler item: the three items of domain letter X all get ``domains[X]``."""
    answers = {f"{letter}{i}": domains[letter] for letter in PERMA_DOMAINS for i in (1, 2, 3)}
    return {**answers, "Lon": loneliness, "hap": happiness}


class PanelBuilder(StudyBuilder):
    def __init__(self, engine: Any, protocol_yaml: str) -> None:
        super().__init__(engine, protocol_yaml)
        # No sending channels: the in-app invitation is recorded as delivered when a survey opens.
        self.dispatcher = Dispatcher(engine, Settings(), name="panel-test", channels={})

    def tick(self) -> None:
        report = self.dispatcher.tick()
        assert not report.errors, report.errors

    def answer(self, code: str, *, purpose: str, instrument: str, answers: dict[str, Any]) -> None:
        """Submit the participant's one open survey of ``instrument`` and ``purpose``."""
        with session_scope(self.engine) as session:
            who = self._participant(session, code)
            assignment = session.scalars(select(SurveyAssignment).where(
                SurveyAssignment.participant_id == who.id, SurveyAssignment.purpose == purpose,
                SurveyAssignment.instrument_id == instrument, SurveyAssignment.status == "open")).one()
            surveys.submit(session, who, assignment.id, answers, submission_id=f"{code}-{assignment.id}")

    def withdraw(self, code: str, level: WithdrawalLevel) -> None:
        with session_scope(self.engine) as session:
            participants.withdraw(session, self._participant(session, code), level, TEST_ACTOR)


@dataclass(frozen=True)
class Person:
    """One participant of a small study for the disclosure tests, and what they do."""

    arm: str  # wellbeing or control
    baseline: int | None = None  # every PERMA-Profiler item at this value, or no baseline answered
    chats: bool = False  # one conversation (coach, or the standard assistant)
    crisis: bool = False  # ... with a crisis message (a safety event)
    reviewed: bool = False  # ... which staff then review
    decides: bool = False  # ... ending with a decision
    withdraws: WithdrawalLevel | None = None


def populate(build: PanelBuilder, people: list[Person], clock: FrozenClock) -> list[str]:
    """Enroll ``people`` and play what each does through the real services, a minute apart; their codes."""
    codes = [build.participant(person.arm) for person in people]
    for code, person in zip(codes, people, strict=True):
        clock.advance(dt.timedelta(minutes=1))
        if person.baseline is not None:
            build.answer(code, purpose="baseline", instrument="perma-profiler",
                         answers=perma_answers(dict.fromkeys("PERMANH", person.baseline), person.baseline,
                                               person.baseline))
        if person.chats:
            conversation = build.start(code, "coach" if person.arm == "wellbeing" else None)
            build.say(code, conversation, "Help me plan my week", "Start with Monday.")
            if person.crisis:
                build.say(code, conversation, "I want to kill myself", "Please call 988 now.")
            build.end(code, conversation, rating=4, decision="Take the course" if person.decides else None)
        if person.crisis and person.reviewed:
            with session_scope(build.engine) as session:
                who = build._participant(session, code)
                for event in session.scalars(select(SafetyEvent).where(SafetyEvent.participant_id == who.id)):
                    review_safety_event(session, event, "reviewer@uni.example", "Called; safe.")
    clock.advance(dt.timedelta(minutes=1))
    for code, person in zip(codes, people, strict=True):
        if person.withdraws is not None:
            build.withdraw(code, person.withdraws)
    build.tick()
    return codes
