"""The rehearsal turn at start-up (``api.rehearsal``): it completes on the offline model whatever
model the deployment uses, and leaves the study's database and the temporary folder as they were."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

import api.app
from api import rehearsal
from api.app import create_app
from chat import gateway
from chat.gateway import Gateway
from study.settings import get_settings


def row_counts(engine: Engine) -> dict[str, int]:
    tables = sa.inspect(engine).get_table_names()
    with engine.connect() as connection:
        return {t: connection.execute(sa.text(f'SELECT COUNT(*) FROM "{t}"')).scalar_one() for t in tables}


@pytest.fixture
def unreachable_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The deployment's model is one nothing answers for (a call to it fails), and temporary
    folders go to a folder of the test's own, to be looked at afterwards."""
    monkeypatch.setenv("AFTERWARD_LLM_MODEL", "openai/gpt-4o-mini")
    monkeypatch.setenv("AFTERWARD_LLM_API_BASE", "http://127.0.0.1:9/v1")  # the discard port: nothing listens
    monkeypatch.setenv("AFTERWARD_LLM_RETRIES", "0")
    get_settings.cache_clear()  # read again, after the fixtures before this one
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def test_the_rehearsal_turn_is_answered_by_the_offline_model_on_a_scratch_database(
    unreachable_model: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A slow offline model (the shutdown tests' ten-minute replies): the rehearsal neither waits
    # for it (its model is the provider's start-up one) nor changes it for the process.
    monkeypatch.setenv("AFTERWARD_OFFLINE_LLM_DELAY_MS", "600000")
    get_settings.cache_clear()
    Gateway(get_settings())
    asyncio.run(asyncio.wait_for(rehearsal.rehearse(create_app), timeout=300))  # raises unless the reply was stored
    assert gateway._offline.delay_seconds == 600
    assert list(unreachable_model.iterdir()) == []


def test_start_up_rehearses_once_and_writes_nothing_to_the_study(engine: Engine, slug: str, unreachable_model: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.app, "_rehearsed", False)
    before = row_counts(engine)
    completed: list[int] = []
    real = rehearsal.rehearse

    async def counted(factory: object) -> None:
        await real(factory)  # type: ignore[arg-type]
        completed.append(1)  # not reached when the rehearsal raised (start-up logs it and serves)
    monkeypatch.setattr(rehearsal, "rehearse", counted)
    for _ in range(2):
        with TestClient(create_app(engine), raise_server_exceptions=False):
            pass
    assert completed == [1]  # once per process
    assert row_counts(engine) == before
    assert list(unreachable_model.iterdir()) == []
