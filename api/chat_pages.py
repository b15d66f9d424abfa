"""The participant web app's chat pages: the role picker, the conversation with its pushback
cards, and the exit check (``api.pages`` has the rest of the app and the helpers). A message, a
retry and an override go through ``chat.turn`` as the API's routes do."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.datastructures import FormData

from api.deps import Form, RowId, SessionDep, run_unit
from api.pages import check_csrf, page, ready, refused, see_other
from api.routers import chat as chat_api
from chat import check_ins, triage, turn
from chat import service as chat_service
from chat.roles import ROLE_SPECS, SAFETY_CONCERNS, RoleSpec
from chat.schemas import CheckInAnswers, ConversationCreate, ExitCheck, MessageCreate, RoleChange
from study.errors import DomainError
from study.i18n import N_, gettext
from study.models import Participant
from study.validation import form_int

router = APIRouter(include_in_schema=False)


def _card(request: Request, spec: RoleSpec) -> RoleSpec:
    """The role with its card in the page's language."""
    return replace(spec, disclosure=spec.disclosure.translated(request.state.language))


@router.get("/chat", response_class=HTMLResponse)
def chat_home(request: Request, session: SessionDep) -> Response:
    participant = ready(session, request)
    arm, offered = chat_service.roles_offered(session, participant)
    conversations = chat_service.list_conversations(session, participant)
    return page(request, "chat_start.html", offered=[_card(request, spec) for spec in offered], mode=arm.mode,
                default_role=arm.default_role,
                conversations=conversations)


@router.post("/chat")
def chat_start(request: Request, form: Form, session: SessionDep) -> Response:
    check_csrf(request, form)
    participant = ready(session, request)
    try:
        role = ConversationCreate(role=str(form.get("role", "")) or None).role
        conversation = chat_service.start_conversation(session, participant, role)
    except (DomainError, ValidationError) as exc:
        return refused(session, request, exc, status_code=422, back="/chat")
    return see_other(f"/chat/{conversation.id}")


@router.get("/chat/{conversation_id}", response_class=HTMLResponse)
def chat_page(conversation_id: RowId, request: Request, session: SessionDep) -> Response:
    participant = ready(session, request)
    conversation = chat_service.get_conversation(session, participant, conversation_id)
    arm, offered = chat_service.roles_offered(session, participant)
    turns = chat_service.turns(session, conversation)
    resources = {shown.concern: chat_api.crisis_resources(session, participant, shown.concern).text
                 for shown in turns if shown.stance in ("check_in", "escalate")}
    responses = chat_service.pushback_responses(session, conversation.id)
    asked = {turn_id: chat_api.check_in_read(session, *found)
             for turn_id, found in check_ins.of_conversation(session, conversation.id).items()}
    now_on = check_ins.current(session, conversation.id)  # shown last, where the conversation is
    current = next((read for read in asked.values() if now_on is not None and read.id == now_on.id), None)
    switches: dict[int, list[str]] = {}  # after how many turns -> "Coach to Collaborator"
    for switch in chat_service.role_switches(session, conversation):
        switches.setdefault(switch.after_seq, []).append(
            gettext(request.state.language, "%(before)s to %(after)s",
                    before=_card(request, ROLE_SPECS[switch.from_role]).disclosure.title,
                    after=_card(request, ROLE_SPECS[switch.to_role]).disclosure.title))
    return page(request, "chat.html", conversation=conversation, turns=turns, responses=responses, switches=switches,
                answerable=chat_service.latest_pushback_id(session, conversation.id),
                offered=[_card(request, spec) for spec in offered], mode=arm.mode, resources=resources,
                role=_card(request, ROLE_SPECS[conversation.role]),
                safety_concerns=SAFETY_CONCERNS, writing=chat_service.reply_in_flight(conversation),
                unanswered=chat_service.unanswered(conversation, turns), check_ins=asked, current=current,
                answer_labels={answer: gettext(request.state.language, label)
                               for answer, label in triage.ANSWER_LABELS.items()})


Prepare = Callable[[Session, Participant, FormData], chat_service.PreparedTurn | None]


async def _chat_action(request: Request, conversation_id: int, form: FormData, prepare: Prepare,
                       message: str | None = None) -> Response:
    """Prepare in one unit of work (``chat.turn.prepare``: a new ``message`` read by the crisis
    encoder first); then, for a turn, ask the model outside any transaction."""
    check_csrf(request, form)

    def unit(session: Session) -> chat_service.PreparedTurn | Response | None:
        participant = ready(session, request)
        try:
            return prepare(session, participant, form)
        except (DomainError, ValidationError) as exc:
            return refused(session, request, exc, back=f"/chat/{conversation_id}")
    prepared = await turn.prepare(partial(run_unit, request), unit, message)
    if isinstance(prepared, Response):
        return prepared
    if prepared is not None:
        try:
            await chat_api.reply_to(request, chat_api.gateway_of(request), prepared)
        except DomainError:
            return see_other(f"/chat/{conversation_id}#unanswered")  # the page offers to try again
    return see_other(f"/chat/{conversation_id}#latest")


