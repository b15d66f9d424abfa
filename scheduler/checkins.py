"""Check-ins past their deadline: the dispatcher's phase that makes a safety check-in unanswered.

A risk finding met by a check-in (``chat.check_ins``) waits for its answers until the protocol's
``safety.triage.unanswered_after``. Each poll, this phase takes the events whose answers are due
and not given, and makes each ``unanswered`` by one conditional UPDATE
(``study.safety.mark_unanswered``): however many dispatchers poll at once, one of them does it,
exactly once, and an answer that settles the check-in first wins over it. The same transaction
applies the protocol's ``on_unanswered``: ``page`` (the event pages from now: the on-call planning
that follows in the same tick notifies the contacts) and ``follow_up`` (the participant is shown
a follow-up message in the conversation; never to a participant who has withdrawn, whom the study
does not contact again).

Each event is its own transaction: one that fails is logged, raises a staff alert at once (a
check-in nobody hears of is a safety problem) and is tried again at the next poll; the others go on.
"""

from __future__ import annotations

import logging

from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from scheduler.channels import DeliveryError
from scheduler.scope import LIVE, Scope
from scheduler.tick import SCHEDULER_ALERTS, TickReport, describe, record_alert
from study import audit
from study.clock import now
from study.db import session_scope
from study.models import Participant
from study.safety import SafetyCheckIn, SafetyEvent, mark_unanswered
from study.studies import current_protocol

log = logging.getLogger("afterward.scheduler")


def mark_unanswered_due(engine: Engine, report: TickReport, scope: Scope = LIVE) -> None:
    """Make every check-in of the ``scope``'s studies whose answers are past due unanswered, and
    apply ``on_unanswered``."""
    at = now()
    with session_scope(engine, read_only=True) as session:
        due = session.execute(select(SafetyEvent.id, SafetyEvent.study_id).where(
            SafetyEvent.answer_due_at <= at, SafetyEvent.unanswered_at.is_(None),
            scope.covers(SafetyEvent.study_id)).order_by(SafetyEvent.id)).all()
    for event_id, study_id in due:
        try:
            with session_scope(engine) as session:
                if _unanswered(session, event_id, study_id):
                    report.unanswered += 1
        except Exception as exc:
            log.exception("safety event %s: its check-in could not be marked unanswered", event_id)
            report.errors.append(f"safety event {event_id}: its check-in could not be marked unanswered: "
                                 f"{describe(exc)}")
            with session_scope(engine) as session:
                record_alert(session, SCHEDULER_ALERTS, DeliveryError(
                    "unanswered_failed", f"safety event {event_id}: an unanswered check-in could not be marked, "
                    f"so nobody was paged about it: {describe(exc)}"), 1)


def _unanswered(session: Session, event_id: int, study_id: int) -> bool:
    triage = current_protocol(session, study_id).safety.triage
    at = now()
    if not mark_unanswered(session, event_id, at, triage):
        return False  # answered meanwhile, or another dispatcher did it
    event = session.get(SafetyEvent, event_id)
    assert event is not None
    participant = session.get(Participant, event.participant_id) if event.participant_id is not None else None
    followed_up = "follow_up" in triage.on_unanswered and participant is not None and not participant.is_withdrawn
    if followed_up:
        session.execute(update(SafetyCheckIn).where(SafetyCheckIn.safety_event_id == event_id)
                        .values(followed_up_at=at).execution_options(synchronize_session=False))
    audit.record(session, audit.Actor.system("scheduler"), "chat.check_in_unanswered", study_id=study_id,
                 participant_code=participant.code if participant else None, event_id=event_id,
                 paged=triage.pages("unanswered"), followed_up=followed_up)
    return True
