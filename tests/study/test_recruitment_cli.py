"""``afterward invites list/revoke`` and ``afterward study pause/resume/close/archive``, run the way
a researcher runs them."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from api.cli import app
from study.settings import get_settings
from tests.builders import enroll_fully, load_study, make_invites

runner = CliRunner()


@pytest.fixture
def cli_database(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    return engine


def _cli(*args: str, exit_code: int = 0) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == exit_code, result.output
    return result.output


def _audit(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        return [(actor, action) for actor, action in connection.execute(sa.text(
            "SELECT actor, action FROM audit_log WHERE action LIKE 'study.%' OR action LIKE 'invite%' "
            "ORDER BY seq"))]


def test_invites_list_and_revoke(cli_database: Engine, app_client: TestClient, example_protocol: str) -> None:
    slug = load_study(cli_database, example_protocol)
    first, second, third = make_invites(cli_database, slug, count=3)
    who = enroll_fully(app_client, first, email="private@example.org")

    listed = _cli("invites", "list", slug)
    lines = listed.splitlines()
    assert lines[0].startswith(f"3 invite(s) in '{slug}'")
    assert " used " in lines[1]
    assert "used 1/1" in lines[1]
    assert "created 20" in lines[1]
    assert lines[2].strip().startswith(f"by {who.code} at 20")
    assert sum(" unused " in line for line in lines) == 2
    assert "private@example.org" not in listed
    unused = _cli("invites", "list", slug, "--status", "unused")
    assert unused.splitlines()[0].startswith(f"2 invite(s) unused in '{slug}'")
    assert who.code not in unused
    assert "Invalid value" in _cli("invites", "list", slug, "--status", "bogus", exit_code=2)

    revoked = _cli("invites", "revoke", slug, second)
    assert " revoked " in revoked
    assert "revoked 20" in revoked
    third_id = unused.splitlines()[2].split()[0]
    assert " revoked " in _cli("invites", "revoke", slug, "--id", third_id)
    assert "already revoked" in _cli("invites", "revoke", slug, second, exit_code=1)
    assert "by its code or by its id" in _cli("invites", "revoke", slug, exit_code=1)
    assert "has no invite with this code" in _cli("invites", "revoke", slug, "ZZZZ-ZZZZ-ZZZZ", exit_code=1)
    assert "no study 'nope'" in _cli("invites", "list", "nope", exit_code=1)
    assert _cli("invites", "list", slug, "--status", "revoked").splitlines()[0].startswith("2 invite(s) revoked")
    refused = app_client.post("/api/v1/enrollment", json={"invite_code": second})
    assert refused.json()["error"]["code"] == "invite_revoked"
    assert _audit(cli_database) == [("tests", "study.created"), ("tests", "invites.created"),
                                    ("cli", "invites.listed"), ("cli", "invites.listed"), ("cli", "invite.revoked"),
                                    ("cli", "invite.revoked"), ("cli", "invites.listed")]


def test_pause_resume_close_archive(cli_database: Engine, app_client: TestClient, example_protocol: str) -> None:
    slug = load_study(cli_database, example_protocol)
    first, second = make_invites(cli_database, slug, count=2)
    enroll_fully(app_client, first)

    assert _cli("study", "pause", slug).strip() == f"study '{slug}' is now paused"
    assert app_client.post("/api/v1/enrollment", json={"invite_code": second}).status_code == 403
    assert f"study '{slug}' is already paused" in _cli("study", "pause", slug, exit_code=1)
    assert _cli("study", "resume", slug).strip() == f"study '{slug}' is now open"
    assert f"{slug}\tv1\topen\t" in _cli("study", "list")

    assert _cli("study", "close", slug).strip() == f"study '{slug}' is now closed"
    with cli_database.connect() as connection:
        assert set(connection.execute(sa.text("SELECT status FROM followups")).scalars()) == {"planned"}
    assert "a closed study cannot take new participants again" in _cli("study", "resume", slug, exit_code=1)
    assert "--stop-followups" in _cli("study", "archive", slug, exit_code=1)
    assert _cli("study", "close", slug, "--stop-followups").strip() == (
        f"study '{slug}' is now closed; 2 follow-up(s) still to come cancelled")
    with cli_database.connect() as connection:
        assert set(connection.execute(sa.text("SELECT status FROM followups")).scalars()) == {"cancelled"}
    assert "already closed" in _cli("study", "close", slug, "--stop-followups", exit_code=1)

    assert _cli("study", "archive", slug).strip() == f"study '{slug}' is now archived"
    assert slug not in _cli("study", "list")
    assert f"{slug}\tv1\tarchived\t" in _cli("study", "list", "--all")
    assert "archived and read-only" in _cli("study", "pause", slug, exit_code=1)
    assert "archived and read-only" in _cli("invites", "revoke", slug, second, exit_code=1)
    assert "no study 'nope'" in _cli("study", "close", "nope", exit_code=1)
    assert [action for _, action in _audit(cli_database) if action.startswith("study.")] == [
        "study.created", "study.paused", "study.resumed", "study.closed", "study.followups_stopped",
        "study.archived"]
    assert {actor for actor, action in _audit(cli_database) if action != "study.created"
            and action.startswith("study.")} == {"cli"}
