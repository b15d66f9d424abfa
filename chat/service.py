"""Chat operations. Each function is one step inside a transaction opened by the caller; a turn
is two of them around the LLM call, so no transaction is held while the model thinks:

1. ``accept_message`` stores the participant's message (committed before the LLM is called),
   runs the monitors and returns a ``PreparedTurn`` with everything the call needs;
2. the caller asks the gateway;
3. ``record_reply`` (or ``record_failure``) stores the outcome.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from chat import monitors
from chat.answer_format import guidance, parse_answer
from chat.gateway import Completion
from chat.models import Conversation, Decision, PushbackResponse, RoleSwitch, SafetyEvent, Turn
from chat.policy import Assessment, History, StanceDecision, decide, directive, with_classifier
from chat.roles import ROLE_SPECS, RoleName, RoleSpec, roles_for_arm, system_prompt
from study import audit
from study.clock import now
from study.errors import Conflict, Invalid, NotFound
from study.models import Participant, ParticipantStatus
from study.participants import WithdrawalLevel, withdrawal_hooks
from study.protocol import Arm
from study.settings import get_settings
from study.studies import current_protocol

HISTORY_TURNS = 20  # turns of the conversation sent to the model
REASSURANCE_LOOKBACK = dt.timedelta(days=30)
STUCK_AFTER = dt.timedelta(minutes=2)  # an 'awaiting' reply older than this may be retried


@dataclass(frozen=True)
class PreparedTurn:
    """What an LLM call for one reply needs; plain values, safe to use after the session closes."""

    conversation_id: int
    participant_turn_id: int
    role: RoleName
    model: str | None  # the arm's model; None means the gateway's default
    prompt_version: str
    messages: list[dict[str, str]]
    required: StanceDecision
    history: History
    after_override: bool = False
    existing_reply_id: int | None = None  # the message was already answered (a resend)
    content: str = ""  # the participant's message
    crisis_source: str | None = None
    features: dict[str, object] = field(default_factory=dict)


# Roles and conversations


def arm_of(session: Session, participant: Participant) -> Arm:
    if participant.arm is None or participant.status != ParticipantStatus.ENROLLED:
        raise Conflict("finish enrollment (consent, then your profile) before chatting", code="not_enrolled")
    return current_protocol(session, participant.study_id).arm(participant.arm)


def roles_offered(session: Session, participant: Participant) -> tuple[Arm, list[RoleSpec]]:
    arm = arm_of(session, participant)
    return arm, [ROLE_SPECS[name] for name in roles_for_arm(arm.mode, list(arm.roles))]


def _check_role(arm: Arm, offered: list[RoleSpec], role: str | None) -> RoleName:
    names = [spec.name for spec in offered]
    if arm.mode != "wellbeing":
        if role not in (None, "standard"):
            raise Invalid("your study group uses the standard assistant, which has no roles to choose from",
                          code="roles_not_offered")
        return "standard"
    if role is None:
        raise Invalid(f"choose how the assistant should work with you first: {', '.join(names)}",
                      code="role_required")
    if role not in names:
        raise Invalid(f"'{role}' is not a role you can choose; choose one of: {', '.join(names)}",
                      code="unknown_role")
    return role


def start_conversation(session: Session, participant: Participant, role: str | None) -> Conversation:
    arm, offered = roles_offered(session, participant)
    conversation = Conversation(
        participant_id=participant.id, arm=arm.name, mode=arm.mode, role=_check_role(arm, offered, role),
        status="active", turn_count=0, concern_counts={}, overridden_concerns=[], started_at=now())
    session.add(conversation)
    session.flush()
    return conversation


def get_conversation(session: Session, participant: Participant, conversation_id: int,
                     *, for_update: bool = False) -> Conversation:
    query = select(Conversation).where(Conversation.id == conversation_id,
                                       Conversation.participant_id == participant.id)
    conversation = session.scalar(query.with_for_update() if for_update else query)
    if conversation is None:
        raise NotFound(f"you have no conversation {conversation_id}")
    return conversation


def _require_active(conversation: Conversation) -> None:
    if conversation.status != "active":
        raise Conflict("this conversation has ended; start a new one to keep talking", code="conversation_ended")


def switch_role(session: Session, participant: Participant, conversation_id: int, role: str) -> RoleSwitch:
    conversation = get_conversation(session, participant, conversation_id, for_update=True)
    _require_active(conversation)
    arm, offered = roles_offered(session, participant)
    new_role = _check_role(arm, offered, role)
    switch = RoleSwitch(conversation_id=conversation.id, participant_id=participant.id,
                        from_role=conversation.role, to_role=new_role, after_seq=conversation.turn_count,
                        created_at=now())
    conversation.role = new_role
    session.add(switch)
    session.flush()
    return switch


def turns(session: Session, conversation: Conversation) -> list[Turn]:
    return list(session.scalars(select(Turn).where(Turn.conversation_id == conversation.id).order_by(Turn.seq)))


def list_conversations(session: Session, participant: Participant) -> list[Conversation]:
    return list(session.scalars(select(Conversation).where(Conversation.participant_id == participant.id)
                                .order_by(Conversation.started_at.desc(), Conversation.id.desc())))


# A turn


class ConversationState(NamedTuple):
    """What preparing a reply needs of the conversation row (from the ORM object or RETURNING)."""

    id: int
    participant_id: int
    role: str
    arm: str
    concern_counts: dict[str, int]
    overridden_concerns: list[str]


def _state(conversation: Conversation) -> ConversationState:
    return ConversationState(conversation.id, conversation.participant_id, conversation.role, conversation.arm,
                             conversation.concern_counts or {}, conversation.overridden_concerns or [])


def _history(conversation: Conversation | ConversationState) -> History:
    return History(raised=Counter(conversation.concern_counts or {}),
                   overridden=frozenset(conversation.overridden_concerns or ()))


def _assess(session: Session, participant: Participant, content: str, before_turn_id: int | None) -> Assessment:
    crisis = monitors.detect_crisis(content)
    cue = monitors.reassurance_cue(content)
    repeats = 0
    if cue is not None:
        words = monitors.content_words(content)
        earlier = session.scalars(
            select(Turn.content).where(Turn.participant_id == participant.id, Turn.reassurance_seeking.is_(True),
                                       Turn.created_at >= now() - REASSURANCE_LOOKBACK,
                                       *([Turn.id != before_turn_id] if before_turn_id else []))
            .order_by(Turn.id.desc()).limit(50)).all()
        repeats = sum(monitors.similar(words, monitors.content_words(text)) for text in earlier)
    return Assessment(crisis=crisis, reassurance_cue=cue, reassurance_repeats=repeats,
                      dependence_cue=monitors.dependence_cue(content))


def _messages(session: Session, conversation: ConversationState, role: RoleName, required: StanceDecision,
              *, overridden: bool) -> list[dict[str, str]]:
    recent = list(session.execute(
        select(Turn.speaker, Turn.content).where(Turn.conversation_id == conversation.id)
        .order_by(Turn.seq.desc()).limit(HISTORY_TURNS)).all())
    messages = [{"role": "system", "content": system_prompt(role).text}]
    messages += [{"role": "user" if speaker == "participant" else "assistant", "content": content}
                 for speaker, content in reversed(recent)]
    note = guidance(required, overridden=overridden)
    if note:
        messages.append({"role": "system", "content": note})
    return messages


def _prepare(session: Session, conversation: Conversation | ConversationState, participant_turn: Turn,
             assessment: Assessment, *, overridden: bool = False) -> PreparedTurn:
    if isinstance(conversation, Conversation):
        conversation = _state(conversation)
    role: RoleName = conversation.role  # type: ignore[assignment]
    participant = session.get(Participant, conversation.participant_id)  # in the identity map: no query
    assert participant is not None
    model = current_protocol(session, participant.study_id).arm(conversation.arm).model
    history = _history(conversation)
    required = directive(ROLE_SPECS[role], assessment, history)
    if overridden and required.stance != "escalate":
        required = StanceDecision("agree")
    return PreparedTurn(
        conversation_id=conversation.id, participant_turn_id=participant_turn.id, role=role,
        model=model, prompt_version=system_prompt(role).version,
        messages=_messages(session, conversation, role, required, overridden=overridden),
        required=required, history=history, after_override=overridden, content=participant_turn.content,
        crisis_source=assessment.crisis.source if assessment.crisis else None, features=assessment.features())


def reassess(session: Session, prepared: PreparedTurn, verdict: tuple[str, bool] | None) -> PreparedTurn:
    """Fold the LLM crisis classifier's verdict into the turn's features and directive."""
    turn = session.get(Turn, prepared.participant_turn_id)
    conversation = session.get(Conversation, prepared.conversation_id)
    participant = session.get(Participant, turn.participant_id) if turn else None
    if turn is None or conversation is None or participant is None:
        raise NotFound("this conversation no longer exists")
    assessment = with_classifier(_assess(session, participant, turn.content, turn.id), verdict)
    turn.features = {**assessment.features(), "crisis_classifier": "error" if verdict is None else
                     f"{verdict[0]}{' (acute)' if verdict[1] else ''}"}
    return _prepare(session, conversation, turn, assessment, overridden=prepared.after_override)


def accept_message(session: Session, participant: Participant, conversation_id: int, content: str,
                   client_message_id: str | None = None) -> tuple[PreparedTurn, Turn]:
    """Store the participant's message and prepare the reply. Sending the same
    ``client_message_id`` again never stores a second copy."""
    text = content.strip()
    limit = get_settings().chat_max_message_chars
    if not text:
        raise Invalid("write a message first; an empty message can't be sent", code="empty_message")
    if len(text) > limit:
        raise Invalid(f"messages can be at most {limit} characters; this one has {len(text)}. "
                      "Split it into shorter messages.", code="message_too_long")
    if client_message_id:
        existing = session.scalar(select(Turn).join(Conversation, Conversation.id == Turn.conversation_id).where(
            Turn.conversation_id == conversation_id, Conversation.participant_id == participant.id,
            Turn.client_message_id == client_message_id))
        if existing is not None:
            conversation = get_conversation(session, participant, conversation_id, for_update=True)
            return _resume(session, conversation, existing), existing
    at = now()
    # One statement checks ownership, that the conversation is open and not awaiting a reply, and
    # takes the next sequence number (the row stays locked until commit).
    claimed = session.execute(
        update(Conversation).where(
            Conversation.id == conversation_id, Conversation.participant_id == participant.id,
            Conversation.status == "active", or_(Conversation.awaiting_reply_since.is_(None),
                                                 Conversation.awaiting_reply_since <= at - STUCK_AFTER))
        .values(turn_count=Conversation.turn_count + 1, awaiting_reply_since=at)
        .returning(Conversation.turn_count, Conversation.id, Conversation.participant_id, Conversation.role,
                   Conversation.arm, Conversation.concern_counts, Conversation.overridden_concerns)
        .execution_options(synchronize_session=False)).first()
    if claimed is None:
        _require_active(get_conversation(session, participant, conversation_id))  # not yours / ended
        raise Conflict("the assistant is still answering your previous message; wait for it, then send this one",
                       code="reply_in_progress")
    state = ConversationState(*claimed[1:])
    assessment = _assess(session, participant, text, None)
    turn = Turn(conversation_id=conversation_id, participant_id=participant.id, seq=claimed.turn_count,
                speaker="participant", role=state.role, content=text, client_message_id=client_message_id,
                reply_status="awaiting", reassurance_seeking=assessment.reassurance_cue is not None,
                features=assessment.features(), created_at=at)
    session.add(turn)
    session.flush()
    return _prepare(session, state, turn, assessment), turn


def _resume(session: Session, conversation: Conversation, turn: Turn) -> PreparedTurn:
    if turn.reply_status == "answered":
        reply_id = session.scalar(select(Turn.id).where(Turn.reply_to_id == turn.id).order_by(Turn.seq.desc()))
        return PreparedTurn(conversation.id, turn.id, conversation.role, None,  # type: ignore[arg-type]
                            "", [], StanceDecision("agree"), History(), existing_reply_id=reply_id)
    return retry_turn(session, conversation, turn)


def prepare_retry(session: Session, participant: Participant, conversation_id: int) -> PreparedTurn:
    """Ask again for a reply to the last message that did not get one."""
    conversation = get_conversation(session, participant, conversation_id, for_update=True)
    _require_active(conversation)
    turn = session.scalar(select(Turn).where(Turn.conversation_id == conversation.id, Turn.speaker == "participant")
                          .order_by(Turn.seq.desc()).limit(1))
    if turn is None or turn.reply_status == "answered":
        raise Conflict("there is no unanswered message to retry", code="nothing_to_retry")
    return retry_turn(session, conversation, turn)


def retry_turn(session: Session, conversation: Conversation, turn: Turn) -> PreparedTurn:
    claimed = session.execute(
        update(Turn).where(Turn.id == turn.id, (Turn.reply_status == "failed")
                           | ((Turn.reply_status == "awaiting") & (Turn.created_at <= now() - STUCK_AFTER)))
        .values(reply_status="awaiting", reply_error=None)).rowcount  # type: ignore[attr-defined]
    if not claimed and turn.reply_status == "awaiting":
        raise Conflict("the assistant is still answering this message; wait a moment", code="reply_in_progress")
    conversation.awaiting_reply_since = now()
    participant = session.get(Participant, turn.participant_id)
    assert participant is not None
    assessment = _assess(session, participant, turn.content, turn.id)
    overridden = session.scalar(select(PushbackResponse.id).join(Turn, Turn.id == PushbackResponse.turn_id).where(
        Turn.reply_to_id == turn.id, PushbackResponse.action == "override")) is not None
    return _prepare(session, conversation, turn, assessment, overridden=overridden)


def _pushback_turn(session: Session, participant: Participant, conversation: Conversation, turn_id: int) -> Turn:
    turn = session.scalar(select(Turn).where(Turn.id == turn_id, Turn.conversation_id == conversation.id,
                                             Turn.speaker == "assistant"))
    if turn is None:
        raise NotFound(f"there is no assistant message {turn_id} in this conversation")
    if turn.stance == "escalate":
        raise Conflict("a safety message can't be overridden. If you are safe, you can keep talking; the resources "
                       "shown stay available.", code="not_overridable")
    if turn.stance not in ("nudge", "challenge"):
        raise Conflict("this message did not push back, so there is nothing to override", code="nothing_to_override")
    if session.scalar(select(PushbackResponse.id).where(PushbackResponse.turn_id == turn.id)) is not None:
        raise Conflict("you already answered this note", code="already_answered")
    return turn


def prepare_override(session: Session, participant: Participant, conversation_id: int,
                     turn_id: int) -> PreparedTurn:
    """Record "go ahead anyway" and prepare a reply that does what was asked."""
    conversation = get_conversation(session, participant, conversation_id, for_update=True)
    _require_active(conversation)
    pushback = _pushback_turn(session, participant, conversation, turn_id)
    session.add(PushbackResponse(turn_id=pushback.id, conversation_id=conversation.id, participant_id=participant.id,
                                 action="override", stance=pushback.stance or "", concern=pushback.concern or "none",
                                 created_at=now()))
    session.flush()
    original = session.get(Turn, pushback.reply_to_id) if pushback.reply_to_id else None
    if original is None:
        raise Conflict("the message this note answered is gone", code="nothing_to_override")
    original.reply_status = "awaiting"
    conversation.awaiting_reply_since = now()
    if pushback.concern and pushback.concern not in conversation.overridden_concerns:
        conversation.overridden_concerns = [*conversation.overridden_concerns, pushback.concern]
    assessment = _assess(session, participant, original.content, original.id)
    return _prepare(session, conversation, original, assessment, overridden=True)


def reconsider(session: Session, participant: Participant, conversation_id: int, turn_id: int) -> PushbackResponse:
    conversation = get_conversation(session, participant, conversation_id, for_update=True)
    pushback = _pushback_turn(session, participant, conversation, turn_id)
    response = PushbackResponse(turn_id=pushback.id, conversation_id=conversation.id, participant_id=participant.id,
                                action="reconsider", stance=pushback.stance or "", concern=pushback.concern or "none",
                                created_at=now())
    session.add(response)
    session.flush()
    return response


SAFETY_FALLBACK_REPLY = (
    "I'm concerned about your safety, and I want to make sure you can reach someone right now. Please contact one "
    "of the services shown here. If you are in immediate danger, call your local emergency number.")


def record_reply(session: Session, prepared: PreparedTurn, completion: Completion) -> Turn:
    """Store the assistant's turn with the stance the policy settled on; returns it."""
    parsed = parse_answer(completion.text)
    final = decide(ROLE_SPECS[prepared.role], prepared.required, parsed.proposed, prepared.history)
    if prepared.after_override and final.stance != "escalate":
        final = StanceDecision("agree")
    reply = parsed.reply or (SAFETY_FALLBACK_REPLY if final.stance == "escalate" else "")
    if not reply:
        reply = "I'm sorry, I lost my train of thought. Could you say that again?"
    values: dict[str, Any] = {"turn_count": Conversation.turn_count + 1, "awaiting_reply_since": None}
    if final.stance != "agree":
        counts = dict(prepared.history.raised)
        counts[final.concern] = counts.get(final.concern, 0) + 1
        values["concern_counts"] = counts
    claimed = session.execute(update(Conversation).where(Conversation.id == prepared.conversation_id).values(values)
                              .returning(Conversation.turn_count, Conversation.participant_id)
                              .execution_options(synchronize_session=False)).first()
    if claimed is None:
        raise NotFound("this conversation no longer exists")
    session.execute(update(Turn).where(Turn.id == prepared.participant_turn_id)
                    .values(reply_status="answered", reply_error=None).execution_options(synchronize_session=False))
    turn = Turn(
        conversation_id=prepared.conversation_id, participant_id=claimed.participant_id, seq=claimed.turn_count,
        speaker="assistant", role=prepared.role, content=reply,
        reply_to_id=prepared.participant_turn_id, stance=final.stance, concern=final.concern,
        rationale=final.rationale or None, stance_source=final.source,
        model_stance=parsed.proposed.stance if parsed.proposed else None,
        model_concern=parsed.proposed.concern if parsed.proposed else None, after_override=prepared.after_override,
        model=completion.model or prepared.model, prompt_version=prepared.prompt_version,
        latency_ms=completion.latency_ms, prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens, cost_usd=completion.cost_usd,
        streamed=completion.streamed, created_at=now())
    session.add(turn)
    session.flush()
    if final.stance == "escalate":
        _record_safety_event(session, claimed.participant_id, turn, final, prepared)
    return turn


