"""The participant web app: server-rendered pages over the same services as the API.

Every page works without JavaScript (plain forms, CSRF token in each, the httponly session
cookie); ``static/app.js`` only adds time-zone detection, saving survey answers as they are
given, and streaming chat replies. Responses carry a strict Content-Security-Policy (no inline
script or style), see ``api.edge.security_headers``.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any
from zoneinfo import available_timezones

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import languages
from api.client_address import client_address
from api.deps import SESSION_COOKIE, Form, RowId, SessionDep, set_session_cookie
from api.errors import error_body, status_of
from api.page_text import markdown, resources_html
from api.routers import chat as chat_api
from scheduler import service as scheduler_service
from study import audit, i18n, signin
from study import participants as participant_service
from study.clock import now
from study.errors import DomainError, NotFound, TooManyAttempts
from study.i18n import N_
from study.models import Participant, ParticipantStatus, WithdrawalLevel
from study.schemas import (
    ConsentAboutRead,
    ConsentSign,
    ProfileUpdate,
    SignInLinkCreate,
    SignInWithCode,
    WithdrawalCreate,
)
from study.security import csrf_token_for, csrf_token_valid
from study.studies import current_protocol, protocol_for_consent
from study.validation import form_int, line
from surveys import safety_rules
from surveys import service as survey_service
from surveys.models import SurveyAssignment
from surveys.schemas import SUBMISSION_ID_PATTERN

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
languages.install(templates.env)
router = APIRouter(include_in_schema=False)
PRE_COOKIE = "afterward_pre"  # double-submit CSRF token for the invite form (no session yet)
ZONES = ["UTC", *sorted(z for z in available_timezones()
                        if "/" in z and not z.startswith(("Etc/", "SystemV/", "posix/")))]

# Helpers


class Redirect(Exception):
    def __init__(self, to: str) -> None:
        self.to = to


# The navigation by the participant's status: the app's pages only once enrolled (consent signed,
# profile complete), "My study" alone after withdrawal, nothing before consent or without a session.
NAV: dict[str, tuple[tuple[str, str], ...]] = {
    ParticipantStatus.ENROLLED: (("/chat", N_("Chat")), ("/surveys", N_("Surveys")), ("/me", N_("My study"))),
    ParticipantStatus.WITHDRAWN: (("/me", N_("My study")),),
}


def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    token = request.cookies.get(SESSION_COOKIE)
    context.setdefault("csrf", csrf_token_for(token) if token else "")
    # The status of the participant this request looked up (``_signed_in``); a page that looked up
    # nobody (an error page, say) shows no navigation.
    context.setdefault("nav", NAV.get(getattr(request.state, "participant_status", ""), ()))
    for key, value in languages.context(request).items():
        context.setdefault(key, value)
    for key in ("title", "body", "back_label", "message"):  # the page's words from Python (N_), in its language
        if isinstance(context.get(key), str):
            context[key] = i18n.gettext(context["lang"], context[key])
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def is_page(request: Request) -> bool:
    """A participant page (HTML), as opposed to the API and the operational routes (JSON)."""
    return not request.url.path.startswith(("/api/", "/healthz", "/docs", "/redoc", "/openapi.json", "/static/"))


def _prefill(raw: str) -> str:
    """A value from the address shown back in a form field: as the validator would accept it, or nothing."""
    try:
        return line(raw)[:64]
    except ValueError:
        return ""


def see_other(to: str) -> RedirectResponse:
    return RedirectResponse(to, status_code=303)


def _signed_in(session: Session, request: Request) -> Participant | None:
    """The participant of the session cookie, if any (withdrawn or not, consented or not); their
    status is kept for the page's navigation (``page``)."""
    token = request.cookies.get(SESSION_COOKIE)
    participant = participant_service.participant_for_token(session, token) if token else None
    request.state.participant_status = participant.status if participant is not None else ""
    languages.remember(request, session, participant)
    return participant


