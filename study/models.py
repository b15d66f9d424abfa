"""Tables of the study domain."""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from study.clock import now
from study.db import Base, UTCDateTime
from study.outbox import LeasedRow


class ParticipantStatus(enum.StrEnum):
    INVITED = "invited"  # redeemed an invite, has not signed consent yet
    CONSENTED = "consented"  # signed consent, profile not complete
    ENROLLED = "enrolled"  # profile complete, arm assigned
    WITHDRAWN = "withdrawn"


class WithdrawalLevel(enum.StrEnum):
    STOP_CONTACT = "stop_contact"  # no further contact or participation; data kept
    DELETE_DATA = "delete_data"  # as above, and research data deleted where the protocol allows


class StaffRole(enum.StrEnum):
    ADMIN = "admin"
    RESEARCHER = "researcher"
    VIEWER = "viewer"


class StudyStatus(enum.StrEnum):
    OPEN = "open"  # takes new enrollments
    PAUSED = "paused"  # refuses new enrollments for now; may reopen
    CLOSED = "closed"  # recruitment over for good; enrolled participants go on
    ARCHIVED = "archived"  # closed, hidden from default listings, read-only


class Study(Base):
    __tablename__ = "studies"
    __table_args__ = (
        CheckConstraint("status IN ('open', 'paused', 'closed', 'archived')", name="status_known"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    slug: Mapped[str] = mapped_column(String(64), unique=True)
    title: Mapped[str] = mapped_column(String(300))
    allocation_seed: Mapped[str] = mapped_column(String(64))
    allocation_count: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default=StudyStatus.OPEN, server_default=StudyStatus.OPEN)
    status_changed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # Set when the researcher stopped all follow-ups (close --stop-followups): none are planned after.
    followups_stopped_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # Made for simulations (``study.studies.load_simulated``), at creation and for good: only
    # simulations write to it, it takes no real participants, and no live dispatcher touches its rows.
    simulated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class ProtocolVersion(Base):
    __tablename__ = "protocol_versions"
    __table_args__ = (UniqueConstraint("study_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="RESTRICT"))
    version: Mapped[int] = mapped_column(Integer)
    # Large and immutable: loaded when used (current_protocol caches the parsed form).
    protocol: Mapped[dict[str, Any]] = mapped_column(JSON, deferred=True)
    source_yaml: Mapped[str] = mapped_column(Text, deferred=True)
    source_sha256: Mapped[str] = mapped_column(String(64))
    consent_version_id: Mapped[int] = mapped_column(ForeignKey("consent_versions.id"))
    loaded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class ConsentVersion(Base):
    __tablename__ = "consent_versions"
    __table_args__ = (UniqueConstraint("study_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="RESTRICT"))
    version: Mapped[str] = mapped_column(String(40))
    text_markdown: Mapped[str] = mapped_column(Text, deferred=True)
    text_sha256: Mapped[str] = mapped_column(String(64))
    confirmations: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # id, text, required (absent = true)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    # The language of ``text_markdown`` (the protocol's first language), and the text and confirmations
    # in each other language the protocol offers: {language: {"text": ..., "confirmations": {id: text}}}.
    language: Mapped[str] = mapped_column(String(16), default="en")
    translations: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=dict, deferred=True)

    @property
    def languages(self) -> list[str]:
        return [self.language, *sorted(self.translations or {})]

    def text_in(self, language: str) -> str:
        """The consent text as shown in ``language`` (its own text where it has no translation)."""
        return (self.translations or {}).get(language, {}).get("text") or self.text_markdown

    def digest_in(self, language: str) -> str:
        """SHA-256 of the text as shown in ``language``: what a signature in that language records."""
        return hashlib.sha256(self.text_in(language).encode()).hexdigest()

    def confirmations_in(self, language: str) -> list[dict[str, Any]]:
        """The confirmations, each with its text in ``language``."""
        texts = (self.translations or {}).get(language, {}).get("confirmations", {})
        return [{**c, "text": texts.get(c["id"], c["text"])} for c in self.confirmations]


class InviteCode(Base):
    __tablename__ = "invite_codes"
    __table_args__ = (
        CheckConstraint("max_uses >= 1", name="max_uses_positive"),
        CheckConstraint("use_count <= max_uses", name="use_count_within_cap"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="RESTRICT"))
    code_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    label: Mapped[str | None] = mapped_column(String(200))
    max_uses: Mapped[int] = mapped_column(Integer, default=1)
    use_count: Mapped[int] = mapped_column(Integer, default=0)
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class Participant(Base):
    __tablename__ = "participants"
    __table_args__ = (UniqueConstraint("study_id", "external_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="RESTRICT"), index=True)
    code: Mapped[str] = mapped_column(String(16), unique=True)
    invite_id: Mapped[int | None] = mapped_column(ForeignKey("invite_codes.id"))
    # The recruitment panel's id for the participant (protocol ``recruitment``): pseudonymous, one
    # arrival per id and study, used only for the panel's completion codes and payments; never in a
    # research export, never beside contact details.
    external_id: Mapped[str | None] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default=ParticipantStatus.INVITED)
    timezone: Mapped[str | None] = mapped_column(String(64))
    # The language the participant reads the study in (one of its protocol's ``languages``): the
    # browser's preference on arrival, then their own choice (``api.languages``).
    language: Mapped[str | None] = mapped_column(String(16))
    # Fernet token; never exported, never logged. Kept in the same row but opaque without the key.
    contact_email_encrypted: Mapped[bytes | None] = mapped_column(LargeBinary)
    # Keyed hashes (study.security) that find the participant who asks to sign in again, by the
    # address on file or the return code given at enrollment, without decrypting anyone's contact.
    contact_email_hmac: Mapped[str | None] = mapped_column(String(64), index=True)
    return_code_hmac: Mapped[str | None] = mapped_column(String(64), index=True, unique=True)
    arm: Mapped[str | None] = mapped_column(String(64))
    assigned_protocol_version: Mapped[int | None] = mapped_column(Integer)
    allocation_index: Mapped[int | None] = mapped_column(Integer)
    enrolled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    withdrawn_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    withdrawal_level: Mapped[str | None] = mapped_column(String(16))
    data_deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)

    @property
    def is_withdrawn(self) -> bool:
        return self.status == ParticipantStatus.WITHDRAWN


class ConsentSignature(Base):
    """A signature on one consent version. Rows are never updated: the hash is of the exact
    text signed, so a later revision of the study's consent cannot change what was agreed to."""

    __tablename__ = "consent_signatures"

    id: Mapped[int] = mapped_column(primary_key=True)
    participant_id: Mapped[int] = mapped_column(
        ForeignKey("participants.id", ondelete="RESTRICT"), index=True
    )
    consent_version_id: Mapped[int] = mapped_column(ForeignKey("consent_versions.id"))
    signed_text_sha256: Mapped[str] = mapped_column(String(64))  # of the text in ``language``
    language: Mapped[str] = mapped_column(String(16), default="en")  # the language the text was shown and signed in
    typed_signature: Mapped[str] = mapped_column(String(200))
    confirmations: Mapped[list[str]] = mapped_column(JSON)
    signed_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class ParticipantSession(Base):
    __tablename__ = "participant_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    participant_id: Mapped[int] = mapped_column(
        ForeignKey("participants.id", ondelete="CASCADE"), index=True
    )
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class StaffAccount(Base):
    __tablename__ = "staff_accounts"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    password_hash: Mapped[str] = mapped_column(String(200))
    is_active: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class StaffMembership(Base):
    """A staff account's role in one study."""

    __tablename__ = "staff_memberships"
    __table_args__ = (
        UniqueConstraint("staff_id", "study_id"),
        CheckConstraint("role IN ('admin', 'researcher', 'viewer')", name="role_known"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    staff_id: Mapped[int] = mapped_column(ForeignKey("staff_accounts.id", ondelete="CASCADE"))
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))


class StaffToken(Base):
    __tablename__ = "staff_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    staff_id: Mapped[int] = mapped_column(
        ForeignKey("staff_accounts.id", ondelete="CASCADE"), index=True
    )
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    label: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class LoginAttempt(Base):
    """Failed and successful staff logins; the rate limit counts recent failures per email and
    per client address, so it holds across API workers."""

    __tablename__ = "login_attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), index=True)
    client: Mapped[str] = mapped_column(String(64), index=True)
    succeeded: Mapped[bool] = mapped_column()
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now, index=True)


class SignInAttempt(Base):
    """A participant's attempt to sign in again (a return code, a link) or to have a link emailed;
    the limits count recent ones per client address and, for emailed links, per address asked for
    (``subject``: its keyed hash, whether or not anyone enrolled with it)."""

    __tablename__ = "sign_in_attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # return_code | link | link_request
    subject: Mapped[str | None] = mapped_column(String(64), index=True)
    client: Mapped[str] = mapped_column(String(64), index=True)
    succeeded: Mapped[bool] = mapped_column()
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now, index=True)


