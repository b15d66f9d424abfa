"""Staff reads and reviews of a study's safety events, each checked and audited here, whoever
calls (the staff API, the dashboard): the actor must be a researcher or admin of the study
(``study.staff.reader_access``), and every call writes its audit entry (``study.audit``) in the
caller's transaction. The transcripts and the turns around an event are read by
``analysis.transcripts``, which audits them the same way."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from chat import check_ins, service
from chat.schemas import SafetyEventRead
from study import audit
from study.models import Participant
from study.safety import SafetyEvent, event_in_study
from study.staff import reader_access


@dataclass(frozen=True)
class SafetyEvents:
    """Safety events, newest first, and how many match in all (more than listed past a limit)."""

    events: list[SafetyEventRead]
    total: int

    @property
    def truncated(self) -> bool:
        """More events match than are listed."""
        return self.total > len(self.events)


def safety_events(session: Session, actor: audit.Actor, study_id: int, *, unreviewed: bool = False,
                  limit: int | None = None, seen: tuple[int, ...] | None = None) -> SafetyEvents:
    """The study's safety events, newest first, with their review history and the de-identified
    records of participants who withdrew and deleted their data (no participant, marked); only
    the unreviewed ones with ``unreviewed`` (the review queue), the newest ``limit`` of them with
    the count of all. Audited as ``safety_events.read``, except when it lists exactly ``seen``,
    the event ids this actor already has on screen from this read (the dashboard reads its queue
    at every view, so it is current, and records it when what it lists comes into view)."""
    reader_access(session, actor, study_id)
    matching = (SafetyEvent.study_id == study_id, *((SafetyEvent.reviewed_at.is_(None),) if unreviewed else ()))
    rows = session.execute(
        select(SafetyEvent, Participant.code).outerjoin(Participant, Participant.id == SafetyEvent.participant_id)
        .where(*matching).order_by(SafetyEvent.created_at.desc(), SafetyEvent.id.desc()).limit(limit)).all()
    reviews = service.safety_reviews(session, study_id=study_id) if rows and not unreviewed else {}
    asked = check_ins.by_event(session, [event.id for event, _ in rows])
    events = [SafetyEventRead.of(event, code, reviews.get(event.id, []), asked.get(event.id)) for event, code in rows]
    total = len(events) if limit is None or len(events) < limit else (
        session.scalar(select(func.count()).select_from(SafetyEvent).where(*matching)) or 0)
    if seen != tuple(event.id for event in events):
        audit.record(session, actor, "safety_events.read", study_id=study_id, count=len(events))
    return SafetyEvents(events, total)


def review_safety_event(session: Session, actor: audit.Actor, study_id: int, event_id: int,
                        note: str) -> SafetyEventRead:
    """Add the actor's review to the event's history (``chat.service.review_safety_event``: the
    note through the text validator, earlier reviews kept), audited as ``safety_event.reviewed``;
    the event, with every review, as it stands now. Raises NotFound, or Invalid for the note."""
    reader_access(session, actor, study_id)
    event, code = event_in_study(session, study_id, event_id)
    review = service.review_safety_event(session, event, actor.name, note)
    audit.record(session, actor, "safety_event.reviewed", study_id=study_id, participant_code=code,
                 event_id=event.id, review_id=review.id)
    session.refresh(event, ["reviewed_at"])  # read again: it is the review just added
    return SafetyEventRead.of(event, code, service.safety_reviews(session, event_id=event.id)[event.id],
                              check_ins.by_event(session, [event.id]).get(event.id))
