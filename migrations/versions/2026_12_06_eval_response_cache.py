"""evaluation: a response cache shared by runs, and the judge's tries counted apart

``eval_responses`` holds each model answer the harness was paid for under the SHA-256 of its
request (model, messages, settings, seed; ``evals.cache``), so a rerun or a resume asks for it
once. ``eval_cells.judge_attempts`` counts the run judge's tries of a cell: a cell's conversation is
saved first (status ``generated``) and a failed judgement is tried again on it. Cells before this
revision were conversation and judgement in one: their judge tries are 0 (a ``done`` cell's scores
are kept; nothing is asked again).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "eval_responses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("response_model", sa.String(length=200), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_responses")),
        sa.UniqueConstraint("key", name=op.f("uq_eval_responses_key")),
    )
    # Plain ADD COLUMN with a server default: no batch copy of the table on SQLite.
    op.add_column("eval_cells", sa.Column("judge_attempts", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("eval_cells", "judge_attempts")
    op.drop_table("eval_responses")
