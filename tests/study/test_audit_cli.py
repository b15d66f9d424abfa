"""``afterward audit anchor`` and ``afterward audit verify``, run the way an operator runs them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from api.cli import app
from study.clock import FrozenClock
from study.settings import get_settings
from tests.study.test_audit import _append, _without_guard

runner = CliRunner()


@pytest.fixture
def anchor_file(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "anchors.jsonl"
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    monkeypatch.setenv("AFTERWARD_AUDIT_ANCHOR_PATH", str(path))
    monkeypatch.delenv("AFTERWARD_AUDIT_ANCHOR_WEBHOOK_URL", raising=False)
    get_settings.cache_clear()
    return path


def test_anchor_then_verify(engine: Engine, anchor_file: Path, frozen_clock: FrozenClock) -> None:
    _append(engine, 3)
    never = runner.invoke(app, ["audit", "verify"])
    assert never.exit_code == 0, never.output
    assert "audit log intact: 3 entries, never anchored" in never.output

    anchored = runner.invoke(app, ["audit", "anchor"])
    assert anchored.exit_code == 0, anchored.output
    assert anchored.output.strip() == f"anchored seq 3 (2026-03-02 09:00:00 UTC) in {anchor_file}"
    again = runner.invoke(app, ["audit", "anchor"])
    assert again.exit_code == 0, again.output
    assert "head unchanged since the last anchor, seq 3 (2026-03-02 09:00:00 UTC); nothing written" in again.output
    assert len(anchor_file.read_text().splitlines()) == 1

    _append(engine, 1)
    verified = runner.invoke(app, ["audit", "verify"])
    assert verified.exit_code == 0, verified.output
    assert verified.output.strip() == ("audit log intact: 4 entries, last anchored at seq 3 (2026-03-02 09:00:00 UTC); "
                                       "entries after 3 are not anchored yet")


def test_verify_reports_truncation_after_an_anchor(engine: Engine, anchor_file: Path) -> None:
    _append(engine, 5)
    assert runner.invoke(app, ["audit", "anchor"]).exit_code == 0
    _without_guard(engine, "DELETE FROM audit_log WHERE seq > 3")
    result = runner.invoke(app, ["audit", "verify"])
    assert result.exit_code == 1
    assert "entries after 3 were deleted: the chain was anchored at seq 5" in result.stderr
    assert "intact" not in result.output


def test_verify_reports_a_forged_anchor(engine: Engine, anchor_file: Path) -> None:
    _append(engine, 2)
    assert runner.invoke(app, ["audit", "anchor"]).exit_code == 0
    anchor_file.write_text(anchor_file.read_text().replace('"seq":2', '"seq":1'))
    result = runner.invoke(app, ["audit", "verify"])
    assert result.exit_code == 1
    assert f"anchor file {anchor_file} line 1: its HMAC is wrong (forged anchor" in result.stderr


def test_anchor_reports_an_unreachable_webhook(engine: Engine, anchor_file: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AFTERWARD_AUDIT_ANCHOR_WEBHOOK_URL", f"http://127.0.0.1:{port}/anchors")
    get_settings.cache_clear()
    _append(engine, 1)
    result = runner.invoke(app, ["audit", "anchor"])
    assert result.exit_code == 1
    assert f"but the POST to http://127.0.0.1:{port}/anchors failed: ConnectError" in result.stderr
    assert len(anchor_file.read_text().splitlines()) == 1
