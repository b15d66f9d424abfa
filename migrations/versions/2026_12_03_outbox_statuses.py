"""outbox statuses are checked; sign-in emails' idempotency keys as long as the others'

The status of a follow-up (``scheduler.models.FollowUpStatus``) and of every outbox row, the
deliveries, on-call notices and sign-in emails (``study.outbox.OutboxStatus``), is kept to its
known values by a CHECK constraint (``ck_<table>_status_known``). The outbox tables now share
their columns (``study.outbox.LeasedRow``), so ``sign_in_emails.idempotency_key`` takes 128
characters like the others.

SQLite cannot add a constraint in place: the tables are copied (batch mode). Dropping the old
copy of ``followups`` would cascade to its deliveries, so they are kept aside and put back
afterwards with the same ids.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OUTBOX = "status IN ('pending', 'sending', 'sent', 'failed', 'cancelled')"
STATUSES = {
    "followups": "status IN ('planned', 'sent', 'completed', 'expired', 'cancelled')",
    "deliveries": OUTBOX,
    "safety_notifications": OUTBOX,
    "sign_in_emails": OUTBOX,
}


def _is_sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _change(add: bool) -> None:
    sqlite = _is_sqlite()
    if sqlite:
        columns = ", ".join(column["name"] for column in sa.inspect(op.get_bind()).get_columns("deliveries"))
        op.execute(f"CREATE TABLE _deliveries_kept AS SELECT {columns} FROM deliveries")
    for table, condition in STATUSES.items():
        with op.batch_alter_table(table, recreate="always" if sqlite else "auto") as batch_op:
            name = op.f(f"ck_{table}_status_known")
            if add:
                batch_op.create_check_constraint(name, condition)
            else:
                batch_op.drop_constraint(name, type_="check")
            if table == "sign_in_emails":
                batch_op.alter_column("idempotency_key", existing_type=sa.String(length=64 if add else 128),
                                      type_=sa.String(length=128 if add else 64), existing_nullable=False)
    if sqlite:
        # The copy's DROP of followups cascaded to the deliveries; put them back as they were.
        op.execute("DELETE FROM deliveries")
        op.execute(f"INSERT INTO deliveries ({columns}) SELECT {columns} FROM _deliveries_kept ORDER BY id")
        op.execute("DROP TABLE _deliveries_kept")


def upgrade() -> None:
    _change(add=True)


def downgrade() -> None:
    _change(add=False)