class SignInEmail(LeasedRow, Base):
    """A sign-in link a participant asked for, to be emailed to the address on file. Queued by the
    request and sent by the dispatcher like a delivery (``study.outbox``: claimed with a lease,
    retried, alerting); the idempotency key is the email's Message-ID and the link's single-use nonce."""

    __tablename__ = "sign_in_emails"

    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)  # the link's


class UsedSignInLink(Base):
    """A sign-in link that was used: inserting its nonce is what makes a link single-use."""

    __tablename__ = "used_sign_in_links"

    id: Mapped[int] = mapped_column(primary_key=True)
    nonce: Mapped[str] = mapped_column(String(128), unique=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    used_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class AuditEntry(Base):
    """Append-only, hash-chained. Database triggers refuse UPDATE and DELETE; the chain makes an
    edit or deletion done around the triggers detectable by ``afterward audit verify``."""

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    actor_type: Mapped[str] = mapped_column(String(16))  # participant | staff | system
    actor: Mapped[str] = mapped_column(String(320))
    action: Mapped[str] = mapped_column(String(64))
    study_id: Mapped[int | None] = mapped_column(Integer, index=True)
    participant_code: Mapped[str | None] = mapped_column(String(16), index=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)
    prev_hash: Mapped[str] = mapped_column(String(64))
    entry_hash: Mapped[str] = mapped_column(String(64))


class ParticipantResearchData:
    """Mixin for tables holding a participant's research data (chat turns, survey responses...).
    Such tables must have a ``participant_id`` column.

    Withdrawal with deletion deletes every row of every table in ``registered``. A package adds
    its tables from its lifecycle entry point (``study.wiring``), never as a side effect of
    importing its models, so what is deleted does not depend on what a process imported.
    """

    registered: ClassVar[set[type[Any]]] = set()
    participant_id: Mapped[int]
