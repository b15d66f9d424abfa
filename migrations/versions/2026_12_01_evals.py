"""evaluation harness: grid runs, their cells, judge scores, human ratings and model cards

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=120), nullable=False),
        sa.Column("grid", sa.JSON(), nullable=False),
        sa.Column("query_set", sa.String(length=120), nullable=False),
        sa.Column("query_set_sha256", sa.String(length=64), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_runs")),
    )
    op.create_table(
        "eval_cells",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("condition", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("query_id", sa.String(length=64), nullable=False),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.String(length=500), nullable=True),
        sa.Column("prompt_version", sa.String(length=32), nullable=True),
        sa.Column("transcript", sa.JSON(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["eval_runs.id"], name=op.f("fk_eval_cells_run_id_eval_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_cells")),
        sa.UniqueConstraint("run_id", "condition", "model", "query_id", "repeat",
                            name=op.f("uq_eval_cells_run_id_condition_model_query_id_repeat")),
    )
    op.create_index(op.f("ix_eval_cells_run_id"), "eval_cells", ["run_id"], unique=False)
    op.create_table(
        "eval_scores",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cell_id", sa.Integer(), nullable=False),
        sa.Column("judge_model", sa.String(length=200), nullable=False),
        sa.Column("rubric_version", sa.String(length=32), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("capitulated", sa.JSON(), nullable=False),
        sa.Column("raw_output", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cell_id"], ["eval_cells.id"], name=op.f("fk_eval_scores_cell_id_eval_cells"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_scores")),
        sa.UniqueConstraint("cell_id", "judge_model", "rubric_version",
                            name=op.f("uq_eval_scores_cell_id_judge_model_rubric_version")),
    )
    op.create_index(op.f("ix_eval_scores_cell_id"), "eval_scores", ["cell_id"], unique=False)
    op.create_table(
        "eval_human_ratings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cell_id", sa.Integer(), nullable=False),
        sa.Column("rater", sa.String(length=120), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cell_id"], ["eval_cells.id"],
                                name=op.f("fk_eval_human_ratings_cell_id_eval_cells"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_human_ratings")),
        sa.UniqueConstraint("cell_id", "rater", name=op.f("uq_eval_human_ratings_cell_id_rater")),
    )
    op.create_index(op.f("ix_eval_human_ratings_cell_id"), "eval_human_ratings", ["cell_id"], unique=False)
    op.create_table(
        "eval_model_cards",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("condition", sa.String(length=64), nullable=False),
        sa.Column("prompt_version", sa.String(length=32), nullable=False),
        sa.Column("card", sa.JSON(), nullable=False),
        sa.Column("markdown", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["eval_runs.id"], name=op.f("fk_eval_model_cards_run_id_eval_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_model_cards")),
        sa.UniqueConstraint("run_id", "model", "condition", name=op.f("uq_eval_model_cards_run_id_model_condition")),
    )
    op.create_index(op.f("ix_eval_model_cards_run_id"), "eval_model_cards", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_eval_model_cards_run_id"), table_name="eval_model_cards")
    op.drop_table("eval_model_cards")
    op.drop_index(op.f("ix_eval_human_ratings_cell_id"), table_name="eval_human_ratings")
    op.drop_table("eval_human_ratings")
    op.drop_index(op.f("ix_eval_scores_cell_id"), table_name="eval_scores")
    op.drop_table("eval_scores")
    op.drop_index(op.f("ix_eval_cells_run_id"), table_name="eval_cells")
    op.drop_table("eval_cells")
    op.drop_table("eval_runs")
