"""evaluation: people's own answers to the queries, the human baseline column

``eval_human_baselines`` holds, per named baseline and query of a query set, how many people
answered and how many affirmed the person's framing (``evals.human_baseline``; the report sets the
models' affirmation beside it, paired by query).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "eval_human_baselines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=120), nullable=False),
        sa.Column("query_set", sa.String(length=120), nullable=False),
        sa.Column("query_set_sha256", sa.String(length=64), nullable=False),
        sa.Column("query_id", sa.String(length=64), nullable=False),
        sa.Column("responses", sa.Integer(), nullable=False),
        sa.Column("affirmed", sa.Integer(), nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_human_baselines")),
        sa.UniqueConstraint("name", "query_set", "query_id",
                            name=op.f("uq_eval_human_baselines_name_query_set_query_id")),
    )


def downgrade() -> None:
    op.drop_table("eval_human_baselines")
