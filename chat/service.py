"""Chat operations on the chat tables. Each function is one step inside a transaction opened by
the caller; a turn is two of them around the LLM call, so no transaction is held while the model
thinks:

1. ``accept_message`` (or ``prepare_retry``, ``prepare_override``) stores the participant's
   message (committed before the LLM is called), runs the monitors and returns a
   ``PreparedTurn`` with everything the call needs;
2. the caller asks the gateway;
3. ``record_reply`` (or ``record_failure``) stores the outcome.

The turn is orchestrated by ``chat.turn`` (which also reads a new message with the crisis
encoder before step 1 opens its write transaction); the steps that need no database are
``chat.steps``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import JSON, String, and_, case, cast, func, literal, null, or_, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session, aliased

from chat import check_ins, drift
from chat.conversations import _require_active, get_conversation
from chat.conversations import arm_of as arm_of  # re-exported: the service's callers find them here
from chat.conversations import list_conversations as list_conversations
from chat.conversations import role_switches as role_switches
from chat.conversations import roles_offered as roles_offered
from chat.conversations import start_conversation as start_conversation
from chat.conversations import switch_role as switch_role
from chat.conversations import turns as turns
from chat.gateway import Completion
from chat.llm_reader import LLMReading
from chat.models import Conversation, Decision, PushbackResponse, RoleSwitch, Turn
from chat.policy import Assessment, History, StanceDecision
from chat.roles import SAFETY_CONCERNS, RoleName, system_prompt
from chat.steps import HISTORY_TURNS, assess_message, plan, safety_fallback, settle
from study import validation
from study.clock import now
from study.db import is_postgres
from study.errors import Conflict, Invalid, NotFound
from study.models import Participant, WithdrawalLevel
from study.processes import is_gone, this_process
from study.safety import SafetyEvent, SafetyEventReview
from study.settings import get_settings
from study.studies import current_protocol
from study.wiring import Lifecycle

REASSURANCE_LOOKBACK = dt.timedelta(days=30)
# A reply's claim holds this long unless its owner renews it (chat.replies does every few seconds
# while it works): a claim left by a process that died on another machine is taken over after it.
REPLY_LEASE = dt.timedelta(seconds=20)


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
    # When this reply was claimed (the conversation's awaiting_reply_since): storing the outcome
    # releases the claim only if it is still this one, not a newer one taken after it was abandoned.
    claimed_at: dt.datetime | None = None


def unanswered(conversation: Conversation, turns: Sequence[Turn]) -> Turn | None:
    """The message a participant coming back can ask to be answered again (``prepare_retry``): the
    open conversation's last message, when it has no reply and none is being written."""
    last = next((turn for turn in reversed(turns) if turn.speaker == "participant"), None)
    if (conversation.status != "active" or last is None or last.reply_status == "answered"
            or reply_in_flight(conversation)):
        return None
    return last


# A turn


class ConversationState(NamedTuple):
    """What preparing a reply needs of the conversation row (from the ORM object or RETURNING)."""

    id: int
    participant_id: int
    role: RoleName
    arm: str
    concern_counts: dict[str, int]
    overridden_concerns: list[str]


def _state(conversation: Conversation) -> ConversationState:
    return ConversationState(conversation.id, conversation.participant_id, conversation.role, conversation.arm,
                             conversation.concern_counts or {}, conversation.overridden_concerns or [])


def _history(session: Session, conversation: ConversationState, raise_again_after: int | str) -> History:
    return History(raised=Counter(conversation.concern_counts or {}),
                   overridden=muted_concerns(session, conversation, raise_again_after))


def muted_concerns(session: Session, conversation: ConversationState, raise_again_after: int | str) -> frozenset[str]:
    """The overridden concerns not to raise yet (``study.protocol.Pushback``): each one overridden
    fewer than ``raise_again_after`` participant messages ago (the message being answered counts),
    or every one overridden when it is ``never``. One query, and only when something was overridden."""
    overridden = frozenset(conversation.overridden_concerns or ())
    if not overridden or raise_again_after == "never":
        return overridden
    note = aliased(Turn)
    latest = (select(PushbackResponse.concern, func.max(note.seq).label("seq"))
              .join(note, note.id == PushbackResponse.turn_id)
              .where(PushbackResponse.conversation_id == conversation.id, PushbackResponse.action == "override",
                     PushbackResponse.concern.in_(overridden))
              .group_by(PushbackResponse.concern).subquery())
    since = aliased(Turn)
    counts = session.execute(
        select(latest.c.concern, func.count(since.id)).select_from(latest)
        .outerjoin(since, and_(since.conversation_id == conversation.id, since.speaker == "participant",
                               since.seq > latest.c.seq))
        .group_by(latest.c.concern)).all()
    return frozenset(concern for concern, messages in counts if messages < int(raise_again_after))


