"""Pydantic models of what crosses the HTTP edge for the study domain (``XCreate`` in, ``XRead`` out)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from study.i18n import LANGUAGE_TAG
from study.models import StudyStatus, WithdrawalLevel
from study.protocol import PANEL_ID_PATTERN, TIME_ZONE_SCHEMA, Protocol, validate_timezone
from study.recruitment import InviteListing, InviteStatus
from study.validation import (
    LINE_CHAR,
    LINE_PATTERN,
    MAX_ROW_ID,
    SPACE,
    TEXT_CHAR,
    VISIBLE,
    AwareDatetime,
    EmailAddress,
    Line,
    RequestBody,
    Secret,
)


class _In(RequestBody):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def trimmed(min_length: int, max_length: int) -> Callable[[dict[str, Any]], None]:
    """The schema of a string of ``_In``, whose surrounding whitespace is removed before its length
    is checked: a pattern of ``min_length`` to ``max_length`` characters besides that whitespace, in
    place of the lengths (which would count the whitespace). A ``Line`` stays one line inside."""
    def state(schema: dict[str, Any]) -> None:
        for string in [schema, *schema.get("anyOf", [])]:
            if string.get("type") == "string":
                char = LINE_CHAR if string.get("pattern") == LINE_PATTERN else TEXT_CHAR
                inside = (f"({char}{{0,{max_length - 2}}}{VISIBLE})?" if min_length <= 1
                          else f"{char}{{{min_length - 2},{max_length - 2}}}{VISIBLE}")
                string.pop("minLength", None)
                string.pop("maxLength", None)
                string["pattern"] = f"^{SPACE}*{VISIBLE}{inside}{SPACE}*$"
    return state


class EnrollmentCreate(_In):
    invite_code: Line = Field(min_length=4, max_length=64, json_schema_extra=trimmed(4, 64),
                             description="The code from the invitation")
    panel_id: str | None = Field(default=None, pattern=PANEL_ID_PATTERN,
                                 description="the recruitment panel's id for the person, from the study link "
                                             "(kept when the study recruits on a panel)")


class ConsentConfirmationRead(BaseModel):
    id: str
    text: str
    required: bool = True  # optional ones may be left unticked (e.g. sharing conversation text)


class ConsentAboutRead(BaseModel):
    """The study as participants know it, and who stands behind it, shown with a consent text.
    The title is the protocol's public title, never the internal one."""

    study_title: str
    study_description: str = Field(description="Markdown")
    principal_investigator: str | None
    irb_contact: str | None
    protocol_number: str | None

    @classmethod
    def of(cls, protocol: Protocol, language: str | None = None) -> ConsentAboutRead:
        return cls(study_title=protocol.study.title_in(language),
                   study_description=protocol.study.description_in(language),
                   principal_investigator=protocol.consent.principal_investigator,
                   irb_contact=protocol.consent.irb_contact, protocol_number=protocol.consent.protocol_number)


class ConsentRead(BaseModel):
    version: str
    language: str = Field(description="the language of text_markdown and the confirmations: the participant's")
    languages: list[str] = Field(description="the languages this consent version is written in")
    text_markdown: str
    text_sha256: str = Field(description="SHA-256 of text_markdown, as the signature records it")
    confirmations: list[ConsentConfirmationRead]
    about: ConsentAboutRead


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
    version: Line = Field(min_length=1, max_length=40, json_schema_extra=trimmed(1, 40))
    confirmations: list[Line] = Field(max_length=50)
    typed_signature: Line = Field(min_length=1, max_length=200, json_schema_extra=trimmed(1, 200))
    language: str | None = Field(default=None, pattern=LANGUAGE_TAG, description=(
        "the language the consent was shown in (one of ConsentRead.languages); default: the participant's"))


class LanguageUpdate(_In):
    language: str = Field(pattern=LANGUAGE_TAG, description="one of the study's languages, e.g. 'es'")


class SignedConsentRead(BaseModel):
    participant_code: str
    version: str
    language: str = Field(description="the language the consent was shown and signed in")
    about: ConsentAboutRead
    text_markdown: str
    signed_text_sha256: str
    typed_signature: str
    confirmations: list[str]
    signed_at: dt.datetime


class ProfileUpdate(_In):
    timezone: Line = Field(max_length=64, json_schema_extra=TIME_ZONE_SCHEMA,
                          description="IANA time zone, e.g. Europe/Berlin")
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
    language: str | None = Field(description="the language the participant reads the study in")
    has_contact_email: bool
    enrolled_at: dt.datetime | None
    withdrawn_at: dt.datetime | None
    withdrawal_level: str | None
    needs_consent: bool
    csrf_token: str | None = None
    return_code: str | None = Field(default=None, description=(
        "given once, when enrollment completes without an email address: the code to sign in again with "
        "(POST /sign-in/code); only its keyed hash is kept"))


