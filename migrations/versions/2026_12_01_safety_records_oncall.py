"""safety records survive data deletion; on-call notices of safety events

A safety event's links to the participant, the conversation and the turn become nullable and are
set to NULL instead of cascading, and ``participant_data_deleted`` marks an event kept as a
de-identified record after its participant withdrew and deleted their data. The reviews stay.

``safety_notifications`` holds the on-call notices the dispatcher sends to the protocol's safety
contacts (one per event, round and contact; the idempotency key is unique).

SQLite cannot change a column's nullability or a foreign key in place: the table is copied
(batch mode). Dropping the old copy would cascade to the append-only reviews, so they are kept
aside with their triggers dropped, and put back afterwards with the same ids.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 02:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPEND_ONLY = "safety_event_reviews is append-only: add a new review instead"
LINKS = (("participant_id", "participants"), ("conversation_id", "conversations"), ("turn_id", "turns"))
REVIEW_COLUMNS = "id, safety_event_id, reviewed_at, reviewed_by, note"


def _is_sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _sqlite_review_triggers(create: bool) -> None:
    if not create:
        op.execute("DROP TRIGGER IF EXISTS safety_event_reviews_no_update")
        op.execute("DROP TRIGGER IF EXISTS safety_event_reviews_no_delete")
        return
    op.execute(
        "CREATE TRIGGER safety_event_reviews_no_update BEFORE UPDATE ON safety_event_reviews "
        f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END"
    )
    op.execute(
        "CREATE TRIGGER safety_event_reviews_no_delete BEFORE DELETE ON safety_event_reviews "
        "WHEN EXISTS (SELECT 1 FROM safety_events WHERE id = OLD.safety_event_id) "
        f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END"
    )


def _relink(ondelete: str, nullable: bool) -> None:
    """Point the event's links at their rows with ``ondelete``, nullable or not."""
    sqlite = _is_sqlite()
    if sqlite:
        op.execute(f"CREATE TABLE _safety_event_reviews_kept AS SELECT {REVIEW_COLUMNS} FROM safety_event_reviews")
        _sqlite_review_triggers(create=False)
    with op.batch_alter_table("safety_events", recreate="always" if sqlite else "auto") as batch_op:
        for column, table in LINKS:
            batch_op.drop_constraint(f"fk_safety_events_{column}_{table}", type_="foreignkey")
            batch_op.alter_column(column, existing_type=sa.Integer(), nullable=nullable)
            batch_op.create_foreign_key(f"fk_safety_events_{column}_{table}", table, [column], ["id"],
                                        ondelete=ondelete)
    if sqlite:
        # The copy's DROP cascaded to the reviews; put them back as they were.
        op.execute("DELETE FROM safety_event_reviews")
        op.execute(f"INSERT INTO safety_event_reviews ({REVIEW_COLUMNS}) "
                   f"SELECT {REVIEW_COLUMNS} FROM _safety_event_reviews_kept "
                   "WHERE safety_event_id IN (SELECT id FROM safety_events) ORDER BY id")
        op.execute("DROP TABLE _safety_event_reviews_kept")
        _sqlite_review_triggers(create=True)


def upgrade() -> None:
    op.add_column("safety_events", sa.Column("participant_data_deleted", sa.Boolean(), nullable=False,
                                             server_default=sa.false()))
    _relink("SET NULL", nullable=True)
    op.create_table(
        "safety_notifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("safety_event_id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("recipient", sa.String(length=2000), nullable=False),
        sa.Column("idempotency_key", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["safety_event_id"],
            ["safety_events.id"],
            name=op.f("fk_safety_notifications_safety_event_id_safety_events"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], name=op.f("fk_safety_notifications_study_id_studies")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_safety_notifications")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_safety_notifications_idempotency_key")),
    )
    op.create_index(op.f("ix_safety_notifications_due"), "safety_notifications", ["status", "next_attempt_at"],
                    unique=False)
    op.create_index(op.f("ix_safety_notifications_safety_event_id"), "safety_notifications", ["safety_event_id"],
                    unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_safety_notifications_safety_event_id"), table_name="safety_notifications")
    op.drop_index(op.f("ix_safety_notifications_due"), table_name="safety_notifications")
    op.drop_table("safety_notifications")
    # The old schema cannot hold a record without its participant: de-identified records go
    # (with their reviews, which the triggers let go once the event is gone).
    op.execute("DELETE FROM safety_events WHERE participant_id IS NULL OR conversation_id IS NULL "
               "OR turn_id IS NULL")
    op.drop_column("safety_events", "participant_data_deleted")  # in place, also on SQLite >= 3.35
    _relink("CASCADE", nullable=False)