def _participant(session: Session, request: Request) -> Participant:
    participant = _signed_in(session, request)
    if participant is None:
        raise Redirect("/?expired=1")
    return participant


def check_csrf(request: Request, form: FormData) -> None:
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


def ready(session: Session, request: Request) -> Participant:
    participant = _participant(session, request)
    step = _next_step(session, participant)
    if step:
        raise Redirect(step)
    return participant


def refused(session: Session, request: Request, exc: DomainError | ValidationError, *, name: str = "message.html",
            status_code: int | None = None, context: Callable[[], dict[str, Any]] | None = None,
            render: Callable[[], Response] | None = None, **values: Any) -> Response:
    """The page for a form the services refused, after what the handler did in this request's
    transaction is rolled back: ``name`` with ``problem(exc)`` (``message.html``'s body, any other
    page's ``error``), the error's status (422 for an invalid form) and ``values``; ``context``
    gives what the page needs to read from the database, once the transaction is rolled back;
    ``render`` builds a page of its own instead."""
    session.rollback()
    if render is not None:
        return render()
    status = status_code or (status_of(exc) if isinstance(exc, DomainError) else 422)
    values.setdefault("body" if name == "message.html" else "error", problem(exc))
    if name == "message.html":
        values.setdefault("title", N_("That didn't work"))
        values.setdefault("back", "/")
    return page(request, name, status_code=status, **values, **(context() if context else {}))


def problem(exc: DomainError | ValidationError) -> str:
    """What to tell the participant, as a sentence on a page (the API's messages start in lower
    case): the domain error's message, or the first invalid field's."""
    if isinstance(exc, DomainError):
        text = exc.message
    else:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "this form"
        text = f"{field.replace('_', ' ')}: {str(first['msg']).removeprefix('Value error, ')}"
    return as_sentence(text)


def as_sentence(text: str) -> str:
    """A service's message (in lower case, as the API gives it) as a sentence on a page."""
    return text[:1].upper() + text[1:]


templates.env.filters["markdown"] = markdown
templates.env.filters["resources"] = resources_html


def _public_text(session: Session, participant: Participant) -> dict[str, Any]:
    """The study as participants know it: the protocol's public title and description, never the
    internal title (which may name the hypothesis)."""
    info = current_protocol(session, participant.study_id).study
    return {"study_title": info.title_in(participant.language),
            "study_description": info.description_in(participant.language)}


def _listed(session: Session, participant: Participant, pending: list[SurveyAssignment]) -> list[dict[str, Any]]:
    """Surveys waiting for the participant as a list shows them: the instrument's title and when it
    closes, in their language and time zone."""
    language = participant.language or i18n.SOURCE
    return [{"id": a.id, "title": survey_service.shown(session, a)[0].title,
             "closes": i18n.moment_text(a.closes_at, participant.timezone, language) if a.closes_at else None}
            for a in pending]


def _consent_about(session: Session, state: participant_service.ConsentStatus,
                   participant: Participant) -> ConsentAboutRead:
    return ConsentAboutRead.of(protocol_for_consent(session, state.current.id),
                               participant_service.consent_language(participant, state.current))


def _consent_shown(participant: Participant, state: participant_service.ConsentStatus) -> dict[str, Any]:
    """The consent version in force as this participant reads it: its language, text and confirmations."""
    language = participant_service.consent_language(participant, state.current)
    return {"consent_language": language, "consent_text": state.current.text_in(language),
            "confirmations": state.current.confirmations_in(language)}


# Invite and consent


