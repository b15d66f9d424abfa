"""Scheduler API models."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

from scheduler.models import ChannelAlert, FollowUp
from study.validation import RequestBody


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
