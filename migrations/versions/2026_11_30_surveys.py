"""Surveys: custom instruments, assignments with their windows, responses and scores.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 14:52:07.155777
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "custom_instruments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instrument_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=40), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("source_yaml", sa.Text(), nullable=False),
        sa.Column("source_sha256", sa.String(length=64), nullable=False),
        sa.Column("loaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_custom_instruments")),
        sa.UniqueConstraint("instrument_id", "version", name=op.f("uq_custom_instruments_instrument_id_version")),
    )
    op.create_table(
        "survey_assignments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("instrument_id", sa.String(length=64), nullable=False),
        sa.Column("instrument_version", sa.String(length=40), nullable=False),
        sa.Column("purpose", sa.String(length=16), nullable=False),
        sa.Column("followup_key", sa.String(length=128), nullable=True),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("intended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closes_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_survey_assignments_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_survey_assignments")),
    )
    with op.batch_alter_table("survey_assignments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_survey_assignments_participant_id"), ["participant_id"], unique=False)

    op.create_table(
        "survey_responses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("assignment_id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("instrument_id", sa.String(length=64), nullable=False),
        sa.Column("instrument_version", sa.String(length=40), nullable=False),
        sa.Column("answers", sa.JSON(), nullable=False),
        sa.Column("submission_id", sa.String(length=64), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["assignment_id"],
            ["survey_assignments.id"],
            name=op.f("fk_survey_responses_assignment_id_survey_assignments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_survey_responses_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_survey_responses")),
        sa.UniqueConstraint("assignment_id", name=op.f("uq_survey_responses_assignment_id")),
    )
    with op.batch_alter_table("survey_responses", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_survey_responses_participant_id"), ["participant_id"], unique=False)

    op.create_table(
        "survey_scores",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("response_id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("instrument_version", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("n_items", sa.Integer(), nullable=False),
        sa.Column("n_expected", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_survey_scores_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["response_id"],
            ["survey_responses.id"],
            name=op.f("fk_survey_scores_response_id_survey_responses"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_survey_scores")),
        sa.UniqueConstraint("response_id", "name", name=op.f("uq_survey_scores_response_id_name")),
    )
    with op.batch_alter_table("survey_scores", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_survey_scores_participant_id"), ["participant_id"], unique=False)



def downgrade() -> None:
    with op.batch_alter_table("survey_scores", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_survey_scores_participant_id"))

    op.drop_table("survey_scores")
    with op.batch_alter_table("survey_responses", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_survey_responses_participant_id"))

    op.drop_table("survey_responses")
    with op.batch_alter_table("survey_assignments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_survey_assignments_participant_id"))

    op.drop_table("survey_assignments")
    op.drop_table("custom_instruments")