class SignInLinkCreate(_In):
    email: EmailAddress = Field(max_length=320, description="the contact address given at enrollment")


class SignInLinkRequested(BaseModel):
    message: str = Field(description="the same whether or not the address is enrolled")


class SignInWithLink(_In):
    token: Line = Field(min_length=8, max_length=512, json_schema_extra=trimmed(8, 512),
                       description="the part of the emailed link after /sign-in/link/")


class SignInWithCode(_In):
    return_code: Line = Field(min_length=4, max_length=64, json_schema_extra=trimmed(4, 64),
                             description="the return code given at enrollment")


class SignInRead(BaseModel):
    participant_code: str
    token: str = Field(description="Bearer token; browsers get the same in an httponly cookie")
    csrf_token: str
    method: str = Field(description="how: email_link, followup_link or return_code")


class ReturnCodeRead(BaseModel):
    return_code: str = Field(description="shown this once; the previous code stops working")


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
    email: Line = Field(min_length=3, max_length=320, json_schema_extra=trimmed(3, 320),
                       description="the staff account's email")
    password: Secret = Field(min_length=1, max_length=1000, json_schema_extra=trimmed(1, 1000))


class TokenRead(BaseModel):
    token: str
    token_type: Literal["bearer"] = "bearer"


class StudyAccessRead(BaseModel):
    study: str
    title: str
    role: str
    status: StudyStatus = StudyStatus.OPEN


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
    arm: str | None = Field(description="null before randomization")
    consent_version: str | None
    enrolled_at: dt.datetime | None
    withdrawn_at: dt.datetime | None
    withdrawal_level: str | None


class InviteCreate(_In):
    count: int = Field(default=1, ge=1, le=1000)
    max_uses: int = Field(default=1, ge=1, le=100_000)
    label: Line | None = Field(default=None, max_length=200)
    expires_at: AwareDatetime | None = Field(default=None, description="with a time zone, e.g. 2026-12-31T23:59:00Z")


class InvitesRead(BaseModel):
    codes: list[str]
    max_uses: int


class InviteUseRead(BaseModel):
    participant_code: str
    at: dt.datetime = Field(description="when the invite was redeemed")


class InviteRead(BaseModel):
    """An invite and who used it when: participant codes only, never contact details. The code
    itself is not stored (only its hash), so it cannot be shown again."""

    id: int
    label: str | None
    status: InviteStatus
    created_at: dt.datetime
    max_uses: int
    use_count: int
    expires_at: dt.datetime | None
    expired: bool
    revoked_at: dt.datetime | None
    uses: list[InviteUseRead]

    @classmethod
    def of(cls, listing: InviteListing) -> InviteRead:
        invite = listing.invite
        return cls(id=invite.id, label=invite.label, status=listing.status, created_at=invite.created_at,
                   max_uses=invite.max_uses, use_count=invite.use_count, expires_at=invite.expires_at,
                   expired=listing.expired, revoked_at=invite.revoked_at,
                   uses=[InviteUseRead(participant_code=u.participant_code, at=u.at) for u in listing.uses])


class InviteRevoke(_In):
    schema_rules = {"oneOf": [  # one of the two, as _one_of says
        {"required": ["code"], "properties": {"code": {"type": "string"}, "invite_id": {"type": "null"}}},
        {"required": ["invite_id"], "properties": {"code": {"type": "null"}, "invite_id": {"type": "integer"}}}]}
    code: Line | None = Field(default=None, min_length=4, max_length=64, json_schema_extra=trimmed(4, 64),
                             description="the invite code")
    invite_id: int | None = Field(default=None, ge=1, le=MAX_ROW_ID, description="or its id, from the listing")

    @model_validator(mode="after")
    def _one_of(self) -> InviteRevoke:
        if (self.code is None) == (self.invite_id is None):
            raise ValueError("give the invite's code or its invite_id (one of the two)")
        return self


class StudyClose(_In):
    stop_followups: StrictBool = Field(default=False, description=(
        "also cancel every follow-up still to come for participants already enrolled (as withdrawal "
        "does); by default their follow-ups continue"))


class StudyStatusRead(BaseModel):
    study: str
    status: StudyStatus
    status_changed_at: dt.datetime | None
    followups_stopped_at: dt.datetime | None
    followups_cancelled: int = Field(default=0, description="follow-ups this change cancelled")
