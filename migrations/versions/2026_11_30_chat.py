"""chat: conversations, turns, pushback responses, role switches, safety events, decisions

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 15:27:01.420122
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("arm", sa.String(length=64), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("turn_count", sa.Integer(), nullable=False),
        sa.Column("awaiting_reply_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("concern_counts", sa.JSON(), nullable=False),
        sa.Column("overridden_concerns", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("made_decision", sa.Boolean(), nullable=True),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_conversations_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_conversations")),
    )
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_conversations_participant_id"), ["participant_id"], unique=False)

    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_decisions_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_decisions_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
        sa.UniqueConstraint("conversation_id", name=op.f("uq_decisions_conversation_id")),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_decisions_participant_id"), ["participant_id"], unique=False)

    op.create_table(
        "role_switches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("from_role", sa.String(length=16), nullable=False),
        sa.Column("to_role", sa.String(length=16), nullable=False),
        sa.Column("after_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_role_switches_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_role_switches_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_role_switches")),
    )
    with op.batch_alter_table("role_switches", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_role_switches_conversation_id"), ["conversation_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_role_switches_participant_id"), ["participant_id"], unique=False)

    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("speaker", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("client_message_id", sa.String(length=64), nullable=True),
        sa.Column("reply_status", sa.String(length=16), nullable=True),
        sa.Column("reply_error", sa.String(length=300), nullable=True),
        sa.Column("reassurance_seeking", sa.Boolean(), nullable=False),
        sa.Column("features", sa.JSON(), nullable=False),
        sa.Column("reply_to_id", sa.Integer(), nullable=True),
        sa.Column("stance", sa.String(length=16), nullable=True),
        sa.Column("concern", sa.String(length=32), nullable=True),
        sa.Column("rationale", sa.Text(), nullable=True),
        sa.Column("stance_source", sa.String(length=16), nullable=True),
        sa.Column("model_stance", sa.String(length=16), nullable=True),
        sa.Column("model_concern", sa.String(length=32), nullable=True),
        sa.Column("after_override", sa.Boolean(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("prompt_version", sa.String(length=16), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("streamed", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_turns_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_turns_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["reply_to_id"], ["turns.id"], name=op.f("fk_turns_reply_to_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turns")),
        sa.UniqueConstraint(
            "conversation_id", "client_message_id", name=op.f("uq_turns_conversation_id_client_message_id")
        ),
        sa.UniqueConstraint("conversation_id", "seq", name=op.f("uq_turns_conversation_id_seq")),
    )
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.create_index(
            "ix_turns_participant_reassurance", ["participant_id", "reassurance_seeking"], unique=False
        )

    op.create_table(
        "pushback_responses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("turn_id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("stance", sa.String(length=16), nullable=False),
        sa.Column("concern", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_pushback_responses_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_pushback_responses_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_pushback_responses_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pushback_responses")),
        sa.UniqueConstraint("turn_id", name=op.f("uq_pushback_responses_turn_id")),
    )
    with op.batch_alter_table("pushback_responses", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pushback_responses_conversation_id"), ["conversation_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_pushback_responses_participant_id"), ["participant_id"], unique=False)

    op.create_table(
        "safety_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.Integer(), nullable=False),
        sa.Column("turn_id", sa.Integer(), nullable=False),
        sa.Column("category", sa.String(length=32), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("cue", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reviewed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reviewed_by", sa.String(length=320), nullable=True),
        sa.Column("review_note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_safety_events_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_safety_events_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_safety_events_study_id_studies")),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_safety_events_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_safety_events")),
    )
    with op.batch_alter_table("safety_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_safety_events_participant_id"), ["participant_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_safety_events_study_id"), ["study_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("safety_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_safety_events_study_id"))
        batch_op.drop_index(batch_op.f("ix_safety_events_participant_id"))

    op.drop_table("safety_events")
    with op.batch_alter_table("pushback_responses", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pushback_responses_participant_id"))
        batch_op.drop_index(batch_op.f("ix_pushback_responses_conversation_id"))

    op.drop_table("pushback_responses")
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_index("ix_turns_participant_reassurance")

    op.drop_table("turns")
    with op.batch_alter_table("role_switches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_role_switches_participant_id"))
        batch_op.drop_index(batch_op.f("ix_role_switches_conversation_id"))

    op.drop_table("role_switches")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_decisions_participant_id"))

    op.drop_table("decisions")
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_conversations_participant_id"))

    op.drop_table("conversations")
