"""Scheduler API models."""

from __future__ import annotations

import datetime as dt
from typing import Annotated
from zoneinfo import ZoneInfo

from pydantic import BaseModel, Field, WithJsonSchema, field_validator, model_validator

from scheduler.models import ChannelAlert, FollowUp
from scheduler.planner import FollowUpPreview, to_utc
from study.protocol import TIME_ZONE_SCHEMA, validate_timezone
from study.validation import EARLIEST, LATEST, LOCAL_DATETIME_PATTERN, Line, RequestBody, aware_datetime


class MyFollowUpRead(BaseModel):
    """What a participant sees of their schedule."""

    id: int
    followup: str
    instrument: str
    status: str
    due_at: dt.datetime
    closes_at: dt.datetime
    about: str | None  # the decision it asks about, if any

    @classmethod
    def of(cls, f: FollowUp) -> MyFollowUpRead:
        return cls(id=f.id, followup=f.followup_key, instrument=f.instrument_id, status=f.status, due_at=f.due_at,
                   closes_at=f.closes_at, about=f.context.get("decision"))


class FollowUpRead(MyFollowUpRead):
    participant: str
    intended_local: str
    timezone: str
    protocol_version: int
    sent_at: dt.datetime | None
    lateness_seconds: float | None
    reminders_sent: int
    ended_at: dt.datetime | None
    end_reason: str | None
    failed_deliveries: int

    @classmethod
    def staff_view(cls, f: FollowUp, code: str, failed: int) -> FollowUpRead:
        return cls(**MyFollowUpRead.of(f).model_dump(exclude={"about"}), about=None, participant=code,
                   intended_local=f.intended_local, timezone=f.timezone, protocol_version=f.protocol_version,
                   sent_at=f.sent_at, lateness_seconds=f.lateness_seconds, reminders_sent=f.reminders_sent,
                   ended_at=f.ended_at, end_reason=f.end_reason, failed_deliveries=failed)


class AlertResolve(RequestBody):
    note: str = Field(min_length=1, max_length=2000, description="what was done about it")


class ChannelAlertRead(BaseModel):
    id: int
    channel: str
    problem: str
    message: str
    failures: int
    first_at: dt.datetime
    last_at: dt.datetime
    raised_at: dt.datetime | None
    resolved_at: dt.datetime | None

    @classmethod
    def of(cls, a: ChannelAlert) -> ChannelAlertRead:
        return cls(id=a.id, channel=a.channel, problem=a.problem, message=a.message, failures=a.failures,
                   first_at=a.first_at, last_at=a.last_at, raised_at=a.raised_at, resolved_at=a.resolved_at)


# A moment, or a wall-clock time without an offset (years 2000-2199).
LocalOrAware = Annotated[dt.datetime, WithJsonSchema({"type": "string", "pattern": LOCAL_DATETIME_PATTERN})]


class SchedulePreviewQuery(RequestBody):
    """What to preview: a participant enrolling at ``enrolled_at`` in ``timezone`` and, optionally,
    making a decision at ``decision_at``. A time without an offset is a wall-clock time in ``timezone``."""

    enrolled_at: LocalOrAware = Field(description="e.g. 2026-03-28T09:00 (local) or 2026-03-28T09:00Z")
    timezone: Line = Field(max_length=64, json_schema_extra=TIME_ZONE_SCHEMA,
                          description="IANA time zone, e.g. Europe/London")
    decision_at: LocalOrAware | None = Field(default=None, description="anchor of the decision follow-ups")

    @field_validator("timezone")
    @classmethod
    def _iana(cls, value: str) -> str:
        validate_timezone(value)
        return value

    @field_validator("enrolled_at", "decision_at")
    @classmethod
    def _sensible(cls, value: dt.datetime | None) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            return aware_datetime(value)
        if not EARLIEST.replace(tzinfo=None) <= value <= LATEST.replace(tzinfo=None):
            raise ValueError(f"must be between {EARLIEST:%Y} and {LATEST:%Y}")
        return value  # a wall-clock time: made UTC in the zone below

    @model_validator(mode="after")
    def _in_utc(self) -> SchedulePreviewQuery:
        zone = ZoneInfo(self.timezone)
        if self.enrolled_at.tzinfo is None:
            self.enrolled_at = to_utc(self.enrolled_at, zone)
        if self.decision_at is not None and self.decision_at.tzinfo is None:
            self.decision_at = to_utc(self.decision_at, zone)
        return self


class PreviewMessageRead(BaseModel):
    kind: str  # invitation | reminder
    sequence: int
    at_utc: dt.datetime
    at_local: dt.datetime


class FollowUpPreviewRead(BaseModel):
    followup: str
    occurrence: int = Field(description="of a repeating follow-up, from 0 (a single one: 0)")
    instrument: str
    anchor: str
    anchored_at_utc: dt.datetime
    intended_local: str = Field(description="the local time the protocol asks for, before quiet hours")
    moved_by_quiet_hours: bool
    closes_at_utc: dt.datetime
    closes_at_local: dt.datetime
    messages: list[PreviewMessageRead]

    @classmethod
    def of(cls, preview: FollowUpPreview, zone: ZoneInfo) -> FollowUpPreviewRead:
        first = preview.messages[0].due_at.astimezone(zone)
        return cls(followup=preview.followup, occurrence=preview.occurrence, instrument=preview.instrument,
                   anchor=preview.anchor,
                   anchored_at_utc=preview.anchored_at, intended_local=preview.intended_local,
                   moved_by_quiet_hours=first.strftime("%Y-%m-%dT%H:%M") != preview.intended_local,
                   closes_at_utc=preview.closes_at, closes_at_local=preview.closes_at.astimezone(zone),
                   messages=[PreviewMessageRead(kind=m.kind, sequence=m.sequence, at_utc=m.due_at,
                                                at_local=m.due_at.astimezone(zone)) for m in preview.messages])


class SchedulePreviewRead(BaseModel):
    """The follow-ups a protocol would send one participant; nothing is stored."""

    study: str
    protocol_version: int
    timezone: str
    quiet_hours: dict[str, str]  # start, end (local)
    enrolled_at_utc: dt.datetime
    enrolled_at_local: dt.datetime
    decision_at_utc: dt.datetime | None
    decision_at_local: dt.datetime | None
    followups: list[FollowUpPreviewRead]
    decision_followups_not_shown: list[str] = Field(
        description="decision-anchored follow-ups, previewed only when decision_at is given")
