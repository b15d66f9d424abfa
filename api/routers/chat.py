"""Chat endpoints. A turn (``chat.turn``) runs in short transactions around the LLM call, so
these handlers run their own units of work (``api.deps.run_unit``, on a worker thread) instead
of using the request session: the participant's message is committed before the model is asked,
and no transaction (on SQLite, no write lock) is held while it answers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import StreamingResponse
from pydantic_core import to_jsonable_python
from sqlalchemy.orm import Session

from api.deps import (
    CONSENTED,
    ConsentedParticipant,
    CurrentParticipant,
    RowId,
    SessionDep,
    consented_participant,
    participant_token,
    run_unit,
)
from api.errors import DocumentedRoute, error_body, refusals
from api.routers.staff import ParticipantLevelAccess, staff_actor
from chat import check_ins, service, staff, turn
from chat import resources as chat_resources
from chat.gateway import Gateway
from chat.models import Turn
from chat.replies import Replies
from chat.roles import SAFETY_CONCERNS
from chat.schemas import (
    CheckInAnswers,
    CheckInRead,
    ConversationCreate,
    ConversationDetail,
    ConversationEnded,
    ConversationRead,
    CrisisResourcesRead,
    DisclosureRead,
    ExchangeRead,
    ExitCheck,
    MessageCreate,
    PushbackResponseRead,
    RoleChange,
    RolesRead,
    SafetyEventRead,
    SafetyReview,
    TurnRead,
)
from chat.turn import Outcome
from scheduler import planner
from study import audit, i18n
from study.errors import Unavailable
from study.i18n import N_
from study.models import Participant
from study.safety import SafetyCheckIn, SafetyEvent
from study.settings import get_settings
from study.studies import current_protocol
from surveys import service as survey_service

router = APIRouter(tags=["chat"], route_class=DocumentedRoute)
staff_router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)
NOT_ENROLLED = {409: "enrollment is not finished: consent, then the profile (code not_enrolled)"}
ROLE = {422: "a role the participant's arm does not offer, or none where one must be chosen "
             "(codes role_required, unknown_role, roles_not_offered)"}
ENDED = {409: "the conversation has ended (code conversation_ended)"}
# A handler that asks the model: it checks the participant itself (as_participant), then may wait for the model.
REPLIES = {**CONSENTED,
           503: "the model did not answer; the message is kept: retry (codes llm_timeout, llm_unavailable)"}
PUSHBACK = {409: "this turn cannot be answered so: it did not push back, is a safety message, was answered "
                 "already or is not the latest note (codes nothing_to_override, not_overridable, already_answered, "
                 "pushback_superseded)"}
T = TypeVar("T")
Token = Annotated[str, Depends(participant_token)]

# What the exit check sets off: the decision's follow-ups, the rating stored as a survey response.
EXIT_EFFECTS = turn.ExitEffects(planner.on_decision, survey_service.assign, survey_service.submit)
RETRY_MESSAGE = ("Your message was saved, but the assistant could not answer just now. Try again in a moment "
                 "(POST .../retry, or resend the same client_message_id); nothing you wrote was lost.")


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway | None = getattr(request.app.state, "gateway", None)
    if gateway is None:
        gateway = request.app.state.gateway = Gateway(get_settings())
    return gateway


async def _gateway(request: Request) -> Gateway:
    return gateway_of(request)  # a coroutine: a dependency without I/O needs no thread-pool hop


GatewayDep = Annotated[Gateway, Depends(_gateway)]


async def as_participant(request: Request, token: str, work: Callable[[Session, Participant], T],
                         message: str | None = None) -> T:
    """Run ``work`` in its own committed transaction, as the consented participant; a new
    ``message`` is read by the crisis encoder first, outside it (``chat.turn.prepare``)."""
    return await turn.prepare(partial(run_unit, request),
                              lambda session: work(session, consented_participant(session, token)), message)


async def in_transaction(request: Request, work: Callable[[Session], T]) -> T:
    return await run_unit(request, work)


GENERIC_CRISIS_RESOURCES = N_(
    "If you are in danger or thinking about harming yourself, call your local emergency number now. "
    "You can find a free, confidential helpline at https://findahelpline.com.")


def crisis_resources(session: Session, participant: Participant | None,
                     category: str | None = None) -> CrisisResourcesRead:
    """The resources for the participant's region that fit ``category``: the protocol's crisis
    lines for a risk to self (and by default), ``chat.resources`` for danger from or to someone
    else; generic ones for someone not signed in."""
    language = (participant.language if participant is not None else None) or i18n.SOURCE
    found = chat_resources.category_resources(category or "", participant.timezone if participant else None)
    if found is not None:
        return CrisisResourcesRead(region=found[0], text=i18n.gettext(language, found[1]))
    if participant is None:
        return CrisisResourcesRead(region="default", text=GENERIC_CRISIS_RESOURCES)
    region, text = current_protocol(session, participant.study_id).crisis_resources_for(participant.timezone,
                                                                                           language)
    return CrisisResourcesRead(region=region, text=text)


def check_in_read(session: Session, check_in: SafetyCheckIn, event: SafetyEvent) -> CheckInRead:
    participant = session.get(Participant, event.participant_id) if event.participant_id is not None else None
    return CheckInRead.of(check_in, event, check_ins.next_step(session, check_in, event),
                          (participant.language if participant is not None else None) or "en")


def turn_read(session: Session, turn: Turn, participant: Participant, response: str | None = None,
              answerable_id: int | None = None,
              asked: dict[int, tuple[SafetyCheckIn, SafetyEvent]] | None = None) -> TurnRead:
    """A turn with the resources its stance offers (a check-in or an escalation, for its concern)
    and the safety check-in it asked (``asked``: the conversation's, by turn); a note can be
    answered only while it is ``answerable_id``, the conversation's latest."""
    resources = (crisis_resources(session, participant, turn.concern)
                 if turn.stance in ("check_in", "escalate") else None)
    found = (asked or {}).get(turn.id)
    read = TurnRead.of(turn, resources, response, check_in_read(session, *found) if found else None)
    overridable = read.overridable and turn.id == answerable_id and turn.concern not in SAFETY_CONCERNS
    rationale = i18n.gettext(participant.language or "en", read.rationale) if read.rationale else read.rationale
    return read.model_copy(update={"crisis_resources": resources, "overridable": overridable, "rationale": rationale})


def _turn_read(session: Session, turn: Turn) -> TurnRead:
    participant = session.get(Participant, turn.participant_id)
    assert participant is not None
    latest = service.latest_pushback_id(session, turn.conversation_id)
    asked = check_ins.of_conversation(session, turn.conversation_id) if turn.stance in ("check_in", "escalate") else {}
    return turn_read(session, turn, participant, answerable_id=latest, asked=asked)


def _exchange(session: Session, prepared: service.PreparedTurn, reply: Turn,
              message: TurnRead | None = None) -> ExchangeRead:
    """The message and its reply; ``message`` as read when it was stored, if the caller has it."""
    if message is None:
        stored = session.get(Turn, prepared.participant_turn_id)
        assert stored is not None
        message = TurnRead.of(stored)
    else:
        message = message.model_copy(update={"reply_status": "answered"})
    return ExchangeRead(conversation_id=prepared.conversation_id, message=message, reply=_turn_read(session, reply))


def _stored_exchange(session: Session, prepared: service.PreparedTurn, reply_id: int,
                     message: TurnRead | None = None) -> ExchangeRead:
    reply = session.get(Turn, reply_id)
    assert reply is not None
    return _exchange(session, prepared, reply, message)


def replies_of(request: Request) -> Replies:
    replies: Replies = request.app.state.replies
    return replies


def _unavailable(outcome: Outcome) -> Unavailable:
    timeout = outcome.error is not None and outcome.error.kind == "timeout"
    return Unavailable(RETRY_MESSAGE, code="llm_timeout" if timeout else "llm_unavailable")


async def reply_to(request: Request, gateway: Gateway, prepared: service.PreparedTurn,
                   message: TurnRead | None = None) -> ExchangeRead:
    """Ask the model for the prepared turn and return the stored exchange (non-streaming). The
    reply is written and stored by a task of its own (chat.replies): cancelling this request,
    or the participant leaving, does not stop it."""
    if prepared.existing_reply_id is not None:  # a resent message, already answered
        reply_id = prepared.existing_reply_id
        return await in_transaction(request, lambda s: _stored_exchange(s, prepared, reply_id))
    outcome = await replies_of(request).complete(gateway, prepared)
    if outcome.reply_id is None:
        raise _unavailable(outcome)
    stored = outcome.reply_id
    return await in_transaction(request, lambda s: _stored_exchange(s, outcome.prepared, stored, message))


def _sse(event: str, payload: Any) -> bytes:
    # Any value pydantic would write (times included) is written exactly as in the plain JSON answers.
    return f"event: {event}\ndata: {json.dumps(payload, default=to_jsonable_python)}\n\n".encode()


async def _stream(request: Request, gateway: Gateway, prepared: service.PreparedTurn,
                  message: TurnRead) -> AsyncIterator[bytes]:
    """Server-sent events: ``message`` (saved), ``delta`` (reply text as it comes), then ``reply``
    (the stored turn with its stance; its content replaces the streamed text) or ``error``. When
    the platform already requires a safety stance there are no deltas (chat.replies). A client
    that goes away stops only the events: the reply is still stored."""
    yield _sse("message", message.model_dump(mode="json"))
    if prepared.existing_reply_id is not None:
        reply_id = prepared.existing_reply_id
        exchange = await in_transaction(request, lambda s: _stored_exchange(s, prepared, reply_id))
        yield _sse("reply", exchange.reply.model_dump(mode="json"))
        return
    reply = replies_of(request).start(gateway, prepared, streamed=True)
    async for text in reply.pieces():
        yield _sse("delta", {"text": text})
    outcome = await reply.outcome()
    if outcome.reply_id is None:
        unavailable = _unavailable(outcome)
        yield _sse("error", error_body(unavailable.code, unavailable.message)["error"])
        return
    stored = outcome.reply_id
    exchange = await in_transaction(request, lambda s: _stored_exchange(s, outcome.prepared, stored, message))
    yield _sse("reply", exchange.reply.model_dump(mode="json"))


# Participant endpoints


@router.get("/me/chat/roles", responses=refusals(NOT_ENROLLED))
def my_roles(session: SessionDep, participant: ConsentedParticipant) -> RolesRead:
    arm, offered = service.roles_offered(session, participant)
    return RolesRead(mode=arm.mode, default_role=arm.default_role if arm.mode == "wellbeing" else "standard",
                     roles=[DisclosureRead.of(spec) for spec in offered])


@router.get("/me/crisis-resources")
def my_crisis_resources(session: SessionDep, participant: CurrentParticipant) -> CrisisResourcesRead:
    """Safety information is never gated: no consent needed, and still there after withdrawal."""
    return crisis_resources(session, participant)


@router.post("/me/conversations", status_code=status.HTTP_201_CREATED, responses=refusals({**NOT_ENROLLED, **ROLE}))
def start_conversation(body: ConversationCreate, session: SessionDep,
                       participant: ConsentedParticipant) -> ConversationRead:
    return ConversationRead.of(service.start_conversation(session, participant, body.role))


@router.get("/me/conversations")
def my_conversations(session: SessionDep, participant: ConsentedParticipant) -> list[ConversationRead]:
    return [ConversationRead.of(c) for c in service.list_conversations(session, participant)]


@router.get("/me/conversations/{conversation_id}")
def my_conversation(conversation_id: RowId, session: SessionDep,
                    participant: ConsentedParticipant) -> ConversationDetail:
    conversation = service.get_conversation(session, participant, conversation_id)
    responses = service.pushback_responses(session, conversation.id)
    latest = service.latest_pushback_id(session, conversation.id)
    asked = check_ins.of_conversation(session, conversation.id)
    return ConversationDetail(**ConversationRead.of(conversation).model_dump(), turns=[
        turn_read(session, turn, participant, responses.get(turn.id), latest, asked)
        for turn in service.turns(session, conversation)])


@router.put("/me/conversations/{conversation_id}/role", responses=refusals({**ENDED, **ROLE}))
def change_role(conversation_id: RowId, body: RoleChange, session: SessionDep,
                participant: ConsentedParticipant) -> ConversationRead:
    service.switch_role(session, participant, conversation_id, body.role)
    return ConversationRead.of(service.get_conversation(session, participant, conversation_id))


@router.post("/me/conversations/{conversation_id}/messages", response_model=ExchangeRead, responses={
    200: {"content": {"text/event-stream": {}}, "description": "The exchange, or an event stream with ?stream=true"},
    **refusals({**REPLIES, 409: "the conversation has ended (code conversation_ended), or the assistant is still "
                               "answering the previous message (code reply_in_progress: retry after Retry-After)",
                422: "the message is empty or too long (codes empty_message, message_too_long)"})})
async def send_message(conversation_id: RowId, body: MessageCreate, request: Request, token: Token,
                       gateway: GatewayDep,
                       stream: Annotated[bool, Query(description="stream the reply as server-sent events")] = False,
                       ) -> ExchangeRead | StreamingResponse:
    def accept(session: Session, participant: Participant) -> tuple[service.PreparedTurn, TurnRead]:
        prepared, message = service.accept_message(session, participant, conversation_id, body.content,
                                                   body.client_message_id)
        return prepared, TurnRead.of(message)
    prepared, message = await as_participant(request, token, accept, body.content)
    if stream:
        return StreamingResponse(_stream(request, gateway, prepared, message), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    return await reply_to(request, gateway, prepared, message)


@router.post("/me/conversations/{conversation_id}/retry", response_model=ExchangeRead, responses=refusals({
    **REPLIES, 409: "there is no unanswered message to retry (code nothing_to_retry), or a reply is being written "
                    "(code reply_in_progress)"}))
async def retry_reply(conversation_id: RowId, request: Request, token: Token, gateway: GatewayDep) -> ExchangeRead:
    prepared = await as_participant(request, token, lambda s, p: service.prepare_retry(s, p, conversation_id))
    return await reply_to(request, gateway, prepared)


@router.post("/me/conversations/{conversation_id}/turns/{turn_id}/override", response_model=ExchangeRead,
             responses=refusals({**REPLIES, **PUSHBACK}))
async def override_pushback(conversation_id: RowId, turn_id: RowId, request: Request, token: Token,
                            gateway: GatewayDep) -> ExchangeRead:
    """Go ahead anyway: the assistant answers the same message again, doing what was asked."""
    prepared = await as_participant(
        request, token, lambda s, p: service.prepare_override(s, p, conversation_id, turn_id))
    return await reply_to(request, gateway, prepared)


@router.post("/me/conversations/{conversation_id}/turns/{turn_id}/reconsider", responses=refusals(PUSHBACK))
def reconsider_pushback(conversation_id: RowId, turn_id: RowId, session: SessionDep,
                        participant: ConsentedParticipant) -> PushbackResponseRead:
    response = service.reconsider(session, participant, conversation_id, turn_id)
    return PushbackResponseRead(turn_id=response.turn_id, action=response.action)


@router.post("/me/conversations/{conversation_id}/check-ins/{check_in_id}/answers", responses=refusals({
    **NOT_ENROLLED, 404: "no such check-in in this conversation",
    409: "the question was already answered otherwise (code already_answered), or a newer check-in replaced this "
         "one (code check_in_replaced); also not_enrolled",
    422: "a question this check-in does not ask (code unknown_question), or an answer other than yes, no or "
         "declined"}))
def answer_check_in(conversation_id: RowId, check_in_id: RowId, body: CheckInAnswers, session: SessionDep,
                    participant: ConsentedParticipant) -> CheckInRead:
    """Answer a safety check-in's questions (yes, no or declined: prefer not to say). The answers
    set the safety event's level (``chat.triage.decide``): e.g. a yes to intent, a plan or recent
    behaviour pages the study's on-call contacts. The same answer again changes nothing."""
    answered = check_ins.answer(session, participant, conversation_id, check_in_id,
                                {str(question): str(value) for question, value in body.answers.items()})
    return check_in_read(session, *check_ins.check_in_of(session, participant, conversation_id, answered.id))


@router.post("/me/conversations/{conversation_id}/end", responses=refusals(ENDED))
def end_conversation(conversation_id: RowId, body: ExitCheck, session: SessionDep,
                     participant: ConsentedParticipant) -> ConversationEnded:
    """End with the exit check: the rating is stored as the immediate-rating survey; a decision is
    recorded for the decision-anchored follow-ups."""
    return turn.exit_check(session, participant, conversation_id, rating=body.rating,
                           made_decision=body.made_decision, decision=body.decision, effects=EXIT_EFFECTS)


# Staff: safety events


@staff_router.get("/studies/{slug}/safety-events")
def safety_events(session: SessionDep, access: ParticipantLevelAccess, actor: Annotated[audit.Actor, Depends(
        staff_actor)], unreviewed: bool = False) -> list[SafetyEventRead]:
    """The study's safety events, newest first, with the de-identified records of participants who
    withdrew and deleted their data (no participant, marked)."""
    return staff.safety_events(session, actor, access.study.id, unreviewed=unreviewed).events


@staff_router.post("/studies/{slug}/safety-events/{event_id}/review")
def review_safety_event(event_id: RowId, body: SafetyReview, session: SessionDep, access: ParticipantLevelAccess,
                        actor: Annotated[audit.Actor, Depends(staff_actor)]) -> SafetyEventRead:
    return staff.review_safety_event(session, actor, access.study.id, event_id, body.note)