@router.get("/", response_class=HTMLResponse)
def home(request: Request, session: SessionDep) -> Response:
    participant = _signed_in(session, request)
    if participant is None:
        pre = request.cookies.get(PRE_COOKIE) or secrets.token_urlsafe(24)
        response = page(request, "join.html", pre=pre, expired="expired" in request.query_params,
                        code=_prefill(request.query_params.get("code", "")),
                        panel_id=_prefill(request.query_params.get("panel_id", "")))
        response.set_cookie(PRE_COOKIE, pre, httponly=True, samesite="strict", path="/")
        return response
    step = _next_step(session, participant)
    if step and step != "/me":
        return see_other(step)
    pending = survey_service.pending(session, participant) if not participant.is_withdrawn else []
    return page(request, "home.html", participant=participant, pending=_listed(session, participant, pending),
                **_public_text(session, participant))


@router.post("/language")
def choose_language(request: Request, form: Form, session: SessionDep) -> Response:
    """The language menu: a participant's choice is kept with them (pages, emails, surveys); before
    joining, and after withdrawing, this browser's is kept in a cookie."""
    language = str(form.get("language", ""))[:16]
    participant = _signed_in(session, request)
    if participant is not None and not participant.is_withdrawn:
        check_csrf(request, form)
        try:
            participant_service.set_language(session, participant, language)
        except DomainError as exc:
            return refused(session, request, exc, status_code=422)
    elif language not in i18n.interface_languages():
        return page(request, "message.html", status_code=422, title=N_("That didn't work"),
                    body=N_("The pages are not offered in that language."), back="/")
    return languages.chosen(languages.redirect(str(form.get("next", "/"))), language)


@router.post("/join")
def join(request: Request, form: Form, session: SessionDep) -> Response:
    pre = request.cookies.get(PRE_COOKIE)
    if not pre or form.get("pre") != pre:
        return see_other("/?expired=1")
    code = str(form.get("invite_code", "")).strip()[:64]
    panel_id = str(form.get("panel_id", "")).strip()[:200] or None
    try:
        token = participant_service.enroll(session, code, panel_id, languages.wanted(request)).token
    except DomainError as exc:
        return refused(session, request, exc, name="join.html", status_code=400, pre=pre, code=code,
                       panel_id=panel_id or "")
    response = see_other("/consent")
    set_session_cookie(response, token)
    response.delete_cookie(PRE_COOKIE, path="/")
    return response


# Coming back: a sign-in link emailed to the address on file, the link of a follow-up email, or the
# return code (study.signin). The forms carry the double-submit token of the invite form, so another
# site cannot sign a visitor in as someone else.


