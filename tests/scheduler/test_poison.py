"""One bad row fails alone: an undecryptable contact, an injected address, a channel that raises,
a study that cannot be re-planned and a follow-up that cannot be opened each leave every other
delivery sent (to a real SMTP server) and are given up with their reason and a staff alert."""

from __future__ import annotations

import base64
import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.channels import Channel, DeliveryError, EmailChannel, InAppChannel, Invitation
from scheduler.dispatcher import Dispatcher
from study.clock import FrozenClock
from study.models import StaffRole
from study.security import encrypt_contact
from study.settings import Settings
from tests.builders import enroll_fully, load_study, make_invites, make_staff
from tests.mail import Inbox, smtp_server

UTC = dt.UTC
WEEK_ONE_DUE = dt.datetime(2026, 3, 9, 9, 0, tzinfo=UTC)  # 10:00 in Berlin, for everyone enrolled on 03-02
MAX_ATTEMPTS = 3
_viewers = itertools.count()


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as served:
        yield served


def enroll_all(engine: Engine, client: TestClient, protocol: str, emails: list[str]) -> tuple[str, list[str]]:
    """A study with one participant per email (Berlin time); returns its slug and the codes."""
    slug = load_study(engine, protocol)
    invites = make_invites(engine, slug, count=len(emails))
    return slug, [enroll_fully(client, invite, email=email).code for invite, email in zip(invites, emails, strict=True)]


def settings(port: int, **overrides: Any) -> Settings:
    return Settings(smtp_port=port, delivery_max_attempts=MAX_ATTEMPTS, delivery_retry_seconds=60, **overrides)


def store_contact(engine: Engine, code: str, encrypted: bytes) -> None:
    """What the edge now refuses, or a key rotated out: written straight into the row."""
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE participants SET contact_email_encrypted = :e WHERE code = :c"),
                           {"e": encrypted, "c": code})


def email_deliveries(engine: Engine) -> dict[str, Any]:
    """The week-1 invitation by email of each participant, by code."""
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT p.code, d.status, d.attempts, d.last_error FROM deliveries d "
            "JOIN participants p ON p.id = d.participant_id JOIN followups f ON f.id = d.followup_id "
            "WHERE d.channel = 'email' AND d.kind = 'invitation' AND f.followup_key = 'perma-week-1'")).all()
    return {row.code: row for row in rows}


