"""Coming back without the session cookie: sign-in links emailed on request (through the dispatcher,
to a real SMTP server on loopback), the link in follow-up emails, return codes; single use, expiry,
signatures, limits, no enumeration, audit."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from study import signin
from study.clock import FrozenClock
from study.db import session_scope
from study.models import AuditEntry
from study.settings import Settings, get_settings
from tests.builders import enroll, enroll_fully, load_study, make_invites, sign_consent
from tests.mail import Inbox, free_port, smtp_server

UTC = dt.UTC
LINK = re.compile(r"https?://\S+/sign-in/link/\S+")


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as served:
        yield served


@pytest.fixture
def invites(engine: Engine, example_protocol: str) -> list[str]:
    return make_invites(engine, load_study(engine, example_protocol), count=4)


def dispatch(engine: Engine, port: int) -> Any:
    return Dispatcher(engine, Settings(smtp_port=port), name="test").tick()


def links_in(message: Any) -> list[str]:
    body = message.get_body(("plain",))
    assert body is not None
    return LINK.findall(body.get_content())


def token_of(link: str) -> str:
    return urlsplit(link).path.rsplit("/", 1)[1]


def request_link(client: TestClient, email: str) -> Any:
    return client.post("/api/v1/sign-in/email-link", json={"email": email})


def audit_trail(engine: Engine, code: str) -> list[tuple[str, dict[str, Any]]]:
    with session_scope(engine, read_only=True) as session:
        return [(entry.action, entry.detail) for entry in session.scalars(
            sa.select(AuditEntry).where(AuditEntry.participant_code == code).order_by(AuditEntry.seq))]


def count(engine: Engine, sql: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(sql)).scalar_one())


def pre_of(html: str) -> str:
    match = re.search(r'name="pre" value="([^"]+)"', html)
    assert match, html
    return match.group(1)


def test_a_requested_link_arrives_signs_in_once_and_is_audited(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    who = enroll_fully(app_client, invites[0], email="ada@example.org")
    asked = request_link(app_client, " Ada@Example.ORG ")  # as people type it
    assert asked.status_code == 202, asked.text
    assert "sign-in link is on its way" in asked.json()["message"]

    report = dispatch(engine, port)
    assert report.sign_in_sent == 1, report
    [email] = messages.to("ada@example.org")
    assert str(email["Subject"]) == "Your sign-in link"
    text = email.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    # Berlin, 09:00 UTC + 30 minutes; and the study's (internal) title is not in it.
    assert "until Monday 2 March 2026, 10:30 CET (Europe/Berlin)" in text
    assert "Well-being" not in text
    assert "wellbeing" not in text.lower()
    [link] = links_in(email)
    token = token_of(link)

    assert app_client.get(urlsplit(link).path).status_code == 200  # asks first: a mail scanner uses nothing
    signed_in = app_client.post("/api/v1/sign-in/link", json={"token": token})
    assert signed_in.status_code == 200, signed_in.text
    body = signed_in.json()
    assert (body["participant_code"], body["method"]) == (who.code, "email_link")
    me = app_client.get("/api/v1/me", headers={"Authorization": f"Bearer {body['token']}"})
    assert me.json()["participant_code"] == who.code

    again = app_client.post("/api/v1/sign-in/link", json={"token": token})
    assert again.status_code == 410
    assert again.json()["error"]["code"] == "sign_in_link_used"
    trail = [(action, detail.get("method"), detail.get("reason")) for action, detail in audit_trail(engine, who.code)
             if action.startswith("participant.sign_in") or action == "participant.signed_in"]
    assert trail == [("participant.sign_in_link_requested", None, None),
                     ("participant.signed_in", "email_link", None),
                     ("participant.sign_in_refused", "email_link", "sign_in_link_used")]
    with engine.connect() as connection:
        actors: dict[str, str] = dict(connection.execute(sa.text(
            "SELECT action, actor_type FROM audit_log WHERE action LIKE 'participant.sign%'")).all())
    # Only the one who used the link is known to be the participant; asking, or a refused link, is not.
    assert actors == {"participant.sign_in_link_requested": "system", "participant.signed_in": "participant",
                      "participant.sign_in_refused": "system"}


def test_two_uses_at_once_sign_in_once(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two requests with one link can both pass the check before either commits; the unique nonce
    inserted on use is what refuses the second."""
    enroll_fully(app_client, invites[0], email="ada@example.org")
    with session_scope(engine, read_only=True) as session:
        ada_id = session.execute(sa.text("SELECT id FROM participants")).scalar_one()
    token = signin.link_token(signin.FOLLOWUP_LINK, ada_id, "followup-1-0-email",
                              frozen_clock.now() + dt.timedelta(days=1))
    monkeypatch.setattr(signin, "_used", lambda session, nonce: False)  # as if both checked at once
    first = app_client.post("/api/v1/sign-in/link", json={"token": token})
    second = app_client.post("/api/v1/sign-in/link", json={"token": token})
    assert (first.status_code, second.status_code) == (200, 410)
    assert second.json()["error"]["code"] == "sign_in_link_used"
    assert count(engine, "SELECT count(*) FROM used_sign_in_links") == 1


