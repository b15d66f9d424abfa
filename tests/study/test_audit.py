from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from study import audit
from study.db import session_scope

ACTOR = audit.Actor("staff", "r@example.org")


def _append(engine: Engine, n: int) -> None:
    with session_scope(engine) as session:
        for i in range(n):
            audit.record(session, ACTOR, "participants.listed", study_id=1, count=i)


def _verify(engine: Engine) -> audit.VerifyResult:
    with session_scope(engine) as session:
        return audit.verify(session)


def _without_guard(engine: Engine, statement: str) -> None:
    """What someone with direct database access could do: drop the trigger, then tamper."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only"))
            connection.execute(sa.text(statement))
            connection.execute(sa.text("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only"))
        else:
            connection.execute(sa.text("DROP TRIGGER audit_log_no_update"))
            connection.execute(sa.text("DROP TRIGGER audit_log_no_delete"))
            connection.execute(sa.text(statement))


def test_intact_chain_verifies(engine: Engine) -> None:
    _append(engine, 5)
    result = _verify(engine)
    assert (result.ok, result.entries) == (True, 5)


def test_database_refuses_update_and_delete(engine: Engine) -> None:
    _append(engine, 2)
    for statement in ("UPDATE audit_log SET actor = 'x' WHERE seq = 1", "DELETE FROM audit_log WHERE seq = 1"):
        with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as connection:
            connection.execute(sa.text(statement))


def test_edited_entry_is_detected(engine: Engine) -> None:
    _append(engine, 4)
    _without_guard(engine, "UPDATE audit_log SET actor = 'someone-else@example.org' WHERE seq = 2")
    result = _verify(engine)
    assert not result.ok
    assert result.problems == ["entry 2: content does not match its hash (edited?)"]


def test_edited_entry_with_recomputed_hash_breaks_the_next_link(engine: Engine) -> None:
    _append(engine, 4)
    with session_scope(engine) as session:
        entry = session.get(audit.AuditEntry, 2)
        assert entry is not None
        entry.detail = {"count": 99}
        forged = audit._entry_hash(entry)
        session.expunge(entry)
    _without_guard(engine, f"UPDATE audit_log SET detail = '{{\"count\": 99}}', entry_hash = '{forged}' WHERE seq = 2")
    assert _verify(engine).problems == ["entry 3: link to the previous entry is broken"]


def test_deleted_entry_is_detected(engine: Engine) -> None:
    _append(engine, 4)
    _without_guard(engine, "DELETE FROM audit_log WHERE seq = 3")
    problems = _verify(engine).problems
    assert "entries 3..3 are missing (deleted?)" in problems
    assert "entry 4: link to the previous entry is broken" in problems
