"""Participants: invites, enrollment, sessions, consent, profile, arm allocation, withdrawal."""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Exists, delete, func, select, update
from sqlalchemy.orm import Session

from study import audit, recruitment, wiring
from study.clock import now
from study.db import Base
from study.errors import Conflict, ConsentRequired, Forbidden, Gone, Invalid, NotFound
from study.models import (
    ConsentSignature,
    ConsentVersion,
    InviteCode,
    Participant,
    ParticipantSession,
    ParticipantStatus,
    ProtocolVersion,
    Study,
    WithdrawalLevel,
)
from study.protocol import PANEL_ID_PATTERN, Arm, Panel, validate_timezone
from study.security import (
    email_lookup_hash,
    encrypt_contact,
    human_code,
    new_token,
    normalize_code,
    token_digest,
)
from study.settings import get_settings
from study.studies import (
    SIMULATION_INVITE_LABEL,
    current_consent,
    current_protocol,
    current_version,
    in_force_id,
    note_in_force,
)
from study.validation import email_address
from study.wiring import WithdrawalHook

# Invites


def create_invites(
    session: Session, study: Study, actor: audit.Actor, *, count: int = 1, max_uses: int = 1,
    label: str | None = None, expires_at: dt.datetime | None = None, simulation: int | None = None,
) -> list[str]:
    """Create ``count`` invite codes and return them in plain text (only their hashes are kept).
    ``max_uses`` > 1 makes a capped study link that several people can use. A simulated study
    takes no real participants: its invites are a simulation's only (``simulation``: its run id,
    which labels them), and a simulation's go to a simulated study only."""
    if not 1 <= count <= 10_000 or max_uses < 1:
        raise Invalid("count must be 1..10000 and max_uses at least 1")
    if study.simulated and simulation is None:
        raise Conflict(f"'{study.slug}' is a simulated study: it takes no real participants, and its invites "
                       "are made by `afterward simulate` only", code="simulated_study")
    if simulation is not None:
        if not study.simulated:
            raise Conflict(f"'{study.slug}' is not a simulated study: a simulation's invites go to a simulated "
                           "study only", code="not_simulated")
        label = f"{SIMULATION_INVITE_LABEL}{simulation}"
    recruitment.require_recruiting(study, "creating invites")
    if expires_at is not None and expires_at <= now():
        raise Invalid(f"expires_at ({expires_at.isoformat()}) is in the past; give a time after now, "
                      "with a time zone", code="invalid_expiry")
    codes = [human_code() for _ in range(count)]
    session.add_all(
        InviteCode(study_id=study.id, code_sha256=token_digest(normalize_code(code)), label=label,
                   max_uses=max_uses, use_count=0, expires_at=expires_at)
        for code in codes
    )
    session.flush()
    audit.record(session, actor, "invites.created", study_id=study.id, count=count,
                 max_uses=max_uses, label=label)
    return codes


DUPLICATE_PANEL_ID = ("this panel ID has already joined the study: each person takes part once. If you joined "
                      "before, sign in again with the link sent to your email or with your return code")


def _redeem(session: Session, code: str, panel_id: str | None = None) -> InviteCode:
    """The invite, with one of its uses claimed; refused for a panel id that already joined its
    study before the use is claimed."""
    invite = session.scalar(
        select(InviteCode).where(InviteCode.code_sha256 == token_digest(normalize_code(code))))
    if invite is None:
        raise NotFound("this invite code is not known; check it against your invitation")
    if invite.revoked_at is not None:
        raise Gone("this invite has been withdrawn by the study team; ask them for a new one",
                   code="invite_revoked")
    study = session.get(Study, invite.study_id)
    assert study is not None  # a foreign key guarantees it
    recruitment.require_enrolling(study)
    if invite.expires_at and invite.expires_at <= now():
        raise Gone("this invite has expired; ask the study team for a new one")
    if panel_id is not None and session.scalar(select(Participant.id).where(
            Participant.study_id == invite.study_id, Participant.external_id == panel_id)) is not None:
        raise Conflict(DUPLICATE_PANEL_ID, code="duplicate_panel_id")
    # Atomic conditional update: two people racing for the last use cannot both get it.
    claimed = session.execute(
        update(InviteCode)
        .where(InviteCode.id == invite.id, InviteCode.use_count < InviteCode.max_uses)
        .values(use_count=InviteCode.use_count + 1)
    ).rowcount  # type: ignore[attr-defined]
    if claimed != 1:
        raise Conflict("this invite has already been used; each invite enrolls one person",
                       code="invite_used")
    return invite


