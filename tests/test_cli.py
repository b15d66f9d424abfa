from __future__ import annotations

import datetime as dt
import os
import shlex
import socket
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from api.cli import app
from study.clock import FrozenClock
from study.db import engine_for
from study.security import verify_password
from study.settings import get_settings
from tests.builders import enroll_fully, make_invites
from tests.conftest import POSTGRES_URL
from tests.mail import free_port
from tests.postgres import scratch_schema

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture
def cli_database(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()  # making the engine read the settings before the URL was set
    return engine


def test_every_compose_command_exists_in_the_cli() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    commands = [service["command"] for service in compose["services"].values() if "command" in service]
    assert len(commands) >= 2
    for command in commands:
        assert command[0] == "afterward"
        words = [w for w in command[1:] if not w.startswith("-")][:2]
        result = runner.invoke(app, [*words, "--help"])
        assert result.exit_code == 0, (command, result.output)
        options = [w.split("=")[0] for w in command[1:] if w.startswith("--")]
        for option in options:
            assert option in result.output, (command, option)


def test_the_image_holds_every_package() -> None:
    """The Dockerfile copies every package pyproject.toml installs (migrations import evals.models,
    the dashboard service runs dashboard/)."""
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in (p.rstrip("*") for p in packages):
        assert f"COPY {package} ./{package}" in dockerfile, package


def dockerfile_env() -> dict[str, str]:
    """The variables the Dockerfile's ENV instructions set (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for word in shlex.split(line[4:]):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def test_the_image_runs_in_production() -> None:
    """A plain `docker run` of the image (no compose file) is production, so it refuses the
    development secret instead of using it."""
    assert dockerfile_env()["AFTERWARD_ENVIRONMENT"] == "production"


@pytest.mark.parametrize("command", [["api"], ["scheduler"], ["db", "upgrade"]])
def test_a_production_start_without_its_secrets_refuses_in_one_line(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFTERWARD_")}
    env.update({k: v for k, v in dockerfile_env().items() if k.startswith("AFTERWARD_")})
    done = subprocess.run([sys.executable, "-m", "api", *command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("refusing to start: AFTERWARD_SECRET_KEY must be set"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["study", "list"], ["instruments", "list"]])
def test_a_database_never_upgraded_is_named_with_what_to_run(command: list[str], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFTERWARD_")}
    env["AFTERWARD_DATABASE_URL"] = f"sqlite:///{tmp_path / 'new.db'}"
    done = subprocess.run([sys.executable, "-m", "api", *command], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 1
    assert "no such table" in done.stderr
    assert done.stderr.strip().endswith("run `afterward db upgrade` first")
    assert "Traceback" not in done.stderr


def test_study_load_reports_field_and_line(cli_database: Engine, tmp_path: Path, example_protocol: str) -> None:
    broken = tmp_path / "protocol.yaml"
    broken.write_text(example_protocol.replace("  - name: control\n    mode: default",
                                               "  - name: control\n    mode: defualt"))
    line = broken.read_text().splitlines().index("    mode: defualt") + 1
    result = runner.invoke(app, ["study", "load", str(broken)])
    assert result.exit_code == 1
    assert f"arms[1].mode (line {line})" in result.output


def test_study_load_versions_and_audit_verify(cli_database: Engine, tmp_path: Path, example_protocol: str) -> None:
    protocol = tmp_path / "protocol.yaml"
    protocol.write_text(example_protocol)
    assert "created study 'wellbeing-pilot'" in runner.invoke(app, ["study", "load", str(protocol)]).output
    protocol.write_text(example_protocol.replace("weight: 1", "weight: 2", 1))
    assert "protocol version 2 loaded" in runner.invoke(app, ["study", "load", str(protocol)]).output
    invites = runner.invoke(app, ["invites", "create", "wellbeing-pilot", "--count", "3"])
    assert len(invites.output.split()) == 3
    verified = runner.invoke(app, ["audit", "verify"])
    assert verified.exit_code == 0
    assert "audit log intact: 5 entries" in verified.output


def test_followups_due_send_and_schedule(cli_database: Engine, app_client: TestClient, example_protocol: str,
                                         frozen_clock: FrozenClock, tmp_path: Path) -> None:
    protocol = tmp_path / "protocol.yaml"
    protocol.write_text(example_protocol.replace("channels: [email, in_app]", "channels: [in_app]"))
    assert runner.invoke(app, ["study", "load", str(protocol)]).exit_code == 0
    [invite] = make_invites(cli_database, "wellbeing-pilot")
    who = enroll_fully(app_client, invite, email=None, timezone="Europe/Berlin")
    frozen_clock.set(dt.datetime(2026, 3, 9, 0, 0, tzinfo=dt.UTC))
    due = runner.invoke(app, ["followups", "due", "--within-hours", "12"])
    assert due.exit_code == 0, due.output
    assert "1 follow-up(s) due" in due.output
    assert "perma-week-1" in due.output
    followup_id = due.output.splitlines()[1].split()[0]
    sent = runner.invoke(app, ["followups", "send", followup_id])
    assert sent.exit_code == 0, sent.output
    assert "opened 1" in sent.output
    schedule = runner.invoke(app, ["followups", "schedule", who.code])
    assert schedule.exit_code == 0, schedule.output
    lines = schedule.output.splitlines()
    assert any("perma-week-1" in line and " sent " in line for line in lines)
    assert any("perma-week-4" in line and "planned" in line for line in lines)
    assert any("invitation 0 in_app" in line and "sent" in line for line in lines)
    assert runner.invoke(app, ["followups", "schedule", "PNOBODY"]).exit_code == 1
    with cli_database.connect() as connection:
        actions = connection.execute(sa.text("SELECT action FROM audit_log WHERE participant_code = :c"),
                                     {"c": who.code}).scalars().all()
    assert {"followup.sent_now", "followups.schedule_read"} <= set(actions)
    # Changing the protocol from the CLI re-plans what was not sent yet.
    protocol.write_text(protocol.read_text().replace("offset: P28D", "offset: P21D"))
    reloaded = runner.invoke(app, ["study", "load", str(protocol)])
    assert "1 re-planned, 0 cancelled, 0 added" in reloaded.output


def test_staff_create_reads_the_password_from_stdin(cli_database: Engine, slug: str) -> None:
    password = "correct horse battery staple"
    created = runner.invoke(app, ["staff", "create", "r@uni.example", "--name", "R. Searcher", "--study", slug,
                                  "--role", "researcher", "--password-stdin"], input=password + "\n")
    assert created.exit_code == 0, created.output
    assert "created r@uni.example as researcher in wellbeing-pilot" in created.output
    with cli_database.connect() as connection:
        stored = connection.execute(sa.text("SELECT password_hash FROM staff_accounts WHERE email = 'r@uni.example'"
                                            )).scalar_one()
    assert verify_password(stored, password)
    # Without a terminal to prompt on, the command says what to do instead of hanging or aborting.
    no_terminal = runner.invoke(app, ["staff", "create", "s@uni.example", "--name", "S", "--study", slug])
    assert no_terminal.exit_code == 1
    assert "--password-stdin" in no_terminal.output
    both = runner.invoke(app, ["staff", "create", "s@uni.example", "--name", "S", "--study", slug,
                               "--password", "x" * 12, "--password-stdin"], input="y" * 12 + "\n")
    assert both.exit_code == 1
    assert "not both" in both.output


def test_db_upgrade_says_what_it_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with ExitStack() as stack:
        url = (stack.enter_context(scratch_schema(POSTGRES_URL, "afterward_upgrade")) if POSTGRES_URL
               else f"sqlite:///{tmp_path / 'empty.db'}")
        monkeypatch.setenv("AFTERWARD_DATABASE_URL", url)
        get_settings.cache_clear()
        first = runner.invoke(app, ["db", "upgrade"])
        assert first.exit_code == 0, first.output
        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        assert f"created the schema in an empty database (revision {head})" in first.output
        assert "up to date" not in first.output
        again = runner.invoke(app, ["db", "upgrade"])
        assert again.exit_code == 0, again.output
        assert f"database is up to date (revision {head})" in again.output
        engine_for(url).dispose()


def alembic_config() -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(ROOT / "migrations"))
    return config


def test_a_second_shell_reads_the_mailbox_port_from_the_settings_file(tmp_path: Path) -> None:
    """`make run` and a command typed later in another shell and folder read one settings file, so
    they agree on the mailbox port; a taken port says to set it there."""
    port = free_port()
    settings_file = tmp_path / "settings.env"
    settings_file.write_text(f"AFTERWARD_SMTP_PORT={port}\n", encoding="utf-8")
    env = {name: value for name, value in os.environ.items() if not name.startswith("AFTERWARD_")}
    env["AFTERWARD_SETTINGS_FILE"] = str(settings_file)
    elsewhere = tmp_path / "another-folder"
    elsewhere.mkdir()
    command = [str(Path(sys.executable).parent / "afterward"), "mailbox", "--check"]
    checked = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120,
                             check=False)
    assert checked.returncode == 0, checked.stderr
    assert f"127.0.0.1:{port} is free" in checked.stdout
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        refused = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120,
                                 check=False)
    assert refused.returncode == 1
    assert f"put AFTERWARD_SMTP_PORT=<a free port> in the settings file ({settings_file})" in refused.stderr
