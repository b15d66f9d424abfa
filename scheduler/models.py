"""Scheduler tables: anchors (what follow-ups are counted from), follow-ups (one survey to send at
a planned time), deliveries (each invitation or reminder on one channel), on-call safety
notifications and channel alerts."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

import study.safety  # noqa: F401 - safety_events, which safety notifications refer to
from study.clock import now
from study.db import Base, UTCDateTime
from study.models import ParticipantResearchData
from study.outbox import LeasedRow, one_of


class Anchor(ParticipantResearchData, Base):
    """An event follow-ups are counted from: enrollment, or a decision reported in chat."""

    __tablename__ = "followup_anchors"
    __table_args__ = (UniqueConstraint("participant_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # enrollment | decision
    key: Mapped[str] = mapped_column(String(64))  # "enrollment" or "decision:<id>"
    anchored_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    context: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)  # piped into the survey


class FollowUpStatus(enum.StrEnum):
    PLANNED = "planned"  # waiting for due_at
    SENT = "sent"  # opened: its survey is open and its deliveries go out
    COMPLETED = "completed"  # answered
    EXPIRED = "expired"  # its window closed without a response (or before it could be opened)
    CANCELLED = "cancelled"  # withdrawn, stopped, re-planned away or given up


class FollowUp(ParticipantResearchData, Base):
    """One planned survey invitation. ``intended_local`` is what the protocol asked for in the
    participant's time zone; ``due_at`` is that moment in UTC, moved out of quiet hours.
    ``occurrence`` counts a repeating follow-up's occurrences from 0 (a single one is occurrence 0)."""

    __tablename__ = "followups"
    __table_args__ = (
        UniqueConstraint("participant_id", "followup_key", "anchor_key", "occurrence"),
        Index("ix_followups_due", "status", "due_at"),
        one_of("status", FollowUpStatus),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    followup_key: Mapped[str] = mapped_column(String(64))  # the protocol's follow-up id
    anchor_key: Mapped[str] = mapped_column(String(64))
    occurrence: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    instrument_id: Mapped[str] = mapped_column(String(64))
    protocol_version: Mapped[int] = mapped_column(Integer)
    context: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    timezone: Mapped[str] = mapped_column(String(64))
    intended_local: Mapped[str] = mapped_column(String(32))  # e.g. 2026-03-09T10:00 (wall clock)
    due_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    closes_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    reminder_offsets: Mapped[list[int]] = mapped_column(JSON, default=list)  # seconds after due_at
    status: Mapped[str] = mapped_column(String(16), default=FollowUpStatus.PLANNED)
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    assignment_id: Mapped[int | None] = mapped_column(ForeignKey("survey_assignments.id", ondelete="SET NULL"))
    sent_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    lateness_seconds: Mapped[float | None]
    reminders_sent: Mapped[int] = mapped_column(Integer, default=0)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    end_reason: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class Delivery(ParticipantResearchData, LeasedRow, Base):
    """One message on one channel: the invitation (``sequence`` 0) or reminder n. The
    idempotency key is stable across retries and dispatchers; email uses it as Message-ID."""

    __tablename__ = "deliveries"

    followup_id: Mapped[int] = mapped_column(ForeignKey("followups.id", ondelete="CASCADE"), index=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # invitation | reminder
    sequence: Mapped[int] = mapped_column(Integer)
    channel: Mapped[str] = mapped_column(String(16))  # email | webhook | in_app
    due_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class SafetyNotification(LeasedRow, Base):
    """One on-call notice of a safety event to one of the protocol's safety contacts: ``round`` 0
    when the event is new, n when it is still unreviewed n re-notify periods after it was raised.
    Planned and sent by the dispatcher like a delivery (``study.outbox``: claimed with a lease,
    retried, alerting).

    It is about the study's safety, not contact with the participant: it names no participant and
    holds no message text, and withdrawal neither cancels nor deletes it."""

    __tablename__ = "safety_notifications"

    safety_event_id: Mapped[int] = mapped_column(ForeignKey("safety_events.id", ondelete="CASCADE"), index=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"))
    round: Mapped[int] = mapped_column(Integer)
    channel: Mapped[str] = mapped_column(String(16))  # email | webhook
    recipient: Mapped[str] = mapped_column(String(2000))  # a staff address or webhook URL, from the protocol


class ChannelAlert(Base):
    """A channel that keeps failing (refused login, server down, bouncing addresses), a delivery or
    follow-up given up for good, or a failed audit anchor. Problems with a channel as a whole close
    when a delivery on it succeeds again; the others stay open until staff resolve them."""

    __tablename__ = "channel_alerts"

    id: Mapped[int] = mapped_column(primary_key=True)
    channel: Mapped[str] = mapped_column(String(16))
    problem: Mapped[str] = mapped_column(String(32))  # auth_refused | unreachable | bouncing | rejected | ...
    message: Mapped[str] = mapped_column(Text)
    failures: Mapped[int] = mapped_column(Integer, default=1)
    first_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    last_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    raised_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)  # when staff were alerted
    resolved_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
