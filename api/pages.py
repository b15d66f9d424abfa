"""The participant web app: server-rendered pages over the same services as the API.

Every page works without JavaScript (plain forms, CSRF token in each, the httponly session
cookie); ``static/app.js`` only adds time-zone detection, saving survey answers as they are
given, and streaming chat replies. Responses carry a strict Content-Security-Policy (no inline
script or style), see ``security_headers``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from zoneinfo import available_timezones

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from markdown_it import MarkdownIt
from sqlalchemy.orm import Session
from starlette.datastructures import FormData

from api.deps import SESSION_COOKIE, SessionDep, set_session_cookie
from api.errors import error_body
from api.routers import chat as chat_api
from chat import service as chat_service
from chat.roles import ROLE_SPECS
from scheduler import planner
from scheduler import service as scheduler_service
from study import audit
from study import participants as participant_service
from study.clock import now
from study.db import session_scope
from study.errors import DomainError, NotFound
from study.models import Participant, ParticipantStatus, Study, WithdrawalLevel
from study.security import csrf_token_for, csrf_token_valid
from study.studies import current_protocol
from surveys import service as survey_service
from surveys.models import SurveyAssignment

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(include_in_schema=False)
PRE_COOKIE = "afterward_pre"  # double-submit CSRF token for the invite form (no session yet)
_markdown = MarkdownIt("commonmark", {"html": False})
ZONES = sorted(z for z in available_timezones() if "/" in z and not z.startswith(("Etc/", "SystemV/", "posix/")))

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'")


async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    response = await call_next(request)
    if not request.url.path.startswith(("/docs", "/redoc")):  # FastAPI's API explorer loads its own scripts
        response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")  # survey links carry a token
    response.headers.setdefault("X-Frame-Options", "DENY")
    return response


# Helpers


class Redirect(Exception):
    def __init__(self, to: str) -> None:
        self.to = to


def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    token = request.cookies.get(SESSION_COOKIE)
    context.setdefault("csrf", csrf_token_for(token) if token else "")
    context.setdefault("signed_in", bool(token))
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def see_other(to: str) -> RedirectResponse:
    return RedirectResponse(to, status_code=303)


def _signed_in(session: Session, request: Request) -> Participant | None:
    """The participant of the session cookie, if any (withdrawn or not, consented or not)."""
    token = request.cookies.get(SESSION_COOKIE)
    return participant_service.participant_for_token(session, token) if token else None


def _participant(session: Session, request: Request) -> Participant:
    participant = _signed_in(session, request)
    if participant is None:
        raise Redirect("/?expired=1")
    return participant


def _check_csrf(request: Request, form: FormData) -> None:
    token = request.cookies.get(SESSION_COOKIE, "")
    if not token or not csrf_token_valid(token, str(form.get("csrf", ""))):
        raise Redirect("/?expired=1")


def _next_step(session: Session, participant: Participant) -> str | None:
    """Where a participant who is not ready for the app must go first."""
    if participant.is_withdrawn:
        return "/me"
    if participant_service.consent_status(session, participant).needs_consent:
        return "/consent"
    if participant.status != ParticipantStatus.ENROLLED:
        return "/onboarding"
    return None


def _ready(session: Session, request: Request) -> Participant:
    participant = _participant(session, request)
    step = _next_step(session, participant)
    if step:
        raise Redirect(step)
    return participant


def _resources(session: Session, participant: Participant | None) -> tuple[str, str]:
    if participant is None:
        return "default", ("If you are in danger or thinking about harming yourself, call your local emergency "
                           "number now. You can find a free, confidential helpline at https://findahelpline.com.")
    return current_protocol(session, participant.study_id).crisis_resources_for(participant.timezone)


def markdown(text: str) -> str:
    return _markdown.render(text)


templates.env.filters["markdown"] = markdown


# Invite and consent


@router.get("/", response_class=HTMLResponse)
def home(request: Request, session: SessionDep) -> Response:
    participant = _signed_in(session, request)
    if participant is None:
        pre = request.cookies.get(PRE_COOKIE) or secrets.token_urlsafe(24)
        response = page(request, "join.html", pre=pre, expired="expired" in request.query_params,
                        code=request.query_params.get("code", ""))
        response.set_cookie(PRE_COOKIE, pre, httponly=True, samesite="strict", path="/")
        return response
    step = _next_step(session, participant)
    if step and step != "/me":
        return see_other(step)
    pending = survey_service.pending(session, participant) if not participant.is_withdrawn else []
    return page(request, "home.html", participant=participant, pending=pending,
                study=session.get(Study, participant.study_id))


@router.post("/join")
async def join(request: Request) -> Response:
    form = await request.form()
    pre = request.cookies.get(PRE_COOKIE)
    if not pre or form.get("pre") != pre:
        return see_other("/?expired=1")
    code = str(form.get("invite_code", "")).strip()
    try:
        with session_scope(request.app.state.engine) as session:
            enrollment = participant_service.enroll(session, code)
            token = enrollment.token
    except DomainError as exc:
        return page(request, "join.html", status_code=400, pre=pre, code=code, error=exc.message)
    response = see_other("/consent")
    set_session_cookie(response, token)
    response.delete_cookie(PRE_COOKIE, path="/")
    return response


@router.get("/consent", response_class=HTMLResponse)
def consent(request: Request, session: SessionDep) -> Response:
    participant = _participant(session, request)
    state = participant_service.consent_status(session, participant)
    return page(request, "consent.html", state=state, participant=participant,
                revised=state.signed is not None and state.needs_consent)


@router.post("/consent")
async def sign(request: Request) -> Response:
    form = await request.form()
    _check_csrf(request, form)
    with session_scope(request.app.state.engine) as session:
        participant = _participant(session, request)
        state = participant_service.consent_status(session, participant)
        try:
            participant_service.sign_consent(
                session, participant, version=str(form.get("version", "")),
                confirmations=[str(c) for c in form.getlist("confirmations")],
                typed_signature=str(form.get("typed_signature", "")))
        except DomainError as exc:
            session.rollback()
            return page(request, "consent.html", status_code=422, state=state, participant=participant,
                        revised=state.signed is not None and state.needs_consent, error=exc.message,
                        checked=set(form.getlist("confirmations")), typed=form.get("typed_signature", ""))
        ready = participant.status == ParticipantStatus.ENROLLED
    return see_other("/" if ready else "/onboarding")


@router.get("/onboarding", response_class=HTMLResponse)
def onboarding(request: Request, session: SessionDep) -> Response:
    participant = _participant(session, request)
    if participant_service.consent_status(session, participant).needs_consent:
        return see_other("/consent")
    protocol = current_protocol(session, participant.study_id)
    return page(request, "onboarding.html", zones=ZONES, participant=participant,
                selected=participant.timezone or protocol.enrollment.default_timezone or "",
                email_required=protocol.enrollment.contact_email == "required")


@router.post("/onboarding")
async def onboard(request: Request) -> Response:
    form = await request.form()
    _check_csrf(request, form)
    with session_scope(request.app.state.engine) as session:
        participant = _participant(session, request)
        first_time = participant.enrolled_at is None
        email = str(form.get("contact_email", "")).strip() or None
        try:
            if email is not None and "@" not in email:
                raise DomainError("this email address does not look right; check it or leave the field empty")
            participant_service.update_profile(session, participant, timezone=str(form.get("timezone", "")),
                                               contact_email=email)
        except DomainError as exc:
            session.rollback()
            protocol = current_protocol(session, participant.study_id)
            return page(request, "onboarding.html", status_code=422, zones=ZONES, participant=participant,
                        selected=str(form.get("timezone", "")), email=email or "", error=exc.message,
                        email_required=protocol.enrollment.contact_email == "required")
        if first_time:
            baseline = survey_service.assign_baseline(session, participant,
                                                      current_protocol(session, participant.study_id).baseline)
            planner.on_enrollment(session, participant)
            if baseline:
                return see_other(f"/surveys/{baseline[0].id}")
    return see_other("/")


# Surveys: one screen per block; answers are saved with every step.


def _blocks(rendered: survey_service.RenderedSurvey) -> list[dict[str, Any]]:
    anchors = {block.id: list(block.anchors or ()) for block in rendered.instrument.blocks}
    screens: list[dict[str, Any]] = []
    for item in rendered.items:
        key = item.get("block") or "main"
        if not screens or screens[-1]["id"] != key:
            screens.append({"id": key, "anchors": anchors.get(key, []), "items": []})
        screens[-1]["items"].append(item)
    return screens


def _answers_from(form: FormData, items: list[dict[str, Any]]) -> dict[str, Any]:
    """Form fields to answers: numbers for scales, lists for multiple choice, None for blanks."""
    answers: dict[str, Any] = {}
    for item in items:
        kind, key = item["type"], item["id"]
        if kind == "multiple":
            answers[key] = [str(v) for v in form.getlist(key)] or None
            continue
        raw = str(form.get(key, "")).strip()
        if raw == "":
            answers[key] = None
        elif kind in ("likert", "slider", "number"):
            try:
                number = float(raw)
                answers[key] = int(number) if number.is_integer() else number
            except ValueError:
                answers[key] = raw  # the instrument's check names the problem
        else:
            answers[key] = raw
    return answers


def _survey_page(request: Request, session: Session, assignment: SurveyAssignment, step: int, action: str,
                 errors: dict[str, str] | None = None, status_code: int = 200) -> Response:
    rendered = survey_service.render(session, assignment)
    screens = _blocks(rendered)
    step = max(0, min(step, len(screens) - 1))
    closed = survey_service.closed_reason(assignment)
    return page(request, "survey.html", status_code=status_code, rendered=rendered, screen=screens[step], step=step,
                steps=len(screens), action=action, closed=closed, errors=errors or {},
                saved=rendered.saved_answers, submission_id=secrets.token_hex(8))


async def _survey_post(request: Request, assignment_for: Callable[[Session], tuple[SurveyAssignment, Participant]],
                       action: str, done: str) -> Response:
    form = await request.form()
    with session_scope(request.app.state.engine) as session:
        assignment, participant = assignment_for(session)
        screens = _blocks(survey_service.render(session, assignment))
        step = max(0, min(int(str(form.get("step", "0")) or 0), len(screens) - 1))
        answers = _answers_from(form, screens[step]["items"])
        finishing = form.get("go") == "submit"
        try:
            survey_service.save_partial(session, participant, assignment, answers)
            if finishing:
                survey_service.submit(session, participant, assignment, {},
                                      submission_id=str(form.get("submission_id", "")) or secrets.token_hex(8))
        except survey_service.AnswerError as exc:
            session.rollback()
            return _survey_page(request, session, assignment, step, action, status_code=422,
                                errors={f["field"]: f["message"] for f in exc.fields})
        except DomainError:
            session.rollback()
            return _survey_page(request, session, assignment, step, action, status_code=409)
    if finishing:
        return see_other(done)
    target = step - 1 if form.get("go") == "back" else step + 1
    return see_other(f"{action}?step={target}")


@router.get("/surveys", response_class=HTMLResponse)
def surveys(request: Request, session: SessionDep) -> Response:
    participant = _ready(session, request)
    return page(request, "surveys.html", pending=survey_service.pending(session, participant))


@router.get("/surveys/{assignment_id}", response_class=HTMLResponse)
def survey(assignment_id: int, request: Request, session: SessionDep, step: int = 0) -> Response:
    participant = _ready(session, request)
    assignment = survey_service.owned_assignment(session, participant, assignment_id)
    return _survey_page(request, session, assignment, step, f"/surveys/{assignment_id}")


@router.post("/surveys/{assignment_id}")
async def answer_survey(assignment_id: int, request: Request) -> Response:
    form = await request.form()
    _check_csrf(request, form)

    def owned(session: Session) -> tuple[SurveyAssignment, Participant]:
        participant = _ready(session, request)
        return survey_service.owned_assignment(session, participant, assignment_id), participant
    return await _survey_post(request, owned, f"/surveys/{assignment_id}", "/done")


@router.get("/done", response_class=HTMLResponse, name="survey_done")
def survey_done(request: Request) -> Response:
    return page(request, "message.html", title="Thank you", body="Your answers were saved.", back="/")


@router.get("/s/{token}", response_class=HTMLResponse)
def linked_survey(token: str, request: Request, session: SessionDep, step: int = 0) -> Response:
    try:
        assignment, _ = survey_service.assignment_for_link(session, token, _signed_in(session, request))
    except DomainError as exc:
        return page(request, "message.html", status_code=404, title="This link can't be used",
                    body=exc.message, back="/")
    return _survey_page(request, session, assignment, step, f"/s/{token}")


@router.post("/s/{token}")
async def answer_linked_survey(token: str, request: Request) -> Response:
    def linked(session: Session) -> tuple[SurveyAssignment, Participant]:
        return survey_service.assignment_for_link(session, token, _signed_in(session, request))
    # The signed link is the credential here (no session needed), and it names one survey of one person.
    try:
        return await _survey_post(request, linked, f"/s/{token}", "/done")
    except DomainError as exc:
        return page(request, "message.html", status_code=404, title="This link can't be used", body=exc.message,
                    back="/")


# Chat


@router.get("/chat", response_class=HTMLResponse)
def chat_home(request: Request, session: SessionDep) -> Response:
    participant = _ready(session, request)
    arm, offered = chat_service.roles_offered(session, participant)
    conversations = chat_service.list_conversations(session, participant)
    return page(request, "chat_start.html", offered=offered, mode=arm.mode, default_role=arm.default_role,
                conversations=conversations)


@router.post("/chat")
async def chat_start(request: Request) -> Response:
    form = await request.form()
    _check_csrf(request, form)
    with session_scope(request.app.state.engine) as session:
        participant = _ready(session, request)
        role = str(form.get("role", "")) or None
        conversation = chat_service.start_conversation(session, participant, role)
        return see_other(f"/chat/{conversation.id}")


@router.get("/chat/{conversation_id}", response_class=HTMLResponse)
def chat_page(conversation_id: int, request: Request, session: SessionDep) -> Response:
    participant = _ready(session, request)
    conversation = chat_service.get_conversation(session, participant, conversation_id)
    arm, offered = chat_service.roles_offered(session, participant)
    region, resources = _resources(session, participant)
    responses = chat_api.pushback_responses(session, conversation.id)
    return page(request, "chat.html", conversation=conversation, turns=chat_service.turns(session, conversation),
                responses=responses, offered=offered, mode=arm.mode, resources=resources,
                role=ROLE_SPECS[conversation.role], failed=request.query_params.get("failed"))  # type: ignore[index]


Prepare = Callable[[Session, Participant, FormData], chat_service.PreparedTurn | None]


async def _chat_action(request: Request, conversation_id: int, prepare: Prepare) -> Response:
    form = await request.form()
    _check_csrf(request, form)
    with session_scope(request.app.state.engine) as session:
        participant = _ready(session, request)
        try:
            prepared = prepare(session, participant, form)
        except DomainError as exc:
            session.rollback()
            return page(request, "message.html", status_code=409, title="That didn't work", body=exc.message,
                        back=f"/chat/{conversation_id}")
    if prepared is not None:
        try:
            await chat_api.reply_to(request, chat_api.gateway_of(request), prepared)
        except DomainError:
            return see_other(f"/chat/{conversation_id}?failed=1#composer")
    return see_other(f"/chat/{conversation_id}#latest")


@router.post("/chat/{conversation_id}/send")
async def chat_send(conversation_id: int, request: Request) -> Response:
    def prepare(session: Session, participant: Participant, form: FormData) -> chat_service.PreparedTurn:
        prepared, _ = chat_service.accept_message(session, participant, conversation_id,
                                                  str(form.get("content", "")), str(form.get("mid", "")) or None)
        return prepared
    return await _chat_action(request, conversation_id, prepare)


@router.post("/chat/{conversation_id}/retry")
async def chat_retry(conversation_id: int, request: Request) -> Response:
    return await _chat_action(request, conversation_id,
                              lambda s, p, f: chat_service.prepare_retry(s, p, conversation_id))


@router.post("/chat/{conversation_id}/turns/{turn_id}/override")
async def chat_override(conversation_id: int, turn_id: int, request: Request) -> Response:
    return await _chat_action(request, conversation_id,
                              lambda s, p, f: chat_service.prepare_override(s, p, conversation_id, turn_id))


@router.post("/chat/{conversation_id}/turns/{turn_id}/reconsider")
async def chat_reconsider(conversation_id: int, turn_id: int, request: Request) -> Response:
    def prepare(session: Session, participant: Participant, form: FormData) -> None:
        chat_service.reconsider(session, participant, conversation_id, turn_id)
    return await _chat_action(request, conversation_id, prepare)


@router.post("/chat/{conversation_id}/role")
async def chat_role(conversation_id: int, request: Request) -> Response:
    def prepare(session: Session, participant: Participant, form: FormData) -> None:
        chat_service.switch_role(session, participant, conversation_id, str(form.get("role", "")))
    return await _chat_action(request, conversation_id, prepare)


@router.get("/chat/{conversation_id}/end", response_class=HTMLResponse)
def chat_exit(conversation_id: int, request: Request, session: SessionDep) -> Response:
    participant = _ready(session, request)
    conversation = chat_service.get_conversation(session, participant, conversation_id)
    return page(request, "exit_check.html", conversation=conversation)


@router.post("/chat/{conversation_id}/end")
async def chat_end(conversation_id: int, request: Request) -> Response:
    form = await request.form()
    _check_csrf(request, form)
    made = form.get("made_decision") == "yes"
    decision = str(form.get("decision", "")).strip() or None
    rating_raw = str(form.get("rating", ""))
    rating = int(rating_raw) if rating_raw.isdigit() and 1 <= int(rating_raw) <= 7 else None
    with session_scope(request.app.state.engine) as session:
        participant = _ready(session, request)
        try:
            chat_api.end_with_exit_check(session, participant, conversation_id, rating=rating, made_decision=made,
                                         decision=decision if made else None)
        except DomainError as exc:
            session.rollback()
            conversation = chat_service.get_conversation(session, participant, conversation_id)
            return page(request, "exit_check.html", status_code=422, conversation=conversation, error=exc.message,
                        rating=rating, made=made, decision=decision or "")
    return page(request, "message.html", title="Thank you",
                body=("We will ask you in a few days how this decision turned out." if made else
                      "Your answers were saved."), back="/")


# My study, withdrawal, help


@router.get("/me", response_class=HTMLResponse)
def my_study(request: Request, session: SessionDep) -> Response:
    participant = _participant(session, request)
    study = session.get(Study, participant.study_id)
    protocol = current_protocol(session, participant.study_id)
    followups = [f for f in scheduler_service.schedule(session, participant) if f.status in ("planned", "sent")]
    return page(request, "my_study.html", participant=participant, study=study, followups=followups,
                deletion_allowed=protocol.withdrawal.allow_data_deletion, now=now())


@router.post("/me/withdraw")
async def withdraw(request: Request) -> Response:
    form = await request.form()
    _check_csrf(request, form)
    if form.get("confirm") != "yes":
        with session_scope(request.app.state.engine) as session:
            participant = _participant(session, request)
            protocol = current_protocol(session, participant.study_id)
            return page(request, "my_study.html", status_code=422, participant=participant,
                        study=session.get(Study, participant.study_id), followups=[],
                        deletion_allowed=protocol.withdrawal.allow_data_deletion, now=now(),
                        error="Tick the box to confirm that you want to withdraw.")
    level = (WithdrawalLevel.DELETE_DATA if form.get("level") == "delete_data" else WithdrawalLevel.STOP_CONTACT)
    with session_scope(request.app.state.engine) as session:
        participant = _participant(session, request)
        try:
            receipt = participant_service.withdraw(session, participant, level,
                                                   audit.Actor("participant", participant.code))
        except DomainError as exc:
            session.rollback()
            return page(request, "message.html", status_code=409, title="Withdrawal", body=exc.message, back="/me")
    return page(request, "message.html", title="You have withdrawn", body=receipt.message, back="/help",
                back_label="Crisis and support resources")


@router.get("/help", response_class=HTMLResponse)
def help_page(request: Request, session: SessionDep) -> Response:
    participant = _signed_in(session, request)
    region, resources = _resources(session, participant)
    elsewhere = (current_protocol(session, participant.study_id).crisis_resources["default"]
                 if participant is not None and region != "default" else None)
    return page(request, "help.html", resources=resources, region=region, elsewhere=elsewhere)


def install(app: Any) -> None:
    """Pages, static files, security headers, and redirects for pages that need another step."""
    from fastapi.staticfiles import StaticFiles
    from starlette.middleware.base import BaseHTTPMiddleware

    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.include_router(router)
    app.add_middleware(BaseHTTPMiddleware, dispatch=security_headers)

    @app.exception_handler(Redirect)
    async def _redirect(_: Request, exc: Redirect) -> Response:
        return see_other(exc.to)

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse(error_body(exc.code, exc.message), status_code=404)
        return page(request, "message.html", status_code=404, title="Not found", body=exc.message, back="/")
