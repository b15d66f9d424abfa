"""Participants signing in again when their session is gone (a new phone, a cleared browser).

Three ways back, each ending in a new session:

- a sign-in link emailed on request to the address on file (``request_link`` queues it, the
  dispatcher sends it), working once and for ``Settings.sign_in_link_minutes``;
- the link in every follow-up email, working once until the follow-up's window closes;
- the return code given at enrollment to participants without an email address.

A link is signed (HMAC with the secret key) and names its purpose, the participant, a nonce and
its expiry, so nothing secret is stored; inserting its nonce into ``used_sign_in_links`` when it
is used makes it single-use, also against two requests at once. Participants are found by keyed
hashes (``study.security``), never by decrypting everyone's contact details, and a request
answers the same whether or not anyone enrolled with the address. Attempts are limited the way
staff logins are (``study.staff.Failures``: past the limit each further attempt waits a delay
that doubles), and every sign-in, refusal of a known participant and emailed link is audited.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import logging
import math
import secrets
from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from study import audit
from study.clock import now
from study.db import is_postgres
from study.errors import DomainError, Forbidden, Gone, Invalid, NotFound, TooManyAttempts
from study.models import Participant, ParticipantStatus, SignInAttempt, SignInEmail, UsedSignInLink
from study.outbox import OutboxStatus
from study.participants import create_session, require_active
from study.security import decrypt_contact, email_lookup_hash, human_code, return_code_hash
from study.settings import get_settings
from study.staff import CLIENT_FAILURES_FACTOR, Failures

log = logging.getLogger("afterward.signin")

EMAIL_LINK = "email"  # asked for from the home page
FOLLOWUP_LINK = "followup"  # in a follow-up email
_PURPOSE_CODES = {EMAIL_LINK: "e", FOLLOWUP_LINK: "f"}
METHODS = {EMAIL_LINK: "email_link", FOLLOWUP_LINK: "followup_link", "return_code": "return_code"}
# Several enrollments may share an address (two studies); one request mails each, up to this many.
MAX_PARTICIPANTS_PER_ADDRESS = 5
MAX_TOKEN_CHARS = 512
# Who asks for a link, or presents one that is refused, is not known to be the participant.
SIGN_IN_ACTOR = audit.Actor.system("sign-in")

INVALID_LINK = "this sign-in link is not valid (it may have been cut short); ask for a new one below"
USED_LINK = "this sign-in link was already used: each link works once. Ask for a new one below"
EXPIRED_LINK = "this sign-in link has expired. Ask for a new one below"
UNKNOWN_CODE = "this return code is not known; check it against the one you wrote down (letters and digits)"
WITHDRAWN = ("you have withdrawn from this study, so you cannot sign in to it again; crisis and support "
             "resources stay available from every page")


# Signed links


@dataclass(frozen=True)
class LinkClaims:
    purpose: str  # EMAIL_LINK | FOLLOWUP_LINK
    participant_id: int
    nonce: str
    expires_at: dt.datetime


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _signature(payload: bytes) -> str:
    key = get_settings().secret_key.get_secret_value().encode()
    return _b64(hmac.new(key, b"sign-in-link:" + payload, hashlib.sha256).digest()[:18])


def link_token(purpose: str, participant_id: int, nonce: str, expires_at: dt.datetime) -> str:
    """The token of a link that signs ``participant_id`` in once, until ``expires_at``. The same
    arguments give the same token, so an email sent again after a failure carries the same link."""
    payload = f"{_PURPOSE_CODES[purpose]}.{participant_id}.{nonce}.{math.floor(expires_at.timestamp())}".encode()
    return f"{_b64(payload)}.{_signature(payload)}"


def link_url(base_url: str, token: str) -> str:
    return f"{base_url.rstrip('/')}/sign-in/link/{token}"


def link_claims(token: str) -> LinkClaims | None:
    """What a link says, or None when it is malformed or its signature is wrong."""
    body, _, signature = token.partition(".")
    if len(token) > MAX_TOKEN_CHARS or not body or not signature:
        return None
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        code, participant_id, nonce, expires = payload.decode("ascii").split(".")
        purpose = {value: key for key, value in _PURPOSE_CODES.items()}[code]
        claims = LinkClaims(purpose, int(participant_id), nonce,
                            dt.datetime.fromtimestamp(int(expires), tz=dt.UTC))
    except (ValueError, KeyError, UnicodeError, binascii.Error, OverflowError, OSError):
        return None
    if not hmac.compare_digest(_signature(payload), signature):
        return None
    return claims


def _used(session: Session, nonce: str) -> bool:
    return session.scalar(select(UsedSignInLink.id).where(UsedSignInLink.nonce == nonce)) is not None


def check_link(session: Session, token: str) -> tuple[Participant, LinkClaims]:
    """The participant a link would sign in, without using it (the page that asks to confirm);
    raises NotFound (not a valid link), Forbidden (withdrawn), Gone (used or expired)."""
    claims = link_claims(token)
    participant = session.get(Participant, claims.participant_id) if claims else None
    if claims is None or participant is None:
        raise NotFound(INVALID_LINK, code="sign_in_link_invalid")
    if participant.is_withdrawn:
        raise Forbidden(WITHDRAWN, code="withdrawn")
    if _used(session, claims.nonce):
        raise Gone(USED_LINK, code="sign_in_link_used")
    if claims.expires_at <= now():
        raise Gone(EXPIRED_LINK, code="sign_in_link_expired")
    return participant, claims


def _mark_used(session: Session, nonce: str, participant_id: int) -> bool:
    """Record the link's use; False if it was used already (also by a request running at once:
    the unique nonce makes the second insert do nothing, after the first commits)."""
    insert = postgresql.insert if is_postgres(session) else sqlite.insert
    inserted = session.scalar(insert(UsedSignInLink).values(nonce=nonce, participant_id=participant_id, used_at=now())
                              .on_conflict_do_nothing(index_elements=["nonce"]).returning(UsedSignInLink.id))
    return inserted is not None


# Signing in


@dataclass(frozen=True)
class SignedIn:
    participant: Participant
    token: str  # the new session's token
    method: str  # email_link | followup_link | return_code
    purpose: str | None = None  # the link's, when signed in by a link


def _since() -> dt.datetime:
    return now() - dt.timedelta(seconds=get_settings().login_window_seconds)


def _recent(session: Session, *where: ColumnElement[bool]) -> Failures:
    count, last_at = session.execute(select(func.count(), func.max(SignInAttempt.at)).where(
        *where, SignInAttempt.at > _since())).one()
    return Failures(count or 0, last_at)


def _too_many(wait: float, what: str) -> TooManyAttempts:
    seconds = max(1, math.ceil(wait))
    return TooManyAttempts(f"{what}: wait {seconds} seconds, then try again", retry_after_seconds=seconds)


def _require_not_limited(session: Session, client: str) -> None:
    """Refuse (without counting it) an attempt from a client past its failure limit: each failure
    past ``login_max_failures`` in the window doubles the wait, as for staff logins."""
    settings = get_settings()
    wait = _recent(session, SignInAttempt.kind.in_(("return_code", "link")), SignInAttempt.client == client,
                   SignInAttempt.succeeded.is_(False)).wait_seconds(settings.login_max_failures,
                                                                    settings.login_max_delay_seconds)
    if wait > 0:
        raise _too_many(wait, "too many sign-in attempts from your address did not work")


def _attempt(session: Session, kind: str, client: str, succeeded: bool, subject: str | None = None) -> None:
    session.add(SignInAttempt(kind=kind, subject=subject, client=client, succeeded=succeeded, at=now()))
    session.flush()


def _refused(session: Session, participant: Participant | None, method: str, refusal: DomainError) -> DomainError:
    if participant is not None:  # whoever holds the link or code, it may not be the participant
        audit.record(session, SIGN_IN_ACTOR, "participant.sign_in_refused",
                     study_id=participant.study_id, participant_code=participant.code, method=method,
                     reason=refusal.code)
    return refusal


def _signed_in(session: Session, participant: Participant, method: str, purpose: str | None = None) -> SignedIn:
    token = create_session(session, participant)
    audit.record(session, audit.Actor("participant", participant.code), "participant.signed_in",
                 study_id=participant.study_id, participant_code=participant.code, method=method)
    return SignedIn(participant, token, method, purpose)


def sign_in_with_link(session: Session, token: str, *, client: str) -> SignedIn | DomainError:
    """Use a sign-in link: a new session, or the refusal to show (returned, not raised, so the
    caller commits the failed attempt and it counts toward the limit). Raises TooManyAttempts
    when the client must wait. ``client`` is the resolved client IP (api.client_address)."""
    _require_not_limited(session, client)
    claims = link_claims(token)
    method = METHODS[claims.purpose] if claims else "link"
    try:
        participant, checked = check_link(session, token)
        if not _mark_used(session, checked.nonce, participant.id):
            raise Gone(USED_LINK, code="sign_in_link_used")
    except DomainError as refusal:
        _attempt(session, "link", client, succeeded=False)
        return _refused(session, session.get(Participant, claims.participant_id) if claims else None, method,
                        refusal)
    _attempt(session, "link", client, succeeded=True)
    return _signed_in(session, participant, method, checked.purpose)


def sign_in_with_code(session: Session, code: str, *, client: str) -> SignedIn | DomainError:
    """Sign in with a return code; like ``sign_in_with_link``, a refusal is returned."""
    _require_not_limited(session, client)
    participant = session.scalar(select(Participant).where(Participant.return_code_hmac == return_code_hash(code)))
    if participant is None or participant.is_withdrawn:
        _attempt(session, "return_code", client, succeeded=False)
        refusal: DomainError = (Invalid(UNKNOWN_CODE, code="return_code_unknown") if participant is None
                                else Forbidden(WITHDRAWN, code="withdrawn"))
        return _refused(session, participant, "return_code", refusal)
    _attempt(session, "return_code", client, succeeded=True)
    return _signed_in(session, participant, "return_code")


# Emailed links


def request_link(session: Session, address: str, *, client: str) -> int:
    """Queue a sign-in link to ``address`` (validated) for each active participant with it on
    file. Returns how many were queued, for tests and logs only: callers answer the same either
    way. Requests are limited per address asked for (whether or not it is enrolled, so the limit
    says nothing either) and per client; past the limit TooManyAttempts is raised, uncounted."""
    settings = get_settings()
    subject = email_lookup_hash(address)
    requests = SignInAttempt.kind == "link_request"
    per_address = _recent(session, requests, SignInAttempt.subject == subject).wait_seconds(
        settings.login_max_failures, settings.login_max_delay_seconds)
    per_client = _recent(session, requests, SignInAttempt.client == client).wait_seconds(
        settings.login_max_failures * CLIENT_FAILURES_FACTOR, settings.login_max_delay_seconds)
    if max(per_address, per_client) > 0:
        whose = "for this address" if per_address >= per_client else "from your address"
        raise _too_many(max(per_address, per_client), f"too many sign-in links were asked for {whose}")
    _attempt(session, "link_request", client, succeeded=True, subject=subject)
    found = session.scalars(select(Participant).where(
        Participant.contact_email_hmac == subject, Participant.status != ParticipantStatus.WITHDRAWN)
        .order_by(Participant.id).limit(MAX_PARTICIPANTS_PER_ADDRESS)).all()
    at = now()
    for participant in found:
        session.add(SignInEmail(
            participant_id=participant.id, idempotency_key=f"sign-in-{secrets.token_hex(12)}",
            status=OutboxStatus.PENDING, attempts=0, next_attempt_at=at,
            expires_at=at + dt.timedelta(minutes=settings.sign_in_link_minutes), created_at=at))
        audit.record(session, SIGN_IN_ACTOR, "participant.sign_in_link_requested",
                     study_id=participant.study_id, participant_code=participant.code)
    session.flush()
    return len(found)


def requested_message(address: str) -> str:
    """What a request for a link is answered, whoever the address belongs to."""
    minutes = get_settings().sign_in_link_minutes
    return (f"If {address} is the address of someone taking part, a sign-in link is on its way to it. It works "
            f"once, for {minutes} minutes. Nothing after a few minutes? Check your spam folder, or sign in "
            "with your return code.")


# Return codes


def issue_return_code(session: Session, participant: Participant) -> str:
    """A new return code for the participant (the old one stops working); only its keyed hash is
    kept, so the caller shows it once."""
    require_active(participant)
    code = human_code(groups=4)  # about 78 bits: unguessable within the sign-in limits
    replaced = participant.return_code_hmac is not None
    participant.return_code_hmac = return_code_hash(code)
    session.flush()
    audit.record(session, audit.Actor("participant", participant.code), "participant.return_code_issued",
                 study_id=participant.study_id, participant_code=participant.code, replaced=replaced)
    return code


def ensure_return_code(session: Session, participant: Participant) -> str | None:
    """A return code for a participant who gave no email address and has none yet (at the end
    of enrollment), or None."""
    if (participant.is_withdrawn or participant.contact_email_encrypted is not None
            or participant.return_code_hmac is not None):
        return None
    return issue_return_code(session, participant)


def backfill_lookup_hashes(session: Session, batch_size: int = 500) -> int:
    """Give the addresses on file without a lookup hash (enrolled before sign-in links existed)
    theirs; an address the configured keys cannot decrypt is skipped. Returns how many."""
    hashed, after = 0, 0
    while True:
        rows = session.execute(select(Participant.id, Participant.contact_email_encrypted).where(
            Participant.contact_email_encrypted.is_not(None), Participant.contact_email_hmac.is_(None),
            Participant.id > after).order_by(Participant.id).limit(batch_size)).all()
        if not rows:
            return hashed
        for participant_id, encrypted in rows:
            try:
                address = decrypt_contact(encrypted or b"")
            except ValueError:
                log.warning("participant %s: the contact address cannot be decrypted; not hashed", participant_id)
                continue
            session.execute(update(Participant).where(Participant.id == participant_id)
                            .values(contact_email_hmac=email_lookup_hash(address)))
            hashed += 1
        after = rows[-1][0]
        session.flush()