def test_an_unknown_address_gets_the_same_answer_and_no_email(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    enroll_fully(app_client, invites[0], email="ada@example.org")
    known = request_link(app_client, "ada@example.org")
    unknown = request_link(app_client, "nobody@example.org")
    assert known.status_code == unknown.status_code == 202
    assert known.json()["message"].replace("ada@", "nobody@") == unknown.json()["message"]
    # The page says the same too.
    pages = []
    for address in ("ada@example.org", "nobody@example.org"):
        pre = pre_of(app_client.get("/").text)
        pages.append(app_client.post("/sign-in/email", data={"pre": pre, "email": address}))
    assert pages[0].status_code == pages[1].status_code == 200
    assert pages[0].text.replace("ada@", "nobody@") == pages[1].text
    dispatch(engine, port)
    assert [str(m["To"]) for m in messages.messages] == ["ada@example.org", "ada@example.org"]


def test_a_link_expires_and_its_page_offers_a_new_one(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    enroll_fully(app_client, invites[0], email="ada@example.org")
    request_link(app_client, "ada@example.org")
    dispatch(engine, port)
    [link] = links_in(messages.messages[0])
    frozen_clock.advance(dt.timedelta(minutes=31))
    shown = app_client.get(urlsplit(link).path)
    assert shown.status_code == 410
    assert "has expired" in shown.text
    assert "Email me a new sign-in link" in shown.text
    used = app_client.post("/api/v1/sign-in/link", json={"token": token_of(link)})
    assert (used.status_code, used.json()["error"]["code"]) == (410, "sign_in_link_expired")


def test_a_link_not_sent_before_it_expired_is_not_sent_and_a_down_mail_server_is_retried(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
) -> None:
    enroll_fully(app_client, invites[0], email="ada@example.org")
    request_link(app_client, "ada@example.org")
    down = free_port()
    report = dispatch(engine, down)
    assert (report.sign_in_sent, report.retrying) == (0, 1), report
    with engine.connect() as connection:
        status, error = connection.execute(sa.text("SELECT status, last_error FROM sign_in_emails")).one()
    assert status == "pending"
    assert error.startswith("unreachable")
    with smtp_server(down) as (messages, port):
        frozen_clock.advance(dt.timedelta(minutes=2))
        assert dispatch(engine, port).sign_in_sent == 1
        assert len(messages.messages) == 1
        request_link(app_client, "ada@example.org")
        frozen_clock.advance(dt.timedelta(minutes=31))  # no dispatcher ran meanwhile
        report = dispatch(engine, port)
        assert (report.sign_in_sent, report.cancelled) == (0, 1), report
        assert len(messages.messages) == 1


def test_links_with_a_wrong_signature_or_cut_short_are_refused_with_a_page_not_an_error(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AFTERWARD_LOGIN_MAX_FAILURES", "20")  # this test fails on purpose more than 5 times
    get_settings.cache_clear()
    who = enroll_fully(app_client, invites[0], email="ada@example.org")
    other = enroll_fully(app_client, invites[1], email="bob@example.org")
    with session_scope(engine, read_only=True) as session:
        ada_id, bob_id = (session.execute(sa.text("SELECT id FROM participants WHERE code = :c"), {"c": c}).scalar_one()
                          for c in (who.code, other.code))
    good = signin.link_token(signin.EMAIL_LINK, ada_id, "sign-in-test", frozen_clock.now() + dt.timedelta(minutes=5))
    body, signature = good.split(".")
    forged = signin.link_token(signin.EMAIL_LINK, bob_id, "sign-in-test", frozen_clock.now() + dt.timedelta(minutes=5))
    tampered = [
        f"{body}.{signature[:-2]}AA",  # the signature changed
        f"{forged.split('.')[0]}.{signature}",  # another participant under Ada's signature
        good[: len(good) // 2],  # cut short by a mail program
        "not-a-token",
        "x" * 600,
    ]
    for token in tampered:
        refused = app_client.post("/api/v1/sign-in/link", json={"token": token[:512]})
        assert refused.status_code in (404, 422), (token, refused.text)
        shown = app_client.get(f"/sign-in/link/{token}")
        assert shown.status_code == 404, token
        assert "not valid" in shown.text
    assert app_client.post("/api/v1/sign-in/link", json={"token": good}).status_code == 200  # the real one works


def test_failed_sign_ins_are_limited_like_staff_logins(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
) -> None:
    for _ in range(5):
        wrong = app_client.post("/api/v1/sign-in/code", json={"return_code": "ABCD-EFGH-JKMN-PQRS"})
        assert (wrong.status_code, wrong.json()["error"]["code"]) == (422, "return_code_unknown")
    limited = app_client.post("/api/v1/sign-in/code", json={"return_code": "ABCD-EFGH-JKMN-PQRS"})
    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "5"
    # Links count toward the same limit, and the page says so too.
    assert app_client.post("/api/v1/sign-in/link", json={"token": "abc.def-ghij"}).status_code == 429
    pre = pre_of(app_client.get("/").text)
    page = app_client.post("/sign-in/code", data={"pre": pre, "return_code": "ABCD-EFGH-JKMN-PQRS"})
    assert page.status_code == 429
    assert "wait 5 seconds" in page.text
    frozen_clock.advance(dt.timedelta(seconds=6))
    assert app_client.post("/api/v1/sign-in/code", json={"return_code": "ABCD"}).status_code == 422
    again = app_client.post("/api/v1/sign-in/code", json={"return_code": "ABCD"})
    assert (again.status_code, again.headers["Retry-After"]) == (429, "10")  # the wait doubles
    assert count(engine, "SELECT count(*) FROM sign_in_attempts WHERE succeeded") == 0


def test_link_requests_are_limited_per_address_whether_or_not_it_is_enrolled(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
) -> None:
    enroll_fully(app_client, invites[0], email="ada@example.org")
    for address in ("ada@example.org", "nobody@example.org"):
        statuses = [request_link(app_client, address).status_code for _ in range(6)]
        assert statuses == [202] * 5 + [429], address
    assert count(engine, "SELECT count(*) FROM sign_in_emails") == 5
    # One client asking for many addresses is limited too.
    statuses = [request_link(app_client, f"p{n}@example.org").status_code for n in range(12)]
    assert statuses == [202] * 10 + [429] * 2


def test_a_return_code_is_given_once_without_email_and_signs_in(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
) -> None:
    who = enroll(app_client, invites[0])
    sign_consent(app_client, who)
    profile = app_client.put("/api/v1/me/profile", headers=who.headers, json={"timezone": "Europe/Berlin"})
    code = profile.json()["return_code"]
    assert re.fullmatch(r"[A-Z0-9]{4}(-[A-Z0-9]{4}){3}", code)
    again = app_client.put("/api/v1/me/profile", headers=who.headers, json={"timezone": "Europe/Paris"})
    assert again.json()["return_code"] is None  # shown once
    with engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT return_code_hmac FROM participants")).scalar_one()
    assert code not in stored
    assert code.replace("-", "") not in stored

    typed = code.lower().replace("-", " ")  # as someone might type it
    signed_in = app_client.post("/api/v1/sign-in/code", json={"return_code": typed})
    assert signed_in.status_code == 200, signed_in.text
    assert (signed_in.json()["participant_code"], signed_in.json()["method"]) == (who.code, "return_code")
    assert app_client.cookies.get("afterward_session") == signed_in.json()["token"]
    # A new code replaces the old one.
    renewed = app_client.post("/api/v1/me/return-code", headers=who.headers)
    assert renewed.status_code == 201
    old = app_client.post("/api/v1/sign-in/code", json={"return_code": code})
    assert old.status_code == 422
    assert app_client.post("/api/v1/sign-in/code", json={"return_code": renewed.json()["return_code"]}
                           ).status_code == 200
    actions = [action for action, _ in audit_trail(engine, who.code)]
    assert actions.count("participant.return_code_issued") == 2
    assert actions.count("participant.signed_in") == 2
    # A participant who gave an email address gets no code unless they ask for one.
    other = enroll(app_client, invites[1])
    sign_consent(app_client, other)
    with_email = app_client.put("/api/v1/me/profile", headers=other.headers,
                                json={"timezone": "Europe/Berlin", "contact_email": "bob@example.org"})
    assert with_email.json()["return_code"] is None


def test_the_onboarding_page_shows_the_return_code_once_and_the_home_page_signs_in_with_it(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
) -> None:
    app_client.post("/join", data={"pre": pre_of(app_client.get("/").text), "invite_code": invites[0]})
    consent = app_client.get("/consent").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', consent).group(1)  # type: ignore[union-attr]
    app_client.post("/consent", data={"csrf": csrf, "version": "1.2", "typed_signature": "A",
                                      "confirmations": ["read-and-understood", "adult", "voluntary"]})
    shown = app_client.post("/onboarding", data={"csrf": csrf, "timezone": "Europe/Berlin"}, follow_redirects=False)
    assert shown.status_code == 200
    code = re.search(r'class="return-code"><strong>([A-Z0-9-]+)</strong>', shown.text).group(1)  # type: ignore[union-attr]
    assert 'href="/surveys/' in shown.text  # then on to the baseline survey

    app_client.cookies.clear()  # a new phone
    assert "Already taking part?" in app_client.get("/").text
    pre = pre_of(app_client.get("/").text)
    wrong = app_client.post("/sign-in/code", data={"pre": pre, "return_code": "AAAA-BBBB"})
    assert wrong.status_code == 422
    assert "not known" in wrong.text
    back = app_client.post("/sign-in/code", data={"pre": pre, "return_code": code}, follow_redirects=False)
    assert (back.status_code, back.headers["location"]) == (303, "/")
    assert app_client.get("/me").status_code == 200
    # Without the form's double-submit token another site could sign a visitor in: refused.
    app_client.cookies.clear()
    forged = app_client.post("/sign-in/code", data={"pre": "x", "return_code": code}, follow_redirects=False)
    assert forged.headers["location"] == "/?expired=1"


def test_a_withdrawn_participant_cannot_sign_in(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    who = enroll(app_client, invites[0])
    sign_consent(app_client, who)
    code = app_client.put("/api/v1/me/profile", headers=who.headers,
                          json={"timezone": "Europe/Berlin"}).json()["return_code"]
    emailed = enroll_fully(app_client, invites[1], email="bob@example.org")
    with session_scope(engine, read_only=True) as session:
        bob_id = session.execute(sa.text("SELECT id FROM participants WHERE code = :c"),
                                 {"c": emailed.code}).scalar_one()
    link = signin.link_token(signin.FOLLOWUP_LINK, bob_id, "followup-1-0-email",
                             frozen_clock.now() + dt.timedelta(days=3))
    for handle in (who, emailed):
        withdrawn = app_client.post("/api/v1/me/withdrawal", headers=handle.headers,
                                    json={"level": "stop_contact", "confirm": True})
        assert withdrawn.status_code == 200, withdrawn.text
    app_client.cookies.clear()

    by_code = app_client.post("/api/v1/sign-in/code", json={"return_code": code})
    assert (by_code.status_code, by_code.json()["error"]["code"]) == (403, "withdrawn")
    by_link = app_client.post("/api/v1/sign-in/link", json={"token": link})
    assert (by_link.status_code, by_link.json()["error"]["code"]) == (403, "withdrawn")
    page = app_client.get(f"/sign-in/link/{link}")
    assert page.status_code == 403
    assert "withdrawn" in page.text
    assert "Email me a new sign-in link" not in page.text
    assert request_link(app_client, "bob@example.org").status_code == 202
    dispatch(engine, port)
    assert messages.messages == []
    assert count(engine, "SELECT count(*) FROM participant_sessions") == 2  # only those of enrollment
    assert app_client.get("/chat", follow_redirects=False).headers["location"] == "/?expired=1"
    refused = [detail["reason"] for action, detail in audit_trail(engine, who.code)
               if action == "participant.sign_in_refused"]
    assert refused == ["withdrawn"]


def test_follow_up_emails_give_the_deadline_in_local_time_and_sign_in_to_my_study_once(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
    inbox: tuple[Inbox, int],
) -> None:
    messages, port = inbox
    berlin = enroll_fully(app_client, invites[0], email="berlin@example.org", timezone="Europe/Berlin")
    enroll_fully(app_client, invites[1], email="york@example.org", timezone="America/New_York")
    dispatcher = Dispatcher(engine, Settings(smtp_port=port), name="test")
    for hour in (9, 14):  # week 1 is due at 10:00 local: 09:00 UTC in Berlin, 14:00 UTC in New York
        frozen_clock.set(dt.datetime(2026, 3, 9, hour, 0, tzinfo=UTC))
        dispatcher.tick()
    [to_berlin] = messages.to("berlin@example.org")
    [to_york] = messages.to("york@example.org")
    berlin_text = to_berlin.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    york_text = to_york.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    # Sent at 10:00 local on 9 March, open three days: New York is on summer time since 8 March.
    assert "works until Thursday 12 March 2026, 10:00 CET (Europe/Berlin)" in berlin_text
    assert "works until Thursday 12 March 2026, 10:00 EDT (America/New_York)" in york_text
    assert "UTC" not in berlin_text
    assert "My study" in to_berlin.get_body(("html",)).get_content()  # type: ignore[union-attr]
    [link] = links_in(to_berlin)

    app_client.cookies.clear()  # another device
    confirm = app_client.get(urlsplit(link).path)
    assert confirm.status_code == 200
    used = app_client.post(urlsplit(link).path, data={"pre": pre_of(confirm.text)}, follow_redirects=False)
    assert (used.status_code, used.headers["location"]) == (303, "/me")
    my_study = app_client.get("/me")
    assert my_study.status_code == 200
    assert berlin.code in my_study.text
    # Opened again on this device: already signed in, straight to My study.
    assert app_client.get(urlsplit(link).path, follow_redirects=False).headers["location"] == "/me"
    # Elsewhere, the second use is refused with a way to get a new link.
    app_client.cookies.clear()
    second = app_client.get(urlsplit(link).path)
    assert second.status_code == 410
    assert "already used" in second.text
    assert "Email me a new sign-in link" in second.text
    # The link ends with the survey's window.
    app_client.cookies.clear()
    [york_link] = links_in(to_york)
    frozen_clock.set(dt.datetime(2026, 3, 12, 14, 1, tzinfo=UTC))
    assert app_client.post("/api/v1/sign-in/link", json={"token": token_of(york_link)}).status_code == 410


def test_addresses_on_file_before_sign_in_links_are_hashed_by_the_upgrade(
    engine: Engine, app_client: TestClient, invites: list[str], frozen_clock: FrozenClock,
) -> None:
    enroll_fully(app_client, invites[0], email="ada@example.org")
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE participants SET contact_email_hmac = NULL"))
    request_link(app_client, "ada@example.org")
    assert count(engine, "SELECT count(*) FROM sign_in_emails") == 0
    with session_scope(engine) as session:
        assert signin.backfill_lookup_hashes(session) == 1
        assert signin.backfill_lookup_hashes(session) == 0
    request_link(app_client, "ada@example.org")
    assert count(engine, "SELECT count(*) FROM sign_in_emails") == 1
