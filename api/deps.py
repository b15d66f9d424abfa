"""Typed dependencies: the request's database session, and who is calling."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Response
from sqlalchemy.orm import Session

from study import participants as participant_service
from study import staff as staff_service
from study.db import session_factory
from study.models import Participant, StaffAccount
from study.security import csrf_token_valid
from study.settings import get_settings

SESSION_COOKIE = "afterward_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def set_session_cookie(response: Response, token: str) -> None:
    """The participant's session in an httponly cookie (the API's bearer token, for browsers)."""
    settings = get_settings()
    response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="lax", path="/",
                        secure=settings.base_url.startswith("https"), max_age=settings.session_ttl_days * 86400)


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request: committed when the handler returns, before the response is
    sent (so a failed commit is an error response, never a silent loss)."""
    session = session_factory(request.app.state.engine)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def _bearer(request: Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def participant_token(request: Request) -> str:
    """The participant's token from the Authorization header, or from the session cookie; a
    state-changing request authenticated by the cookie must carry the CSRF token."""
    token = _bearer(request)
    if token:
        return token
    cookie = request.cookies.get(SESSION_COOKIE)
    if not cookie:
        raise HTTPException(401, "sign in first: open your invite link again or use your token",
                            headers={"WWW-Authenticate": "Bearer"})
    if request.method not in SAFE_METHODS:
        presented = request.headers.get(CSRF_HEADER) or getattr(request.state, "form_csrf", None)
        if not presented or not csrf_token_valid(cookie, presented):
            raise HTTPException(403, "this form has expired; reload the page and try again")
    return cookie


def current_participant(session: SessionDep, token: Annotated[str, Depends(participant_token)]) -> Participant:
    participant = participant_service.participant_for_token(session, token)
    if participant is None:
        raise HTTPException(401, "your session has expired; open your invite link or sign in again",
                            headers={"WWW-Authenticate": "Bearer"})
    return participant


CurrentParticipant = Annotated[Participant, Depends(current_participant)]


def consented_participant(session: SessionDep, participant: CurrentParticipant) -> Participant:
    """A participant who may take part now: not withdrawn and signed the consent in force."""
    participant_service.require_current_consent(session, participant)
    return participant


ConsentedParticipant = Annotated[Participant, Depends(consented_participant)]


def current_staff(session: SessionDep, request: Request) -> StaffAccount:
    token = _bearer(request)
    account = staff_service.staff_for_token(session, token) if token else None
    if account is None:
        raise HTTPException(401, "a valid staff token is required (POST /api/v1/staff/login)",
                            headers={"WWW-Authenticate": "Bearer"})
    return account


CurrentStaff = Annotated[StaffAccount, Depends(current_staff)]