# Enrollment and sessions


@dataclass(frozen=True)
class Enrollment:
    participant: Participant
    token: str


def _new_participant_code(session: Session) -> str:
    while True:
        code = "P" + human_code(groups=1, size=7)
        if session.scalar(select(Participant.id).where(Participant.code == code)) is None:
            return code


def enroll(session: Session, invite_code: str, panel_id: str | None = None,
           languages: Sequence[str] = ()) -> Enrollment:
    """Redeem an invite: a pseudonymous participant who must sign consent next. ``panel_id``, the
    recruitment panel's id for the person (from the study link), is kept when the study recruits
    on a panel (protocol ``recruitment``), and ignored otherwise; a second arrival with the same id
    is refused (Conflict ``duplicate_panel_id``) without using the invite. The participant reads the
    study in the first of ``languages`` (the browser's, most wanted first) the study offers, else in
    the study's first language."""
    if panel_id is not None and not re.fullmatch(PANEL_ID_PATTERN, panel_id):
        raise Invalid("the panel ID in the link is not one a panel gives (letters, digits, '-' and '_', at most "
                      "128); open the study link from the panel again", code="invalid_panel_id")
    invite = _redeem(session, invite_code, panel_id)
    protocol = current_protocol(session, invite.study_id)
    if panel_id is not None and protocol.recruitment is None:
        panel_id = None  # a stray parameter: this study does not recruit on a panel
    language = next((code for code in languages if code in protocol.languages), protocol.languages[0])
    participant = Participant(study_id=invite.study_id, code=_new_participant_code(session), language=language,
                              invite_id=invite.id, status=ParticipantStatus.INVITED, external_id=panel_id)
    session.add(participant)
    session.flush()
    audit.record(session, audit.Actor("participant", participant.code), "participant.invited",
                 study_id=invite.study_id, participant_code=participant.code, invite_id=invite.id)
    return Enrollment(participant, create_session(session, participant))


def set_language(session: Session, participant: Participant, language: str) -> None:
    """The participant's choice of language for pages, emails and surveys: one the study offers."""
    offered = current_protocol(session, participant.study_id).languages
    if language not in offered:
        raise Invalid(f"this study is not offered in '{language}' (it is in: {', '.join(offered)})",
                      code="language_not_offered")
    if participant.language != language:
        participant.language = language
        audit.record(session, audit.Actor("participant", participant.code), "participant.language_set",
                     study_id=participant.study_id, participant_code=participant.code, language=language)


def consent_language(participant: Participant, consent: ConsentVersion) -> str:
    """The language the participant is shown ``consent`` in: theirs when the version is written in it."""
    return participant.language if participant.language in consent.languages else consent.language


def _panel(session: Session, participant: Participant) -> Panel | None:
    """The study's recruitment panel, for a participant who came from it (None otherwise)."""
    return current_protocol(session, participant.study_id).recruitment if participant.external_id else None


def completion_url(session: Session, participant: Participant, wave: str) -> str | None:
    """The recruitment panel's completion address for ``wave`` (``baseline`` or a follow-up id) when
    the participant came from the study's panel and the protocol names one; else None."""
    panel = _panel(session, participant)
    return panel.completion.get(wave) if panel is not None else None


def screen_out_url(session: Session, participant: Participant) -> str | None:
    """Where a panel participant who declines the consent is sent (the panel's screen-out code)."""
    panel = _panel(session, participant)
    return panel.screen_out if panel is not None else None


def create_session(session: Session, participant: Participant) -> str:
    token = new_token()
    session.add(ParticipantSession(
        participant_id=participant.id, token_sha256=token_digest(token),
        expires_at=now() + dt.timedelta(days=get_settings().session_ttl_days)))
    session.flush()
    return token


def participant_for_token(session: Session, token: str) -> Participant | None:
    return session.scalar(
        select(Participant).join(ParticipantSession)
        .where(ParticipantSession.token_sha256 == token_digest(token),
               ParticipantSession.revoked_at.is_(None), ParticipantSession.expires_at > now()))


