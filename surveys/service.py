"""Survey operations: assign, render (with piping), save partial answers, submit and score, and
signed one-time survey links. Services flush; the caller commits."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from study import wiring
from study.clock import now
from study.errors import Conflict, Forbidden, Gone, Invalid, NotFound
from study.models import Participant
from study.participants import require_current_consent
from study.settings import get_settings
from surveys import registry, safety_rules
from surveys.definitions import Instrument
from surveys.models import SurveyAssignment, SurveyResponse, SurveyScore


class AnswerError(Invalid):
    """Answers that do not fit the instrument; ``problems`` is a list of (item id, message)."""

    code = "invalid_answers"

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.fields = [{"field": item, "message": problem} for item, problem in problems]
        super().__init__("; ".join(f"{item}: {problem}" for item, problem in problems))


def assign(
    session: Session, participant: Participant, instrument_id: str, *, purpose: str,
    intended_at: dt.datetime | None = None, closes_at: dt.datetime | None = None,
    followup_key: str | None = None, context: dict[str, str] | None = None,
) -> SurveyAssignment:
    instrument = registry.get(session, instrument_id)
    missing = set(instrument.context) - set(context or {})
    if missing:
        raise Conflict(f"{instrument_id} needs {', '.join(sorted(missing))} to be piped in")
    assignment = SurveyAssignment(
        participant_id=participant.id, instrument_id=instrument.id, instrument_version=instrument.version,
        purpose=purpose, followup_key=followup_key, context=context or {},
        intended_at=intended_at or now(), closes_at=closes_at, status="open")
    session.add(assignment)
    session.flush()
    return assignment


def assign_baseline(session: Session, participant: Participant, instrument_ids: list[str]) -> list[SurveyAssignment]:
    """Baseline surveys, once, when enrollment completes."""
    already = set(session.scalars(select(SurveyAssignment.instrument_id).where(
        SurveyAssignment.participant_id == participant.id, SurveyAssignment.purpose == "baseline")))
    return [assign(session, participant, i, purpose="baseline") for i in instrument_ids if i not in already]


def pending(session: Session, participant: Participant) -> list[SurveyAssignment]:
    """Open surveys the participant can answer now, oldest first."""
    at = now()
    return list(session.scalars(select(SurveyAssignment).where(
        SurveyAssignment.participant_id == participant.id, SurveyAssignment.status == "open",
        SurveyAssignment.intended_at <= at,
        or_(SurveyAssignment.closes_at.is_(None), SurveyAssignment.closes_at > at),
    ).order_by(SurveyAssignment.intended_at, SurveyAssignment.id)))


NOT_YOURS = "there is no such survey for you"  # someone else's survey looks exactly like a missing one


def owned_assignment(session: Session, participant: Participant, assignment_id: int) -> SurveyAssignment:
    assignment = session.get(SurveyAssignment, assignment_id)
    if assignment is None or assignment.participant_id != participant.id:
        raise NotFound(NOT_YOURS)
    return assignment


def _require_answerable(assignment: SurveyAssignment) -> None:
    if assignment.status == "completed":
        raise Conflict("you have already completed this survey, thank you", code="already_completed")
    if assignment.status == "cancelled":
        raise Gone("this survey was cancelled", code="survey_cancelled")
    if assignment.status == "expired" or (assignment.closes_at is not None and assignment.closes_at <= now()):
        closed = f" on {assignment.closes_at:%Y-%m-%d %H:%M} UTC" if assignment.closes_at else ""
        raise Gone(f"this survey closed{closed}; answers can no longer be accepted", code="survey_closed")
    if assignment.intended_at > now():
        raise Conflict("this survey is not open yet", code="survey_not_open")


def closed_reason(assignment: SurveyAssignment) -> str | None:
    """Why this survey cannot be answered now (for pages), or None."""
    try:
        _require_answerable(assignment)
    except (Conflict, Gone) as exc:
        return exc.message
    return None


@dataclass(frozen=True)
class RenderedSurvey:
    assignment: SurveyAssignment
    instrument: Instrument  # as shown: in the participant's language when the study team translated it
    instructions: str
    items: list[dict[str, Any]]
    saved_answers: dict[str, Any]
    language: str = "en"


def shown(session: Session, assignment: SurveyAssignment) -> tuple[Instrument, str]:
    """The assignment's instrument as its participant reads it, and that language: theirs when the
    study team's translation of this version is loaded (a study that offers the language has one)."""
    instrument = registry.get(session, assignment.instrument_id, assignment.instrument_version)
    participant = session.get(Participant, assignment.participant_id)
    language = participant.language if participant is not None else None
    if assignment.purpose == "exit" and language:  # the exit check asks in the interface's words, in theirs
        return instrument, language
    return registry.in_language(session, instrument, language)