def alerts(client: TestClient, engine: Engine, slug: str) -> list[dict[str, Any]]:
    """The raised, unresolved alerts, as staff see them."""
    token = make_staff(engine, slug, StaffRole.VIEWER, f"viewer{next(_viewers)}@example.org")
    response = client.get("/api/v1/staff/alerts", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


def recipients(inbox: Inbox) -> list[str]:
    return sorted(str(message["To"]) for message in inbox.messages)


def nothing_left_sending(engine: Engine) -> bool:
    with engine.connect() as connection:
        return connection.execute(sa.text("SELECT count(*) FROM deliveries WHERE status = 'sending'")).scalar_one() == 0


def test_an_undecryptable_contact_fails_at_once_and_the_others_are_sent(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    emails = [f"p{i}@example.org" for i in range(5)]
    slug, codes = enroll_all(engine, app_client, example_protocol, emails)
    foreign_key = base64.urlsafe_b64encode(b"a key this deployment never had".ljust(32, b"!"))
    store_contact(engine, codes[2], Fernet(foreign_key).encrypt(b"p2@example.org"))
    dispatch = Dispatcher(engine, settings(port), name="test")

    frozen_clock.set(WEEK_ONE_DUE)
    report = dispatch.tick()
    assert (report.opened, report.sent, report.failed) == (5, 4, 1)
    assert recipients(messages) == [e for i, e in enumerate(emails) if i != 2]
    poisoned = email_deliveries(engine)[codes[2]]
    # It can never succeed: given up at the first attempt, with the reason.
    assert (poisoned.status, poisoned.attempts) == ("failed", 1)
    assert poisoned.last_error == "unreadable_contact: contact details cannot be decrypted with the configured keys"
    [alert] = alerts(app_client, engine, slug)
    assert (alert["channel"], alert["problem"]) == ("email", "unreadable_contact")
    assert alert["raised_at"] is not None
    assert "given up after 1 attempt" in alert["message"]

    frozen_clock.advance(dt.timedelta(hours=1))
    dispatch.tick()
    assert email_deliveries(engine)[codes[2]].attempts == 1  # not selected again
    assert len(messages.messages) == 4
    assert [a["problem"] for a in alerts(app_client, engine, slug)] == ["unreadable_contact"]  # still open
    assert nothing_left_sending(engine)


def test_an_injected_header_or_an_address_list_is_refused_when_sending(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    slug, codes = enroll_all(engine, app_client, example_protocol, ["ok1@example.org", "x1@example.org",
                                                                    "x2@example.org", "ok2@example.org"])
    store_contact(engine, codes[1], encrypt_contact("me@x.org\r\nBcc: victim@example.net"))
    store_contact(engine, codes[2], encrypt_contact("a@x.org, stranger@example.net"))
    dispatch = Dispatcher(engine, settings(port), name="test")

    frozen_clock.set(WEEK_ONE_DUE)
    report = dispatch.tick()
    assert (report.sent, report.failed) == (2, 2)
    assert recipients(messages) == ["ok1@example.org", "ok2@example.org"]
    assert not any("example.net" in str(m) for m in messages.messages)
    rows = email_deliveries(engine)
    for code, reason in ((codes[1], "a line break in an address could add mail headers"),
                         (codes[2], "give one email address only, like name@example.org")):
        assert (rows[code].status, rows[code].attempts) == ("failed", 1)
        assert rows[code].last_error == f"bouncing: the contact email is refused: {reason}"
    [alert] = alerts(app_client, engine, slug)
    assert (alert["channel"], alert["problem"], alert["failures"]) == ("email", "bouncing", 2)


@pytest.mark.parametrize("address", ["me@x.org\r\nBcc: v@y.net", "a@x.org, v1@y.net", "Bob <b@x.org>", "me@x.org\n"])
def test_the_email_channel_writes_no_header_from_a_bad_address(address: str) -> None:
    invitation = Invitation("key", "invitation", "P1", address, "Study", "Survey", "http://x/s/t", "tomorrow")
    with pytest.raises(DeliveryError) as refused:
        EmailChannel(Settings()).compose(invitation)
    assert (refused.value.problem, refused.value.permanent) == ("bouncing", True)
    assert str(refused.value).startswith("the contact email is refused")


class BrokenFor:
    """A channel with a bug that one recipient's message hits; everyone else's goes through the
    real email channel to the real SMTP server."""

    name = "email"

    def __init__(self, real: Channel, victim: str) -> None:
        self.real, self.victim, self.calls = real, victim, 0

    def send(self, message: Invitation) -> None:
        if message.to_email == self.victim:
            self.calls += 1
            raise RuntimeError("list index out of range")
        self.real.send(message)


def test_a_channel_raising_an_unexpected_exception_is_retried_then_given_up_alone(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    emails = [f"q{i}@example.org" for i in range(4)]
    slug, codes = enroll_all(engine, app_client, example_protocol, emails)
    s = settings(port)
    broken = BrokenFor(EmailChannel(s), "q0@example.org")
    dispatch = Dispatcher(engine, s, name="test", channels={"email": broken, "in_app": InAppChannel()})

    frozen_clock.set(WEEK_ONE_DUE)
    first = dispatch.tick()
    assert (first.sent, first.retrying, first.failed) == (3, 1, 0)
    assert recipients(messages) == emails[1:]
    poisoned = email_deliveries(engine)[codes[0]]
    assert (poisoned.status, poisoned.attempts) == ("pending", 1)  # not left 'sending'
    assert poisoned.last_error == "error: the email channel failed: RuntimeError: list index out of range"
    assert alerts(app_client, engine, slug) == []  # one failure that may pass is not an alert yet

    frozen_clock.advance(dt.timedelta(seconds=59))
    assert dispatch.tick().retrying == 0  # backing off
    for _ in range(MAX_ATTEMPTS - 1):
        frozen_clock.advance(dt.timedelta(hours=1))
        dispatch.tick()
    poisoned = email_deliveries(engine)[codes[0]]
    assert (poisoned.status, poisoned.attempts, broken.calls) == ("failed", MAX_ATTEMPTS, MAX_ATTEMPTS)
    assert "RuntimeError: list index out of range" in poisoned.last_error
    [alert] = alerts(app_client, engine, slug)
    assert (alert["channel"], alert["problem"]) == ("email", "error")
    assert f"given up after {MAX_ATTEMPTS} attempt(s)" in alert["message"]

    frozen_clock.advance(dt.timedelta(hours=6))  # (before the first reminders)
    dispatch.tick()
    assert broken.calls == MAX_ATTEMPTS  # given up for good
    assert len(messages.messages) == 3
    assert nothing_left_sending(engine)


def test_a_study_that_cannot_be_replanned_does_not_stop_the_other_studies(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    second = example_protocol.replace("id: wellbeing-pilot", "id: second-pilot", 1)
    broken_slug, broken_codes = enroll_all(engine, app_client, second, ["b0@example.org", "b1@example.org"])
    slug, _ = enroll_all(engine, app_client, example_protocol, ["a0@example.org", "a1@example.org"])
    # A new version of the second study, whose stored protocol then fails to load (a row edited by hand).
    load_study(engine, second.replace("offset: P28D", "offset: P21D"))
    with engine.begin() as connection:
        connection.execute(sa.text(
            "UPDATE protocol_versions SET protocol = :broken, source_sha256 = :sha WHERE version = 2 AND study_id = "
            "(SELECT id FROM studies WHERE slug = :slug)"),
            {"broken": '{"study": "edited by hand"}', "sha": "0" * 64, "slug": broken_slug})
    dispatch = Dispatcher(engine, settings(port), name="test")

    frozen_clock.set(WEEK_ONE_DUE)
    report = dispatch.tick()
    assert (report.opened, report.sent) == (2, 2)
    assert recipients(messages) == ["a0@example.org", "a1@example.org"]
    assert any(e.startswith("study ") and "re-planning for protocol version 2 failed" in e for e in report.errors)
    assert alerts(app_client, engine, slug) == []
    for _ in range(MAX_ATTEMPTS - 1):
        frozen_clock.advance(dt.timedelta(hours=1))
        assert dispatch.tick().errors

    with engine.connect() as connection:
        broken = connection.execute(sa.text(
            "SELECT f.followup_key, f.status, f.end_reason FROM followups f JOIN participants p "
            "ON p.id = f.participant_id WHERE p.code IN (:b0, :b1) ORDER BY f.followup_key"),
            {"b0": broken_codes[0], "b1": broken_codes[1]}).all()
    assert [(key, status) for key, status, _ in broken] == [
        ("perma-week-1", "cancelled"), ("perma-week-1", "cancelled"), ("perma-week-4", "planned"),
        ("perma-week-4", "planned")]  # only what was due is given up; week 4 waits for a fix
    assert broken[0].end_reason.startswith(f"not sent: re-planning for protocol version 2 failed {MAX_ATTEMPTS} "
                                           "times: ValidationError")
    [alert] = alerts(app_client, engine, slug)
    assert (alert["channel"], alert["problem"]) == ("scheduler", "replan_failed")
    assert "2 due follow-up(s) given up" in alert["message"]
    assert len(messages.messages) == 2
    frozen_clock.advance(dt.timedelta(days=1))  # and the healthy study's reminders still go out
    dispatch.tick()
    reminders = messages.messages[2:]
    assert sorted(str(m["To"]) for m in reminders) == ["a0@example.org", "a1@example.org"]
    assert all(str(m["Subject"]).startswith("Reminder") for m in reminders)


def test_a_follow_up_that_cannot_be_opened_never_blocks_the_rows_behind_it(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    emails = [f"r{i}@example.org" for i in range(5)]
    slug, codes = enroll_all(engine, app_client, example_protocol, emails)
    with engine.begin() as connection:  # first in due order, and its instrument is gone
        connection.execute(sa.text(
            "UPDATE followups SET instrument_id = 'withdrawn-instrument', due_at = :earlier WHERE followup_key = "
            "'perma-week-1' AND participant_id = (SELECT id FROM participants WHERE code = :c)"),
            {"earlier": WEEK_ONE_DUE - dt.timedelta(hours=1), "c": codes[0]})
    # Batches of two: the poisoned row is at the front of the first one.
    dispatch = Dispatcher(engine, settings(port, scheduler_batch_size=2), name="test")

    frozen_clock.set(WEEK_ONE_DUE)
    report = dispatch.tick()
    assert (report.opened, report.sent) == (4, 4)
    assert recipients(messages) == emails[1:]
    [error] = report.errors
    assert error.endswith("could not be opened: NotFound: no instrument 'withdrawn-instrument'")
    for _ in range(MAX_ATTEMPTS - 1):
        frozen_clock.advance(dt.timedelta(hours=1))
        dispatch.tick()
    with engine.connect() as connection:
        status, reason = connection.execute(sa.text(
            "SELECT status, end_reason FROM followups WHERE instrument_id = 'withdrawn-instrument'")).one()
    assert status == "cancelled"
    assert reason == (f"not sent: could not be opened after {MAX_ATTEMPTS} attempts: "
                      "NotFound: no instrument 'withdrawn-instrument'")
    [alert] = alerts(app_client, engine, slug)
    assert (alert["channel"], alert["problem"]) == ("scheduler", "open_failed")
    assert len(messages.messages) == 4


def test_a_delivery_whose_dispatcher_died_at_every_attempt_is_given_up(
    engine: Engine, app_client: TestClient, example_protocol: str, frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    slug, codes = enroll_all(engine, app_client, example_protocol, ["s0@example.org", "s1@example.org"])
    dispatch = Dispatcher(engine, settings(port), name="test")
    frozen_clock.set(WEEK_ONE_DUE)
    assert dispatch.tick().sent == 2
    with engine.begin() as connection:  # s0's invitation as its last dispatcher left it, dead mid-send
        connection.execute(sa.text(
            "UPDATE deliveries SET status = 'sending', attempts = :n, lease_until = :gone, claimed_by = 'dead', "
            "sent_at = NULL WHERE channel = 'email' AND kind = 'invitation' AND participant_id = "
            "(SELECT id FROM participants WHERE code = :c)"), {"n": MAX_ATTEMPTS, "gone": WEEK_ONE_DUE, "c": codes[0]})
    frozen_clock.advance(dt.timedelta(minutes=5))
    report = dispatch.tick()
    assert report.failed == 1
    row = email_deliveries(engine)[codes[0]]
    assert (row.status, row.attempts) == ("failed", MAX_ATTEMPTS)
    assert row.last_error == "error: the last attempt never finished (its dispatcher stopped mid-send)"
    [alert] = alerts(app_client, engine, slug)
    assert (alert["problem"], alert["raised_at"] is not None) == ("error", True)
    assert len(messages.messages) == 2
    assert nothing_left_sending(engine)