# Consent


@dataclass(frozen=True)
class ConsentStatus:
    current: ConsentVersion
    signed: ConsentSignature | None  # the newest signature, whichever version
    signed_version: str | None
    in_force_signed: bool  # the one definition, ``_signed_consent_in_force``, that every check uses

    @property
    def needs_consent(self) -> bool:
        return not self.in_force_signed


def consent_status(session: Session, participant: Participant) -> ConsentStatus:
    current = current_consent(session, participant.study_id)
    row = session.execute(
        select(ConsentSignature, ConsentVersion.version)
        .join(ConsentVersion, ConsentVersion.id == ConsentSignature.consent_version_id)
        .where(ConsentSignature.participant_id == participant.id)
        .order_by(ConsentSignature.signed_at.desc(), ConsentSignature.id.desc()).limit(1)
    ).first()
    in_force = bool(session.scalar(select(_signed_consent_in_force(participant.id, participant.study_id))))
    return ConsentStatus(current, row[0] if row else None, row[1] if row else None, in_force)


def require_active(participant: Participant) -> None:
    if participant.is_withdrawn:
        raise Forbidden("you have withdrawn from this study, so this is no longer available",
                        code="withdrawn")


def _signed_consent_in_force(participant_id: Any, study_id: Any) -> Exists:
    """SQL: the participant signed the consent version of the study's newest protocol version
    (values, or columns to correlate with an outer query)."""
    in_force = (select(ProtocolVersion.consent_version_id).where(ProtocolVersion.id == in_force_id(study_id))
                .correlate_except(ProtocolVersion).scalar_subquery())
    return select(ConsentSignature.id).where(ConsentSignature.participant_id == participant_id,
                                             ConsentSignature.consent_version_id == in_force).exists()


def require_current_consent(session: Session, participant: Participant) -> None:
    """Refuse unless the participant is active and signed the consent version in force. One
    query on the common path: this runs on every participant request."""
    require_active(participant)
    if session.scalar(select(_signed_consent_in_force(participant.id, participant.study_id))):
        return
    status = consent_status(session, participant)
    what = "signed" if status.signed is None else "re-signed (the consent was revised)"
    raise ConsentRequired(f"the study's consent (version {status.current.version}) must be {what} first")


def consented_participant_for_token(session: Session, token: str) -> Participant | None:
    """The token's participant if active and consented to the version in force, in one query, which
    also reads the study's protocol version in force for the rest of the transaction
    (``study.studies.current_version``); None for an unknown or expired token; otherwise the refusal
    ``require_current_consent`` gives."""
    row = session.execute(
        select(Participant, ProtocolVersion, _signed_consent_in_force(Participant.id, Participant.study_id))
        .join(ParticipantSession)
        .outerjoin(ProtocolVersion, ProtocolVersion.id == in_force_id(Participant.study_id))
        .where(ParticipantSession.token_sha256 == token_digest(token), ParticipantSession.revoked_at.is_(None),
               ParticipantSession.expires_at > now())).first()
    if row is None:
        return None
    participant, version, consented = row
    if version is not None:
        note_in_force(session, version)
    if not consented or participant.is_withdrawn:
        require_current_consent(session, participant)  # raises, saying why
    return participant