def _with_pre(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
    """A page with the sign-in forms, and the double-submit cookie they need."""
    pre = request.cookies.get(PRE_COOKIE) or secrets.token_urlsafe(24)
    response = page(request, name, status_code=status_code, pre=pre, **context)
    response.set_cookie(PRE_COOKIE, pre, httponly=True, samesite="strict", path="/")
    return response


def _pre_ok(request: Request, form: FormData) -> bool:
    pre = request.cookies.get(PRE_COOKIE)
    return bool(pre) and form.get("pre") == pre


def _signed_in_again(result: signin.SignedIn) -> Response:
    response = see_other("/me" if result.purpose == signin.FOLLOWUP_LINK else "/")
    set_session_cookie(response, result.token)
    response.delete_cookie(PRE_COOKIE, path="/")
    return response


def _link_not_usable(request: Request, exc: DomainError) -> Response:
    """A used, expired or broken link: say so, and offer a new one (not to a withdrawn participant)."""
    return _with_pre(request, "sign_in.html", status_code=status_of(exc), state="refused", title=N_("Sign in again"),
                     message=exc.message, ask_again=exc.code != "withdrawn")


@router.post("/sign-in/email")
def ask_for_sign_in_link(request: Request, form: Form, session: SessionDep) -> Response:
    if not _pre_ok(request, form):
        return see_other("/?expired=1")
    typed = str(form.get("email", "")).strip()[:320]
    try:
        address = SignInLinkCreate(email=typed).email
        signin.request_link(session, address, client=client_address(request))
    except (ValidationError, TooManyAttempts) as exc:
        return _with_pre(request, "join.html", status_code=429 if isinstance(exc, TooManyAttempts) else 422,
                         email=typed, email_error=problem(exc))
    return page(request, "sign_in.html", state="sent", title=N_("Check your email"),
                message=signin.requested_message(address))


@router.post("/sign-in/code")
def sign_in_with_code(request: Request, form: Form, session: SessionDep) -> Response:
    if not _pre_ok(request, form):
        return see_other("/?expired=1")
    typed = str(form.get("return_code", "")).strip()[:64]
    try:
        result = signin.sign_in_with_code(session, SignInWithCode(return_code=typed).return_code,
                                          client=client_address(request))
    except (ValidationError, TooManyAttempts) as exc:
        return _with_pre(request, "join.html", status_code=429 if isinstance(exc, TooManyAttempts) else 422,
                         return_code=typed, code_error=problem(exc))
    if isinstance(result, DomainError):  # the failed attempt is committed: it counts toward the limit
        return _with_pre(request, "join.html", status_code=status_of(result), return_code=typed,
                         code_error=result.message)
    return _signed_in_again(result)


@router.get("/sign-in/link/{token}", response_class=HTMLResponse)
def sign_in_link(token: str, request: Request, session: SessionDep) -> Response:
    """Ask before using the link: mail scanners that open links must not use it up."""
    claims = signin.link_claims(token)
    current = _signed_in(session, request)
    if claims and current is not None and current.id == claims.participant_id and not current.is_withdrawn:
        return see_other("/me" if claims.purpose == signin.FOLLOWUP_LINK else "/")  # signed in here already
    try:
        signin.check_link(session, token)
    except DomainError as exc:
        return _link_not_usable(request, exc)
    if claims:  # the page in the language of the person the link is for
        languages.remember(request, session, session.get(Participant, claims.participant_id))
    return _with_pre(request, "sign_in.html", state="confirm", title=N_("Sign in"), token=token)


@router.post("/sign-in/link/{token}")
def use_sign_in_link(token: str, request: Request, form: Form, session: SessionDep) -> Response:
    if not _pre_ok(request, form):
        return see_other(f"/sign-in/link/{token}")
    try:
        result = signin.sign_in_with_link(session, token, client=client_address(request))
    except TooManyAttempts as exc:
        return _link_not_usable(request, exc)
    if isinstance(result, DomainError):  # the failed attempt is committed: it counts toward the limit
        return _link_not_usable(request, result)
    return _signed_in_again(result)


@router.get("/consent", response_class=HTMLResponse)
def consent(request: Request, session: SessionDep) -> Response:
    participant = _participant(session, request)
    state = participant_service.consent_status(session, participant)
    return page(request, "consent.html", state=state, participant=participant,
                revised=state.signed is not None and state.needs_consent,
                about=_consent_about(session, state, participant),
                **_consent_shown(participant, state))


@router.post("/consent")
def sign(request: Request, form: Form, session: SessionDep) -> Response:
    check_csrf(request, form)
    participant = _participant(session, request)
    state = participant_service.consent_status(session, participant)
    try:
        signed = ConsentSign(version=str(form.get("version", "")),
                             confirmations=[str(c) for c in form.getlist("confirmations")],
                             typed_signature=str(form.get("typed_signature", "")),
                             language=str(form.get("language", "")) or None)  # the language the page showed
        participant_service.sign_consent(session, participant, version=signed.version,
                                         confirmations=signed.confirmations, typed_signature=signed.typed_signature,
                                         language=signed.language)
    except (DomainError, ValidationError) as exc:
        return refused(session, request, exc, name="consent.html", status_code=422, state=state,
                       participant=participant, revised=state.signed is not None and state.needs_consent,
                       context=lambda: {"about": _consent_about(session, state, participant),
                                        **_consent_shown(participant, state)},
                       checked=set(form.getlist("confirmations")), typed=str(form.get("typed_signature", ""))[:200])
    return see_other("/" if participant.status == ParticipantStatus.ENROLLED else "/onboarding")


@router.post("/consent/decline")
def decline(request: Request, form: Form, session: SessionDep) -> Response:
    """Not taking part: someone who has not signed any consent yet leaves the study (as a withdrawal
    that stops all contact); a panel participant goes back to the panel with its screen-out code."""
    check_csrf(request, form)
    participant = _participant(session, request)
    if participant.status != ParticipantStatus.INVITED:
        return see_other("/me")  # who signed withdraws from My study
    participant_service.withdraw(session, participant, WithdrawalLevel.STOP_CONTACT,
                                 audit.Actor("participant", participant.code))
    screen_out = participant_service.screen_out_url(session, participant)
    if screen_out is not None:
        return see_other(screen_out)
    request.state.participant_status = ParticipantStatus.WITHDRAWN
    return page(request, "message.html", title=N_("Thank you"), back="/help", back_label=N_("Help and resources"),
                body=N_("You chose not to take part. Nothing more will be asked of you, and nobody will contact you."))


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
def onboard(request: Request, form: Form, session: SessionDep) -> Response:
    check_csrf(request, form)
    participant = _participant(session, request)
    email = str(form.get("contact_email", "")).strip() or None
    try:
        profile = ProfileUpdate(timezone=str(form.get("timezone", "")), contact_email=email)
        baseline = scheduler_service.save_profile(session, participant, timezone=profile.timezone,
                                                  contact_email=profile.contact_email)
    except (DomainError, ValidationError) as exc:
        return refused(session, request, exc, name="onboarding.html", status_code=422, zones=ZONES,
                       participant=participant, selected=str(form.get("timezone", ""))[:64], email=(email or "")[:320],
                       context=lambda: {"email_required": current_protocol(session, participant.study_id)
                                        .enrollment.contact_email == "required"})
    after = f"/surveys/{baseline[0].id}" if baseline else "/"
    return_code = signin.ensure_return_code(session, participant)
    if return_code is not None:  # no email address to send sign-in links to: shown this once
        return page(request, "return_code.html", code=return_code, next=after)
    return see_other(after)


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
            except ValueError:
                number = math.nan
            if math.isfinite(number):
                answers[key] = int(number) if number.is_integer() else number
            else:
                answers[key] = raw[:100]  # the instrument's check names the problem
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
                steps=len(screens), action=action, closed=closed and as_sentence(closed), errors=errors or {},
                saved=rendered.saved_answers, submission_id=secrets.token_hex(8),
                safety=safety_rules.notice(session, session.get_one(Participant, assignment.participant_id),
                                           assignment.id))


