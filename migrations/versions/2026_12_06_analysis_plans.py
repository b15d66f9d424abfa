"""analysis: each study's frozen analysis plan

``analysis_plans`` holds, per study, the analysis plan as ``afterward plan freeze`` recorded it (its
text, SHA-256 and validated form, the file it came from, who froze it and when, and how many reads of
the study's outcomes the audit log held by then), so ``afterward analyze`` runs the plan first and
reports every deviation from it (``analysis.plan``, ``analysis.plan_report``).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 20:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "analysis_plans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source_text", sa.Text(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("source_path", sa.String(length=1000), nullable=False),
        sa.Column("frozen_by", sa.String(length=320), nullable=False),
        sa.Column("frozen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome_reads_before", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_analysis_plans_study_id_studies"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_analysis_plans")),
        sa.UniqueConstraint("study_id", name=op.f("uq_analysis_plans_study_id")),
    )


def downgrade() -> None:
    op.drop_table("analysis_plans")
