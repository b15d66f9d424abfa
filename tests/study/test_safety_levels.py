"""Safety events have a level the database keeps to its enum; the revision that added levels and
check-ins keeps every event, review and on-call notice when it copies the table (SQLite) and back,
each earlier event an escalation paging since it was raised; the append-only reviews stay append-only."""

from __future__ import annotations

import datetime as dt
from contextlib import ExitStack
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import Engine

from study.safety import CheckInKind, SafetyLevel
from tests.revisions import checked_values, migrated_to

AT = dt.datetime(2026, 12, 3, 9, 0, tzinfo=dt.UTC)
SETUP = (
    "INSERT INTO studies (id, slug, title, allocation_seed, allocation_count, status, created_at) "
    "VALUES (1, 'pilot', 'Pilot', 'seed', 0, 'open', :at)",
    "INSERT INTO safety_events (id, study_id, category, source, cue, created_at, participant_data_deleted) "
    "VALUES (5, 1, 'risk_to_self', 'lexicon', NULL, :at, true)",
    "INSERT INTO safety_event_reviews (id, safety_event_id, reviewed_at, reviewed_by, note) "
    "VALUES (3, 5, :at, 'r@uni.example', 'called')",
    "INSERT INTO safety_notifications (id, safety_event_id, study_id, round, channel, recipient, idempotency_key, "
    "status, attempts, next_attempt_at, created_at) VALUES (9, 5, 1, 0, 'email', 'oncall@example.org', "
    "'safety-5-0-email-abc', 'sent', 1, :at, :at)",
)


@pytest.mark.parametrize(("table", "name", "values"), [
    ("safety_events", "level_known", SafetyLevel), ("safety_check_ins", "kind_known", CheckInKind)])
def test_the_migrated_database_allows_exactly_the_enums_values(engine: Engine, table: str, name: str,
                                                               values: type[SafetyLevel | CheckInKind]) -> None:
    assert checked_values(engine, table, name) == {value.value for value in values}


def test_the_triage_revision_keeps_every_event_review_and_notice_up_and_down(tmp_path: Path) -> None:
    with ExitStack() as stack:
        engine, config = migrated_to(stack, tmp_path, "triage", "0013")
        with engine.begin() as connection:
            for statement in SETUP:
                connection.execute(sa.text(statement), {"at": AT})

        def rows(extra: str = "") -> list[tuple[object, ...]]:
            with engine.connect() as connection:
                return [tuple(row) for row in connection.execute(sa.text(
                    f"SELECT e.id, e.participant_data_deleted, r.id, r.note, n.id, n.idempotency_key{extra} "
                    "FROM safety_events e JOIN safety_event_reviews r ON r.safety_event_id = e.id "
                    "JOIN safety_notifications n ON n.safety_event_id = e.id"))]

        before = rows()
        command.upgrade(config, "0014")
        # An escalation, paging since it was raised: its notices keep their rounds and keys.
        assert rows(", e.level, CASE WHEN e.page_since = e.created_at THEN 'since raised' END") == [
            (*before[0], "escalation", "since raised")]
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
            connection.execute(sa.text("UPDATE safety_events SET level = 'urgent'"))
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(sa.text("UPDATE safety_event_reviews SET note = 'rewritten'"))
        command.downgrade(config, "0013")
        assert rows() == before
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM safety_event_reviews"))