def _assess(session: Session, participant: Participant, content: str, before_turn_id: int | None,
            reader: LLMReading | None = None) -> Assessment:
    def earlier() -> Sequence[str]:
        return session.scalars(
            select(Turn.content).where(Turn.participant_id == participant.id, Turn.reassurance_seeking.is_(True),
                                       Turn.created_at >= now() - REASSURANCE_LOOKBACK,
                                       *([Turn.id != before_turn_id] if before_turn_id else []))
            .order_by(Turn.id.desc()).limit(50)).all()

    def reliance() -> Sequence[dt.datetime]:  # stored features: nothing is encoded in the transaction
        return session.scalars(
            select(Turn.created_at).where(Turn.participant_id == participant.id, Turn.speaker == "participant",
                                          Turn.features["dependence_signal"].as_boolean().is_(True),
                                          Turn.created_at >= drift.window_start(now()),
                                          *([Turn.id != before_turn_id] if before_turn_id else []))).all()

    return assess_message(content, earlier, reliance, tz=drift.zone(participant.timezone), reader=reader)


def _recent(session: Session, conversation_id: int) -> list[tuple[str, str]]:
    """The conversation's last ``HISTORY_TURNS`` turns as ``(speaker, content)``, oldest first."""
    recent = session.execute(select(Turn.speaker, Turn.content).where(Turn.conversation_id == conversation_id)
                             .order_by(Turn.seq.desc()).limit(HISTORY_TURNS)).all()
    return [(speaker, content) for speaker, content in reversed(recent)]


def _prepare(session: Session, conversation: Conversation | ConversationState, participant_turn: Turn,
             assessment: Assessment, *, claimed_at: dt.datetime | None, overridden: bool = False) -> PreparedTurn:
    if isinstance(conversation, Conversation):
        conversation = _state(conversation)
    role = conversation.role
    participant = session.get(Participant, conversation.participant_id)  # in the identity map: no query
    assert participant is not None
    protocol = current_protocol(session, participant.study_id)
    model = protocol.arm(conversation.arm).model
    history = _history(session, conversation, protocol.pushback.raise_again_after)
    required, messages = plan(role, assessment, history, system_prompt(role).text,
                              _recent(session, conversation.id), overridden=overridden)
    return PreparedTurn(
        conversation_id=conversation.id, participant_turn_id=participant_turn.id, role=role,
        model=model, prompt_version=system_prompt(role).version, messages=messages,
        required=required, history=history, after_override=overridden, content=participant_turn.content,
        crisis_source=assessment.crisis.source if assessment.crisis else None, features=assessment.features(),
        claimed_at=claimed_at)


def reassess(session: Session, prepared: PreparedTurn, reader: LLMReading) -> PreparedTurn:
    """Fuse the LLM reader's verdict with the local reading (``chat.llm_reader.fuse``): the turn's
    features record both readers, and its directive follows the fused reading."""
    turn = session.get(Turn, prepared.participant_turn_id)
    conversation = session.get(Conversation, prepared.conversation_id)
    participant = session.get(Participant, turn.participant_id) if turn else None
    if turn is None or conversation is None or participant is None:
        raise NotFound("this conversation no longer exists")
    assessment = _assess(session, participant, turn.content, turn.id, reader)
    turn.features = assessment.features()
    turn.reassurance_seeking = assessment.reassurance_cue is not None  # later messages count it as a repeat
    return _prepare(session, conversation, turn, assessment, overridden=prepared.after_override,
                    claimed_at=prepared.claimed_at)


