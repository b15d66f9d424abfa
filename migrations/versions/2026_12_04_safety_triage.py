"""safety triage: every risk finding is a safety event at a level; check-ins and their answers

``safety_events`` gains ``level`` (``check_in``, ``escalation`` or ``unanswered``, checked by
``ck_safety_events_level_known``), ``page_since`` (when its level started to page the on-call
contacts), ``answer_due_at`` (while its check-in's answers are awaited, indexed for the
dispatcher's deadline phase) and ``unanswered_at``. Every event before this revision was an
escalation that paged from when it was raised: ``level`` is ``escalation`` and ``page_since`` its
``created_at``, so its on-call notices keep their rounds and idempotency keys.

``safety_check_ins`` holds the check-in a finding asked (``chat.triage``): its questions, each
answer with how it was given, when the answers settled its level, and the follow-up shown when it
went unanswered. One per event; the link to the turn that asked is cleared, never cascaded.

SQLite cannot add a constraint in place: the table is copied (batch mode). Dropping the old copy
would cascade to its append-only reviews and its on-call notices, so they are kept aside (the
reviews' triggers dropped and made again from their own SQL) and put back with the same ids.

Downgrading keeps every event (a safety record is not deleted): the old schema reads them all as
escalations, so check-in and unanswered events would page as escalations do.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 09:00:00.000000
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LEVELS = "level IN ('check_in', 'escalation', 'unanswered')"
KINDS = "kind IN ('risk_to_self', 'risk_from_others')"
DEPENDENTS = ("safety_event_reviews", "safety_notifications")  # cascade from safety_events


@contextmanager
def _dependents_kept() -> Iterator[None]:
    """On SQLite, keep the rows (and the triggers) of the tables that cascade from safety_events
    aside while batch mode copies it, and put them back as they were."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        yield
        return
    columns = {table: ", ".join(c["name"] for c in sa.inspect(bind).get_columns(table)) for table in DEPENDENTS}
    triggers = bind.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN "
                                    "('safety_event_reviews', 'safety_notifications')")).all()
    for name, _ in triggers:
        op.execute(f"DROP TRIGGER {name}")
    for table in DEPENDENTS:
        op.execute(f"CREATE TABLE _{table}_kept AS SELECT {columns[table]} FROM {table}")
    yield
    for table in DEPENDENTS:  # the copy's DROP cascaded to them
        op.execute(f"DELETE FROM {table}")
        op.execute(f"INSERT INTO {table} ({columns[table]}) SELECT {columns[table]} FROM _{table}_kept "
                   "WHERE safety_event_id IN (SELECT id FROM safety_events) ORDER BY id")
        op.execute(f"DROP TABLE _{table}_kept")
    for _, sql in triggers:
        op.execute(sql)


def _recreate() -> str:
    return "always" if op.get_bind().dialect.name == "sqlite" else "auto"


def upgrade() -> None:
    with _dependents_kept(), op.batch_alter_table("safety_events", recreate=_recreate()) as batch_op:
        batch_op.add_column(sa.Column("level", sa.String(length=16), nullable=False, server_default="escalation"))
        batch_op.add_column(sa.Column("page_since", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("answer_due_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("unanswered_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_check_constraint(op.f("ck_safety_events_level_known"), LEVELS)
        batch_op.create_index(batch_op.f("ix_safety_events_answer_due_at"), ["answer_due_at"], unique=False)
    op.execute("UPDATE safety_events SET page_since = created_at")  # each was an escalation, paging since raised
    op.create_table(
        "safety_check_ins",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("safety_event_id", sa.Integer(), nullable=False),
        sa.Column("turn_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("questions", sa.JSON(), nullable=False),
        sa.Column("answers", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_reason", sa.String(length=200), nullable=True),
        sa.Column("followed_up_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(KINDS, name=op.f("ck_safety_check_ins_kind_known")),
        sa.ForeignKeyConstraint(["safety_event_id"], ["safety_events.id"],
                                name=op.f("fk_safety_check_ins_safety_event_id_safety_events"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"], name=op.f("fk_safety_check_ins_turn_id_turns"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_safety_check_ins")),
        sa.UniqueConstraint("safety_event_id", name=op.f("uq_safety_check_ins_safety_event_id")),
    )


def downgrade() -> None:
    op.drop_table("safety_check_ins")
    with _dependents_kept(), op.batch_alter_table("safety_events", recreate=_recreate()) as batch_op:
        batch_op.drop_index(batch_op.f("ix_safety_events_answer_due_at"))
        batch_op.drop_constraint(op.f("ck_safety_events_level_known"), type_="check")
        for column in ("unanswered_at", "answer_due_at", "page_since", "level"):
            batch_op.drop_column(column)
