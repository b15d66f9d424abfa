"""Signing in again without the session cookie (a new phone, a cleared browser): a link emailed on
request to the address on file, the link in a follow-up email, or the return code given at
enrollment (``study.signin``). A request for a link answers the same whether or not the address is
enrolled; a refusal is a clear 4xx, and a refused attempt is committed so it counts toward the
limit (429 with ``Retry-After``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from fastapi.responses import JSONResponse

from api.client_address import client_address
from api.deps import CurrentParticipant, SessionDep, set_session_cookie
from api.errors import DocumentedRoute, error_body, refusals, status_of
from study import signin
from study.errors import DomainError
from study.schemas import (
    ReturnCodeRead,
    SignInLinkCreate,
    SignInLinkRequested,
    SignInRead,
    SignInWithCode,
    SignInWithLink,
)
from study.security import csrf_token_for

router = APIRouter(tags=["participant"], route_class=DocumentedRoute)
LIMITED = {429: "too many attempts from this address (or links for this email); wait the Retry-After seconds"}
REFUSED = refusals({**LIMITED,
                    403: "the participant withdrew: signing in is no longer possible (code withdrawn)",
                    404: "not a valid sign-in link (code sign_in_link_invalid)",
                    410: "the link was already used, or expired: ask for a new one",
                    422: "the return code is not known (code return_code_unknown)"})


@router.post("/sign-in/email-link", status_code=status.HTTP_202_ACCEPTED, responses=refusals(LIMITED))
def request_sign_in_link(body: SignInLinkCreate, session: SessionDep, request: Request) -> SignInLinkRequested:
    """Email a single-use sign-in link to this address if a participant gave it (the dispatcher
    sends it within a poll). The answer is the same whether or not anyone did."""
    signin.request_link(session, body.email, client=client_address(request))
    return SignInLinkRequested(message=signin.requested_message(body.email))


def _answer(result: signin.SignedIn | DomainError, response: Response) -> SignInRead | JSONResponse:
    if isinstance(result, DomainError):
        # Returned, not raised: the failed attempt must be committed to count toward the limit.
        return JSONResponse(error_body(result.code, result.message), status_code=status_of(result))
    set_session_cookie(response, result.token)
    return SignInRead(participant_code=result.participant.code, token=result.token,
                      csrf_token=csrf_token_for(result.token), method=result.method)


@router.post("/sign-in/link", response_model=SignInRead, responses=REFUSED)
def sign_in_with_link(body: SignInWithLink, session: SessionDep, request: Request,
                      response: Response) -> SignInRead | JSONResponse:
    """Use an emailed sign-in link (once): a new session, as a token and the httponly cookie."""
    return _answer(signin.sign_in_with_link(session, body.token, client=client_address(request)), response)


@router.post("/sign-in/code", response_model=SignInRead, responses=REFUSED)
def sign_in_with_code(body: SignInWithCode, session: SessionDep, request: Request,
                      response: Response) -> SignInRead | JSONResponse:
    """Sign in with the return code given at enrollment."""
    return _answer(signin.sign_in_with_code(session, body.return_code, client=client_address(request)), response)


@router.post("/me/return-code", status_code=status.HTTP_201_CREATED,
             responses=refusals({403: "the participant withdrew (code withdrawn)"}))
def new_return_code(session: SessionDep, participant: CurrentParticipant) -> ReturnCodeRead:
    """A new return code (shown once); the previous one stops working."""
    return ReturnCodeRead(return_code=signin.issue_return_code(session, participant))