# The reply state. ``Conversation.awaiting_reply_since`` is its one home: set when a reply starts
# being produced, cleared when its outcome is stored. It lives on the conversation, not on the
# participant's turn, because the rule it enforces is per conversation (one reply in flight at a
# time) and only a conditional UPDATE of one row can enforce it atomically: PostgreSQL re-checks
# the condition on the row a concurrent claim just committed, SQLite serializes writers. A turn's
# ``reply_status`` records only how its reply ended (answered | failed; NULL until then).
#
# A claim records its owner (``study.processes``) and a lease the owner renews while it works. A
# claim nobody will finish (its owner is gone, or its lease ran out) is abandoned: the next claim
# takes it over first, and an API process does so for every one it finds when it starts. A live
# owner's claim, a sibling worker's included, is never taken.


class ReplyInProgress(Conflict):
    code = "reply_in_progress"
    retry_after_seconds = 5


_STATE = (Conversation.id, Conversation.participant_id, Conversation.role, Conversation.arm,
          Conversation.concern_counts, Conversation.overridden_concerns)  # the columns of ConversationState


def _claim_reply(session: Session, participant: Participant, conversation_id: int, *,
                 new_message: bool) -> tuple[dt.datetime, ConversationState, int]:
    """The one statement that starts a reply (new message, retry or override alike): the
    conversation must be the participant's, open, and not awaiting a reply (an abandoned claim is
    taken over first). A new message also takes the next sequence number. Returns the claim's
    time, the conversation's state and its turn count; refuses with a retryable 409 while a reply
    is being written."""
    at = now()
    values: dict[str, Any] = {"awaiting_reply_since": at, "reply_claimed_by": this_process(),
                              "reply_lease_until": at + REPLY_LEASE}
    if new_message:
        values["turn_count"] = Conversation.turn_count + 1
    claim = (update(Conversation).where(
        Conversation.id == conversation_id, Conversation.participant_id == participant.id,
        Conversation.status == "active", Conversation.awaiting_reply_since.is_(None))
        .values(values).returning(Conversation.turn_count, *_STATE).execution_options(synchronize_session=False))
    claimed = session.execute(claim).first()
    if claimed is None and take_over_abandoned(session, conversation_id, participant_id=participant.id):
        claimed = session.execute(claim).first()
    if claimed is None:
        _require_active(get_conversation(session, participant, conversation_id))  # not yours / ended
        raise ReplyInProgress("the assistant is still answering your previous message; wait a moment for it, "
                              "then try again")
    return at, ConversationState(*claimed[1:]), claimed.turn_count


def _expired(lease_until: dt.datetime | None, at: dt.datetime) -> bool:
    return lease_until is None or lease_until <= at  # no lease: a claim made before leases existed


def _abandoned(owner: str | None, lease_until: dt.datetime | None, at: dt.datetime) -> bool:
    return _expired(lease_until, at) or is_gone(owner)


def reply_in_flight(conversation: Conversation) -> bool:
    """Whether a reply to the conversation is being written now (an abandoned claim is not)."""
    return conversation.awaiting_reply_since is not None and not _abandoned(
        conversation.reply_claimed_by, conversation.reply_lease_until, now())


def abandoned_claims(session: Session) -> list[int]:
    """The conversations whose reply claim nobody will finish (see ``take_over_abandoned``)."""
    at = now()
    rows = session.execute(select(Conversation.id, Conversation.reply_claimed_by, Conversation.reply_lease_until)
                           .where(Conversation.awaiting_reply_since.is_not(None)))
    return [conversation_id for conversation_id, owner, lease in rows if _abandoned(owner, lease, at)]


def take_over_abandoned(session: Session, conversation_id: int, *, participant_id: int | None = None) -> bool:
    """Release the conversation's reply claim if nobody will finish it: its owner is gone, or its
    lease ran out. Returns whether a claim was released (see ``_abandon``)."""
    at = now()
    query = select(Conversation.awaiting_reply_since, Conversation.reply_claimed_by,
                   Conversation.reply_lease_until).where(Conversation.id == conversation_id)
    if participant_id is not None:
        query = query.where(Conversation.participant_id == participant_id)
    held = session.execute(query).first()
    if held is None or held.awaiting_reply_since is None:
        return False
    gone = is_gone(held.reply_claimed_by)
    if not gone and not _expired(held.reply_lease_until, at):
        return False
    # Only while it is still abandoned: a live owner may have renewed its lease since the read.
    still = or_(Conversation.reply_lease_until.is_(None), Conversation.reply_lease_until <= at,
                *([Conversation.reply_claimed_by == held.reply_claimed_by] if gone else []))
    reason = "the server writing the reply stopped" if gone else "the server writing the reply stopped answering"
    return _abandon(session, conversation_id, held.awaiting_reply_since, still, reason)


