"""Survey tables: custom instruments, assignments (a survey a participant owes, with its window),
responses (raw answers, partial until submitted) and scores."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from study.clock import now
from study.db import Base, UTCDateTime
from study.models import ParticipantResearchData


class CustomInstrument(Base):
    __tablename__ = "custom_instruments"
    __table_args__ = (UniqueConstraint("instrument_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    instrument_id: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(40))
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    source_yaml: Mapped[str] = mapped_column(Text)
    source_sha256: Mapped[str] = mapped_column(String(64))
    loaded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class InstrumentTranslation(Base):
    """A study team's translation of one instrument version into one language
    (``surveys.translations``): every item, label, option and block text, checked complete at load."""

    __tablename__ = "instrument_translations"
    __table_args__ = (UniqueConstraint("instrument_id", "version", "language"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    instrument_id: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(40))
    language: Mapped[str] = mapped_column(String(16))
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    source_yaml: Mapped[str] = mapped_column(Text)
    source_sha256: Mapped[str] = mapped_column(String(64))
    loaded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class SurveyAssignment(ParticipantResearchData, Base):
    """One survey a participant is asked to answer: baseline, or a follow-up with a window.
    ``intended_at`` vs the response's ``submitted_at`` is what analysis uses for timing."""

    __tablename__ = "survey_assignments"

    id: Mapped[int] = mapped_column(primary_key=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    instrument_id: Mapped[str] = mapped_column(String(64))
    instrument_version: Mapped[str] = mapped_column(String(40))
    purpose: Mapped[str] = mapped_column(String(16))  # baseline | followup | exit
    followup_key: Mapped[str | None] = mapped_column(String(128))
    context: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    intended_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    closes_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(16), default="open")  # open|completed|expired|cancelled
    completed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class SurveyResponse(ParticipantResearchData, Base):
    __tablename__ = "survey_responses"

    id: Mapped[int] = mapped_column(primary_key=True)
    assignment_id: Mapped[int] = mapped_column(
        ForeignKey("survey_assignments.id", ondelete="CASCADE"), unique=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    instrument_id: Mapped[str] = mapped_column(String(64))
    instrument_version: Mapped[str] = mapped_column(String(40))
    answers: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    language: Mapped[str | None] = mapped_column(String(16))  # the language the items were shown in
    submission_id: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    submitted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class SurveyScore(ParticipantResearchData, Base):
    __tablename__ = "survey_scores"
    __table_args__ = (UniqueConstraint("response_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    response_id: Mapped[int] = mapped_column(ForeignKey("survey_responses.id", ondelete="CASCADE"))
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    instrument_version: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float | None] = mapped_column(Float)
    n_items: Mapped[int] = mapped_column(Integer)
    n_expected: Mapped[int] = mapped_column(Integer)
