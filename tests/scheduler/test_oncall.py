"""On-call notices of safety events: the protocol's safety contacts hear of every escalation
within one dispatcher poll, once however many dispatchers run, without what the participant
wrote; unreviewed events are notified again once per period; failures are retried and alerted."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import re
import threading
from collections.abc import Iterator
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher, TickReport
from scheduler.oncall import event_link
from study.clock import FrozenClock
from study.models import StaffRole
from study.protocol import ProtocolError, parse_protocol
from study.settings import Settings
from tests.builders import (
    ParticipantHandle,
    enroll_fully,
    load_study,
    make_invites,
    make_staff,
    put_in_arm,
    say,
    start_chat,
)
from tests.mail import Inbox, free_port, smtp_server

ONCALL = "oncall@example.org"  # the example protocol's safety contact
BASE_URL = "https://study.example.org"
DASHBOARD_URL = "https://staff.study.example.org/dashboard/"  # a trailing slash is not doubled
CRISIS = "I want to kill myself"
EARLIER = "My manager keeps undermining me"


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as served:
        yield served


def escalate(engine: Engine, client: TestClient, slug: str) -> ParticipantHandle:
    [invite] = make_invites(engine, slug)
    who = enroll_fully(client, invite, email="participant@example.org")
    put_in_arm(engine, who.code, "wellbeing")
    conversation = start_chat(client, who, "coach")
    say(client, who, conversation, EARLIER)
    assert say(client, who, conversation, CRISIS)["stance"] == "escalate"
    return who


def dispatcher(engine: Engine, port: int, name: str = "test", **settings: Any) -> Dispatcher:
    return Dispatcher(engine, Settings(smtp_port=port, base_url=BASE_URL, dashboard_url=DASHBOARD_URL, **settings),
                      name=name)


def at_once(*dispatchers: Dispatcher) -> dict[str, TickReport]:
    """One poll of each dispatcher, at the same moment (on PostgreSQL truly at once; SQLite
    serializes writers); their reports by name, none with an error."""
    start = threading.Barrier(len(dispatchers))
    reports: dict[str, TickReport] = {}

    def poll(dispatch: Dispatcher) -> None:
        start.wait()
        reports[dispatch.name] = dispatch.tick()

    threads = [threading.Thread(target=poll, args=(d,)) for d in dispatchers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not [r.errors for r in reports.values() if r.errors]
    assert len(reports) == len(dispatchers)
    return reports


def dashboard_link(slug: str, event: int) -> str:
    """The dashboard's safety review of the event: the study's slug and the event's id, nothing else."""
    return f"https://staff.study.example.org/dashboard/safety?study={slug}&event={event}"


def event_id(engine: Engine) -> int:
    with engine.connect() as connection:
        [found] = connection.execute(sa.text("SELECT id FROM safety_events")).scalars().all()
    return int(found)


def notices(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text(
            "SELECT round, channel, recipient, status, attempts, claimed_by, last_error FROM safety_notifications "
            "ORDER BY id")).mappings())


def body_of(message: EmailMessage) -> str:
    part = message.get_body(("plain",))
    assert part is not None
    return str(part.get_content())


def assert_no_content(message: EmailMessage, who: ParticipantHandle) -> None:
    raw = message.as_string()
    for trace in (who.code, CRISIS, "kill myself", EARLIER, "participant@example.org"):
        assert trace not in raw


