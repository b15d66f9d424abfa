"""Statuses are typed: the database keeps each status column to its enum's values, and the
revision that added the checks keeps every row when it copies the tables (SQLite) and back."""

from __future__ import annotations

import datetime as dt
import enum
from contextlib import ExitStack
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import Engine

from scheduler.models import Delivery, FollowUp, FollowUpStatus, SafetyNotification
from study.models import SignInEmail
from study.outbox import OutboxStatus
from tests.revisions import checked_values, migrated_to

TABLES: list[tuple[type[object], type[enum.StrEnum]]] = [
    (FollowUp, FollowUpStatus), (Delivery, OutboxStatus), (SafetyNotification, OutboxStatus),
    (SignInEmail, OutboxStatus)]
AT = dt.datetime(2026, 12, 3, 9, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(("model", "statuses"), TABLES, ids=[model.__name__ for model, _ in TABLES])
def test_the_migrated_database_allows_exactly_the_enums_statuses(
        engine: Engine, model: type[object], statuses: type[enum.StrEnum]) -> None:
    table = model.__tablename__  # type: ignore[attr-defined]
    assert checked_values(engine, table, "status_known") == {status.value for status in statuses}


def test_the_status_revision_keeps_every_row_up_and_down(tmp_path: Path) -> None:
    with ExitStack() as stack:
        engine, config = migrated_to(stack, tmp_path, "statuses", "0012")
        with engine.begin() as connection:
            for statement in (
                    "INSERT INTO studies (id, slug, title, allocation_seed, allocation_count, status, created_at) "
                    "VALUES (1, 'pilot', 'Pilot', 'seed', 0, 'open', :at)",
                    "INSERT INTO participants (id, study_id, code, status, created_at) "
                    "VALUES (1, 1, 'P1', 'enrolled', :at)",
                    "INSERT INTO followups (id, participant_id, study_id, followup_key, anchor_key, instrument_id, "
                    "protocol_version, context, timezone, intended_local, due_at, closes_at, reminder_offsets, "
                    "status, reminders_sent, created_at, updated_at) VALUES (1, 1, 1, 'week-1', 'enrollment', "
                    "'perma', 1, '{}', 'UTC', '2026-12-03T09:00', :at, :at, '[]', 'sent', 0, :at, :at)",
                    "INSERT INTO deliveries (id, followup_id, participant_id, kind, sequence, channel, "
                    "idempotency_key, due_at, status, attempts, next_attempt_at, detail, created_at) VALUES "
                    "(7, 1, 1, 'invitation', 0, 'email', 'followup-1-0-email', :at, 'pending', 0, :at, '{}', :at)"):
                connection.execute(sa.text(statement), {"at": AT})

        def rows() -> list[tuple[object, ...]]:
            with engine.connect() as connection:
                return [tuple(row) for row in connection.execute(sa.text(
                    "SELECT f.id, f.status, d.id, d.idempotency_key, d.status FROM followups f "
                    "JOIN deliveries d ON d.followup_id = f.id"))]

        before = rows()
        command.upgrade(config, "0013")
        assert rows() == before == [(1, "sent", 7, "followup-1-0-email", "pending")]
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
            connection.execute(sa.text("UPDATE deliveries SET status = 'delivered'"))
        command.downgrade(config, "0012")
        assert rows() == before
        with engine.begin() as connection:  # no check any more
            connection.execute(sa.text("UPDATE deliveries SET status = 'delivered'"))
