"""Typed dependencies: the request's database session, and who is calling.

How requests use the database (one model for the whole app): database work is synchronous
SQLAlchemy and never runs on the event loop. Plain handlers are ``def`` endpoints that take
``SessionDep`` (FastAPI runs them and their dependencies in its thread pool); a handler that must
``await`` (an LLM call, a stream) runs each transaction with ``run_unit``, also on a worker thread.
Both open the transaction with ``study.db.session_scope``; the engine refuses statements on a
thread running an event loop, so a regression fails loudly in every test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Annotated, TypeVar

from fastapi import Depends, HTTPException, Path, Request, Response
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile

from api.errors import SAFE_METHODS, refuses
from study import participants as participant_service
from study import staff as staff_service
from study.db import session_scope
from study.models import Participant, StaffAccount
from study.security import csrf_token_valid
from study.settings import get_settings
from study.validation import MAX_ROW_ID, text

SESSION_COOKIE = "afterward_session"
CSRF_HEADER = "X-CSRF-Token"
AUDITED_READS_PREFIX = "/api/v1/staff/"  # staff reads write an audit entry
T = TypeVar("T")

RowId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="a row id")]


def set_session_cookie(response: Response, token: str) -> None:
    """The participant's session in an httponly cookie (the API's bearer token, for browsers)."""
    settings = get_settings()
    response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="lax", path="/",
                        secure=settings.base_url.startswith("https"), max_age=settings.session_ttl_days * 86400)


def reads_only(request: Request) -> bool:
    """A GET that writes nothing (staff reads are audited, so they write)."""
    return request.method in SAFE_METHODS and not request.url.path.startswith(AUDITED_READS_PREFIX)


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request: committed when the handler returns, before the response is
    sent (so a failed commit is an error response, never a silent loss). A request cancelled
    meanwhile (its client gone, the server stopping) still commits what its handler did: the
    handler runs on a thread, which a cancellation waits for, so it arrives here only once the
    handler has returned (or before it started); rolling back would lose a participant's answer
    or exit check that was complete."""
    with session_scope(request.app.state.engine, read_only=reads_only(request)) as session:
        try:
            yield session
        except asyncio.CancelledError:
            session.commit()
            raise


async def run_unit(request: Request, work: Callable[[Session], T]) -> T:
    """Run ``work`` in its own committed transaction on a worker thread, for handlers that await."""
    return await run_unit_on(request.app.state.engine, work)


async def run_unit_on(engine: Engine, work: Callable[[Session], T]) -> T:
    """``run_unit`` for the app's own tasks, which outlive requests (``chat.replies``)."""
    def unit() -> T:
        with session_scope(engine) as session:
            return work(session)
    return await run_in_threadpool(unit)


async def form_data(request: Request) -> FormData:
    """A page's form, parsed before the (sync) handler runs, every name and text value through
    ``study.validation.text`` as the API's bodies are; the body size is limited upstream."""
    form = await request.form()
    fields: list[tuple[str, str | UploadFile]] = []
    for key, value in form.multi_items():
        try:
            name = text(key)
        except ValueError as exc:  # the name itself is not echoed
            raise HTTPException(422, f"a field name {exc}") from None
        try:
            fields.append((name, text(value) if isinstance(value, str) else value))
        except ValueError as exc:
            raise HTTPException(422, f"{name or 'a field'}: {exc}") from None
    return FormData(fields)


Form = Annotated[FormData, Depends(form_data)]


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


# Declared as security schemes so the OpenAPI document says how each operation authenticates.
participant_bearer = HTTPBearer(scheme_name="ParticipantToken", auto_error=False,
                                description="the token from POST /api/v1/enrollment")
participant_cookie = APIKeyCookie(name=SESSION_COOKIE, scheme_name="ParticipantCookie", auto_error=False,
                                  description="browsers: the httponly session cookie, with X-CSRF-Token on writes")
staff_bearer = HTTPBearer(scheme_name="StaffToken", auto_error=False,
                          description="from POST /api/v1/staff/login or `afterward staff token`")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(participant_bearer)]


SIGNED_OUT = "not signed in: no participant token or session cookie"
CSRF_MISSING = "a change sent with the session cookie but without a valid X-CSRF-Token header"


@refuses({401: SIGNED_OUT}, on_writes={403: CSRF_MISSING})
async def participant_token(request: Request, bearer: Bearer,
                            cookie: Annotated[str | None, Depends(participant_cookie)]) -> str:
    """The participant's token (a coroutine: no database, so no thread-pool hop)."""
    return token_from(request, bearer, cookie)


def token_from(request: Request, bearer: HTTPAuthorizationCredentials | None, cookie: str | None) -> str:
    """The participant's token from the Authorization header, or from the session cookie; a
    state-changing request authenticated by the cookie must carry the CSRF token."""
    if bearer is not None and bearer.credentials.strip():
        return bearer.credentials.strip()
    if not cookie:
        raise HTTPException(401, "sign in first: with your token, or again with POST /api/v1/sign-in/email-link "
                            "or /sign-in/code", headers={"WWW-Authenticate": "Bearer"})
    if request.method not in SAFE_METHODS:
        presented = request.headers.get(CSRF_HEADER)
        if not presented or not csrf_token_valid(cookie, presented):
            raise HTTPException(403, "this form has expired; reload the page and try again")
    return cookie


def _signed_in(participant: Participant | None) -> Participant:
    if participant is None:
        raise HTTPException(401, "your session has expired; sign in again (POST /api/v1/sign-in/email-link "
                            "or /sign-in/code)", headers={"WWW-Authenticate": "Bearer"})
    return participant


SESSION_ENDED = "the token or session is unknown, expired or was signed out"


@refuses({401: SESSION_ENDED})
def current_participant(session: SessionDep, token: Annotated[str, Depends(participant_token)]) -> Participant:
    return _signed_in(participant_service.participant_for_token(session, token))


CurrentParticipant = Annotated[Participant, Depends(current_participant)]


# Also what chat's handlers refuse with: they check the participant in their own unit of work.
CONSENTED = {401: SESSION_ENDED,
             403: "the participant withdrew, or has not signed the consent version in force (code consent_required)"}


@refuses(CONSENTED)
def consented_participant(session: SessionDep, token: Annotated[str, Depends(participant_token)]) -> Participant:
    """A participant who may take part now: not withdrawn and signed the consent in force (one query)."""
    return _signed_in(participant_service.consented_participant_for_token(session, token))


ConsentedParticipant = Annotated[Participant, Depends(consented_participant)]
ParticipantToken = Annotated[str, Depends(participant_token)]


async def run_as_consented(request: Request, token: str, work: Callable[[Session, Participant], T]) -> T:
    """``work`` in one unit of work as the consented participant (refused as ``CONSENTED`` says): the
    whole request on one worker thread, for hot write paths (a survey's autosave and submit), where
    the session, the participant and the handler as dependencies cost a thread-pool hop each."""
    return await run_unit(request, lambda session: work(session, consented_participant(session, token)))


STAFF_SIGNED_OUT = "no staff token, or one that is unknown, expired or revoked"


@refuses({401: STAFF_SIGNED_OUT})
def current_staff(session: SessionDep,
                  bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(staff_bearer)]) -> StaffAccount:
    token = bearer.credentials.strip() if bearer is not None else ""
    account = staff_service.staff_for_token(session, token) if token else None
    if account is None:
        raise HTTPException(401, "a valid staff token is required (POST /api/v1/staff/login)",
                            headers={"WWW-Authenticate": "Bearer"})
    return account


CurrentStaff = Annotated[StaffAccount, Depends(current_staff)]