def render(session: Session, assignment: SurveyAssignment) -> RenderedSurvey:
    instrument, language = shown(session, assignment)
    response = _response(session, assignment)
    items = []
    for item in instrument.items:
        rendered = item.model_dump(mode="json", exclude={"reverse"})
        rendered["text"] = instrument.pipe(item.text, assignment.context)
        items.append(rendered)
    # Answers are shown back only while the survey is open: a submitted survey's link shows "done".
    saved = dict(response.answers) if response and assignment.status == "open" else {}
    return RenderedSurvey(assignment, instrument, instrument.pipe(instrument.instructions, assignment.context),
                          items, saved, language)


def _response(session: Session, assignment: SurveyAssignment) -> SurveyResponse | None:
    """The assignment's response as stored now (a copy already in the session is refreshed)."""
    return session.scalar(select(SurveyResponse).where(SurveyResponse.assignment_id == assignment.id)
                          .execution_options(populate_existing=True))


@dataclass(frozen=True)
class Stored:
    """What a save or a submit stored, with what its unit of work already knows, so that nothing is
    read back: the response, the scores (a submit's as computed, a repeated submission's as stored;
    none for a save) and the safety notice to show (``safety_rules.apply``), or None."""

    assignment: SurveyAssignment
    response: SurveyResponse
    scores: list[SurveyScore]
    notice: safety_rules.SafetyNotice | None


def _locked(session: Session, participant: Participant, assignment_id: int) -> tuple[SurveyAssignment,
                                                                                     SurveyResponse, bool]:
    """The participant's assignment with its response, created if missing (and True when created
    now), the assignment row locked first: two requests for one survey (an autosave and "Next", a
    double submit) take turns instead of racing to insert the same response. The locking read is
    also the ownership check: someone else's survey is refused as a missing one. The response is
    read by a statement of its own: on PostgreSQL a statement that waited for the lock sees the locked
    row as it is now but every other table as it was when it began, so a response the lock's holder
    inserted would be missed and inserted again (tests/api/test_concurrency.py)."""
    assignment = session.scalar(
        select(SurveyAssignment)
        .where(SurveyAssignment.id == assignment_id, SurveyAssignment.participant_id == participant.id)
        .with_for_update().execution_options(populate_existing=True))
    if assignment is None:
        raise NotFound(NOT_YOURS)
    response = _response(session, assignment)
    if response is not None:
        return assignment, response, False
    response = SurveyResponse(assignment_id=assignment.id, participant_id=assignment.participant_id,
                              instrument_id=assignment.instrument_id,
                              instrument_version=assignment.instrument_version, answers={})
    session.add(response)
    return assignment, response, True


def save_partial(session: Session, participant: Participant, assignment_id: int,
                 answers: dict[str, Any]) -> Stored:
    """Merge answers into the saved ones (resume later, from any device); ``None`` clears one.
    The caller has checked consent (``api.deps.run_as_consented`` or ``assignment_for_link``)."""
    assignment, response, created = _locked(session, participant, assignment_id)
    _require_answerable(assignment)
    instrument = registry.get(session, assignment.instrument_id, assignment.instrument_version)
    clean, problems = instrument.check_answers(answers, complete=False)
    if problems:
        raise AnswerError(problems)
    cleared = {k for k, v in answers.items() if v is None or v == "" or v == []}
    response.answers = {k: v for k, v in {**response.answers, **clean}.items() if k not in cleared}
    response.language = shown(session, assignment)[1]
    response.updated_at = now()
    session.flush()
    return Stored(assignment, response, [], safety_rules.apply(session, participant, response, created=created))


def submit(session: Session, participant: Participant, assignment_id: int,
           answers: dict[str, Any], submission_id: str) -> Stored:
    """Validate the whole survey, score it, read it with the protocol's safety rules
    (``surveys.safety_rules``) and close the assignment. Submitting the same
    ``submission_id`` again returns the stored response instead of storing another. The caller
    has checked consent."""
    assignment, response, created = _locked(session, participant, assignment_id)
    if response.submitted_at is not None and response.submission_id == submission_id:
        return Stored(assignment, response, scores(session, response),
                      safety_rules.notice_for(session, participant, response))
    _require_answerable(assignment)
    instrument = registry.get(session, assignment.instrument_id, assignment.instrument_version)
    merged = {**response.answers, **answers}
    clean, problems = instrument.check_answers(merged, complete=True)
    if problems:
        raise AnswerError(problems)
    response.answers = clean
    response.language = shown(session, assignment)[1]
    response.submission_id = submission_id
    response.updated_at = response.submitted_at = now()
    assignment.status = "completed"
    assignment.completed_at = response.submitted_at
    session.flush()
    scored = [SurveyScore(response_id=response.id, participant_id=participant.id,
                          instrument_version=instrument.version, name=name, value=value,
                          n_items=n_items, n_expected=n_expected)
              for name, (value, n_items, n_expected) in instrument.score(clean).items()]
    session.add_all(scored)
    session.flush()
    notice = safety_rules.apply(session, participant, response, {s.name: s.value for s in scored}, created=created)
    run_completion_hooks(session, assignment)
    return Stored(assignment, response, scored, notice)


