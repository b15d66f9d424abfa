"""Safety events: the study's record of every escalation, for staff review and on-call notices.

Raised by ``chat`` (the turn that escalated), reviewed by staff (``api``), notified by the
scheduler's on-call notices; kept in ``study`` so those packages need not depend on each other,
and because the record belongs to the study: it outlives the participant's data, de-identified.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Boolean, ForeignKey, String, Text, false, func, select
from sqlalchemy.orm import Mapped, Session, column_property, mapped_column

from study.clock import now
from study.db import Base, UTCDateTime
from study.errors import NotFound
from study.models import Participant, ParticipantResearchData


class SafetyEventReview(Base):
    """One staff review of a safety event: when, by whom, what was done. Append-only: database
    triggers refuse UPDATE, and DELETE while the event exists, so a second review never overwrites
    the first note. Reviews stay with their event, also after the participant deleted their data."""

    __tablename__ = "safety_event_reviews"

    id: Mapped[int] = mapped_column(primary_key=True)
    safety_event_id: Mapped[int] = mapped_column(ForeignKey("safety_events.id", ondelete="CASCADE"), index=True)
    reviewed_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    reviewed_by: Mapped[str] = mapped_column(String(320))
    note: Mapped[str] = mapped_column(Text)


class SafetyEvent(ParticipantResearchData, Base):
    """An escalation, for study staff to review. Staff reads are audited.

    When the participant withdraws with data deletion, the event stays as a de-identified safety
    record (``chat.service.deidentify_safety_events``, run before their research data is deleted):
    study, category, source, time and reviews are kept; the participant, conversation and turn
    links and the matched text are cleared, and ``participant_data_deleted`` marks it. The links
    are set to NULL rather than cascaded, so no deletion path can take the record with it."""

    __tablename__ = "safety_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    participant_id: Mapped[int | None] = mapped_column(  # type: ignore[assignment]  # None once de-identified
        ForeignKey("participants.id", ondelete="SET NULL"), index=True)
    conversation_id: Mapped[int | None] = mapped_column(ForeignKey("conversations.id", ondelete="SET NULL"))
    turn_id: Mapped[int | None] = mapped_column(ForeignKey("turns.id", ondelete="SET NULL"))
    category: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(16))  # lexicon | semantic | lexicon+semantic | classifier | model
    cue: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    # The participant withdrew and deleted their data: what is left is the de-identified record.
    # A flag, not a time: the deletion's time is on the participant's row and would link them.
    participant_data_deleted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # When it was last reviewed (None: never), read from the review history, its only home; usable
    # in queries too (``SafetyEvent.reviewed_at.is_(None)`` selects the unreviewed).
    reviewed_at: Mapped[dt.datetime | None] = column_property(
        select(func.max(SafetyEventReview.reviewed_at)).where(SafetyEventReview.safety_event_id == id)
        .correlate_except(SafetyEventReview).scalar_subquery())


def event_in_study(session: Session, study_id: int, event_id: int) -> tuple[SafetyEvent, str | None]:
    """A study's safety event with its participant's code (None on a de-identified record).
    Raises NotFound for an event of another study or none."""
    row = session.execute(select(SafetyEvent, Participant.code)
                          .outerjoin(Participant, Participant.id == SafetyEvent.participant_id)
                          .where(SafetyEvent.id == event_id, SafetyEvent.study_id == study_id)).first()
    if row is None:
        raise NotFound(f"no safety event {event_id} in this study")
    return row[0], row[1]
