"""Fault tests: real dispatcher processes killed, stopped with SIGTERM mid-batch and run side by
side, a mail server that is down then up, and a mail server that refuses the login."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from scheduler.models import ChannelAlert
from study import audit
from study.clock import FrozenClock
from study.db import session_scope
from study.models import StaffRole
from study.settings import Settings, get_settings
from tests.builders import enroll_fully, load_study, make_invites, make_staff
from tests.conftest import POSTGRES_URL
from tests.mail import free_port, smtp_server
from tests.waiting import WAIT_SECONDS, until

ROOT = Path(__file__).resolve().parents[2]


def due_now(engine: Engine, app_client: TestClient, example_protocol: str, count: int) -> list[str]:
    """``count`` participants with an email each, whose week-1 invitation is due now (real clock)."""
    slug = load_study(engine, example_protocol)
    invites = make_invites(engine, slug, count=count)
    codes = [enroll_fully(app_client, invite, email=f"p{i}@example.org").code for i, invite in enumerate(invites)]
    with engine.begin() as connection:
        connection.execute(sa.text(
            "UPDATE followups SET due_at = :due, closes_at = :closes, reminder_offsets = '[]' "
            "WHERE followup_key = 'perma-week-1'"),
            {"due": dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1),
             "closes": dt.datetime.now(dt.UTC) + dt.timedelta(days=2)})
        connection.execute(sa.text("DELETE FROM followups WHERE followup_key <> 'perma-week-1'"))
    return codes


def start_dispatcher(engine: Engine, smtp_port: int, name: str, logs: Path) -> subprocess.Popen[bytes]:
    """``afterward scheduler`` as its own process; its log goes to ``logs/<name>.log``."""
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "AFTERWARD_SMTP_PORT": str(smtp_port), "AFTERWARD_DELIVERY_LEASE_SECONDS": "5",
           "AFTERWARD_SCHEDULER_BATCH_SIZE": "10"}
    return subprocess.Popen([sys.executable, "-c", "from api.cli import main; main()", "scheduler",
                             "--poll-seconds", "0.2", "--name", name], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=(logs / f"{name}.log").open("wb"))


def email_statuses(engine: Engine) -> Counter[str]:
    with engine.connect() as connection:
        return Counter(connection.execute(sa.text("SELECT status FROM deliveries WHERE channel = 'email'")).scalars())


def stop_after_everything_is_sent(engine: Engine, count: int, dispatchers: list[subprocess.Popen[bytes]]) -> None:
    """Once every delivery is recorded as sent, stop the dispatchers and wait for them to exit: a
    dispatcher that exits cleanly has finished its last send, so nothing can arrive after this."""
    until(lambda: email_statuses(engine) == {"sent": count}, "every delivery recorded as sent", processes=dispatchers)
    for dispatcher in dispatchers:
        dispatcher.terminate()
    assert [dispatcher.wait(WAIT_SECONDS) for dispatcher in dispatchers] == [0] * len(dispatchers)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
            process.wait(WAIT_SECONDS)


def test_a_dispatcher_killed_mid_batch_and_restarted_delivers_every_invitation(
    engine: Engine, app_client: TestClient, example_protocol: str, processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    count = 30
    due_now(engine, app_client, example_protocol, count)
    with smtp_server(delay_seconds=0.05) as (inbox, port):
        first = start_dispatcher(engine, port, "first", tmp_path)
        processes.append(first)
        until(lambda: len(inbox.messages) >= 8, "the first dispatcher's first messages")
        first.send_signal(signal.SIGKILL)
        first.wait(WAIT_SECONDS)
        received_before_kill = len(inbox.messages)
        assert received_before_kill < count, "the kill came too late to test anything"
        second = start_dispatcher(engine, port, "second", tmp_path)
        processes.append(second)
        stop_after_everything_is_sent(engine, count, [second])
        ids = inbox.message_ids()
    duplicates = sum(n - 1 for n in Counter(ids).values())
    # Each email carries a Message-ID derived from its idempotency key: at most the one message in
    # flight at the moment of the kill can be sent again (a server that accepted it before the
    # dispatcher could record that); a receiver that dedupes by Message-ID sees every one once.
    assert len(set(ids)) == count
    assert duplicates <= 1, Counter(ids).most_common(3)
    with engine.connect() as connection:
        assignments = connection.execute(sa.text("SELECT count(*) FROM survey_assignments "
                                                 "WHERE purpose = 'followup'")).scalar_one()
    assert email_statuses(engine) == {"sent": count}
    assert assignments == count  # each follow-up opened exactly once


def test_sigterm_stops_a_dispatcher_mid_batch_and_hands_the_rest_back(
    engine: Engine, app_client: TestClient, example_protocol: str, processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    count = 40
    due_now(engine, app_client, example_protocol, count)
    # The installed command, as an operator (or systemd, or Kubernetes) runs it; one batch holds
    # every delivery, and the mail server takes 0.3 s a message: the batch would need 12 s. Measured
    # against the batch, not the clock: it exits cleanly with part of the batch sent, the rest handed back.
    command = Path(sys.executable).parent / "afterward"
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "AFTERWARD_SCHEDULER_BATCH_SIZE": "200"}
    with smtp_server(delay_seconds=0.3) as (inbox, port):
        env["AFTERWARD_SMTP_PORT"] = str(port)
        dispatcher = subprocess.Popen([str(command), "scheduler", "--poll-seconds", "0.2", "--name", "stopping"],
                                      cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                      stderr=(tmp_path / "stopping.log").open("wb"))
        processes.append(dispatcher)
        until(lambda: len(inbox.messages) >= 3, "the batch's first messages", processes=[dispatcher])
        dispatcher.send_signal(signal.SIGTERM)
        try:
            code = dispatcher.wait(WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            log = (tmp_path / "stopping.log").read_text()
            pytest.fail(f"the dispatcher was still running {WAIT_SECONDS:.0f} s after SIGTERM:\n{log}")
        received = len(inbox.messages)
    assert code == 0, (tmp_path / "stopping.log").read_text()
    assert 3 <= received < count, "it did not stop mid-batch"
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT status, attempts, lease_until FROM deliveries "
                                          "WHERE channel = 'email'")).all()
    # What went out is recorded as sent; the rest of the claimed batch is pending again, its
    # attempt not counted, ready for the next dispatcher without waiting for a lease to run out.
    assert Counter(status for status, _, _ in rows) == {"sent": received, "pending": count - received}
    assert {(attempts, lease) for status, attempts, lease in rows if status == "pending"} == {(0, None)}


@pytest.mark.skipif(not POSTGRES_URL, reason="several dispatchers at once need PostgreSQL (SQLite serializes them)")
def test_two_dispatchers_on_postgresql_deliver_no_duplicates(
    engine: Engine, app_client: TestClient, example_protocol: str, processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    count = 60
    due_now(engine, app_client, example_protocol, count)
    with smtp_server(delay_seconds=0.02) as (inbox, port):
        both = [start_dispatcher(engine, port, "left", tmp_path), start_dispatcher(engine, port, "right", tmp_path)]
        processes += both
        stop_after_everything_is_sent(engine, count, both)
        ids = inbox.message_ids()
    assert len(ids) == len(set(ids)) == count
    with engine.connect() as connection:
        by_dispatcher: dict[str, int] = dict(connection.execute(sa.text(
            "SELECT claimed_by, count(*) FROM deliveries WHERE channel = 'email' GROUP BY claimed_by")).all())
        assignments = connection.execute(sa.text("SELECT count(*) FROM survey_assignments "
                                                 "WHERE purpose = 'followup'")).scalar_one()
    assert sum(by_dispatcher.values()) == count
    assert set(by_dispatcher) <= {"left", "right"}
    assert assignments == count


def test_a_mail_server_that_is_down_then_up_gets_every_email_and_staff_are_alerted(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, example_protocol)
    invites = make_invites(engine, slug, count=3)
    for i, invite in enumerate(invites):
        enroll_fully(app_client, invite, email=f"r{i}@example.org", timezone="Europe/Berlin")
    port = free_port()  # nothing listens here yet
    dispatch = Dispatcher(engine, Settings(smtp_port=port, smtp_timeout_seconds=2), name="test")
    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    frozen_clock.set(dt.datetime(2026, 3, 9, 9, 0, tzinfo=dt.UTC))
    report = dispatch.tick()
    assert (report.opened, report.sent, report.retrying) == (3, 0, 3)
    [alert] = app_client.get("/api/v1/staff/alerts", headers=staff).json()
    assert (alert["channel"], alert["problem"], alert["failures"]) == ("email", "unreachable", 3)
    with smtp_server(port) as (inbox, _):
        frozen_clock.advance(dt.timedelta(seconds=29))
        assert dispatch.tick().sent == 0  # the retry waits its backoff
        frozen_clock.advance(dt.timedelta(seconds=2))
        assert dispatch.tick().sent == 3
        assert sorted(str(m["To"]) for m in inbox.messages) == ["r0@example.org", "r1@example.org", "r2@example.org"]
    assert app_client.get("/api/v1/staff/alerts", headers=staff).json() == []
    with engine.connect() as connection:
        attempts = connection.execute(sa.text("SELECT attempts, last_error FROM deliveries WHERE kind = 'invitation' "
                                              "AND channel = 'email'")).all()
    assert attempts == [(2, None)] * 3


def test_refused_smtp_login_raises_a_staff_alert_at_once(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    enroll_fully(app_client, invite, email="a@example.org", timezone="Europe/Berlin")
    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    with smtp_server(password="right") as (inbox, port):
        dispatch = Dispatcher(engine, Settings(smtp_port=port, smtp_username="study", smtp_password="wrong"),
                              name="test")
        frozen_clock.set(dt.datetime(2026, 3, 9, 9, 0, tzinfo=dt.UTC))
        report = dispatch.tick()
        assert (report.sent, report.retrying) == (0, 1)
        assert inbox.messages == []
        [alert] = app_client.get("/api/v1/staff/alerts", headers=staff).json()
        assert (alert["problem"], alert["failures"]) == ("auth_refused", 1)
        assert "refused the login" in alert["message"]
        fixed = Dispatcher(engine, Settings(smtp_port=port, smtp_username="study", smtp_password="right"),
                           name="test")
        frozen_clock.advance(dt.timedelta(minutes=1))
        assert fixed.tick().sent == 1
    assert app_client.get("/api/v1/staff/alerts", headers=staff).json() == []


def test_the_dispatcher_anchors_the_audit_chain_and_alerts_when_it_cannot(
        engine: Engine, app_client: TestClient, example_protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with session_scope(engine) as session:
        audit.record(session, audit.Actor.system("tests"), "something.happened")
    dispatcher = Dispatcher(engine, get_settings(), channels={})
    anchored = dispatcher.anchor_audit()
    assert anchored is not None
    assert (anchored.new, anchored.anchor.seq) == (True, 1)
    assert len(get_settings().audit_anchor_path.read_text().splitlines()) == 1
    with session_scope(engine) as session:
        audit.record(session, audit.Actor.system("tests"), "something.else")
    monkeypatch.setenv("AFTERWARD_AUDIT_ANCHOR_WEBHOOK_URL", "http://127.0.0.1:9/nobody-listens")
    get_settings.cache_clear()
    assert Dispatcher(engine, get_settings(), channels={}).anchor_audit() is None
    with session_scope(engine) as session:
        alert = session.scalars(sa.select(ChannelAlert).where(ChannelAlert.channel == "audit")).one()
        assert (alert.problem, alert.raised_at is not None) == ("anchor_failed", True)
        assert "audit anchor" in alert.message
    # Staff close it once dealt with: viewers may not, the note is audited.
    slug = load_study(engine, example_protocol)
    viewer = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    admin = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.ADMIN, 'a@example.org')}"}
    [shown] = app_client.get("/api/v1/staff/alerts", headers=viewer).json()
    resolve = f"/api/v1/staff/alerts/{shown['id']}/resolve"
    assert app_client.post(resolve, headers=viewer, json={"note": "ok"}).status_code == 403
    assert app_client.post(resolve, headers=admin, json={"note": "webhook URL fixed"}).status_code == 200
    assert app_client.get("/api/v1/staff/alerts", headers=viewer).json() == []
    with engine.connect() as connection:
        detail = connection.execute(sa.text("SELECT detail FROM audit_log WHERE action = 'channel_alert.resolved'"))
        assert "webhook URL fixed" in str(detail.scalar_one())