def test_an_escalation_reaches_the_on_call_contact_within_one_poll_once_across_two_dispatchers(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    slug = load_study(engine, example_protocol)
    who = escalate(engine, app_client, slug)
    left, right = dispatcher(engine, port, "left"), dispatcher(engine, port, "right")

    reports = at_once(left, right)
    [message] = messages.to(ONCALL)  # there when the poll returns: sent within it
    assert sum(r.notified for r in reports.values()) == 1

    for _ in range(3):  # later polls of both send nothing more
        assert left.tick().notified == right.tick().notified == 0
    # The test server keeps a message before it answers 250, so all a poll sent is here when it returns.
    assert len(messages.to(ONCALL)) == 1
    assert messages.to("participant@example.org") == []
    [row] = notices(engine)
    assert (row["round"], row["channel"], row["status"], row["attempts"]) == (0, "email", "sent", 1)
    assert row["claimed_by"] in {"left", "right"}

    # What it says: the category, the time and the link to the event in the dashboard (tests/e2e/test_oncall_link.py
    # follows it); nothing the participant wrote.
    event = event_id(engine)
    assert str(message["Subject"]) == ("Safety escalation (risk to self) in Well-being mode pilot: "
                                       "does honest pushback leave people better off?")
    text = body_of(message)
    assert "Category: risk to self" in text
    assert "Raised: 2026-03-02 09:00 UTC" in text
    [link] = re.findall(r"https?://\S+", text)
    assert link == dashboard_link(slug, event)
    assert_no_content(message, who)


def test_an_unreviewed_event_is_notified_again_once_per_period_until_reviewed(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    slug = load_study(engine, example_protocol)  # renotify_after: PT4H
    who = escalate(engine, app_client, slug)
    dispatch = dispatcher(engine, port)
    assert dispatch.tick().notified == 1

    frozen_clock.advance(dt.timedelta(hours=3, minutes=59))
    assert dispatch.tick().notified == 0
    frozen_clock.advance(dt.timedelta(minutes=2))  # 4 h 1 min after the escalation, still unreviewed
    assert dispatch.tick().notified == 1
    assert dispatch.tick().notified == 0  # once per period
    frozen_clock.advance(dt.timedelta(hours=3))
    assert dispatch.tick().notified == 0
    frozen_clock.advance(dt.timedelta(hours=1))  # 8 h 1 min: the second period
    assert dispatch.tick().notified == 1
    first, again, third = messages.to(ONCALL)
    assert not str(first["Subject"]).startswith("Not yet reviewed")
    assert str(again["Subject"]).startswith("Not yet reviewed: Safety escalation (risk to self)")
    assert "has not been reviewed yet" in body_of(again)
    assert len({str(m["Message-ID"]) for m in (first, again, third)}) == 3
    for message in (first, again, third):
        assert_no_content(message, who)

    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.RESEARCHER, 'r@example.org')}"}
    reviewed = app_client.post(f"/api/v1/staff/studies/{slug}/safety-events/{event_id(engine)}/review",
                               headers=staff, json={"note": "Called; safe."})
    assert reviewed.status_code == 200, reviewed.text
    frozen_clock.advance(dt.timedelta(hours=8))
    assert dispatch.tick().notified == 0
    assert [row["round"] for row in notices(engine)] == [0, 1, 2]


def test_a_mail_server_that_is_down_gets_the_notice_retried_and_staff_alerted_at_once(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, example_protocol)
    escalate(engine, app_client, slug)
    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    port = free_port()  # nothing listens here yet
    dispatch = dispatcher(engine, port, smtp_timeout_seconds=2)

    report = dispatch.tick()
    assert (report.notified, report.retrying) == (0, 1)
    [alert] = app_client.get("/api/v1/staff/alerts", headers=staff).json()
    assert (alert["channel"], alert["problem"], alert["failures"]) == ("on-call email", "unreachable", 1)
    frozen_clock.advance(dt.timedelta(seconds=29))
    assert dispatch.tick().retrying == 0  # waits its backoff (30 s, then doubling)
    frozen_clock.advance(dt.timedelta(seconds=2))
    assert dispatch.tick().retrying == 1
    [alert] = app_client.get("/api/v1/staff/alerts", headers=staff).json()
    assert alert["failures"] == 2

    with smtp_server(port) as (inbox, _):
        frozen_clock.advance(dt.timedelta(seconds=61))
        assert dispatch.tick().notified == 1
        assert len(inbox.to(ONCALL)) == 1
    assert app_client.get("/api/v1/staff/alerts", headers=staff).json() == []
    [row] = notices(engine)
    assert (row["status"], row["attempts"], row["last_error"]) == ("sent", 3, None)


def test_a_notice_that_keeps_failing_is_given_up_with_an_alert_that_stays(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, example_protocol)
    escalate(engine, app_client, slug)
    staff = {"Authorization": f"Bearer {make_staff(engine, slug, StaffRole.VIEWER, 'v@example.org')}"}
    dispatch = dispatcher(engine, free_port(), smtp_timeout_seconds=2, delivery_max_attempts=2)
    assert dispatch.tick().retrying == 1
    frozen_clock.advance(dt.timedelta(seconds=31))
    assert dispatch.tick().failed == 1
    frozen_clock.advance(dt.timedelta(hours=1))
    assert dispatch.tick().failed == 0  # given up: not tried again
    [row] = notices(engine)
    assert (row["status"], row["attempts"]) == ("failed", 2)
    assert row["last_error"].startswith("unreachable: cannot reach the mail server")
    [alert] = app_client.get("/api/v1/staff/alerts", headers=staff).json()
    assert alert["channel"] == "on-call email"
    assert alert["message"].startswith(f"on-call notice 1 of safety event {event_id(engine)} given up after 2")


