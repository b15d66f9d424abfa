"""Pydantic models of what crosses the HTTP edge for the study domain (``XCreate`` in, ``XRead`` out)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from study.models import WithdrawalLevel
from study.protocol import validate_timezone
from study.validation import AwareDatetime, EmailAddress, RequestBody


class _In(RequestBody):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class EnrollmentCreate(_In):
    invite_code: str = Field(min_length=4, max_length=64, description="The code from the invitation")


class ConsentConfirmationRead(BaseModel):
    id: str
    text: str
    required: bool = True  # optional ones may be left unticked (e.g. sharing conversation text)


class ConsentRead(BaseModel):
    version: str
    text_markdown: str
    text_sha256: str
    confirmations: list[ConsentConfirmationRead]


class EnrollmentRead(BaseModel):
    participant_code: str
    token: str = Field(description="Bearer token; browsers get the same in an httponly cookie")
    csrf_token: str
    consent: ConsentRead
    next_step: Literal["consent"] = "consent"


class ConsentStatusRead(BaseModel):
    current: ConsentRead
    signed_version: str | None
    signed_at: dt.datetime | None
    needs_consent: bool


class ConsentSign(_In):
    version: str = Field(min_length=1, max_length=40)
    confirmations: list[str] = Field(max_length=50)
    typed_signature: str = Field(min_length=1, max_length=200)


class SignedConsentRead(BaseModel):
    participant_code: str
    version: str
    text_markdown: str
    signed_text_sha256: str
    typed_signature: str
    confirmations: list[str]
    signed_at: dt.datetime


class ProfileUpdate(_In):
    timezone: str = Field(max_length=64, description="IANA time zone, e.g. Europe/Berlin")
    contact_email: EmailAddress | None = None

    @field_validator("timezone")
    @classmethod
    def _iana(cls, value: str) -> str:
        validate_timezone(value)
        return value


class ParticipantRead(BaseModel):
    participant_code: str
    study: str
    status: str
    arm: str | None
    timezone: str | None
    has_contact_email: bool
    enrolled_at: dt.datetime | None
    withdrawn_at: dt.datetime | None
    withdrawal_level: str | None
    needs_consent: bool
    csrf_token: str | None = None


class WithdrawalCreate(_In):
    level: WithdrawalLevel = Field(
        description="stop_contact: no more contact, keep data; delete_data: also delete research data")
    confirm: Literal[True] = Field(description="Must be true: withdrawal takes effect immediately")


class WithdrawalRead(BaseModel):
    participant_code: str
    level: WithdrawalLevel
    withdrawn_at: dt.datetime
    deleted_rows: dict[str, int]
    message: str


class StaffLogin(_In):
    email: str = Field(min_length=3, max_length=320, description="the staff account's email")
    password: str = Field(min_length=1, max_length=1000)


class TokenRead(BaseModel):
    token: str
    token_type: Literal["bearer"] = "bearer"


class StudyAccessRead(BaseModel):
    study: str
    title: str
    role: str


class StudySummaryRead(BaseModel):
    study: str
    protocol_version: int
    consent_version: str
    participants_by_status: dict[str, int]
    enrolled_by_arm: dict[str, int]
    followups_by_status: dict[str, int] = {}
    safety_events_total: int = 0
    safety_events_unreviewed: int = 0
    safety_events_participant_deleted: int = Field(default=0, description=(
        "safety events kept as de-identified records: participant withdrew and deleted data"))
    safety_events_unreviewed_participant_deleted: int = Field(default=0, description=(
        "of the unreviewed, those whose participant withdrew and deleted data"))
    channel_alerts_open: int = 0


class StaffParticipantRead(BaseModel):
    """Pseudonymous only: no contact details, ever."""

    participant_code: str
    status: str
    arm: str | None
    consent_version: str | None
    enrolled_at: dt.datetime | None
    withdrawn_at: dt.datetime | None
    withdrawal_level: str | None


class InviteCreate(_In):
    count: int = Field(default=1, ge=1, le=1000)
    max_uses: int = Field(default=1, ge=1, le=100_000)
    label: str | None = Field(default=None, max_length=200)
    expires_at: AwareDatetime | None = Field(default=None, description="with a time zone, e.g. 2026-12-31T23:59:00Z")


class InvitesRead(BaseModel):
    codes: list[str]
    max_uses: int
