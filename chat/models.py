"""Chat tables: conversations, turns, pushback responses (overrides), role switches and decisions.
All are participant research data, deleted on withdrawal with deletion. The safety events chat
raises are the study's records (``study.safety``): they outlive that deletion, de-identified."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from chat.roles import RoleName
from study.clock import now
from study.db import Base, UTCDateTime
from study.models import ParticipantResearchData


class Conversation(ParticipantResearchData, Base):
    __tablename__ = "conversations"

    id: Mapped[int] = mapped_column(primary_key=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    arm: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(16))  # wellbeing | default
    role: Mapped[RoleName] = mapped_column(String(16))  # the role in force now
    status: Mapped[str] = mapped_column(String(16), default="active")  # active | ended
    turn_count: Mapped[int] = mapped_column(Integer, default=0)
    # The reply state's one home: set when a reply starts being produced (a new message, a retry
    # or an override), cleared when its outcome is stored; the guard against two replies at once
    # (chat.service._claim_reply). The claim's owner (study.processes) and its lease, renewed while
    # the owner works on it, tell a reply still being written from one whose process is gone;
    # both are read only while awaiting_reply_since is set. Counts of pushbacks per concern and
    # overridden concerns are kept here too, changed in SQL under the row's lock, so a turn needs
    # no extra queries.
    awaiting_reply_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    reply_claimed_by: Mapped[str | None] = mapped_column(String(120))
    reply_lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    concern_counts: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    overridden_concerns: Mapped[list[str]] = mapped_column(JSON, default=list)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # The exit check's rating is a survey response (immediate-rating, context conversation_id).
    made_decision: Mapped[bool | None] = mapped_column(Boolean)


class Turn(ParticipantResearchData, Base):
    """One message. A participant turn keeps the monitors' features and whether it was answered;
    an assistant turn keeps the stance, the model's own proposal, and what the call cost."""

    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("conversation_id", "seq"),
        UniqueConstraint("conversation_id", "client_message_id"),
        Index("ix_turns_participant_reassurance", "participant_id", "reassurance_seeking"),
        Index("ix_turns_conversation_stance", "conversation_id", "speaker", "stance"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    speaker: Mapped[str] = mapped_column(String(16))  # participant | assistant
    role: Mapped[RoleName] = mapped_column(String(16))  # the assistant role in force for this turn
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
    # participant turns
    client_message_id: Mapped[str | None] = mapped_column(String(64))
    # How the reply to this message ended: answered | failed; NULL until then. Whether a reply is
    # being produced is the conversation's state (awaiting_reply_since), not the turn's.
    reply_status: Mapped[str | None] = mapped_column(String(16))
    reply_error: Mapped[str | None] = mapped_column(String(300))
    reassurance_seeking: Mapped[bool] = mapped_column(Boolean, default=False)
    features: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # assistant turns
    reply_to_id: Mapped[int | None] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"))
    stance: Mapped[str | None] = mapped_column(String(16))
    concern: Mapped[str | None] = mapped_column(String(32))
    rationale: Mapped[str | None] = mapped_column(Text)
    stance_source: Mapped[str | None] = mapped_column(String(16))  # platform | model
    model_stance: Mapped[str | None] = mapped_column(String(16))  # what the model proposed, before policy
    model_concern: Mapped[str | None] = mapped_column(String(32))
    after_override: Mapped[bool] = mapped_column(Boolean, default=False)
    model: Mapped[str | None] = mapped_column(String(200))
    prompt_version: Mapped[str | None] = mapped_column(String(16))
    latency_ms: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    streamed: Mapped[bool] = mapped_column(Boolean, default=False)


class PushbackResponse(ParticipantResearchData, Base):
    """What the participant did with a nudge or challenge: ``override`` (go ahead anyway) or
    ``reconsider``. One per assistant turn."""

    __tablename__ = "pushback_responses"

    id: Mapped[int] = mapped_column(primary_key=True)
    turn_id: Mapped[int] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"), unique=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    action: Mapped[str] = mapped_column(String(16))
    stance: Mapped[str] = mapped_column(String(16))
    concern: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class RoleSwitch(ParticipantResearchData, Base):
    __tablename__ = "role_switches"

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    from_role: Mapped[RoleName] = mapped_column(String(16))
    to_role: Mapped[RoleName] = mapped_column(String(16))
    after_seq: Mapped[int] = mapped_column(Integer)  # the switch happened after this many turns
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)


class Decision(ParticipantResearchData, Base):
    """A decision the participant reported at the end of a conversation, in their words.
    Decision-anchored follow-ups (the Decision Regret Scale) ask about it."""

    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(primary_key=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"), index=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), unique=True)
    text: Mapped[str] = mapped_column(Text)
    decided_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=now)