def test_withdrawal_with_deletion_before_the_poll_does_not_stop_the_notice(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    slug = load_study(engine, example_protocol)
    who = escalate(engine, app_client, slug)
    withdrawn = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                                json={"level": "delete_data", "confirm": True})
    assert withdrawn.status_code == 200, withdrawn.text
    assert dispatcher(engine, port).tick().notified == 1
    [message] = messages.to(ONCALL)
    assert dashboard_link(slug, event_id(engine)) in body_of(message)
    assert_no_content(message, who)


class _Hook(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


def test_a_webhook_contact_gets_one_signed_post_without_content(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.received = []
    hook = f"http://127.0.0.1:{server.server_port}/page"
    try:
        slug = load_study(engine, example_protocol.replace(
            f"      email: {ONCALL}\n", f"      email: {ONCALL}\n    - name: Pager\n      webhook: {hook}\n"))
        who = escalate(engine, app_client, slug)
        dispatch = dispatcher(engine, port, webhook_secret="hook-secret")
        assert dispatch.tick().notified == 2
        assert dispatch.tick().notified == 0
    finally:
        server.shutdown()
    assert len(messages.to(ONCALL)) == 1
    [(headers, body)] = _Hook.received
    assert headers["X-Afterward-Signature"] == "sha256=" + hmac.new(b"hook-secret", body,
                                                                   hashlib.sha256).hexdigest()
    assert headers["Idempotency-Key"].startswith(f"safety-{event_id(engine)}-0-webhook-")
    payload = json.loads(body)
    assert payload == {"kind": "safety_escalation", "level": "escalation", "study": slug,
                       "study_title": payload["study_title"],
                       "event_id": event_id(engine), "category": "risk_to_self",
                       "raised_at": "2026-03-02T09:00:00+00:00", "round": 0,
                       "link": dashboard_link(slug, event_id(engine)), "source": "chat"}
    assert who.code not in body.decode()
    assert "kill myself" not in body.decode()


def test_the_link_points_at_the_dashboard_make_run_starts_unless_configured() -> None:
    assert event_link(Settings(), "pilot", 7) == "http://127.0.0.1:8501/safety?study=pilot&event=7"
    assert event_link(Settings(api_host="::1"), "pilot", 7) == "http://[::1]:8501/safety?study=pilot&event=7"
    assert event_link(Settings(dashboard_url="https://dash.example.org"), "pilot", 7) == (
        "https://dash.example.org/safety?study=pilot&event=7")


def test_a_dispatcher_given_its_own_channels_tells_nobody(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    """Simulations and analysis tests run dispatchers with in-app delivery only: nothing leaves."""
    slug = load_study(engine, example_protocol)
    escalate(engine, app_client, slug)
    report = Dispatcher(engine, Settings(), name="simulated", channels={}).tick()
    assert (report.notified, report.errors) == (0, [])
    assert notices(engine) == []


@pytest.mark.parametrize(("section", "problem"), [
    ("    - email: not-an-address\n", r"safety.contacts\[0\].email \(line 3\): this email address does not look"),
    ("    - webhook: http://alerts.example.org/x\n", r"safety.contacts\[0\].webhook \(line 3\): .*must use https"),
    ("    - webhook: alerts.example.org\n", r"safety.contacts\[0\].webhook \(line 3\): give the webhook as a full"),
    ("    - name: Nobody\n", r"safety.contacts\[0\] \(line 3\): a safety contact needs an email, a webhook"),
    ("    - email: a@example.org\n    - email: a@example.org\n", r"safety \(line 1\): .*listed more than once"),
    ("    - email: a@example.org\n  renotify_after: PT5M\n", r"safety.renotify_after \(line 4\): .*between PT15M"),
])
def test_safety_contacts_are_validated_with_the_field_and_line(example_protocol: str, section: str,
                                                                 problem: str) -> None:
    start = example_protocol.index("safety:\n")
    end = example_protocol.index("crisis_resources:")
    broken = example_protocol[:start] + "safety:\n  contacts:\n" + section + "\n" + example_protocol[end:]
    first_line = broken[:start].count("\n")  # lines before the safety section
    with pytest.raises(ProtocolError) as error:
        parse_protocol(broken)
    [message] = error.value.problems
    found = re.match(r"^(.*) \(line (\d+)\): (.*)$", message)
    assert found is not None, message
    relative = f"{found.group(1)} (line {int(found.group(2)) - first_line}): {found.group(3)}"
    assert re.match(problem, relative), relative
