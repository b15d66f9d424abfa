"""scheduler: follow-up anchors, follow-ups, deliveries, channel alerts

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 15:39:04.974736
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "channel_alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("problem", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("raised_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_channel_alerts")),
    )
    op.create_table(
        "followup_anchors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("anchored_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_followup_anchors_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_followup_anchors")),
        sa.UniqueConstraint("participant_id", "key", name=op.f("uq_followup_anchors_participant_id_key")),
    )
    op.create_table(
        "followups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("followup_key", sa.String(length=64), nullable=False),
        sa.Column("anchor_key", sa.String(length=64), nullable=False),
        sa.Column("instrument_id", sa.String(length=64), nullable=False),
        sa.Column("protocol_version", sa.Integer(), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("intended_local", sa.String(length=32), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closes_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reminder_offsets", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("assignment_id", sa.Integer(), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lateness_seconds", sa.Double(), nullable=True),
        sa.Column("reminders_sent", sa.Integer(), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["assignment_id"],
            ["survey_assignments.id"],
            name=op.f("fk_followups_assignment_id_survey_assignments"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_followups_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_followups_study_id_studies")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_followups")),
        sa.UniqueConstraint(
            "participant_id",
            "followup_key",
            "anchor_key",
            name=op.f("uq_followups_participant_id_followup_key_anchor_key"),
        ),
    )
    with op.batch_alter_table("followups", schema=None) as batch_op:
        batch_op.create_index("ix_followups_due", ["status", "due_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_followups_participant_id"), ["participant_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_followups_study_id"), ["study_id"], unique=False)

    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("followup_id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("idempotency_key", sa.String(length=128), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["followup_id"], ["followups.id"], name=op.f("fk_deliveries_followup_id_followups"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_deliveries_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_deliveries_idempotency_key")),
    )
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.create_index("ix_deliveries_due", ["status", "next_attempt_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_deliveries_followup_id"), ["followup_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_deliveries_participant_id"), ["participant_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deliveries_participant_id"))
        batch_op.drop_index(batch_op.f("ix_deliveries_followup_id"))
        batch_op.drop_index("ix_deliveries_due")

    op.drop_table("deliveries")
    with op.batch_alter_table("followups", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_followups_study_id"))
        batch_op.drop_index(batch_op.f("ix_followups_participant_id"))
        batch_op.drop_index("ix_followups_due")

    op.drop_table("followups")
    op.drop_table("followup_anchors")
    op.drop_table("channel_alerts")
