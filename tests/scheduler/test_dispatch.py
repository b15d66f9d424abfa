"""The planner and dispatcher with the clock moved through weeks, delivering to a real SMTP server."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from study.clock import FrozenClock
from study.settings import Settings
from tests.builders import ParticipantHandle, enroll_fully, load_study, make_invites, put_in_arm, start_chat
from tests.mail import Inbox, link_in, smtp_server

UTC = dt.UTC


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as served:
        yield served


def one_participant(engine: Engine, client: TestClient, protocol: str, email: str | None,
                    timezone: str = "Europe/Berlin") -> ParticipantHandle:
    [invite] = make_invites(engine, load_study(engine, protocol))
    return enroll_fully(client, invite, email=email, timezone=timezone)


def dispatcher(engine: Engine, port: int, **settings: Any) -> Dispatcher:
    return Dispatcher(engine, Settings(smtp_port=port, **settings), name="test")


def walk(clock: FrozenClock, dispatch: Dispatcher, until: dt.datetime, step: dt.timedelta = dt.timedelta(hours=1),
         ) -> None:
    while clock.now() < until:
        clock.advance(step)
        dispatch.tick()


def followups(engine: Engine, code: str) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(sa.text(
            "SELECT f.* FROM followups f JOIN participants p ON p.id = f.participant_id WHERE p.code = :c "
            "ORDER BY f.due_at, f.followup_key"), {"c": code}).mappings())


def as_utc(value: Any) -> dt.datetime:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def answer_by_link(client: TestClient, link: str) -> None:
    token = link.rsplit("/s/", 1)[1]
    survey = client.get(f"/api/v1/survey-links/{token}")
    assert survey.status_code == 200, survey.text
    first = survey.json()["items"][0]["id"]
    submission = "sub-" + hashlib.sha256(token.encode()).hexdigest()[:20]
    done = client.post(f"/api/v1/survey-links/{token}/submit", json={"answers": {first: 7},
                                                                     "submission_id": submission})
    assert done.status_code == 200, done.text


def test_weeks_of_follow_ups_across_daylight_saving_in_two_time_zones(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    slug = load_study(engine, example_protocol)
    berlin_invite, york_invite = make_invites(engine, slug, count=2)
    # Enrolled on Monday 2026-03-02; New York moves its clocks on 03-08, Berlin on 03-29.
    berlin = enroll_fully(app_client, berlin_invite, email="berlin@example.org", timezone="Europe/Berlin")
    york = enroll_fully(app_client, york_invite, email="york@example.org", timezone="America/New_York")
    dispatch = dispatcher(engine, port)

    walk(frozen_clock, dispatch, dt.datetime(2026, 3, 9, 9, 0, tzinfo=UTC))
    [berlin_invitation] = messages.to("berlin@example.org")
    assert "Reminder" not in berlin_invitation["Subject"]
    answer_by_link(app_client, link_in(berlin_invitation))  # Berlin answers at once
    walk(frozen_clock, dispatch, dt.datetime(2026, 4, 9, 0, 0, tzinfo=UTC))

    for who, zone in ((berlin, "Europe/Berlin"), (york, "America/New_York")):
        rows = {row["followup_key"]: row for row in followups(engine, who.code)}
        assert set(rows) == {"perma-week-1", "perma-week-4"}
        for key, day in (("perma-week-1", 9), ("perma-week-4", 30)):
            sent = as_utc(rows[key]["sent_at"]).astimezone(ZoneInfo(zone))
            assert (sent.month, sent.day, sent.hour, sent.minute) == (3, day, 10, 0), (who.code, key, sent)
            assert rows[key]["lateness_seconds"] == 0
    # The UTC hours differ because of daylight saving: the local hour does not.
    york_rows = {row["followup_key"]: row for row in followups(engine, york.code)}
    berlin_rows = {row["followup_key"]: row for row in followups(engine, berlin.code)}
    assert as_utc(york_rows["perma-week-1"]["sent_at"]).hour == 14  # EDT since 03-08
    assert as_utc(berlin_rows["perma-week-1"]["sent_at"]).hour == 9  # CET
    assert as_utc(berlin_rows["perma-week-4"]["sent_at"]).hour == 8  # CEST since 03-29

    # Reminders stop at completion: Berlin answered week 1 and got none; New York got both, then expiry.
    assert berlin_rows["perma-week-1"]["status"] == "completed"
    assert berlin_rows["perma-week-1"]["reminders_sent"] == 0
    assert york_rows["perma-week-1"]["status"] == "expired"
    assert york_rows["perma-week-1"]["reminders_sent"] == 2
    assert york_rows["perma-week-1"]["end_reason"] == "the window closed without a response"
    york_subjects = [str(m["Subject"]) for m in messages.to("york@example.org")]
    assert [s.startswith("Reminder") for s in york_subjects] == [False, True, True, False, True]
    with engine.connect() as connection:
        statuses = connection.execute(sa.text("SELECT status FROM survey_assignments WHERE purpose = 'followup' "
                                              "ORDER BY id")).scalars().all()
    assert statuses == ["completed", "expired", "expired", "expired"]


def test_reminders_and_invitations_avoid_quiet_hours(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    late = example_protocol.replace('send_at_local: "10:00"', 'send_at_local: "22:30"', 1)
    who = one_participant(engine, app_client, late, "tokyo@example.org", "Asia/Tokyo")
    dispatch = dispatcher(engine, port)
    walk(frozen_clock, dispatch, dt.datetime(2026, 3, 13, 0, 0, tzinfo=UTC), step=dt.timedelta(minutes=30))
    [week1] = [row for row in followups(engine, who.code) if row["followup_key"] == "perma-week-1"]
    assert week1["intended_local"] == "2026-03-09T22:30"
    tokyo = ZoneInfo("Asia/Tokyo")
    assert as_utc(week1["due_at"]).astimezone(tokyo).strftime("%Y-%m-%d %H:%M") == "2026-03-10 08:00"
    with engine.connect() as connection:
        sent = connection.execute(sa.text("SELECT kind, sent_at FROM deliveries WHERE channel = 'email' "
                                          "ORDER BY sent_at")).all()
    assert [kind for kind, _ in sent] == ["invitation", "reminder", "reminder"]
    for _, at in sent:
        local = as_utc(at).astimezone(tokyo)
        assert dt.time(8, 0) <= local.time() < dt.time(21, 0), local
    assert len(messages.to("tokyo@example.org")) == 3


def test_a_protocol_edit_replans_only_what_was_not_sent(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    _, port = inbox
    who = one_participant(engine, app_client, example_protocol, "someone@example.org")
    dispatch = dispatcher(engine, port)
    walk(frozen_clock, dispatch, dt.datetime(2026, 3, 9, 12, 0, tzinfo=UTC))
    before = {row["followup_key"]: row for row in followups(engine, who.code)}
    assert before["perma-week-1"]["status"] == "sent"

    edited = (example_protocol.replace("offset: P28D", "offset: P21D")
              .replace("channels: [email, in_app]", "channels: [email, in_app]\n# edited"))
    edited = edited.replace("followups:\n", "followups:\n  - id: goal-week-2\n    instrument: goal-progress\n"
                            "    anchor: enrollment\n    offset: P14D\n    window: P3D\n", 1)
    load_study(engine, edited)  # nobody re-plans by hand: the dispatcher notices the new version
    dispatch.tick()
    after = {row["followup_key"]: row for row in followups(engine, who.code)}
    assert after["perma-week-1"]["protocol_version"] == 1  # sent: left alone
    assert after["perma-week-1"]["sent_at"] == before["perma-week-1"]["sent_at"]
    assert after["perma-week-4"]["protocol_version"] == 2
    assert as_utc(after["perma-week-4"]["due_at"]) == dt.datetime(2026, 3, 23, 9, 0, tzinfo=UTC)
    assert after["goal-week-2"]["status"] == "planned"
    assert as_utc(after["goal-week-2"]["due_at"]) == dt.datetime(2026, 3, 16, 9, 0, tzinfo=UTC)

    without = edited.replace("  - id: perma-week-4\n", "  - id: perma-week-5\n")
    load_study(engine, without)
    dispatch.tick()
    final = {row["followup_key"]: row for row in followups(engine, who.code)}
    assert (final["perma-week-4"]["status"], final["perma-week-4"]["end_reason"]) == (
        "cancelled", "not in protocol version 3")
    assert final["perma-week-5"]["status"] == "planned"


def test_withdrawal_cancels_everything_pending(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    who = one_participant(engine, app_client, example_protocol, "leaving@example.org", "Europe/Berlin")
    put_in_arm(engine, who.code, "wellbeing")
    conversation = start_chat(app_client, who, "collaborator")
    ended = app_client.post(f"/api/v1/me/conversations/{conversation}/end", headers=who.headers,
                            json={"rating": 5, "made_decision": True, "decision": "Take the Leeds job"})
    assert ended.status_code == 200, ended.text
    mine = app_client.get("/api/v1/me/followups", headers=who.headers).json()
    assert {(f["followup"], f["about"]) for f in mine} == {
        ("perma-week-1", None), ("perma-week-4", None), ("regret-day-3", "Take the Leeds job"),
        ("regret-day-14", "Take the Leeds job")}
    dispatch = dispatcher(engine, port)
    walk(frozen_clock, dispatch, dt.datetime(2026, 3, 5, 18, 0, tzinfo=UTC))
    [regret] = messages.to("leaving@example.org")
    assert "Decision" in str(regret["Subject"]) or "decision" in str(regret["Subject"]).lower()
    token = link_in(regret).rsplit("/s/", 1)[1]
    survey = app_client.get(f"/api/v1/survey-links/{token}").json()
    assert "Take the Leeds job" in json.dumps(survey)

    withdrawn = app_client.post("/api/v1/me/withdrawal", headers=who.headers,
                                json={"level": "stop_contact", "confirm": True})
    assert withdrawn.status_code == 200
    walk(frozen_clock, dispatch, dt.datetime(2026, 4, 10, 0, 0, tzinfo=UTC), step=dt.timedelta(hours=6))
    assert len(messages.to("leaving@example.org")) == 1  # no reminder, no later invitation
    with engine.connect() as connection:
        statuses: dict[str, str] = dict(connection.execute(sa.text("SELECT followup_key, status FROM followups")).all())
        pending = connection.execute(sa.text("SELECT count(*) FROM deliveries WHERE status IN "
                                             "('pending', 'sending')")).scalar_one()
    assert statuses == {"perma-week-1": "cancelled", "perma-week-4": "cancelled", "regret-day-3": "cancelled",
                        "regret-day-14": "cancelled"}
    assert pending == 0


def test_after_downtime_late_ones_are_sent_and_closed_ones_expire_with_the_reason(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    who = one_participant(engine, app_client, example_protocol, "late@example.org", "Europe/Berlin")
    dispatch = dispatcher(engine, port)
    frozen_clock.set(dt.datetime(2026, 3, 10, 12, 0, tzinfo=UTC))  # down for 8 days; week 1 was due 03-09 09:00
    dispatch.tick()
    [week1] = [row for row in followups(engine, who.code) if row["followup_key"] == "perma-week-1"]
    assert week1["status"] == "sent"
    assert week1["lateness_seconds"] == 27 * 3600
    [invitation] = messages.to("late@example.org")
    assert "Reminder" not in str(invitation["Subject"])
    frozen_clock.set(dt.datetime(2026, 4, 20, 0, 0, tzinfo=UTC))  # down again, past week 4's whole window
    dispatch.tick()
    rows = {row["followup_key"]: row for row in followups(engine, who.code)}
    assert rows["perma-week-4"]["status"] == "expired"
    assert rows["perma-week-4"]["assignment_id"] is None
    assert "no dispatcher ran before the window closed" in rows["perma-week-4"]["end_reason"]
    assert rows["perma-week-1"]["status"] == "expired"
    assert len(messages.to("late@example.org")) == 1  # the expired week-1 reminders were never sent late


class _Hook(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append((dict(self.headers), body))
        self.send_response(202)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


def test_webhook_deliveries_are_signed_and_carry_the_idempotency_key(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    _, port = inbox
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        who = one_participant(engine, app_client, example_protocol.replace(
            "channels: [email, in_app]", "channels: [webhook, in_app]"), None)
        dispatch = dispatcher(engine, port, webhook_url=f"http://127.0.0.1:{server.server_port}/sms",
                              webhook_secret="hook-secret")
        walk(frozen_clock, dispatch, dt.datetime(2026, 3, 9, 10, 0, tzinfo=UTC))
    finally:
        server.shutdown()
    [(headers, body)] = _Hook.received
    expected = "sha256=" + hmac.new(b"hook-secret", body, hashlib.sha256).hexdigest()
    assert headers["X-Afterward-Signature"] == expected
    assert headers["Idempotency-Key"].endswith("-0-webhook")
    payload = json.loads(body)
    assert (payload["participant"], payload["kind"]) == (who.code, "invitation")
    assert "/s/" in payload["link"]