def _survey_post(request: Request, session: Session, form: FormData, assignment: SurveyAssignment,
                 participant: Participant, action: str, done: str) -> Response:
    screens = _blocks(survey_service.render(session, assignment))
    step = form_int(form.get("step", "0"), lo=0, hi=len(screens) - 1)
    if step is None:
        return page(request, "message.html", status_code=422, title=N_("This form is out of date"),
                    body=N_("The survey page you sent does not exist. Open the survey again; your saved answers "
                            "are kept."), back=action)
    answers = _answers_from(form, screens[step]["items"])
    finishing = form.get("go") == "submit"
    submission_id = str(form.get("submission_id", ""))
    if not re.fullmatch(SUBMISSION_ID_PATTERN, submission_id):
        submission_id = secrets.token_hex(8)
    try:  # a submit takes this screen's answers itself: a resent one (a double click) is answered as the first
        stored = (survey_service.submit(session, participant, assignment.id, answers, submission_id=submission_id)
                  if finishing else survey_service.save_partial(session, participant, assignment.id, answers))
    except DomainError as exc:  # invalid answers name their fields; a closed survey says so itself
        errors = ({f["field"]: i18n.gettext(request.state.language, f["message"]) for f in exc.fields}
                  if isinstance(exc, survey_service.AnswerError) else None)
        return refused(session, request, exc, render=lambda: _survey_page(
            request, session, assignment, step, action, status_code=409 if errors is None else 422, errors=errors))
    if finishing:
        panel = participant_service.completion_url(session, participant, survey_service.wave_of(assignment))
        if stored.notice is not None:  # shown at once, not after a redirect that could be missed
            return page(request, "message.html", title=N_("Thank you"), body=N_("Your answers were saved."),
                        back=panel or "/help", back_label="Continue" if panel else "More help", safety=stored.notice)
        return see_other(panel or done)  # a panel participant goes back to the panel with its completion code
    target = step - 1 if form.get("go") == "back" else step + 1
    return see_other(f"{action}?step={target}")