@router.post("/chat/{conversation_id}/send")
async def chat_send(conversation_id: RowId, request: Request, form: Form) -> Response:
    def prepare(session: Session, participant: Participant, form: FormData) -> chat_service.PreparedTurn:
        message = MessageCreate(content=str(form.get("content", "")),
                                client_message_id=str(form.get("mid", "")) or None)
        prepared, _ = chat_service.accept_message(session, participant, conversation_id, message.content,
                                                  message.client_message_id)
        return prepared
    return await _chat_action(request, conversation_id, form, prepare, str(form.get("content", "")))


@router.post("/chat/{conversation_id}/retry")
async def chat_retry(conversation_id: RowId, request: Request, form: Form) -> Response:
    return await _chat_action(request, conversation_id, form,
                              lambda s, p, f: chat_service.prepare_retry(s, p, conversation_id))


@router.post("/chat/{conversation_id}/turns/{turn_id}/override")
async def chat_override(conversation_id: RowId, turn_id: RowId, request: Request, form: Form) -> Response:
    return await _chat_action(request, conversation_id, form,
                              lambda s, p, f: chat_service.prepare_override(s, p, conversation_id, turn_id))


@router.post("/chat/{conversation_id}/turns/{turn_id}/reconsider")
async def chat_reconsider(conversation_id: RowId, turn_id: RowId, request: Request, form: Form) -> Response:
    def prepare(session: Session, participant: Participant, form: FormData) -> None:
        chat_service.reconsider(session, participant, conversation_id, turn_id)
    return await _chat_action(request, conversation_id, form, prepare)


@router.post("/chat/{conversation_id}/role")
async def chat_role(conversation_id: RowId, request: Request, form: Form) -> Response:
    def prepare(session: Session, participant: Participant, form: FormData) -> None:
        chat_service.switch_role(session, participant, conversation_id, RoleChange(role=str(form.get("role", ""))).role)
    return await _chat_action(request, conversation_id, form, prepare)


@router.post("/chat/{conversation_id}/check-ins/{check_in_id}")
def chat_check_in(conversation_id: RowId, check_in_id: RowId, request: Request, form: Form,
                  session: SessionDep) -> Response:
    """One answer to a check-in's question, from its buttons (as ``POST …/check-ins/{id}/answers``)."""
    check_csrf(request, form)
    participant = ready(session, request)
    try:
        body = CheckInAnswers.model_validate({"answers": {str(form.get("question", "")): str(form.get("answer", ""))}})
        check_ins.answer(session, participant, conversation_id, check_in_id,
                         {str(question): str(value) for question, value in body.answers.items()})
    except (DomainError, ValidationError) as exc:
        return refused(session, request, exc, back=f"/chat/{conversation_id}#check-in-{check_in_id}")
    return see_other(f"/chat/{conversation_id}#check-in-{check_in_id}")


@router.get("/chat/{conversation_id}/end", response_class=HTMLResponse)
def chat_exit(conversation_id: RowId, request: Request, session: SessionDep) -> Response:
    participant = ready(session, request)
    conversation = chat_service.get_conversation(session, participant, conversation_id)
    return page(request, "exit_check.html", conversation=conversation)


@router.post("/chat/{conversation_id}/end")
def chat_end(conversation_id: RowId, request: Request, form: Form, session: SessionDep) -> Response:
    check_csrf(request, form)
    made = form.get("made_decision") == "yes"
    if form.get("made_decision", "no") not in ("yes", "no", ""):
        return page(request, "message.html", status_code=422, title=N_("That didn't work"),
                    body=N_("Answer whether you made a decision with yes or no."), back=f"/chat/{conversation_id}/end")
    decision = str(form.get("decision", "")).strip() or None
    rating = form_int(form.get("rating"), lo=1, hi=7)
    participant = ready(session, request)
    try:
        if str(form.get("rating", "")).strip() and rating is None:
            raise DomainError("choose a rating from 1 to 7, or leave it blank")
        check = ExitCheck(rating=rating, made_decision=made, decision=decision if made else None)
        turn.exit_check(session, participant, conversation_id, rating=check.rating, made_decision=check.made_decision,
                        decision=check.decision, effects=chat_api.EXIT_EFFECTS)
    except (DomainError, ValidationError) as exc:
        return refused(session, request, exc, name="exit_check.html", status_code=422, rating=rating, made=made,
                       decision=(decision or "")[:2000], context=lambda: {
                           "conversation": chat_service.get_conversation(session, participant, conversation_id)})
    return page(request, "message.html", title=N_("Thank you"),
                body=(N_("We will ask you in a few days how this decision turned out.") if made else
                      N_("Your answers were saved.")), back="/")
