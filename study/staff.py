"""Staff accounts, their per-study roles, API tokens and rate-limited login."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from study import audit
from study.clock import now
from study.errors import Conflict, Forbidden, Invalid, TooManyAttempts
from study.models import LoginAttempt, StaffAccount, StaffMembership, StaffRole, StaffToken, Study
from study.security import hash_password, new_token, token_digest, verify_password
from study.settings import get_settings

# What each role may do in a study it belongs to.
PARTICIPANT_LEVEL_ROLES = {StaffRole.ADMIN, StaffRole.RESEARCHER}
MANAGE_ROLES = {StaffRole.ADMIN, StaffRole.RESEARCHER}


def create_staff(
    session: Session, *, email: str, name: str, password: str, actor: audit.Actor,
) -> StaffAccount:
    email = email.strip().lower()
    if len(password) < 12:
        raise Invalid("a staff password needs at least 12 characters")
    if session.scalar(select(StaffAccount.id).where(StaffAccount.email == email)) is not None:
        raise Conflict(f"a staff account for {email} already exists")
    account = StaffAccount(email=email, name=name, password_hash=hash_password(password))
    session.add(account)
    session.flush()
    audit.record(session, actor, "staff.created", email=email)
    return account


def grant(
    session: Session, account: StaffAccount, study: Study, role: StaffRole, actor: audit.Actor,
) -> StaffMembership:
    membership = session.scalar(select(StaffMembership).where(
        StaffMembership.staff_id == account.id, StaffMembership.study_id == study.id))
    if membership is None:
        membership = StaffMembership(staff_id=account.id, study_id=study.id, role=role)
        session.add(membership)
    else:
        membership.role = role
    session.flush()
    audit.record(session, actor, "staff.role_granted", study_id=study.id, email=account.email,
                 role=str(role))
    return membership


def issue_token(session: Session, account: StaffAccount, label: str, actor: audit.Actor) -> str:
    token = new_token()
    session.add(StaffToken(staff_id=account.id, token_sha256=token_digest(token), label=label,
                           expires_at=now() + dt.timedelta(days=get_settings().staff_token_ttl_days)))
    session.flush()
    audit.record(session, actor, "staff.token_issued", email=account.email, label=label)
    return token


def staff_for_token(session: Session, token: str) -> StaffAccount | None:
    return session.scalar(
        select(StaffAccount).join(StaffToken)
        .where(StaffToken.token_sha256 == token_digest(token), StaffToken.revoked_at.is_(None),
               StaffToken.expires_at > now(), StaffAccount.is_active.is_(True)))


# The first wait once an (email, client) pair or a client is past its failure limit; it doubles
# with each further failure, up to settings.login_max_delay_seconds.
FIRST_DELAY_SECONDS = 5
# One client (all emails together) may fail this many times the pair limit before it must wait too:
# room for a few people behind one office address to mistype, too little to spray a password
# across many accounts.
CLIENT_FAILURES_FACTOR = 4


@dataclass(frozen=True)
class Failures:
    count: int
    last_at: dt.datetime | None

    def wait_seconds(self, limit: int, max_delay_seconds: int) -> float:
        """How long from now until another attempt is allowed (0 or less: allowed now)."""
        if self.count < limit or self.last_at is None:
            return 0.0
        delay = min(max_delay_seconds, FIRST_DELAY_SECONDS * 2 ** min(self.count - limit, 32))
        return (self.last_at + dt.timedelta(seconds=delay) - now()).total_seconds()


def _failures(session: Session, since: dt.datetime, *where: ColumnElement[bool]) -> Failures:
    count, last_at = session.execute(select(func.count(), func.max(LoginAttempt.at)).where(
        *where, LoginAttempt.succeeded.is_(False), LoginAttempt.at > since)).one()
    return Failures(count or 0, last_at)


def login(session: Session, *, email: str, password: str, client: str) -> str | None:
    """Check a password and issue a token, or return None for a wrong email or password (the
    caller commits either way, so the failure counts).

    Failures are limited per (email, client) pair, not per email, so someone who knows a staff
    email cannot lock that person out from elsewhere; and per client across all emails, so one
    address cannot spray passwords. Past either limit (within the sliding window) each further
    attempt must wait a delay that doubles per failure; an attempt before the wait is over raises
    TooManyAttempts without the password being checked or the attempt recorded. A success clears
    the pair's failures (not the client's: signing in to one's own account must not reset a spray).
    ``client`` is the resolved client IP (api.client_address)."""
    settings = get_settings()
    email = email.strip().lower()
    since = now() - dt.timedelta(seconds=settings.login_window_seconds)
    pair = (LoginAttempt.email == email, LoginAttempt.client == client)
    # By id, not time: attempts within one clock tick must still count after a success.
    last_success_id = session.scalar(select(func.max(LoginAttempt.id)).where(
        *pair, LoginAttempt.succeeded.is_(True), LoginAttempt.at > since))
    after_success = () if last_success_id is None else (LoginAttempt.id > last_success_id,)
    pair_wait = _failures(session, since, *pair, *after_success).wait_seconds(
        settings.login_max_failures, settings.login_max_delay_seconds)
    client_wait = _failures(session, since, LoginAttempt.client == client).wait_seconds(
        settings.login_max_failures * CLIENT_FAILURES_FACTOR, settings.login_max_delay_seconds)
    if max(pair_wait, client_wait) > 0:
        seconds = max(1, math.ceil(max(pair_wait, client_wait)))
        whose = f"for {email} from your address" if pair_wait >= client_wait else "from your address"
        raise TooManyAttempts(f"too many failed sign-ins {whose}: wait {seconds} seconds, then try again "
                              "(each further wrong password makes the wait longer)",
                              retry_after_seconds=seconds)
    account = session.scalar(select(StaffAccount).where(StaffAccount.email == email))
    # The password is checked whether or not the account exists or is active: the same work either way.
    verified = verify_password(account.password_hash if account is not None else None, password)
    ok = account is not None and account.is_active and verified
    session.add(LoginAttempt(email=email, client=client, succeeded=ok))
    session.flush()
    if not ok or account is None:
        return None
    return issue_token(session, account, "login", audit.Actor("staff", account.email))


@dataclass(frozen=True)
class StudyAccess:
    study: Study
    role: StaffRole

    @property
    def participant_level(self) -> bool:
        return self.role in PARTICIPANT_LEVEL_ROLES


def study_access(session: Session, account: StaffAccount, slug: str) -> StudyAccess:
    """The account's role in the study; a study it has no role in looks the same as none at all."""
    row = session.execute(
        select(Study, StaffMembership.role).join(StaffMembership, StaffMembership.study_id == Study.id)
        .where(Study.slug == slug, StaffMembership.staff_id == account.id)).first()
    if row is None:
        raise Forbidden(f"you have no role in a study '{slug}'", code="no_study_access")
    return StudyAccess(row[0], StaffRole(row[1]))


