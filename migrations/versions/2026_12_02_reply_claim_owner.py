"""a reply's claim records its owner and a lease

``conversations.reply_claimed_by`` is the process writing the reply (``study.processes``: pid,
start time, host, boot and PID namespace) and ``reply_lease_until`` how long the claim holds
unless that process renews it (it does every few seconds while it works). A claim whose owner is
known to be gone, or whose lease ran out, is taken over at once (``chat.service``) instead of
after a fixed two minutes. Claims made before this revision have neither: the first request or
API start-up that meets one takes it over.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (nullable, no constraint): no batch copy of the table on SQLite.
    op.add_column("conversations", sa.Column("reply_claimed_by", sa.String(length=120), nullable=True))
    op.add_column("conversations", sa.Column("reply_lease_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("conversations", "reply_lease_until")
    op.drop_column("conversations", "reply_claimed_by")
