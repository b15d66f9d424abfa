"""Sign-in to the dashboard with the staff accounts, the session's limits, and who may see what.

The password check and its failure limits are the API's (``study.staff.login``: argon2, failures
limited per email and client and per client, each further attempt waiting longer). A successful
sign-in holds a staff token in the Streamlit session; the session ends (and the token is revoked)
after ``IDLE_MINUTES`` without a page view, ``MAX_HOURS`` after signing in, or on sign-out, and the
token is checked on every page view, so a deactivated account or a revoked token ends it at once.
A page left open checks the same limits every ``WATCH_SECONDS`` (``watch``, run by ``app`` as a
fragment that reruns itself; that check is not activity) and, once they are passed, signs out and
clears itself.

The client of the failure limits is the browser's address under the API's rule
(``study.client_address``): the peer of its connection, or, when that peer is one of
``settings.trusted_proxies``, the right-most untrusted hop of ``X-Forwarded-For``. Streamlit's
server (uvicorn) would otherwise rewrite the peer from that header for any local client, so
``afterward dashboard`` starts it with ``FORWARDED_ALLOW_IPS`` empty (do the same when running
``streamlit run`` yourself).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

import streamlit as st
from sqlalchemy import select, update

from dashboard import links
from study import client_address as addresses
from study import staff as staff_service
from study.clock import now
from study.db import get_engine, session_scope
from study.errors import TooManyAttempts
from study.models import StaffAccount, StaffRole, StaffToken, StudyStatus
from study.security import token_digest
from study.settings import get_settings

IDLE_MINUTES = 30
MAX_HOURS = 8
WATCH_SECONDS = 30  # how often an open page checks the session's limits
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
    simulated: bool = False  # a study made for simulations (``afterward simulate``): no real participants

    @property
    def participant_level(self) -> bool:
        return self.role in staff_service.PARTICIPANT_LEVEL_ROLES


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


# Streamlit reports a peer on this machine as no address at all, without saying which loopback it was.
LOOPBACK = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))


def client_address() -> str:
    """The browser's address, the key of the sign-in failure limits: resolved from the peer of the
    browser's connection and the ``X-Forwarded-For`` of its opening request by the API's rule
    (``study.client_address.resolve``). Without a browser connection (AppTest) it is
    ``study.client_address.UNKNOWN_PEER``."""
    headers = st.context.headers  # of the request that opened the session's connection
    if not headers:
        return addresses.UNKNOWN_PEER
    peer = st.context.ip_address
    if not isinstance(peer, str) or not peer:
        # A proxy on this machine counts as trusted if either loopback address is configured as one.
        proxies = addresses.configured_networks()
        peer = str(next((a for a in LOOPBACK if addresses.is_trusted(a, proxies)), LOOPBACK[0]))
    return addresses.resolve(peer, headers.get_all("x-forwarded-for"))


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
    st.session_state.pop(links.APPLIED_KEY, None)  # whoever signs in next has the address's link applied
    if isinstance(held, StaffSession):
        _revoke(held.token)
    if reason:
        st.session_state["afterward_signed_out_because"] = reason


def _ended(held: StaffSession, moment: dt.datetime) -> str | None:
    """Why the session has ended at ``moment`` (idle too long, too old, the token no longer valid),
    or None while it holds. Changes nothing."""
    if moment - held.last_seen_at > dt.timedelta(minutes=IDLE_MINUTES):
        return f"you were signed out after {IDLE_MINUTES} minutes without activity; sign in again"
    if moment - held.signed_in_at > dt.timedelta(hours=MAX_HOURS):
        return f"sessions last {MAX_HOURS} hours; sign in again"
    with session_scope(get_engine(), read_only=True) as session:
        if staff_service.staff_for_token(session, held.token) is None:
            return "your session has ended; sign in again"
    return None


def current() -> StaffSession | None:
    """The signed-in staff member, once the session's limits and the token are checked; the page
    view counts as activity."""
    held = st.session_state.get(SESSION_KEY)
    if not isinstance(held, StaffSession):
        return None
    moment = now()
    reason = _ended(held, moment)
    if reason is not None:
        sign_out(reason)
        return None
    held.last_seen_at = moment
    return held


def watch() -> None:
    """Check the session's limits without counting as activity; once they are passed, run the whole
    page again (``current`` then signs out and only the sign-in page is left). ``app`` runs this as
    a fragment every ``WATCH_SECONDS``, so a page left open clears itself within that time after
    the idle limit instead of showing participant data until the next click."""
    held = st.session_state.get(SESSION_KEY)
    if not isinstance(held, StaffSession) or _ended(held, now()) is not None:
        st.rerun(scope="app")


def memberships(email: str) -> list[Membership]:
    """The studies the staff member has a role in (archived ones left out)."""
    with session_scope(get_engine(), read_only=True) as session:
        account = session.scalar(select(StaffAccount).where(StaffAccount.email == email))
        if account is None:
            return []
        return [Membership(a.study.slug, a.study.title, a.role, bool(a.study.simulated))
                for a in staff_service.memberships(session, account) if a.study.status != StudyStatus.ARCHIVED]


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