def wave_of(assignment: SurveyAssignment) -> str:
    """The wave an assignment belongs to: ``baseline``, a follow-up id, or its purpose (``exit``)."""
    return assignment.followup_key or assignment.purpose


def run_completion_hooks(session: Session, assignment: SurveyAssignment) -> None:
    """In the submitting transaction: what the packages wired for a completed survey (the scheduler
    stops its follow-up's reminders). Wires the process first if its entry point has not."""
    for hook in wiring.wire().completion_hooks:
        hook(session, assignment)


def scores(session: Session, response: SurveyResponse) -> list[SurveyScore]:
    """The response's scores, in the order they were computed."""
    return list(session.scalars(select(SurveyScore).where(SurveyScore.response_id == response.id)
                                .order_by(SurveyScore.id)))


def recompute_scores(session: Session, response: SurveyResponse) -> list[SurveyScore]:
    """Scores again from the raw answers (e.g. after a scoring fix); replaces the stored ones."""
    instrument = registry.get(session, response.instrument_id, response.instrument_version)
    for old in session.scalars(select(SurveyScore).where(SurveyScore.response_id == response.id)):
        session.delete(old)
    session.flush()
    scores = [SurveyScore(response_id=response.id, participant_id=response.participant_id,
                          instrument_version=instrument.version, name=name, value=value,
                          n_items=n_items, n_expected=n_expected)
              for name, (value, n_items, n_expected) in instrument.score(response.answers).items()]
    session.add_all(scores)
    session.flush()
    return scores


# Signed one-time links: the link names one assignment of one participant; it stops working
# when the survey is completed, closed or the participant withdraws.

def _sign(payload: bytes) -> str:
    key = get_settings().secret_key.get_secret_value().encode()
    return base64.urlsafe_b64encode(hmac.new(key, b"survey-link:" + payload, hashlib.sha256).digest()[:18]).decode()


def link_token(assignment: SurveyAssignment) -> str:
    payload = f"{assignment.id}.{assignment.participant_id}".encode()
    return base64.urlsafe_b64encode(payload).decode().rstrip("=") + "." + _sign(payload)


def assignment_for_link(
    session: Session, token: str, caller: Participant | None,
) -> tuple[SurveyAssignment, Participant]:
    """The link's assignment and participant; refused for a forged link, a participant other
    than the signed-in one, a withdrawn participant or one without current consent."""
    body, _, signature = token.partition(".")
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        assignment_id, participant_id = (int(part) for part in payload.decode().split("."))
    except ValueError:
        raise NotFound("this survey link is not valid; use the newest email or open the app") from None
    if not hmac.compare_digest(_sign(payload), signature):
        raise NotFound("this survey link is not valid; use the newest email or open the app")
    if caller is not None and caller.id != participant_id:
        raise Forbidden("this survey link belongs to another participant", code="link_other_participant")
    assignment = session.get(SurveyAssignment, assignment_id)
    participant = session.get(Participant, participant_id)
    if assignment is None or participant is None or assignment.participant_id != participant.id:
        raise NotFound("this survey no longer exists")
    require_current_consent(session, participant)
    return assignment, participant


def cancel_open_assignments(session: Session, participant: Participant, _level: object) -> None:
    """Withdrawal hook: nothing stays pending for a withdrawn participant."""
    session.execute(update(SurveyAssignment).where(
        SurveyAssignment.participant_id == participant.id, SurveyAssignment.status == "open",
    ).values(status="cancelled"))


def wire_lifecycle(lifecycle: wiring.Lifecycle) -> None:
    """The ``afterward.lifecycle`` entry point (pyproject.toml): withdrawal cancels open surveys,
    deletion removes assignments, responses and scores."""
    lifecycle.on_withdrawal(cancel_open_assignments)
    lifecycle.research_data(SurveyAssignment, SurveyResponse, SurveyScore)