@router.get("/surveys", response_class=HTMLResponse)
def surveys(request: Request, session: SessionDep) -> Response:
    participant = ready(session, request)
    return page(request, "surveys.html",
                pending=_listed(session, participant, survey_service.pending(session, participant)))


@router.get("/surveys/{assignment_id}", response_class=HTMLResponse)
def survey(assignment_id: RowId, request: Request, session: SessionDep) -> Response:
    participant = ready(session, request)
    assignment = survey_service.owned_assignment(session, participant, assignment_id)
    return _survey_page(request, session, assignment, _step(request), f"/surveys/{assignment_id}")


@router.post("/surveys/{assignment_id}")
def answer_survey(assignment_id: RowId, request: Request, form: Form, session: SessionDep) -> Response:
    check_csrf(request, form)
    participant = ready(session, request)
    assignment = survey_service.owned_assignment(session, participant, assignment_id)
    return _survey_post(request, session, form, assignment, participant, f"/surveys/{assignment_id}", "/done")


@router.get("/done", response_class=HTMLResponse, name="survey_done")
def survey_done(request: Request) -> Response:
    return page(request, "message.html", title=N_("Thank you"), body=N_("Your answers were saved."), back="/")


def _step(request: Request) -> int:
    return form_int(request.query_params.get("step"), lo=0, hi=10_000) or 0


def _link_refused(request: Request, exc: DomainError) -> Response:
    return page(request, "message.html", status_code=404, title=N_("This link can't be used"),
                body=as_sentence(exc.message), back="/")


@router.get("/s/{token}", response_class=HTMLResponse)
def linked_survey(token: str, request: Request, session: SessionDep) -> Response:
    try:
        assignment, owner = survey_service.assignment_for_link(session, token, _signed_in(session, request))
    except DomainError as exc:
        return _link_refused(request, exc)
    languages.remember(request, session, owner)  # the page in the language of the person it is for
    return _survey_page(request, session, assignment, _step(request), f"/s/{token}")


@router.post("/s/{token}")
def answer_linked_survey(token: str, request: Request, form: Form, session: SessionDep) -> Response:
    # The signed link is the credential here (no session needed), and it names one survey of one person.
    try:
        assignment, participant = survey_service.assignment_for_link(session, token, _signed_in(session, request))
    except DomainError as exc:
        return _link_refused(request, exc)
    languages.remember(request, session, participant)
    return _survey_post(request, session, form, assignment, participant, f"/s/{token}", "/done")


# My study, withdrawal, help


@router.get("/me", response_class=HTMLResponse)
def my_study(request: Request, session: SessionDep) -> Response:
    participant = _participant(session, request)
    protocol = current_protocol(session, participant.study_id)
    return page(request, "my_study.html", participant=participant, **_public_text(session, participant),
                followups=scheduler_service.coming_up(session, participant),
                deletion_allowed=protocol.withdrawal.allow_data_deletion, now=now())


@router.post("/me/return-code")
def new_return_code(request: Request, form: Form, session: SessionDep) -> Response:
    check_csrf(request, form)
    participant = _participant(session, request)
    replaced = participant.return_code_hmac is not None
    try:
        code = signin.issue_return_code(session, participant)
    except DomainError as exc:
        return refused(session, request, exc, title=N_("Return code"), back="/me")
    return page(request, "return_code.html", code=code, next="/me", replaced=replaced)


