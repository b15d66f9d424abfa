"""Safety events and their check-ins on the chat tables: every risk finding recorded at its level,
the check-in it asks (``chat.triage``), answers by button or in words, and what the conversation
shows of it. Each function is a step inside the caller's transaction, like ``chat.service``.

- ``record_finding`` (from ``chat.service.record_reply``): a reply that checks in or escalates for
  a risk is a ``study.safety.SafetyEvent`` (``check_in`` or ``escalation``); for a risk to self or
  danger from others it also asks a check-in, and a ``check_in`` event then waits for its answers
  until the protocol's ``safety.triage.unanswered_after``. A newer check-in of the same kind in the
  conversation replaces the older one, so only one is answered at a time and only its deadline runs.
- ``answer`` (the API and the page's buttons) and ``read_words`` (from
  ``chat.service.accept_message``: the participant's message is stored as any other) record
  answers; ``chat.triage.decide`` sets the level. A message read as an answer is part of its
  check-in: a risk finding in it raises that event rather than raising another.
- ``on_withdrawal``: a check-in still awaiting answers will never be answered, so its event is
  unanswered at once (``study.safety.mark_unanswered``) and pages if the protocol says so: a risk
  already shown stays the study's to follow up (as on-call notices are not cancelled by
  withdrawal), while nothing more is shown to the participant (no follow-up message). With data
  deletion the check-in's links to turns go; its answers stay with the de-identified event.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from chat import triage
from chat.models import Turn
from chat.policy import AGREE, StanceDecision, default_rationale
from chat.roles import Concern
from study import audit
from study.clock import now
from study.errors import Conflict, DomainError, Invalid, NotFound
from study.i18n import gettext
from study.models import Participant, WithdrawalLevel
from study.protocol import Triage
from study.safety import CheckInKind, SafetyCheckIn, SafetyEvent, SafetyLevel, mark_unanswered
from study.studies import current_protocol

log = logging.getLogger("afterward.chat")
KINDS = frozenset(kind.value for kind in CheckInKind)  # the concerns a check-in is asked for
REPLACED = "a newer check-in in the conversation replaced it"


def _triage(session: Session, study_id: int) -> Triage:
    return current_protocol(session, study_id).safety.triage


def record_finding(session: Session, *, participant: Participant, conversation_id: int, reply: Turn,
                   participant_turn_id: int, stance: str, category: str, source: str,
                   cue: str | None) -> SafetyEvent | None:
    """Record the reply's risk finding: an escalation (any category) or a check-in for a risk to
    self or danger from others. Returns the event it is recorded on (None: the reply found none)."""
    if stance not in ("check_in", "escalate") or (stance == "check_in" and category not in KINDS):
        return None
    at, settings = now(), _triage(session, participant.study_id)
    level = SafetyLevel.ESCALATION if stance == "escalate" else SafetyLevel.CHECK_IN
    answered = _answered_by(session, conversation_id, participant_turn_id)
    if answered is not None and answered[0].kind == category:  # the same risk, told in answer to its check-in
        event = _locked_event(session, answered[0].safety_event_id)
        if event.raise_to(level, at, settings):
            _audit_raised(session, participant, event)
        return event
    asks = category in KINDS
    awaits = asks and level == SafetyLevel.CHECK_IN  # an escalation's check-in cannot raise it: no deadline
    event = SafetyEvent(study_id=participant.study_id, participant_id=participant.id, conversation_id=conversation_id,
                        turn_id=reply.id, category=category, source=source, cue=cue[:200] if cue else None,
                        created_at=at, level=level, page_since=at if settings.pages(level) else None,
                        answer_due_at=at + settings.unanswered_after if awaits else None)
    session.add(event)
    session.flush()  # committed with the reply; the dispatcher pages the on-call contacts (scheduler.oncall)
    audit.record(session, audit.Actor.system(), "chat.safety_escalation" if level == SafetyLevel.ESCALATION
                 else "chat.safety_check_in", study_id=participant.study_id, participant_code=participant.code,
                 conversation_id=conversation_id, category=category, event_id=event.id)
    if asks:
        _replace_open(session, conversation_id, CheckInKind(category), event.id)
        kind = CheckInKind(category)
        session.add(SafetyCheckIn(safety_event_id=event.id, turn_id=reply.id, kind=kind, created_at=at,
                                  questions=[{"id": q.id, "text": q.text, "version": triage.wording_version(kind)}
                                             for q in triage.QUESTIONS[kind]], answers={}))
        session.flush()
    return event


def _replace_open(session: Session, conversation_id: int, kind: CheckInKind, new_event_id: int) -> None:
    """Close the conversation's earlier check-ins of ``kind``: the newer one is the one to answer,
    and an earlier one's answers are no longer awaited (its deadline does not run)."""
    earlier = session.execute(
        select(SafetyCheckIn.id, SafetyCheckIn.safety_event_id).join(SafetyEvent, SafetyEvent.id ==
                                                                      SafetyCheckIn.safety_event_id)
        .where(SafetyEvent.conversation_id == conversation_id, SafetyCheckIn.kind == kind,
               SafetyCheckIn.closed_reason.is_(None), SafetyEvent.id != new_event_id)).all()
    if not earlier:
        return
    # The events first, then their check-ins: the order the dispatcher's deadline locks them in.
    session.execute(update(SafetyEvent).where(SafetyEvent.id.in_([row.safety_event_id for row in earlier]),
                                              SafetyEvent.unanswered_at.is_(None))
                    .values(answer_due_at=None).execution_options(synchronize_session=False))
    session.execute(update(SafetyCheckIn).where(SafetyCheckIn.id.in_([row.id for row in earlier]))
                    .values(closed_reason=REPLACED).execution_options(synchronize_session=False))