def release_own_claims(session: Session, conversation_ids: Collection[int]) -> None:
    """Release this process's claims on these conversations (it is stopping; see ``_abandon``)."""
    for conversation_id in conversation_ids:
        claimed_at = session.scalar(select(Conversation.awaiting_reply_since).where(
            Conversation.id == conversation_id, Conversation.reply_claimed_by == this_process()))
        if claimed_at is not None:
            _abandon(session, conversation_id, claimed_at, Conversation.reply_claimed_by == this_process(),
                     "the server stopped before the reply was ready")


def _abandon(session: Session, conversation_id: int, claimed_at: dt.datetime, still: Any, reason: str) -> bool:
    """Release a claim nobody will finish, if it is still the claim of ``claimed_at`` and ``still``
    holds (under the row's lock: two requests may meet it at once). The message it was for is
    marked failed, so it can be retried (retry, or a resend of its client_message_id); a safety
    escalation gets the platform's safety reply at once, as when the model fails (``record_failure``)."""
    taken = session.execute(
        update(Conversation).where(Conversation.id == conversation_id,
                                   Conversation.awaiting_reply_since == claimed_at, still)
        .values(reply_claimed_by=this_process(), reply_lease_until=now() + REPLY_LEASE)
        .returning(*_STATE).execution_options(synchronize_session=False)).first()
    if taken is None:
        return False
    turn = session.scalar(select(Turn).where(Turn.conversation_id == conversation_id, Turn.speaker == "participant",
                                             Turn.reply_status.is_(None)).order_by(Turn.seq.desc()).limit(1))
    if turn is None:  # nothing left to answer: only the claim to release
        session.execute(update(Conversation).where(Conversation.id == conversation_id)
                        .values(awaiting_reply_since=None).execution_options(synchronize_session=False))
        return True
    participant = session.get(Participant, turn.participant_id)
    assert participant is not None
    prepared = _prepare(session, ConversationState(*taken), turn, _assess(session, participant, turn.content, turn.id),
                        overridden=_overridden(session, turn), claimed_at=claimed_at)
    record_failure(session, prepared, f"abandoned: {reason}")
    return True


def renew_claims(session: Session, conversation_ids: Collection[int]) -> None:
    """Another lease for this process's claims on these conversations (their replies are being
    written); a claim taken over meanwhile is not this process's any more, and stays as it is."""
    session.execute(update(Conversation).where(
        Conversation.id.in_(conversation_ids), Conversation.reply_claimed_by == this_process(),
        Conversation.awaiting_reply_since.is_not(None)).values(reply_lease_until=now() + REPLY_LEASE)
        .execution_options(synchronize_session=False))


def _release(prepared: PreparedTurn) -> Any:
    """SQL for awaiting_reply_since once this reply's outcome is stored: cleared if the claim is
    still this reply's; a newer claim (taken over when this one was abandoned) stays in force."""
    if prepared.claimed_at is None:
        return None
    return case((Conversation.awaiting_reply_since == prepared.claimed_at, null()),
                else_=Conversation.awaiting_reply_since)


def _one_more(session: Session, concern: str) -> Any:
    """SQL for concern_counts with one more ``concern``, computed from the row being updated (under
    its lock), so concurrent replies add up instead of writing back stale snapshots."""
    after = func.coalesce(Conversation.concern_counts[concern].as_integer(), 0) + 1
    if is_postgres(session):  # a json column: merge as jsonb
        merged = cast(Conversation.concern_counts, JSONB).op("||")(
            func.jsonb_build_object(cast(literal(concern), String), after))
        return cast(merged, JSON)
    return func.json_set(Conversation.concern_counts, f'$."{concern}"', after)


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
            return _resume(session, participant, existing), existing
    at, state, seq = _claim_reply(session, participant, conversation_id, new_message=True)
    assessment = _assess(session, participant, text, None)
    turn = Turn(conversation_id=conversation_id, participant_id=participant.id, seq=seq,
                speaker="participant", role=state.role, content=text, client_message_id=client_message_id,
                reassurance_seeking=assessment.reassurance_cue is not None,
                features=assessment.features(), created_at=at)
    session.add(turn)
    session.flush()
    check_ins.read_words(session, participant, conversation_id, turn)  # an answer to a check-in, if it is one
    return _prepare(session, state, turn, assessment, claimed_at=at), turn


