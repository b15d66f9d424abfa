"""safety-event reviews as an append-only history; a conversation's reply state in one place

Reviews move from three columns on safety_events (where a second review overwrote the first note)
to their own table, append-only like the audit log; the existing reviews are copied over and the
columns dropped, so the history is the only home of a review (the newest one is read from it).

A turn's reply_status no longer says 'awaiting': whether a reply is being produced is the
conversation's awaiting_reply_since alone; reply_status keeps only the outcome (answered | failed).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 22:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPEND_ONLY = "safety_event_reviews is append-only: add a new review instead"


def upgrade() -> None:
    op.create_table(
        "safety_event_reviews",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("safety_event_id", sa.Integer(), nullable=False),
        sa.Column("reviewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reviewed_by", sa.String(length=320), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["safety_event_id"],
            ["safety_events.id"],
            name=op.f("fk_safety_event_reviews_safety_event_id_safety_events"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_safety_event_reviews")),
    )
    op.create_index(
        op.f("ix_safety_event_reviews_safety_event_id"), "safety_event_reviews", ["safety_event_id"], unique=False
    )
    op.execute(
        "INSERT INTO safety_event_reviews (safety_event_id, reviewed_at, reviewed_by, note) "
        "SELECT id, reviewed_at, COALESCE(reviewed_by, 'unknown'), COALESCE(review_note, '') "
        "FROM safety_events WHERE reviewed_at IS NOT NULL ORDER BY id"
    )
    # Refuse UPDATE always, and DELETE unless the event itself is gone (ON DELETE CASCADE from a
    # withdrawal with data deletion, which runs after the event's row is deleted).
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION safety_event_reviews_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT 1 FROM safety_events WHERE id = OLD.safety_event_id) "
            f"THEN RETURN OLD; END IF; RAISE EXCEPTION '{APPEND_ONLY}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER safety_event_reviews_append_only BEFORE UPDATE OR DELETE ON safety_event_reviews "
            "FOR EACH ROW EXECUTE FUNCTION safety_event_reviews_append_only()"
        )
    else:
        op.execute(
            "CREATE TRIGGER safety_event_reviews_no_update BEFORE UPDATE ON safety_event_reviews "
            f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END"
        )
        op.execute(
            "CREATE TRIGGER safety_event_reviews_no_delete BEFORE DELETE ON safety_event_reviews "
            "WHEN EXISTS (SELECT 1 FROM safety_events WHERE id = OLD.safety_event_id) "
            f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END"
        )
    # Plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35 too): no batch copy of the table, whose
    # DROP would cascade to the reviews just copied.
    for column in ("review_note", "reviewed_by", "reviewed_at"):
        op.drop_column("safety_events", column)

    op.execute("UPDATE turns SET reply_status = NULL WHERE reply_status = 'awaiting'")


def downgrade() -> None:
    op.add_column("safety_events", sa.Column("reviewed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("safety_events", sa.Column("reviewed_by", sa.String(length=320), nullable=True))
    op.add_column("safety_events", sa.Column("review_note", sa.Text(), nullable=True))
    # The newest review of each event (the later id wins a tie).
    newest = (
        "FROM safety_event_reviews r WHERE r.safety_event_id = safety_events.id "
        "ORDER BY r.reviewed_at DESC, r.id DESC LIMIT 1"
    )
    op.execute(
        f"UPDATE safety_events SET reviewed_at = (SELECT r.reviewed_at {newest}), "
        f"reviewed_by = (SELECT r.reviewed_by {newest}), review_note = (SELECT r.note {newest})"
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS safety_event_reviews_append_only ON safety_event_reviews")
        op.execute("DROP FUNCTION IF EXISTS safety_event_reviews_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS safety_event_reviews_no_update")
        op.execute("DROP TRIGGER IF EXISTS safety_event_reviews_no_delete")
    op.drop_index(op.f("ix_safety_event_reviews_safety_event_id"), table_name="safety_event_reviews")
    op.drop_table("safety_event_reviews")