def _locked_event(session: Session, event_id: int) -> SafetyEvent:
    """The event, its row locked until commit: answers and the dispatcher's deadline take turns."""
    event = session.scalar(select(SafetyEvent).where(SafetyEvent.id == event_id).with_for_update()
                           .execution_options(populate_existing=True))
    if event is None:
        raise NotFound("this check-in no longer exists")
    return event


def _audit_raised(session: Session, participant: Participant, event: SafetyEvent) -> None:
    session.flush()
    audit.record(session, audit.Actor.system(), "chat.safety_level_raised", study_id=participant.study_id,
                 participant_code=participant.code, event_id=event.id, level=event.level)


# Answers


def check_in_of(session: Session, participant: Participant, conversation_id: int,
                check_in_id: int) -> tuple[SafetyCheckIn, SafetyEvent]:
    """The participant's check-in in their conversation, with its event. Raises NotFound."""
    row = session.execute(select(SafetyCheckIn, SafetyEvent).join(
        SafetyEvent, SafetyEvent.id == SafetyCheckIn.safety_event_id).where(
        SafetyCheckIn.id == check_in_id, SafetyEvent.conversation_id == conversation_id,
        SafetyEvent.participant_id == participant.id)).first()
    if row is None:
        raise NotFound(f"there is no check-in {check_in_id} in this conversation")
    return row[0], row[1]


def answer(session: Session, participant: Participant, conversation_id: int, check_in_id: int,
           answers: Mapping[str, str], *, given: triage.Given = "button", turn_id: int | None = None) -> SafetyCheckIn:
    """Record answers to the check-in's questions (question id -> yes, no or declined) and set its
    event's level by ``chat.triage.decide``. The same answer again changes nothing; a different
    answer to a question already answered is refused (409 ``already_answered``), and so is any
    answer to a check-in a newer one replaced (409 ``check_in_replaced``). Answers after the
    deadline are kept, and can raise the level, never lower it."""
    check_in, event = check_in_of(session, participant, conversation_id, check_in_id)
    event = _locked_event(session, event.id)
    session.refresh(check_in)  # read again under the event's lock: another answer may have just committed
    kind = CheckInKind(check_in.kind)
    ids = [q.id for q in triage.QUESTIONS[kind]]
    for question, value in answers.items():
        if question not in ids:
            raise Invalid(f"this check-in has no question '{question}'; its questions are {', '.join(ids)}",
                          code="unknown_question")
        if value not in triage.ANSWERS:
            raise Invalid(f"answer '{question}' with yes, no or declined (prefer not to say)", code="invalid_answer")
    if check_in.closed_reason is not None:
        raise Conflict("a newer check-in has replaced this one; please answer that one instead, further down the "
                       "conversation", code="check_in_replaced")
    recorded = dict(check_in.answers or {})
    for question, value in answers.items():
        before = recorded.get(question)
        if before is not None and before["answer"] != value:
            said = triage.ANSWER_LABELS[before["answer"]]
            raise Conflict(f"you already answered this question ({said}). If something has changed, tell the "
                           "assistant in a message, or reach one of the services shown.", code="already_answered")
    new = {question: value for question, value in answers.items() if question not in recorded}
    if not new:
        return check_in
    at = now()
    for question, value in new.items():
        recorded[question] = {"answer": value, "given": given, "at": at.isoformat(),
                              **({"turn_id": turn_id} if turn_id is not None else {})}
    check_in.answers = recorded
    _settle(session, participant, check_in, event, at)
    audit.record(session, audit.Actor.system(), "chat.check_in_answered", study_id=participant.study_id,
                 participant_code=participant.code, event_id=event.id, questions=sorted(new), given=given)
    return check_in


