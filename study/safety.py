"""Safety events: the study's record of every risk finding, for staff review and on-call notices.

Raised by ``chat`` (the reply that checked in or escalated), reviewed by staff (``api``,
``dashboard``), notified by the scheduler's on-call notices; kept in ``study`` so those packages
need not depend on each other, and because the record belongs to the study: it outlives the
participant's data, de-identified.

Each event has a level (``SafetyLevel``): ``check_in`` (a sign of risk met by a check-in, for
staff to review), ``escalation`` (pages the on-call contacts) or ``unanswered`` (its check-in went
unanswered past the protocol's deadline). A level only ever rises, and the protocol's
``safety.triage.page`` says which levels page (``page_since``: when the current one started to).
The check-in's questions and answers are a ``SafetyCheckIn`` (``chat.triage`` asks and reads them).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, String, Text, false, func, select, update
from sqlalchemy.orm import Mapped, Session, column_property, mapped_column

from study.clock import now
from study.db import Base, UTCDateTime
from study.errors import NotFound
from study.models import Participant, ParticipantResearchData
from study.outbox import one_of
from study.protocol import Triage


class SafetyLevel(enum.StrEnum):
    CHECK_IN = "check_in"  # a sign of risk met by a check-in: staff review it; pages only if the protocol says
    ESCALATION = "escalation"  # pages the on-call contacts
    UNANSWERED = "unanswered"  # its check-in was not answered by the protocol's deadline


# Levels only rise: a page already sent is closed by a person reviewing the event, not by a late "no".
LEVEL_RANK = {SafetyLevel.CHECK_IN: 0, SafetyLevel.UNANSWERED: 1, SafetyLevel.ESCALATION: 2}


class CheckInKind(enum.StrEnum):
    """Which check-in was asked (``chat.triage``): the risk-to-self screen or safety from others."""

    RISK_TO_SELF = "risk_to_self"
    RISK_FROM_OTHERS = "risk_from_others"


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
    """A risk finding at its level, for study staff to review. Staff reads are audited.

    When the participant withdraws with data deletion, the event stays as a de-identified safety
    record (``chat.service.deidentify_safety_events``, run before their research data is deleted):
    study, category, source, time and reviews are kept; the participant, conversation and turn
    links and the matched text are cleared, and ``participant_data_deleted`` marks it. The links
    are set to NULL rather than cascaded, so no deletion path can take the record with it."""

    __tablename__ = "safety_events"
    __table_args__ = (one_of("level", SafetyLevel, name="level_known"), Index("ix_safety_events_answer_due_at",
                                                                                 "answer_due_at"))

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    participant_id: Mapped[int | None] = mapped_column(  # type: ignore[assignment]  # None once de-identified
        ForeignKey("participants.id", ondelete="SET NULL"), index=True)
    conversation_id: Mapped[int | None] = mapped_column(ForeignKey("conversations.id", ondelete="SET NULL"))
    turn_id: Mapped[int | None] = mapped_column(ForeignKey("turns.id", ondelete="SET NULL"))
    category: Mapped[str] = mapped_column(String(32))
    # lexicon | semantic | lexicon+semantic | classifier (the LLM reader, chat.llm_reader) | model
    source: Mapped[str] = mapped_column(String(16))
    cue: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    # The participant withdrew and deleted their data: what is left is the de-identified record.
    # A flag, not a time: the deletion's time is on the participant's row and would link them.
    participant_data_deleted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    level: Mapped[str] = mapped_column(String(16), default=SafetyLevel.ESCALATION,
                                       server_default=SafetyLevel.ESCALATION.value)
    # When the current level started to page the on-call contacts (None: it does not page).
    page_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # When the check-in's answers are due while they are awaited (None: none awaited, or answered).
    answer_due_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    unanswered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)  # when it became unanswered
    # When the event took its current level: when it was raised, started to page, or became unanswered.
    level_since: Mapped[dt.datetime] = column_property(func.coalesce(page_since, unanswered_at, created_at))
    # When its current level was last reviewed (None: not yet), read from the review history, its
    # only home; usable in queries too (``SafetyEvent.reviewed_at.is_(None)`` selects the events that
    # wait for review). A review before the level rose (a check-in reviewed, then answered "yes")
    # does not count: the event waits for review again, and pages if its new level does.
    reviewed_at: Mapped[dt.datetime | None] = column_property(
        select(func.max(SafetyEventReview.reviewed_at))
        .where(SafetyEventReview.safety_event_id == id,
               SafetyEventReview.reviewed_at >= func.coalesce(page_since, unanswered_at, created_at))
        .correlate_except(SafetyEventReview).scalar_subquery())

    def raise_to(self, level: SafetyLevel, at: dt.datetime, triage: Triage) -> bool:
        """Raise the event to ``level`` at ``at`` if that is higher than its level now (never lower
        it); it then pages from ``at`` if the protocol's triage pages that level. Returns whether
        the level rose."""
        if LEVEL_RANK[level] <= LEVEL_RANK[SafetyLevel(self.level)]:
            return False
        self.level = level
        self.page_since = at if triage.pages(level) else None
        if level == SafetyLevel.UNANSWERED:
            self.unanswered_at = at
        return True


class SafetyCheckIn(Base):
    """The check-in a risk finding asked (``chat.triage``): its questions as asked, and each answer
    with how it was given. Part of the safety record, like its event: when the participant deletes
    their data it stays (the answers are yes / no / prefer not to say, never their words) and its
    link to the turn is cleared.

    ``answers``: question id -> ``{"answer": yes | no | declined, "given": button | words, "at":
    ISO time, "turn_id": the message read as the answer (words only)}``. ``answered_at``: when the
    answers settled its level (``chat.triage.decide``); ``closed_reason``: why it can no longer be
    answered (a newer check-in replaced it); ``followed_up_at``: when the participant was shown
    the follow-up of an unanswered check-in (the protocol's ``on_unanswered``)."""

    __tablename__ = "safety_check_ins"
    __table_args__ = (one_of("kind", CheckInKind, name="kind_known"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    safety_event_id: Mapped[int] = mapped_column(ForeignKey("safety_events.id", ondelete="CASCADE"), unique=True)
    turn_id: Mapped[int | None] = mapped_column(ForeignKey("turns.id", ondelete="SET NULL"))  # the reply that asked
    kind: Mapped[str] = mapped_column(String(32))
    questions: Mapped[list[dict[str, str]]] = mapped_column(JSON)  # [{"id", "text"}], in the order asked
    answers: Mapped[dict[str, dict[str, Any]]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    answered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    closed_reason: Mapped[str | None] = mapped_column(String(200))
    followed_up_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


def mark_unanswered(session: Session, event_id: int, at: dt.datetime, triage: Triage, *, due: bool = True) -> bool:
    """Make the event ``unanswered`` at ``at`` if its check-in's answers are still awaited (and,
    with ``due``, were due by ``at``); it pages from then if the protocol's triage pages
    unanswered check-ins. One conditional UPDATE: however many dispatchers (or a withdrawal) try at
    once, one of them does it, and an answer settling the check-in meanwhile (which clears
    ``answer_due_at`` under the row's lock) wins over it. Returns whether this call did it."""
    awaited = [SafetyEvent.id == event_id, SafetyEvent.unanswered_at.is_(None), SafetyEvent.answer_due_at.is_not(None),
               SafetyEvent.level == SafetyLevel.CHECK_IN, *([SafetyEvent.answer_due_at <= at] if due else [])]
    pages = triage.pages(SafetyLevel.UNANSWERED)
    claimed = session.execute(update(SafetyEvent).where(*awaited).values(
        level=SafetyLevel.UNANSWERED, unanswered_at=at, page_since=at if pages else None)
        .returning(SafetyEvent.id).execution_options(synchronize_session=False)).first()
    return claimed is not None


def event_in_study(session: Session, study_id: int, event_id: int) -> tuple[SafetyEvent, str | None]:
    """A study's safety event with its participant's code (None on a de-identified record).
    Raises NotFound for an event of another study or none."""
    row = session.execute(select(SafetyEvent, Participant.code)
                          .outerjoin(Participant, Participant.id == SafetyEvent.participant_id)
                          .where(SafetyEvent.id == event_id, SafetyEvent.study_id == study_id)).first()
    if row is None:
        raise NotFound(f"no safety event {event_id} in this study")
    return row[0], row[1]
