"""Nothing waits forever: a request that meets a lock held elsewhere answers a clear, retryable
503 once the lock timeout passes, and on SQLite reads go on while a writer holds the lock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import Engine

from study.db import make_engine
from tests.builders import enroll_fully, load_study, make_invites

LOCK_TIMEOUT_MS = 400


@pytest.fixture
def impatient_engine(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """The test database, through an engine whose lock waits are short."""
    monkeypatch.setenv("AFTERWARD_DB_LOCK_TIMEOUT_MS", str(LOCK_TIMEOUT_MS))
    impatient = make_engine(engine.url.render_as_string(hide_password=False))
    yield impatient
    impatient.dispose()


def test_a_held_lock_answers_503_with_retry_after_and_reads_go_on(impatient_engine: Engine, engine: Engine,
                                                                 example_protocol: str) -> None:
    from api.app import create_app

    slug = load_study(engine, example_protocol)
    with TestClient(create_app(impatient_engine), raise_server_exceptions=False) as client:
        who = enroll_fully(client, make_invites(engine, slug)[0])
        survey = client.get("/api/v1/me/surveys", headers=who.headers).json()[0]["assignment_id"]
        with engine.connect() as holder:
            # Another transaction holds the lock a save needs: the survey's row, or SQLite's write lock.
            if engine.dialect.name == "postgresql":
                holder.execute(text("SELECT id FROM survey_assignments WHERE id = :id FOR UPDATE"), {"id": survey})
            else:
                holder.execute(text("UPDATE studies SET title = title"))
            # Answered while the lock is still held: the wait ended at the lock timeout, not when the lock did.
            response = client.put(f"/api/v1/me/surveys/{survey}/answers", headers=who.headers,
                                  json={"answers": {"A1": 4}})
            assert response.status_code == 503, response.text
            assert response.headers["Retry-After"] == "1"
            assert "try again" in response.json()["error"]["message"]
            # Reading never waits for a writer: a read that needed the lock would meet the same 503.
            assert client.get(f"/api/v1/me/surveys/{survey}", headers=who.headers).status_code == 200
            holder.rollback()
        saved = client.put(f"/api/v1/me/surveys/{survey}/answers", headers=who.headers, json={"answers": {"A1": 4}})
        assert saved.status_code == 200  # the retry goes through once the lock is gone


def test_writers_of_one_process_queue_and_a_long_wait_answers_503(impatient_engine: Engine, engine: Engine,
                                                                  example_protocol: str) -> None:
    """On SQLite a process's writers queue on a lock of their own (no starving in SQLite's busy
    handler); past the lock timeout the answer is the same retryable 503."""
    from api.app import create_app

    if engine.dialect.name != "sqlite":
        pytest.skip("the writer queue is SQLite's")
    slug = load_study(engine, example_protocol)
    with TestClient(create_app(impatient_engine), raise_server_exceptions=False) as client:
        who = enroll_fully(client, make_invites(engine, slug)[0])
        survey = client.get("/api/v1/me/surveys", headers=who.headers).json()[0]["assignment_id"]
        with impatient_engine.connect() as holder:
            holder.execute(text("UPDATE studies SET title = title"))  # this process's write lock
            response = client.put(f"/api/v1/me/surveys/{survey}/answers", headers=who.headers,
                                  json={"answers": {"A1": 4}})
            assert (response.status_code, response.headers["Retry-After"]) == (503, "1")
            holder.rollback()
        assert client.put(f"/api/v1/me/surveys/{survey}/answers", headers=who.headers,
                          json={"answers": {"A1": 4}}).status_code == 200