def _settle(session: Session, participant: Participant, check_in: SafetyCheckIn, event: SafetyEvent,
            at: dt.datetime) -> None:
    """Apply the rule to the answers so far: once they decide, the check-in is answered (its
    deadline stops, under the event's lock) and the event rises to the level they give."""
    decision = triage.decide(CheckInKind(check_in.kind), _values(check_in))
    if decision is None:
        session.flush()
        return
    if check_in.answered_at is None:
        check_in.answered_at = at
    if event.unanswered_at is None:
        event.answer_due_at = None
    if event.raise_to(decision.level, at, _triage(session, participant.study_id)):
        _audit_raised(session, participant, event)
    session.flush()


def _values(check_in: SafetyCheckIn) -> dict[str, str]:
    return {question: str(given["answer"]) for question, given in (check_in.answers or {}).items()}


def read_words(session: Session, participant: Participant, conversation_id: int, turn: Turn) -> None:
    """Read the participant's new message as answers to the conversation's current check-in
    (``current``), if it answers it (``chat.triage.read_words``): a short yes or no answers the
    question being asked (while its answers have not decided yet), an explicit statement its own
    question (also after: "i have a plan" raises a check-in answered no). The message itself is
    stored and answered like any other."""
    found = current(session, conversation_id, before_seq=turn.seq)
    if found is None:
        return
    kind = CheckInKind(found.kind)
    reading = triage.read_words(turn.content, kind)
    answers = dict(reading.specific)  # once answered, only these: "no" then answers no question
    asking = triage.next_question(kind, {**_values(found), **answers})
    if reading.answer is not None and asking is not None and found.answered_at is None:
        answers.setdefault(asking, reading.answer)
    recorded = _values(found)  # an answer given stands (``answer`` would refuse another)
    answers = {question: value for question, value in answers.items() if question not in recorded}
    if not answers:
        return
    try:
        answer(session, participant, conversation_id, found.id, answers, given="words", turn_id=turn.id)
    except DomainError:  # replaced or answered meanwhile: the message is still the participant's to send
        log.warning("conversation %s: message %s was not read as answers to check-in %s", conversation_id,
                    turn.id, found.id, exc_info=True)


def current(session: Session, conversation_id: int, *, before_seq: int | None = None) -> SafetyCheckIn | None:
    """The check-in the conversation is on now: its newest one still open, when every participant
    message after it (before ``before_seq``) reads as answering it (or trying to). A conversation
    that moved on leaves it where it was asked; it can still be answered there."""
    found = session.execute(
        select(SafetyCheckIn, Turn.seq).join(SafetyEvent, SafetyEvent.id == SafetyCheckIn.safety_event_id)
        .join(Turn, Turn.id == SafetyCheckIn.turn_id).where(SafetyEvent.conversation_id == conversation_id,
                                                             SafetyCheckIn.closed_reason.is_(None))
        .order_by(SafetyCheckIn.id.desc()).limit(1)).first()
    if found is None:
        return None
    check_in, asked_at_seq = found
    later = select(Turn.content).where(Turn.conversation_id == conversation_id, Turn.speaker == "participant",
                                       Turn.seq > asked_at_seq)
    if before_seq is not None:
        later = later.where(Turn.seq < before_seq)
    kind = CheckInKind(check_in.kind)
    for content in session.scalars(later):
        reading = triage.read_words(content, kind)
        if not (reading.answers_anything or reading.unclear):
            return None
    return check_in


def _answered_by(session: Session, conversation_id: int, turn_id: int) -> tuple[SafetyCheckIn, SafetyEvent] | None:
    """The conversation's check-in that the participant's message ``turn_id`` was read as answering."""
    rows = session.execute(select(SafetyCheckIn, SafetyEvent).join(
        SafetyEvent, SafetyEvent.id == SafetyCheckIn.safety_event_id).where(
        SafetyEvent.conversation_id == conversation_id).order_by(SafetyCheckIn.id.desc())).all()
    for check_in, event in rows:
        if any(given.get("turn_id") == turn_id for given in (check_in.answers or {}).values()):
            return check_in, event
    return None