def _record_safety_event(session: Session, participant_id: int, turn: Turn, final: StanceDecision,
                         prepared: PreparedTurn) -> None:
    participant = session.get(Participant, participant_id)
    assert participant is not None
    source = prepared.crisis_source if final.source == "platform" else "model"
    cue = prepared.features.get("crisis_cue")
    session.add(SafetyEvent(study_id=participant.study_id, participant_id=participant.id,
                            conversation_id=prepared.conversation_id, turn_id=turn.id, category=final.concern,
                            source=source or "model", cue=str(cue)[:200] if cue else None, created_at=now()))
    session.flush()
    audit.record(session, audit.Actor.system(), "chat.safety_escalation", study_id=participant.study_id,
                 participant_code=participant.code, conversation_id=prepared.conversation_id, category=final.concern)


def record_failure(session: Session, prepared: PreparedTurn, error: str) -> Turn | None:
    """The model did not answer. The message stays, marked for retry; but a safety escalation is
    never left waiting on the model: the platform's own safety reply is stored instead."""
    if prepared.required.stance == "escalate":
        return record_reply(session, prepared, Completion(text=SAFETY_FALLBACK_REPLY, model="platform/safety"))
    session.execute(update(Turn).where(Turn.id == prepared.participant_turn_id)
                    .values(reply_status="failed", reply_error=error[:300]))
    session.execute(update(Conversation).where(Conversation.id == prepared.conversation_id)
                    .values(awaiting_reply_since=None))
    return None