def _resume(session: Session, participant: Participant, turn: Turn) -> PreparedTurn:
    if turn.reply_status == "answered":
        reply_id = session.scalar(select(Turn.id).where(Turn.reply_to_id == turn.id).order_by(Turn.seq.desc()))
        return PreparedTurn(turn.conversation_id, turn.id, turn.role, None,
                            "", [], StanceDecision("agree"), History(), existing_reply_id=reply_id)
    return _retry(session, participant, turn)


def prepare_retry(session: Session, participant: Participant, conversation_id: int) -> PreparedTurn:
    """Ask again for a reply to the last message that did not get one."""
    conversation = get_conversation(session, participant, conversation_id)
    _require_active(conversation)
    turn = session.scalar(select(Turn).where(Turn.conversation_id == conversation.id, Turn.speaker == "participant")
                          .order_by(Turn.seq.desc()).limit(1))
    if turn is None or turn.reply_status == "answered":
        raise Conflict("there is no unanswered message to retry", code="nothing_to_retry")
    return _retry(session, participant, turn)


def _retry(session: Session, participant: Participant, turn: Turn) -> PreparedTurn:
    at, state, _ = _claim_reply(session, participant, turn.conversation_id, new_message=False)
    # Checked again under the claim: a reply stored just before it (a resend racing the answer)
    # must not be asked for a second time.
    reopened = session.execute(
        update(Turn).where(Turn.id == turn.id, or_(Turn.reply_status.is_(None), Turn.reply_status != "answered"))
        .values(reply_status=None, reply_error=None)
        .execution_options(synchronize_session=False)).rowcount  # type: ignore[attr-defined]
    if not reopened:
        raise Conflict("this message has been answered meanwhile; reload the conversation", code="nothing_to_retry")
    assessment = _assess(session, participant, turn.content, turn.id)
    return _prepare(session, state, turn, assessment, overridden=_overridden(session, turn), claimed_at=at)


def _overridden(session: Session, turn: Turn) -> bool:
    """Whether the participant said "go ahead anyway" to a note answering ``turn``."""
    return session.scalar(select(PushbackResponse.id).join(Turn, Turn.id == PushbackResponse.turn_id).where(
        Turn.reply_to_id == turn.id, PushbackResponse.action == "override")) is not None


def _pushback_turn(session: Session, participant: Participant, conversation: Conversation, turn_id: int) -> Turn:
    turn = session.scalar(select(Turn).where(Turn.id == turn_id, Turn.conversation_id == conversation.id,
                                             Turn.speaker == "assistant"))
    if turn is None:
        raise NotFound(f"there is no assistant message {turn_id} in this conversation")
    if turn.stance == "escalate":
        raise Conflict("a safety message can't be overridden. If you are safe, you can keep talking; the resources "
                       "shown stay available.", code="not_overridable")
    if turn.stance not in ("nudge", "challenge", "decline"):
        raise Conflict("this message did not push back, so there is nothing to override", code="nothing_to_override")
    if turn.stance == "decline" or turn.concern in SAFETY_CONCERNS:  # also a safety note stored as a nudge
        raise Conflict("the assistant won't help with something that could hurt you or someone else, and that "
                       "can't be overridden. You can keep talking about what happened or what you need.",
                       code="not_overridable")
    if session.scalar(select(PushbackResponse.id).where(PushbackResponse.turn_id == turn.id)) is not None:
        raise Conflict("you already answered this note", code="already_answered")
    if latest_pushback_id(session, conversation.id) != turn.id:
        raise Conflict("a newer note has replaced this one, and only the latest note can be answered; answer that "
                       "one, or just keep talking", code="pushback_superseded")
    return turn


def pushback_responses(session: Session, conversation_id: int) -> dict[int, str]:
    """What the participant did with each nudge or challenge: turn id -> override | reconsider."""
    rows = session.execute(select(PushbackResponse.turn_id, PushbackResponse.action)
                           .where(PushbackResponse.conversation_id == conversation_id))
    return {turn_id: action for turn_id, action in rows}


