"""`make run`'s processes, started as its recipe starts them, on ports other than the defaults: every link
(printed invites, follow-up emails) points at the API's port, and the mailbox listens on AFTERWARD_SMTP_PORT."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from api.cli import app
from scheduler.models import FollowUp
from study.db import session_scope
from study.models import Participant
from study.settings import SETTINGS_FILE, Settings, get_settings
from tests.builders import CONFIRMATIONS
from tests.mail import free_port
from tests.waiting import WAIT_SECONDS, answers, until

AFTERWARD = Path(sys.executable).parent / "afterward"
runner = CliRunner()


@pytest.fixture
def platform_env(engine: Engine) -> dict[str, str]:
    """What `PORT=... make run` gives its processes, with the test database and a free SMTP port."""
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "AFTERWARD_ENVIRONMENT": "test", "AFTERWARD_API_HOST": "127.0.0.1",
           "AFTERWARD_API_PORT": str(free_port()), "AFTERWARD_SMTP_PORT": str(free_port())}
    env.pop("AFTERWARD_BASE_URL", None)
    return env


def afterward(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(AFTERWARD), *args], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        try:
            process.wait(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()


def start(processes: list[subprocess.Popen[bytes]], env: dict[str, str], log: Path, *args: str) -> None:
    processes.append(subprocess.Popen([str(AFTERWARD), *args], env=env, stdout=log.open("w"),
                                      stderr=subprocess.STDOUT))


def test_links_and_mail_follow_the_ports_make_run_is_given(engine: Engine, platform_env: dict[str, str],
                                                           processes: list[subprocess.Popen[bytes]],
                                                           tmp_path: Path) -> None:
    port, smtp_port = platform_env["AFTERWARD_API_PORT"], platform_env["AFTERWARD_SMTP_PORT"]
    base = f"http://127.0.0.1:{port}"
    demo = afterward(platform_env, "demo")
    assert demo.returncode == 0, demo.stderr
    invites = re.findall(rf"^  {re.escape(base)}/\?code=(\S+)$", demo.stdout, re.MULTILINE)
    assert len(invites) == 5, demo.stdout
    assert "127.0.0.1:8000" not in demo.stdout

    mail = tmp_path / "mail"
    start(processes, platform_env, tmp_path / "mailbox.log", "mailbox", "--folder", str(mail))
    start(processes, platform_env, tmp_path / "scheduler.log", "scheduler", "--poll-seconds", "0.5")
    start(processes, platform_env, tmp_path / "api.log", "api", "--host", "127.0.0.1", "--port", port,
          "--no-access-log")
    until(lambda: answers(f"{base}/healthz"), "the API", processes=processes)
    until(lambda: "development mailbox on" in (tmp_path / "mailbox.log").read_text(), "the mailbox",
          processes=processes)
    assert f"links for participants point at {base}" in (tmp_path / "api.log").read_text()

    # The mailbox listens on AFTERWARD_SMTP_PORT: make run's check before starting another finds it taken.
    taken = afterward(platform_env, "mailbox", "--check")
    assert taken.returncode == 1
    assert f"127.0.0.1:{smtp_port}: the port is taken" in taken.stderr

    # The printed invite works, and a follow-up sent by the scheduler process links to the same port.
    with httpx.Client(base_url=base, timeout=WAIT_SECONDS, trust_env=False) as client:
        enrolled = client.post("/api/v1/enrollment", json={"invite_code": invites[0]})
        assert enrolled.status_code == 201, enrolled.text
        client.headers["Authorization"] = f"Bearer {enrolled.json()['token']}"
        assert client.post("/api/v1/me/consent", json={"version": "1.2", "confirmations": CONFIRMATIONS,
                                                       "typed_signature": "A. Person"}).status_code == 201
        assert client.put("/api/v1/me/profile", json={"timezone": "Europe/Berlin",
                                                      "contact_email": "p@example.org"}).status_code == 200
        with session_scope(engine) as session:
            participant_id = session.scalar(select(Participant.id).where(
                Participant.code == enrolled.json()["participant_code"]))
            first = session.scalars(select(FollowUp.id).where(FollowUp.participant_id == participant_id)
                                    .order_by(FollowUp.due_at).limit(1)).one()
            session.execute(update(FollowUp).where(FollowUp.id == first).values(
                due_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)))
        until(lambda: mail.is_dir() and any(mail.glob("*.eml")), "the follow-up email", processes=processes)
        message = email.message_from_bytes(next(mail.glob("*.eml")).read_bytes(), policy=email.policy.default)
        assert str(message["To"]) == "p@example.org"
        body = message.get_body(("plain",))
        assert body is not None
        links = re.findall(r"https?://\S+", body.get_content())
        assert links
        assert all(link.startswith(f"{base}/") for link in links), links
        survey = next(link for link in links if "/s/" in link)
        assert client.get(survey.removeprefix(base)).status_code == 200


def test_a_taken_mailbox_port_fails_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("AFTERWARD_SMTP_PORT", str(port))
        get_settings.cache_clear()
        for args in (["--folder", str(tmp_path / "mail")], ["--check"]):
            result = runner.invoke(app, ["mailbox", *args])
            assert result.exit_code == 1
            assert result.stderr == (f"the development mailbox cannot listen on 127.0.0.1:{port}: the port is taken "
                                     "(another mailbox or mail server?); stop it, or put AFTERWARD_SMTP_PORT=<a free "
                                     f"port> in the settings file ({SETTINGS_FILE}), which `make run` and every later "
                                     "command read\n")
            assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "mail").exists()


def test_the_base_url_defaults_to_the_served_address() -> None:
    assert Settings(api_host="127.0.0.1", api_port=18801).base_url == "http://127.0.0.1:18801"
    assert Settings(api_host="0.0.0.0", api_port=9000).base_url == f"http://{socket.gethostname()}:9000"
    assert Settings(api_host="::1", api_port=9000).base_url == "http://[::1]:9000"
    assert Settings(base_url="https://study.example.org", api_port=9000).base_url == "https://study.example.org"
