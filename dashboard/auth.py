"""Sign-in to the dashboard with the staff accounts, the session's limits, and who may see what.

The password check and its failure limits are the API's (``study.staff.login``: argon2, failures
limited per email and client and per client, each further attempt waiting longer). A successful
sign-in holds a staff token in the Streamlit session; the session ends (and the token is revoked)
after ``IDLE_MINUTES`` without a page view, ``MAX_HOURS`` after signing in, or on sign-out, and the
token is checked on every page view, so a deactivated account or a revoked token ends it at once.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import streamlit as st
from sqlalchemy import select, update

from study import staff as staff_service
from study.clock import now
from study.db import get_engine, session_scope
from study.errors import TooManyAttempts
from study.models import StaffAccount, StaffRole, StaffToken, StudyStatus
from study.security import token_digest
from study.settings import get_settings

IDLE_MINUTES = 30
MAX_HOURS = 8
SESSION_KEY = "afterward_staff"
CONTEXT_KEY = "afterward_context"
STUDY_KEY = "afterward_study"
WRONG = "email or password is wrong"


@dataclass
class StaffSession:
    token: str
    email: str
    signed_in_at: dt.datetime
    last_seen_at: dt.datetime


@dataclass(frozen=True)
class Membership:
    slug: str
    title: str
    role: StaffRole


@dataclass(frozen=True)
class Context:
    """Who is looking at which study, set by ``app`` before any page runs."""

    email: str
    slug: str
    title: str
    study_id: int
    role: StaffRole
    database_url: str

    @property
    def participant_level(self) -> bool:
        """Researchers and admins; viewers see aggregates only."""
        return self.role in staff_service.PARTICIPANT_LEVEL_ROLES


def client_address() -> str:
    """The browser's address as the Streamlit server sees it (the key of the failure limits)."""
    try:
        address = st.context.ip_address
    except Exception:  # noqa: BLE001 - outside a browser session (AppTest) there is none
        address = None
    return address if isinstance(address, str) and address else "unknown"


def sign_in(email: str, password: str, client: str) -> str | None:
    """Check the password as the API does; returns an error message, or None when signed in."""
    if not email.strip() or not password:
        return "enter your email and password"
    try:
        with session_scope(get_engine()) as session:
            token = staff_service.login(session, email=email, password=password, client=client)
    except TooManyAttempts as exc:
        return exc.message
    if token is None:
        return WRONG
    moment = now()
    st.session_state[SESSION_KEY] = StaffSession(token, email.strip().lower(), moment, moment)
    return None


def _revoke(token: str) -> None:
    with session_scope(get_engine()) as session:
        session.execute(update(StaffToken).where(StaffToken.token_sha256 == token_digest(token),
                                                 StaffToken.revoked_at.is_(None)).values(revoked_at=now()))


def sign_out(reason: str | None = None) -> None:
    held = st.session_state.pop(SESSION_KEY, None)
    st.session_state.pop(CONTEXT_KEY, None)
    st.session_state.pop("afterward_reads", None)  # what was read stays with the session that read it
    st.session_state.pop("afterward_export", None)  # a prepared export is the signed-in person's alone
    if isinstance(held, StaffSession):
        _revoke(held.token)
    if reason:
        st.session_state["afterward_signed_out_because"] = reason


def current() -> StaffSession | None:
    """The signed-in staff member, once the session's limits and the token are checked."""
    held = st.session_state.get(SESSION_KEY)
    if not isinstance(held, StaffSession):
        return None
    moment = now()
    if moment - held.last_seen_at > dt.timedelta(minutes=IDLE_MINUTES):
        sign_out(f"you were signed out after {IDLE_MINUTES} minutes without activity; sign in again")
        return None
    if moment - held.signed_in_at > dt.timedelta(hours=MAX_HOURS):
        sign_out(f"sessions last {MAX_HOURS} hours; sign in again")
        return None
    with session_scope(get_engine(), read_only=True) as session:
        valid = staff_service.staff_for_token(session, held.token) is not None
    if not valid:
        sign_out("your session has ended; sign in again")
        return None
    held.last_seen_at = moment
    return held


def memberships(email: str) -> list[Membership]:
    """The studies the staff member has a role in (archived ones left out)."""
    with session_scope(get_engine(), read_only=True) as session:
        account = session.scalar(select(StaffAccount).where(StaffAccount.email == email))
        if account is None:
            return []
        return [Membership(a.study.slug, a.study.title, a.role) for a in staff_service.memberships(session, account)
                if a.study.status != StudyStatus.ARCHIVED]


def set_context(held: StaffSession, membership: Membership) -> Context:
    """Resolve the chosen study afresh (a role taken away takes effect on the next page view)."""
    with session_scope(get_engine(), read_only=True) as session:
        account = staff_service.staff_for_token(session, held.token)
        assert account is not None
        access = staff_service.study_access(session, account, membership.slug)
        context = Context(held.email, access.study.slug, access.study.title, access.study.id, access.role,
                          get_settings().database_url)
    st.session_state[CONTEXT_KEY] = context
    return context


def require(*, participant_level: bool = False) -> Context:
    """The page's context; stops the page when nobody is signed in or the role does not allow it."""
    context = st.session_state.get(CONTEXT_KEY)
    if not isinstance(context, Context):
        st.error("sign in first")
        st.stop()
        raise AssertionError("unreachable")
    if participant_level and not context.participant_level:
        st.error("your role in this study (viewer) sees aggregate figures only")
        st.stop()
    return context
