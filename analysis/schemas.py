"""Read models of the staff transcript endpoints (``analysis.transcripts`` builds them)."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

from chat.schemas import SafetyEventRead


class ConversationSummaryRead(BaseModel):
    """One conversation in a staff listing."""

    id: int
    participant: str = Field(description="the participant's pseudonymous code")
    arm: str
    mode: str
    role: str = Field(description="the role in force now (or when it ended)")
    roles_used: list[str] = Field(description="every role the conversation was held in, in order")
    status: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    turn_count: int
    stance_counts: dict[str, int] = Field(description="assistant turns per stance (agree, nudge, challenge, "
                                                      "check_in, decline, escalate); zero counts included")
    has_safety_event: bool


class ConversationPageRead(BaseModel):
    total: int = Field(description="conversations matching the filters, on every page")
    limit: int
    offset: int
    items: list[ConversationSummaryRead]


class TranscriptTurnRead(BaseModel):
    """A turn as staff see it: what was said and, for the assistant, why."""

    id: int
    seq: int
    speaker: str = Field(description="participant | assistant")
    role: str
    content: str
    created_at: dt.datetime
    reply_status: str | None = Field(description="participant turns: answered | failed | null (no reply yet)")
    stance: str | None
    concern: str | None
    rationale: str | None = Field(description="the reason shown to the participant when the assistant pushed back")
    stance_source: str | None = Field(description="platform | model")
    model_stance: str | None = Field(description="what the model proposed before the policy")
    after_override: bool
    model: str | None
    prompt_version: str | None
    response: str | None = Field(description="override | reconsider: what the participant did with this pushback")


class PushbackResponseDetail(BaseModel):
    turn_id: int
    action: str = Field(description="override | reconsider")
    stance: str
    concern: str
    created_at: dt.datetime


class RoleSwitchRead(BaseModel):
    from_role: str
    to_role: str
    after_seq: int = Field(description="the switch came after this many turns")
    switched_at: dt.datetime


class DecisionRead(BaseModel):
    id: int
    text: str
    decided_at: dt.datetime


class ExitRatingRead(BaseModel):
    rating: float | None = Field(description="How helpful was this conversation? 1-7 (immediate-rating)")
    submitted_at: dt.datetime | None


class TranscriptRead(ConversationSummaryRead):
    """A whole conversation with everything that happened in it."""

    made_decision: bool | None
    turns: list[TranscriptTurnRead]
    pushback_responses: list[PushbackResponseDetail]
    role_switches: list[RoleSwitchRead]
    decision: DecisionRead | None
    exit_rating: ExitRatingRead | None
    safety_events: list[SafetyEventRead]


class SafetyEventContextRead(BaseModel):
    """A safety event with the turns around the one that triggered it (none for an event a safety
    rule on survey answers raised: its ``event.cue`` names the response, the rule and the answer)."""

    event: SafetyEventRead
    conversation_id: int | None
    transcript_path: str = Field(default="", description="where the full transcript is read")
    trigger_turn_id: int | None
    turns: list[TranscriptTurnRead] = Field(description="the triggering turn with up to `around` turns on each side")
