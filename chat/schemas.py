"""Chat API models."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field, StrictBool

from chat.models import Conversation, Turn
from chat.roles import RoleSpec
from chat.service import reply_in_flight
from study.safety import SafetyEvent, SafetyEventReview
from study.validation import NOT_BLANK_PATTERN, Line, RequestBody


class DisclosureRead(BaseModel):
    name: str
    title: str
    tagline: str
    optimized_for: str
    will: list[str]
    wont: list[str]
    pushback: str

    @classmethod
    def of(cls, spec: RoleSpec) -> DisclosureRead:
        d = spec.disclosure
        return cls(name=spec.name, title=d.title, tagline=d.tagline, optimized_for=d.optimized_for,
                   will=list(d.will), wont=list(d.wont), pushback=d.pushback)


class RolesRead(BaseModel):
    mode: str
    default_role: str | None
    roles: list[DisclosureRead]


class CrisisResourcesRead(BaseModel):
    region: str
    text: str


class ConversationCreate(RequestBody):
    role: Line | None = Field(default=None, max_length=40,
                             description="concierge, collaborator or coach (wellbeing arms)")


class RoleChange(RequestBody):
    role: Line = Field(max_length=40)


class MessageCreate(RequestBody):
    # Length is checked by the service against the configured limit, with a message that says it.
    content: str = Field(json_schema_extra={"pattern": NOT_BLANK_PATTERN})
    client_message_id: str | None = Field(
        default=None, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Your own id for this message; resending it never stores a second copy")


class ExitCheck(RequestBody):
    # As chat.service.end_conversation checks it: a decision is described exactly when one was made.
    schema_rules = {"anyOf": [
        {"required": ["made_decision", "decision"], "properties": {
            "made_decision": {"const": True}, "decision": {"type": "string", "pattern": NOT_BLANK_PATTERN}}},
        {"properties": {"made_decision": {"const": False},
                        "decision": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": r"^\s*$"}]}}}]}
    rating: int | None = Field(default=None, ge=1, le=7,
                               description="How helpful was this conversation? 1 = not at all, 7 = extremely")
    made_decision: StrictBool = False
    decision: str | None = Field(default=None, max_length=2000, description="What you decided, in your words")


class TurnRead(BaseModel):
    id: int
    seq: int
    speaker: str
    role: str
    content: str
    created_at: dt.datetime
    reply_status: str | None = None
    stance: str | None = None
    concern: str | None = None
    rationale: str | None = None
    overridable: bool = False
    crisis_resources: CrisisResourcesRead | None = None
    response: str | None = None  # override | reconsider, once the participant answered the note

    @classmethod
    def of(cls, turn: Turn, resources: CrisisResourcesRead | None = None, response: str | None = None) -> TurnRead:
        return cls(id=turn.id, seq=turn.seq, speaker=turn.speaker, role=turn.role, content=turn.content,
                   created_at=turn.created_at, reply_status=turn.reply_status, stance=turn.stance,
                   concern=turn.concern, rationale=turn.rationale,
                   overridable=turn.stance in ("nudge", "challenge") and response is None,
                   crisis_resources=resources if turn.stance == "escalate" else None, response=response)


class ConversationRead(BaseModel):
    id: int
    role: str
    mode: str
    status: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    turn_count: int
    awaiting_reply: bool = Field(default=False, description="a reply is being written now, and is stored even if "
                                 "nobody waits for it: read the conversation again in a moment")

    @classmethod
    def of(cls, c: Conversation) -> ConversationRead:
        return cls(id=c.id, role=c.role, mode=c.mode, status=c.status, started_at=c.started_at,
                   ended_at=c.ended_at, turn_count=c.turn_count, awaiting_reply=reply_in_flight(c))


class ConversationDetail(ConversationRead):
    turns: list[TurnRead]


class ExchangeRead(BaseModel):
    """A participant message and the assistant's reply to it."""

    conversation_id: int
    message: TurnRead
    reply: TurnRead


class PushbackResponseRead(BaseModel):
    turn_id: int
    action: str


class ConversationEnded(BaseModel):
    conversation: ConversationRead
    decision_id: int | None
    exit_survey_id: int | None


class SafetyReviewRead(BaseModel):
    reviewed_at: dt.datetime
    reviewed_by: str
    note: str

    @classmethod
    def of(cls, review: SafetyEventReview) -> SafetyReviewRead:
        return cls(reviewed_at=review.reviewed_at, reviewed_by=review.reviewed_by, note=review.note)


DEIDENTIFIED = "participant withdrew and deleted data"


class SafetyEventRead(BaseModel):
    id: int
    participant: str | None = Field(description="the participant's code; null once they deleted their data")
    conversation_id: int | None
    category: str
    source: str
    cue: str | None
    created_at: dt.datetime
    participant_data_deleted: bool = Field(
        default=False, description="a de-identified safety record: no participant, conversation or matched text")
    marker: str | None = Field(default=None, description=f"'{DEIDENTIFIED}' on a de-identified record")
    # The newest review, as before the history existed (None: not reviewed yet).
    reviewed_at: dt.datetime | None
    reviewed_by: str | None
    review_note: str | None
    reviews: list[SafetyReviewRead] = Field(description="every review, oldest first; none is ever overwritten")

    @classmethod
    def of(cls, event: SafetyEvent, participant_code: str | None,
           reviews: list[SafetyEventReview]) -> SafetyEventRead:
        """``reviews``: the event's reviews, oldest first."""
        newest = reviews[-1] if reviews else None
        return cls(id=event.id, participant=participant_code, conversation_id=event.conversation_id,
                   category=event.category, source=event.source, cue=event.cue, created_at=event.created_at,
                   participant_data_deleted=event.participant_data_deleted,
                   marker=DEIDENTIFIED if event.participant_data_deleted else None,
                   reviewed_at=newest.reviewed_at if newest else None,
                   reviewed_by=newest.reviewed_by if newest else None, review_note=newest.note if newest else None,
                   reviews=[SafetyReviewRead.of(review) for review in reviews])


class SafetyReview(RequestBody):
    """A review is added to the event's history; earlier ones are kept as they were."""

    note: str = Field(min_length=1, max_length=4000, description="What was done, e.g. 'contacted per protocol'")