def latest_pushback_id(session: Session, conversation_id: int) -> int | None:
    """The conversation's latest assistant turn that did not simply agree: the only note that can
    still be answered ("Go ahead anyway" or "Let me reconsider"), if it is a nudge or challenge."""
    return session.scalar(select(Turn.id).where(
        Turn.conversation_id == conversation_id, Turn.speaker == "assistant", Turn.stance.is_not(None),
        Turn.stance != "agree").order_by(Turn.seq.desc()).limit(1))


def prepare_override(session: Session, participant: Participant, conversation_id: int,
                     turn_id: int) -> PreparedTurn:
    """Record "go ahead anyway" and prepare a reply that does what was asked. Claimed like a new
    message: refused while another reply is awaited, so a conversation never gets two at once."""
    conversation = get_conversation(session, participant, conversation_id)
    _require_active(conversation)
    # Claimed first: no reply (and so no newer note) can be stored between the checks and the override.
    at, state, _ = _claim_reply(session, participant, conversation_id, new_message=False)
    pushback = _pushback_turn(session, participant, conversation, turn_id)
    original = session.get(Turn, pushback.reply_to_id) if pushback.reply_to_id else None
    if original is None:
        raise Conflict("the message this note answered is gone", code="nothing_to_override")
    session.add(PushbackResponse(turn_id=pushback.id, conversation_id=conversation.id, participant_id=participant.id,
                                 action="override", stance=pushback.stance or "", concern=pushback.concern or "none",
                                 created_at=at))
    if pushback.concern and pushback.concern not in state.overridden_concerns:
        # Read by the claim above, written under the row lock it holds until commit: not a stale copy.
        state = state._replace(overridden_concerns=[*state.overridden_concerns, pushback.concern])
        session.execute(update(Conversation).where(Conversation.id == conversation_id)
                        .values(overridden_concerns=state.overridden_concerns)
                        .execution_options(synchronize_session=False))
    session.execute(update(Turn).where(Turn.id == original.id).values(reply_status=None, reply_error=None)
                    .execution_options(synchronize_session=False))
    session.flush()
    assessment = _assess(session, participant, original.content, original.id)
    return _prepare(session, state, original, assessment, overridden=True, claimed_at=at)


def reconsider(session: Session, participant: Participant, conversation_id: int, turn_id: int) -> PushbackResponse:
    conversation = get_conversation(session, participant, conversation_id, for_update=True)
    _require_active(conversation)  # an ended conversation's cards are closed, as for "Go ahead anyway"
    pushback = _pushback_turn(session, participant, conversation, turn_id)
    response = PushbackResponse(turn_id=pushback.id, conversation_id=conversation.id, participant_id=participant.id,
                                action="reconsider", stance=pushback.stance or "", concern=pushback.concern or "none",
                                created_at=now())
    session.add(response)
    session.flush()
    return response


def record_reply(session: Session, prepared: PreparedTurn, completion: Completion) -> Turn:
    """Store the assistant's turn with the stance the policy settled on; returns it. A reply that
    gave in to a nudge or challenge is stored as agreeing, with the capitulation in its ``features``
    (``chat.steps.Capitulation``)."""
    settled = settle(prepared.role, prepared.required, prepared.history, prepared.content, completion.text,
                     after_override=prepared.after_override)
    parsed, final, reply, capitulation = settled.parsed, settled.final, settled.reply, settled.capitulation
    answered = check_ins.reply_to_answer(session, prepared.conversation_id, prepared.participant_turn_id,
                                         prepared.content, final)
    if answered is not None:  # a message answering a check-in: the platform's reply (chat.check_ins)
        (final, reply), capitulation = answered, None
    # One statement: the reply's sequence number, the claim released, the concern counted (in SQL,
    # from the current row: the history the policy read may be stale by now).
    values: dict[str, Any] = {"turn_count": Conversation.turn_count + 1, "awaiting_reply_since": _release(prepared)}
    if final.stance != "agree":
        values["concern_counts"] = _one_more(session, final.concern)
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
        streamed=completion.streamed, features=capitulation.record() if capitulation else {}, created_at=now())
    session.add(turn)
    session.flush()
    if final.stance in ("check_in", "escalate"):
        _record_safety_event(session, claimed.participant_id, turn, final, prepared)
    return turn


