"""stored model fits, and the index the dashboard's conversation counts read

``model_fits`` holds each fit of the report's models made by ``afterward models fit`` (its tables
once done), so the dashboard shows fitted models without fitting them on a page view; a partial
unique index lets one fit of a study run at a time. ``ix_turns_conversation_stance`` covers the
per-conversation counts of replies and stances (``analysis.features.conversation_cells``), so
they are read from the index without a turn's row.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 20:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_fits",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=320), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("data_read_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("participants", sa.Integer(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("tables", sa.JSON(), nullable=True),
        sa.Column("notes", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_model_fits_study_id_studies"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_fits")),
    )
    op.create_index(op.f("ix_model_fits_study_id"), "model_fits", ["study_id"], unique=False)
    op.create_index("uq_model_fits_running", "model_fits", ["study_id"], unique=True,
                    sqlite_where=sa.text("status = 'running'"), postgresql_where=sa.text("status = 'running'"))
    op.create_index("ix_turns_conversation_stance", "turns", ["conversation_id", "speaker", "stance"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_turns_conversation_stance", table_name="turns")
    op.drop_index("uq_model_fits_running", table_name="model_fits")
    op.drop_index(op.f("ix_model_fits_study_id"), table_name="model_fits")
    op.drop_table("model_fits")