# The end of a conversation


def end_conversation(session: Session, participant: Participant, conversation_id: int, *,
                     made_decision: bool | None, decision: str | None) -> Decision | None:
    """Close the conversation with the exit check's decision question; the rating is a survey."""
    conversation = get_conversation(session, participant, conversation_id, for_update=True)
    _require_active(conversation)
    text = (decision or "").strip()
    if made_decision and not text:
        raise Invalid("say in a few words what you decided, so we can ask you later how it turned out",
                      code="decision_required")
    if not made_decision and text:
        raise Invalid("you described a decision but said you didn't make one; tick 'I made a decision' or clear "
                      "the text", code="decision_mismatch")
    conversation.status = "ended"
    conversation.ended_at = now()
    conversation.made_decision = made_decision
    record = None
    if made_decision:
        record = Decision(participant_id=participant.id, conversation_id=conversation.id, text=text[:2000],
                          decided_at=now())
        session.add(record)
    session.flush()
    return record


def _end_on_withdrawal(session: Session, participant: Participant, level: WithdrawalLevel) -> None:
    session.execute(update(Conversation).where(Conversation.participant_id == participant.id,
                                               Conversation.status == "active")
                    .values(status="ended", ended_at=now()))


withdrawal_hooks.append(_end_on_withdrawal)
