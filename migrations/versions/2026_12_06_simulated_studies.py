"""simulated studies: a study is marked simulated when it is created for simulations

``studies.simulated`` marks a study made for ``afterward simulate`` (``study.studies.load_simulated``):
simulations write only to such a study, and it takes no real participants. The live dispatcher
(its on-call notices, check-in deadlines, re-planning, opening, expiry, invitations and
reminders) claims no row of a simulated study; a simulation's own dispatcher claims only its
study's. Every study before this revision is a live one: ``false``.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 16:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN with a server default: no batch copy of the table on SQLite.
    op.add_column("studies", sa.Column("simulated", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    op.drop_column("studies", "simulated")