def _record_safety_event(session: Session, participant_id: int, turn: Turn, final: StanceDecision,
                         prepared: PreparedTurn) -> None:
    """A risk finding, at any level, is a safety event (``chat.check_ins``), committed with the reply."""
    participant = session.get(Participant, participant_id)
    assert participant is not None
    source = prepared.crisis_source if final.source == "platform" else "model"
    cue = prepared.features.get("crisis_cue")
    check_ins.record_finding(session, participant=participant, conversation_id=prepared.conversation_id, reply=turn,
                             participant_turn_id=prepared.participant_turn_id, stance=final.stance,
                             category=final.concern, source=source or "model", cue=str(cue) if cue else None)


def record_failure(session: Session, prepared: PreparedTurn, error: str) -> Turn | None:
    """The model did not answer. The message stays, marked for retry; but a safety escalation is
    never left waiting on the model: the platform's own safety reply is stored instead."""
    fallback = safety_fallback(prepared.required)
    if fallback is not None:
        return record_reply(session, prepared, fallback)
    session.execute(update(Turn).where(Turn.id == prepared.participant_turn_id)
                    .values(reply_status="failed", reply_error=error[:300])
                    .execution_options(synchronize_session=False))
    session.execute(update(Conversation).where(Conversation.id == prepared.conversation_id)
                    .values(awaiting_reply_since=_release(prepared))
                    .execution_options(synchronize_session=False))
    return None


# Safety-event reviews: an append-only history (the table's triggers refuse UPDATE and DELETE)


def review_safety_event(session: Session, event: SafetyEvent, reviewer: str, note: str) -> SafetyEventReview:
    """Add a review to the event's history; earlier reviews stay as they were. The note goes
    through the same text validator as the API's (``study.validation.text``), whoever calls."""
    try:
        note = validation.text(note)
    except ValueError as exc:
        raise Invalid(f"the review note {exc}", code="invalid_note") from None
    review = SafetyEventReview(safety_event_id=event.id, reviewed_at=now(), reviewed_by=reviewer, note=note)
    session.add(review)
    session.flush()
    return review


def safety_reviews(session: Session, *, study_id: int | None = None,
                   event_id: int | None = None) -> dict[int, list[SafetyEventReview]]:
    """Reviews by event id, oldest first, of one study's events or of one event (one query)."""
    query = select(SafetyEventReview).order_by(SafetyEventReview.reviewed_at, SafetyEventReview.id)
    if study_id is not None:
        query = query.join(SafetyEvent, SafetyEvent.id == SafetyEventReview.safety_event_id).where(
            SafetyEvent.study_id == study_id)
    if event_id is not None:
        query = query.where(SafetyEventReview.safety_event_id == event_id)
    by_event: dict[int, list[SafetyEventReview]] = {}
    for review in session.scalars(query):
        by_event.setdefault(review.safety_event_id, []).append(review)
    return by_event


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
                    .values(status="ended", ended_at=now(), awaiting_reply_since=None))


def deidentify_safety_events(session: Session, participant: Participant, level: WithdrawalLevel) -> None:
    """On withdrawal with data deletion, turn the participant's safety events into de-identified
    safety records before their research data is deleted: study, category, source, time and the
    staff reviews stay (an IRB expects the safety record kept); the links to the participant, the
    conversation and the turn and the matched text go. Stopping contact changes nothing."""
    if level != WithdrawalLevel.DELETE_DATA:
        return
    session.execute(update(SafetyEvent).where(SafetyEvent.participant_id == participant.id)
                    .values(participant_id=None, conversation_id=None, turn_id=None, cue=None,
                            participant_data_deleted=True)
                    .execution_options(synchronize_session=False))


def wire_lifecycle(lifecycle: Lifecycle) -> None:
    """The ``afterward.lifecycle`` entry point (pyproject.toml): withdrawal ends conversations,
    and deletion removes every chat table. Safety events are de-identified first (withdrawal hooks
    run before the deletion), so deleting what is still the participant's leaves their record."""
    lifecycle.on_withdrawal(_end_on_withdrawal)
    lifecycle.on_withdrawal(check_ins.on_withdrawal)  # before the events stop naming the participant
    lifecycle.on_withdrawal(deidentify_safety_events)
    lifecycle.research_data(Conversation, Turn, PushbackResponse, RoleSwitch, SafetyEvent, Decision)