def reply_to_answer(session: Session, conversation_id: int, participant_turn_id: int, content: str,
                    final: StanceDecision) -> tuple[StanceDecision, str] | None:
    """The platform's reply to a message read as answering a check-in: thanks and what comes
    next (a reply is not the place to push back on "no"); an escalation when its answers escalated
    the event, so the reply shows the crisis resources. For words it could not read, how to answer.
    None: the message is not about a check-in, or it raised a concern of its own (a decline, a
    safety stance for words it could not read), and the policy's reply stands."""
    if final.stance == "decline":
        return None
    def say(text: str) -> str:  # in the participant's language (a query only when the platform replies)
        language = session.scalar(select(Participant.language).join(Turn, Turn.participant_id == Participant.id)
                                  .where(Turn.id == participant_turn_id))
        return gettext(language or "en", text)

    answered = _answered_by(session, conversation_id, participant_turn_id)
    if answered is not None:
        check_in, event = answered
        note = next_step(session, check_in, event) if check_in.answered_at is not None else None
        note = say(note) if note is not None else None
        if event.level == SafetyLevel.ESCALATION and note is not None:
            kind: Concern = "risk_to_self" if check_in.kind == CheckInKind.RISK_TO_SELF else "risk_from_others"
            return StanceDecision("escalate", kind, default_rationale(kind, "escalate")), note
        stance = final if final.stance in ("check_in", "escalate") else AGREE
        return stance, note or say(triage.NEXT_QUESTION_REPLY)
    if final.stance in ("check_in", "escalate"):
        return None
    seq = session.scalar(select(Turn.seq).where(Turn.id == participant_turn_id))
    found = current(session, conversation_id, before_seq=seq)
    if found is not None and found.answered_at is None and triage.read_words(content, CheckInKind(found.kind)).unclear:
        return AGREE, say(triage.UNCLEAR_REPLY)
    return None


def next_step(session: Session, check_in: SafetyCheckIn, event: SafetyEvent) -> str | None:
    """What happens next, once the answers decided the level (None before)."""
    decision = triage.decide(CheckInKind(check_in.kind), _values(check_in))
    if check_in.answered_at is None or decision is None:
        return None
    protocol = current_protocol(session, event.study_id)
    level = SafetyLevel(event.level)
    paged = protocol.safety.triage.pages(level) and bool(protocol.safety.contacts)
    return triage.next_step(level, decision.outcome, paged=paged)


# What the conversation shows


def of_conversation(session: Session, conversation_id: int) -> dict[int, tuple[SafetyCheckIn, SafetyEvent]]:
    """The conversation's check-ins with their events, by the reply turn that asked each."""
    rows = session.execute(select(SafetyCheckIn, SafetyEvent).join(
        SafetyEvent, SafetyEvent.id == SafetyCheckIn.safety_event_id).where(
        SafetyEvent.conversation_id == conversation_id, SafetyCheckIn.turn_id.is_not(None)))
    return {check_in.turn_id: (check_in, event) for check_in, event in rows if check_in.turn_id is not None}


def by_event(session: Session, event_ids: Sequence[int]) -> dict[int, SafetyCheckIn]:
    """The check-ins of these safety events (one query), by event id."""
    if not event_ids:
        return {}
    return {check_in.safety_event_id: check_in for check_in in session.scalars(
        select(SafetyCheckIn).where(SafetyCheckIn.safety_event_id.in_(list(event_ids))))}


@dataclass(frozen=True)
class Summary:
    """What a check-in's answers say, for staff: the rule's outcome, or why there is none."""

    outcome: str | None
    status: str  # open | answered | unanswered | replaced

    @classmethod
    def of(cls, check_in: SafetyCheckIn, event: SafetyEvent) -> Summary:
        decision = triage.decide(CheckInKind(check_in.kind), _values(check_in))
        status = ("replaced" if check_in.closed_reason is not None and check_in.answered_at is None else
                  "answered" if check_in.answered_at is not None else
                  "unanswered" if event.unanswered_at is not None else "open")
        return cls(decision.outcome if decision is not None else None, status)


# Withdrawal


def on_withdrawal(session: Session, participant: Participant, level: WithdrawalLevel) -> None:
    """A check-in still awaiting answers will never be answered: its event is unanswered now and
    pages if the protocol says so (the study follows up a risk already shown), but nothing more
    is shown to the participant. With data deletion, the check-ins' links to turns are cleared
    (run before ``chat.service.deidentify_safety_events``, while the events still name them)."""
    at = now()
    pending = session.scalars(select(SafetyEvent.id).where(
        SafetyEvent.participant_id == participant.id, SafetyEvent.answer_due_at.is_not(None),
        SafetyEvent.unanswered_at.is_(None)).order_by(SafetyEvent.id)).all()
    if pending:
        settings = _triage(session, participant.study_id)
        for event_id in pending:
            if mark_unanswered(session, event_id, at, settings, due=False):
                audit.record(session, audit.Actor.system(), "chat.check_in_unanswered", study_id=participant.study_id,
                             participant_code=participant.code, event_id=event_id, reason="participant withdrew")
    if level != WithdrawalLevel.DELETE_DATA:
        return
    owned = select(SafetyEvent.id).where(SafetyEvent.participant_id == participant.id)
    for check_in in session.scalars(select(SafetyCheckIn).where(SafetyCheckIn.safety_event_id.in_(owned))):
        check_in.turn_id = None
        check_in.answers = {question: {key: value for key, value in given.items() if key != "turn_id"}
                            for question, given in (check_in.answers or {}).items()}
    session.flush()