def participant_level(access: StudyAccess) -> StudyAccess:
    """The access, when it reaches participant-level data (researchers and admins); viewers are
    refused (they see aggregate figures only)."""
    if not access.participant_level:
        raise Forbidden("your role in this study (viewer) sees aggregate figures only",
                        code="participant_data_forbidden")
    return access


def staff_access(session: Session, actor: audit.Actor, study_id: int) -> StudyAccess:
    """``actor``'s role in the study: an active staff account with a role in it, refused as the
    staff API refuses (a study it has no role in looks the same as none at all: ``no_study_access``)."""
    row = session.execute(
        select(Study, StaffMembership.role).join(StaffMembership, StaffMembership.study_id == Study.id)
        .join(StaffAccount, StaffAccount.id == StaffMembership.staff_id)
        .where(Study.id == study_id, StaffAccount.email == actor.name, StaffAccount.is_active.is_(True))
    ).first() if actor.type == "staff" else None
    if row is None:
        raise Forbidden("you have no role in this study", code="no_study_access")
    return StudyAccess(row[0], StaffRole(row[1]))


def reader_access(session: Session, actor: audit.Actor, study_id: int) -> StudyAccess:
    """What an audited staff read checks first: ``actor`` is a researcher or admin of the study
    (``staff_access``, then ``participant_level``: a viewer is refused with ``participant_data_forbidden``)."""
    return participant_level(staff_access(session, actor, study_id))


def memberships(session: Session, account: StaffAccount) -> list[StudyAccess]:
    rows = session.execute(
        select(Study, StaffMembership.role).join(StaffMembership, StaffMembership.study_id == Study.id)
        .where(StaffMembership.staff_id == account.id).order_by(Study.slug)).all()
    return [StudyAccess(study, StaffRole(role)) for study, role in rows]
