"""Builder steps the panel tests need on top of ``StudyBuilder``: answering a survey, withdrawing,
and running the real dispatcher's tick (which opens and expires follow-ups) at the frozen time."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from scheduler.dispatcher import Dispatcher
from study import participants
from study.db import session_scope
from study.models import WithdrawalLevel
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
            surveys.submit(session, who, assignment, answers, submission_id=f"{code}-{assignment.id}")

    def withdraw(self, code: str, level: WithdrawalLevel) -> None:
        with session_scope(self.engine) as session:
            participants.withdraw(session, self._participant(session, code), level, TEST_ACTOR)
