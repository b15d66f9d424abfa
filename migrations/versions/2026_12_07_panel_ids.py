"""panel ids: the recruitment panel's id for a participant

``participants.external_id`` holds the id a recruitment panel (Prolific, SONA, MTurk) gave the
participant (protocol ``recruitment``): one arrival per id and study, for the panel's completion
codes and payments only, never in a research export. Participants before this revision have none.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 03:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("external_id", sa.String(length=128), nullable=True))
        batch_op.create_unique_constraint("uq_participants_study_id_external_id", ["study_id", "external_id"])


def downgrade() -> None:
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.drop_constraint("uq_participants_study_id_external_id", type_="unique")
        batch_op.drop_column("external_id")
