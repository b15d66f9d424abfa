"""Safety rules on survey answers: the protocol's ``safety.answer_rules`` (``study.protocol.AnswerRule``),
read as answers arrive. An answer at or above a rule's threshold (the PHQ-9's ninth item above 0, say)
raises a safety event of the rule's level at once, in the transaction that stores the answer, so it
is never lost: the participant is shown the crisis resources (``notice``), and the dispatcher pages
the on-call contacts through the same durable path as a chat escalation (``scheduler.oncall``) when
the protocol's ``safety.triage.page`` lists the level. An item rule is read on every save, partial
ones too (someone may answer and leave); a score rule when the survey is submitted. One event per
rule and response, however often the answer is saved.

The event's cue names the response, the rule and the value (``response 12 · rule phq9-item9:
phq9_9 = 2``): answers on a fixed scale, never free text, and cleared like any cue when the
participant deletes their data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from study import audit
from study.clock import now
from study.models import Participant
from study.protocol import AnswerRule, Protocol
from study.safety import SafetyEvent, SafetyLevel
from study.studies import current_protocol
from surveys.models import SurveyResponse

SOURCE = "survey"


@dataclass(frozen=True)
class SafetyNotice:
    """What a participant whose answers raised a safety event is shown at once."""

    region: str
    resources: str
    message: str = ("Some of your answers tell us you may be going through a very hard time. You do not have to "
                    "face it alone: the people below can help right now. A member of the study team will see "
                    "these answers.")


def _cue_prefix(response: SurveyResponse, rule: AnswerRule | None = None) -> str:
    return f"response {response.id} · rule {rule.id}:" if rule is not None else f"response {response.id} · rule "


def _met(rule: AnswerRule, answers: dict[str, Any], scores: dict[str, float | None]) -> float | None:
    value = answers.get(rule.item) if rule.item is not None else scores.get(rule.score or "")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= rule.at_least else None


def apply(session: Session, participant: Participant, response: SurveyResponse,
          scores: dict[str, float | None] | None = None, *, created: bool = False) -> SafetyNotice | None:
    """Raise an event for each of the study's rules on this instrument that ``response``'s answers
    (and ``scores``, once submitted) now meet and that has none for this response yet; returns the
    notice to show when the response has an event (raised now or at an earlier save), else None.
    A response ``created`` in this unit of work can have no earlier event, so none is read; any other
    reads its events once, for the rules and the notice alike."""
    protocol = current_protocol(session, participant.study_id)
    rules = [rule for rule in protocol.safety.answer_rules if rule.instrument == response.instrument_id
             and (rule.item is not None or scores is not None)]
    earlier = [] if created else list(session.scalars(_events_of(participant, response, SafetyEvent.cue)))
    raised = False
    for rule in rules:
        value = _met(rule, response.answers, scores or {})
        if value is None or any(cue.startswith(_cue_prefix(response, rule)) for cue in earlier):
            continue
        at, level = now(), SafetyLevel(rule.level)
        event = SafetyEvent(study_id=participant.study_id, participant_id=participant.id, category=rule.category,
                            source=SOURCE, cue=f"{_cue_prefix(response, rule)} {rule.item or rule.score} = {value:g}",
                            created_at=at, level=level,
                            page_since=at if protocol.safety.triage.pages(level) else None)
        session.add(event)
        session.flush()
        audit.record(session, audit.Actor.system(), "survey.safety_rule", study_id=participant.study_id,
                     participant_code=participant.code, rule=rule.id, instrument=response.instrument_id,
                     level=level, event_id=event.id)
        raised = True
    return _notice(protocol, participant) if raised or earlier else None


def _events_of(participant: Participant, response: SurveyResponse, column: Any) -> Select[Any]:
    """SQL: ``column`` of the safety events the response's answers raised."""
    return select(column).where(SafetyEvent.participant_id == participant.id, SafetyEvent.source == SOURCE,
                                SafetyEvent.cue.startswith(_cue_prefix(response), autoescape=True))


def _notice(protocol: Protocol, participant: Participant) -> SafetyNotice:
    region, text = protocol.crisis_resources_for(participant.timezone)
    return SafetyNotice(region=region, resources=text)


def notice(session: Session, participant: Participant, assignment_id: int) -> SafetyNotice | None:
    """The notice to show with the answers to the assignment when they raised a safety event (now
    or at an earlier save), with the crisis resources for the participant's region; None otherwise."""
    return notice_for(session, participant,
                      session.scalar(select(SurveyResponse).where(SurveyResponse.assignment_id == assignment_id)))


def notice_for(session: Session, participant: Participant, response: SurveyResponse | None) -> SafetyNotice | None:
    """``notice`` for the response in hand (one stored earlier), without reading it again."""
    if response is None or session.scalar(_events_of(participant, response, SafetyEvent.id).limit(1)) is None:
        return None
    return _notice(current_protocol(session, participant.study_id), participant)