def sign_consent(
    session: Session, participant: Participant, *, version: str, confirmations: list[str],
    typed_signature: str, language: str | None = None,
) -> ConsentSignature:
    """Sign the consent version in force, as shown in ``language`` (one of the version's; by default
    the participant's, else the version's own): every required confirmation must be ticked, optional
    ones may be; the signature keeps the ones ticked (e.g. agreeing to share conversation text), the
    language, and the hash of the text in that language."""
    require_active(participant)
    current = current_consent(session, participant.study_id)
    shown = language or (participant.language if participant.language in current.languages else current.language)
    if shown not in current.languages:
        raise Invalid(f"the consent is not written in '{shown}' (it is in: {', '.join(current.languages)})",
                      code="consent_language")
    if version != current.version:
        raise Conflict(f"consent version '{version}' is not the one in force; "
                       f"please read and sign version '{current.version}'", code="consent_outdated")
    offered = {c["id"]: c.get("required", True) is not False for c in current.confirmations}
    missing = [c for c, required in offered.items() if required and c not in confirmations]
    unknown = sorted(set(confirmations) - set(offered))
    if missing or unknown:
        parts = ([f"please confirm: {', '.join(missing)}"] if missing else []) + (
            [f"unknown confirmations: {', '.join(unknown)}"] if unknown else [])
        raise Invalid("; ".join(parts), code="confirmation_missing")
    if not typed_signature.strip():
        raise Invalid("type your name (or initials) to sign")
    text_sha256 = current.digest_in(shown)
    signature = ConsentSignature(
        participant_id=participant.id, consent_version_id=current.id, language=shown,
        signed_text_sha256=text_sha256, typed_signature=typed_signature.strip(),
        confirmations=sorted(set(confirmations)), signed_at=now())
    session.add(signature)
    if participant.status == ParticipantStatus.INVITED:
        participant.status = ParticipantStatus.CONSENTED
    session.flush()
    audit.record(session, audit.Actor("participant", participant.code), "consent.signed",
                 study_id=participant.study_id, participant_code=participant.code,
                 version=current.version, text_sha256=text_sha256, language=shown,
                 optional_confirmations=sorted(c for c in set(confirmations) if not offered[c]))
    return signature


def signed_consent_text(session: Session, participant: Participant) -> tuple[ConsentSignature, ConsentVersion]:
    status = consent_status(session, participant)
    if status.signed is None:
        raise NotFound("you have not signed a consent form yet")
    version = session.get(ConsentVersion, status.signed.consent_version_id)
    assert version is not None
    if version.digest_in(status.signed.language) != status.signed.signed_text_sha256:  # it must never change
        raise Conflict("the stored consent text no longer matches what was signed; "
                       "the study team has been told", code="consent_integrity")
    return status.signed, version


# Profile and allocation


def allocate(seed: str, index: int, arms: list[Arm], blocks_of: int = 2) -> tuple[str, int, int]:
    """Permuted-block randomization: arm for the ``index``-th participant (0-based).

    Each block holds every arm ``weight * blocks_of`` times in an order shuffled by a generator
    seeded with (study seed, block number), so the sequence is reproducible from the stored seed.
    Returns (arm name, block number, position in block).
    """
    block: list[str] = [arm.name for arm in arms for _ in range(arm.weight * blocks_of)]
    number, position = divmod(index, len(block))
    random.Random(f"{seed}:{number}").shuffle(block)
    return block[position], number, position


def update_profile(
    session: Session, participant: Participant, *, timezone: str, contact_email: str | None,
) -> Participant:
    require_current_consent(session, participant)
    try:
        validate_timezone(timezone)
    except ValueError as exc:
        raise Invalid(str(exc), code="invalid_timezone") from None
    if contact_email is not None:
        try:  # the one email check, whoever calls (the API's schema runs the same one first)
            contact_email = email_address(contact_email)
        except ValueError as exc:
            raise Invalid(str(exc), code="invalid_email") from None
    protocol = current_protocol(session, participant.study_id)
    if contact_email is None and protocol.enrollment.contact_email == "required":
        raise Invalid("this study needs a contact email to send follow-up surveys",
                      code="email_required")
    changed = [name for name, differs in (
        ("timezone", participant.timezone != timezone),
        ("contact_email", contact_email is not None or participant.contact_email_encrypted is not None),
    ) if differs]
    participant.timezone = timezone
    participant.contact_email_encrypted = encrypt_contact(contact_email) if contact_email else None
    participant.contact_email_hmac = email_lookup_hash(contact_email) if contact_email else None
    actor = audit.Actor("participant", participant.code)
    if participant.arm is None:
        study = session.get(Study, participant.study_id)
        assert study is not None
        index = session.execute(
            update(Study).where(Study.id == study.id)
            .values(allocation_count=Study.allocation_count + 1)
            .returning(Study.allocation_count)).scalar_one() - 1
        arm, block, position = allocate(study.allocation_seed, index, protocol.arms)
        participant.arm = arm
        participant.allocation_index = index
        participant.assigned_protocol_version = current_version(session, study.id).version
        participant.status = ParticipantStatus.ENROLLED
        participant.enrolled_at = now()
        session.flush()
        audit.record(session, actor, "participant.enrolled", study_id=study.id,
                     participant_code=participant.code, arm=arm, allocation_index=index,
                     block=block, position=position)
    else:
        session.flush()
        audit.record(session, actor, "participant.profile_updated", study_id=participant.study_id,
                     participant_code=participant.code, fields=changed)
    return participant


