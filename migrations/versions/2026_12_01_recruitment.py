"""recruitment control: a study's status (open, paused, closed, archived)

``studies.status`` says whether the study takes new enrollments (only when ``open``);
``status_changed_at`` is when it last changed (the audit log holds who and why);
``followups_stopped_at`` is set when the researcher stopped every follow-up (closing with
``--stop-followups``): nothing is planned for the study's participants after it. Invites
already have ``revoked_at``.

The column is added with its named CHECK in one ``ALTER TABLE ... ADD COLUMN`` (valid on
SQLite and PostgreSQL alike), so SQLite does not copy the ``studies`` table: dropping the old
copy would cascade to, or be refused by, every table that references a study.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE studies ADD COLUMN status VARCHAR(16) DEFAULT 'open' NOT NULL "
        "CONSTRAINT ck_studies_status_known "
        "CHECK (status IN ('open', 'paused', 'closed', 'archived'))"
    )
    op.add_column("studies", sa.Column("status_changed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("studies", sa.Column("followups_stopped_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("studies", "followups_stopped_at")
    op.drop_column("studies", "status_changed_at")
    # The column's own CHECK goes with it: on PostgreSQL, and on SQLite (>= 3.35) without a copy.
    op.drop_column("studies", "status")
