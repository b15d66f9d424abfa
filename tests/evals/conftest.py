"""The evaluation tests' shared fixture: ``afterward`` run against the test's database."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy.engine import Engine
from typer.testing import CliRunner, Result

from api.cli import app
from study.settings import get_settings

Cli = Callable[..., Result]


@pytest.fixture
def cli(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """``afterward`` against the test's database."""
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    yield lambda *args: CliRunner().invoke(app, [str(a) for a in args])
    get_settings.cache_clear()