# Withdrawal

# What withdrawal ends and deletes is wired once per process from the packages' lifecycle entry
# points (study.wiring). This is that registry's list of hooks, each called inside the withdrawal
# transaction; packages register through their entry point, not by appending here on import.
withdrawal_hooks: list[WithdrawalHook] = wiring.lifecycle.withdrawal_hooks


@dataclass(frozen=True)
class WithdrawalReceipt:
    participant_code: str
    level: WithdrawalLevel
    withdrawn_at: dt.datetime
    deleted_rows: dict[str, int] = field(default_factory=dict)
    message: str = ""


def _research_data_tables() -> list[type[Base]]:
    """Dependents before the rows they point at, so each table's own count is reported."""
    order = {table.name: i for i, table in enumerate(reversed(Base.metadata.sorted_tables))}
    return sorted(wiring.lifecycle.research_tables, key=lambda table: order[table.__tablename__])


def withdraw(
    session: Session, participant: Participant, level: WithdrawalLevel, actor: audit.Actor,
) -> WithdrawalReceipt:
    """Withdraw now. Stopping contact keeps the data collected so far; deleting also removes the
    participant's research data where the protocol allows. Consent records and the audit trail
    are kept: they are the study's regulatory record, not research data."""
    if participant.is_withdrawn and (
        participant.withdrawal_level == WithdrawalLevel.DELETE_DATA or level == participant.withdrawal_level
    ):
        assert participant.withdrawn_at is not None
        return WithdrawalReceipt(participant.code, WithdrawalLevel(participant.withdrawal_level or level),
                                 participant.withdrawn_at, message="You had already withdrawn.")
    protocol = current_protocol(session, participant.study_id)
    if level == WithdrawalLevel.DELETE_DATA and not protocol.withdrawal.allow_data_deletion:
        raise Conflict("this study's approved protocol does not allow deleting data already "
                       "collected; you can still stop all contact and participation",
                       code="deletion_not_allowed")
    wiring.wire()  # a no-op once the process's entry point has wired it
    participant.status = ParticipantStatus.WITHDRAWN
    participant.withdrawal_level = level
    participant.withdrawn_at = participant.withdrawn_at or now()
    participant.contact_email_encrypted = None  # nobody may contact them again
    participant.contact_email_hmac = None  # nor send them a sign-in link
    # The hooks run before the deletion: one may first turn rows into records that are no longer
    # the participant's (chat keeps safety events as de-identified safety records).
    for hook in withdrawal_hooks:
        hook(session, participant, level)
    deleted: dict[str, int] = {}
    if level == WithdrawalLevel.DELETE_DATA:
        for table in _research_data_tables():
            owned = table.participant_id == participant.id  # type: ignore[attr-defined]
            # Counted first: rows removed by ON DELETE CASCADE are missing from a DELETE's rowcount.
            deleted[table.__tablename__] = session.scalar(select(func.count()).select_from(table).where(owned)) or 0
            session.execute(delete(table).where(owned))
        participant.timezone = None
        participant.data_deleted_at = now()
    session.flush()
    audit.record(session, actor, "participant.withdrawn", study_id=participant.study_id,
                 participant_code=participant.code, level=str(level), deleted_rows=deleted)
    message = ("You have withdrawn. We will not contact you again; what you contributed so far "
               "stays in the study, without your contact details."
               if level == WithdrawalLevel.STOP_CONTACT else
               "You have withdrawn and your research data has been deleted. We will not contact "
               "you again. A record that you consented and withdrew is kept, as the ethics "
               "approval requires, and so is a record of any safety concern raised in your chats "
               "(its kind, its time and any yes / no answers to the safety questions, never what you "
               "wrote, and not linked to you).")
    return WithdrawalReceipt(participant.code, level, participant.withdrawn_at, deleted, message)


def get_participant(session: Session, study_id: int, code: str) -> Participant:
    participant = session.scalar(
        select(Participant).where(Participant.study_id == study_id, Participant.code == code))
    if participant is None:
        raise NotFound(f"no participant '{code}' in this study")
    return participant
