"""Staff accounts, their per-study roles, API tokens and rate-limited login."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

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


def _recent_failures(
    session: Session, column: InstrumentedAttribute[str], value: str, since: dt.datetime,
) -> int:
    return session.scalar(select(func.count()).select_from(LoginAttempt).where(
        column == value, LoginAttempt.succeeded.is_(False), LoginAttempt.at > since)) or 0


def login(session: Session, *, email: str, password: str, client: str) -> str | None:
    """Check a password and issue a token, or return None for a wrong email or password (the
    caller commits either way, so the failure counts). Failures are counted per email and per
    client address over a sliding window; past the limit every attempt is refused until it passes."""
    settings = get_settings()
    email = email.strip().lower()
    window = dt.timedelta(seconds=settings.login_window_seconds)
    since = now() - window
    if max(_recent_failures(session, LoginAttempt.email, email, since),
           _recent_failures(session, LoginAttempt.client, client, since)) >= settings.login_max_failures:
        raise TooManyAttempts("too many failed logins; try again in a few minutes",
                              retry_after_seconds=settings.login_window_seconds)
    account = session.scalar(select(StaffAccount).where(StaffAccount.email == email))
    ok = account is not None and account.is_active and verify_password(account.password_hash, password)
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


def memberships(session: Session, account: StaffAccount) -> list[StudyAccess]:
    rows = session.execute(
        select(Study, StaffMembership.role).join(StaffMembership, StaffMembership.study_id == Study.id)
        .where(StaffMembership.staff_id == account.id).order_by(Study.slug)).all()
    return [StudyAccess(study, StaffRole(role)) for study, role in rows]
