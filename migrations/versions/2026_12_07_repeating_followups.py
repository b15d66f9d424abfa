"""repeating follow-ups: each occurrence of a repeating follow-up is a row of its own

``followups.occurrence`` counts a repeating follow-up's occurrences from 0 (``study.protocol.Repeat``:
a daily diary of 14 days has occurrences 0-13 for one anchor); every follow-up before this revision
is a single one, occurrence 0. The unique key that makes planning exactly-once takes it in.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "uq_followups_participant_id_followup_key_anchor_key"
NEW = "uq_followups_participant_id_followup_key_anchor_key_occurrence"


def upgrade() -> None:
    with op.batch_alter_table("followups", schema=None) as batch_op:
        batch_op.add_column(sa.Column("occurrence", sa.Integer(), server_default="0", nullable=False))
        batch_op.drop_constraint(OLD, type_="unique")
        batch_op.create_unique_constraint(NEW, ["participant_id", "followup_key", "anchor_key", "occurrence"])


def downgrade() -> None:
    with op.batch_alter_table("followups", schema=None) as batch_op:
        batch_op.drop_constraint(NEW, type_="unique")
        batch_op.create_unique_constraint(OLD, ["participant_id", "followup_key", "anchor_key"])
        batch_op.drop_column("occurrence")