@router.post("/me/withdraw")
def withdraw(request: Request, form: Form, session: SessionDep) -> Response:
    check_csrf(request, form)
    participant = _participant(session, request)
    if form.get("confirm") != "yes":
        protocol = current_protocol(session, participant.study_id)
        return page(request, "my_study.html", status_code=422, participant=participant,
                    **_public_text(session, participant), followups=[],
                    deletion_allowed=protocol.withdrawal.allow_data_deletion, now=now(),
                    error="Tick the box to confirm that you want to withdraw.")
    try:
        level = WithdrawalCreate(level=str(form.get("level", WithdrawalLevel.STOP_CONTACT)), confirm=True).level
    except ValidationError as exc:
        return page(request, "message.html", status_code=422, title=N_("Withdrawal"), body=problem(exc), back="/me")
    try:
        receipt = participant_service.withdraw(session, participant, level,
                                               audit.Actor("participant", participant.code))
    except DomainError as exc:
        return refused(session, request, exc, status_code=409, title=N_("Withdrawal"), back="/me")
    request.state.participant_status = ParticipantStatus.WITHDRAWN  # the navigation of the page saying so
    return page(request, "message.html", title=N_("You have withdrawn"), body=receipt.message, back="/help",
                back_label=N_("Crisis and support resources"))


@router.get("/help", response_class=HTMLResponse)
def help_page(request: Request, session: SessionDep) -> Response:
    participant = _signed_in(session, request)
    found = chat_api.crisis_resources(session, participant)
    region, resources = found.region, i18n.gettext(request.state.language, found.text)  # anyone's, in the page's
    elsewhere = (current_protocol(session, participant.study_id).crisis_resources_in("default", participant.language)
                 if participant is not None and region != "default" else None)
    return page(request, "help.html", resources=resources, region=region, elsewhere=elsewhere,
                from_others=i18n.gettext(request.state.language,
                                         chat_api.crisis_resources(session, participant, "risk_from_others").text),
                to_others=i18n.gettext(request.state.language,
                                       chat_api.crisis_resources(session, participant, "harm_to_others").text))


def install(app: Any) -> None:
    """Pages, static files, and redirects for pages that need another step."""
    from fastapi.staticfiles import StaticFiles

    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.include_router(router)

    @app.exception_handler(Redirect)
    async def _redirect(_: Request, exc: Redirect) -> Response:
        return see_other(exc.to)

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound) -> Response:
        if not is_page(request):
            return JSONResponse(error_body(exc.code, exc.message), status_code=404)
        return page(request, "message.html", status_code=404, title=N_("Not found"), body=as_sentence(exc.message),
                    back="/")

    # A browser gets a page, not the API's JSON, when a page's address or form is refused.
    json_validation = app.exception_handlers[RequestValidationError]
    json_http = app.exception_handlers[StarletteHTTPException]

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        if not is_page(request):
            return await json_validation(request, exc)
        if any(error["loc"][:1] == ("path",) for error in exc.errors()):
            return page(request, "message.html", status_code=404, title=N_("Not found"),
                        body=N_("There is no such page. Start again from the home page."), back="/")
        return page(request, "message.html", status_code=422, title=N_("That didn't work"),
                    body=N_("Something in this request was not valid. Go back and try again."), back="/")

    @app.exception_handler(StarletteHTTPException)
    async def _refused(request: Request, exc: StarletteHTTPException) -> Response:
        if not is_page(request) or exc.status_code in (401, 405):
            return await json_http(request, exc)
        title = "Not found" if exc.status_code == 404 else "That didn't work"
        return page(request, "message.html", status_code=exc.status_code, title=title, body=str(exc.detail),
                    back="/")
