"""Participant pages without a browser: security headers, CSRF, re-consent, closed surveys."""

from __future__ import annotations

import datetime as dt
import re

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from study.clock import FrozenClock
from tests.builders import assign_survey, load_study, make_invites


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, html
    return match.group(1)


def join(client: TestClient, invite: str) -> str:
    """Redeem the invite through the form and sign the consent; returns the consent page HTML."""
    landing = client.get("/")
    pre = re.search(r'name="pre" value="([^"]+)"', landing.text)
    assert pre
    joined = client.post("/join", data={"pre": pre.group(1), "invite_code": invite}, follow_redirects=False)
    assert joined.headers["location"] == "/consent"
    return client.get("/consent").text


def sign(client: TestClient, html: str, version: str = "1.1") -> None:
    signed = client.post("/consent", data={
        "csrf": csrf_of(html), "version": version, "typed_signature": "A",
        "confirmations": ["read-and-understood", "adult", "voluntary"]}, follow_redirects=False)
    assert signed.status_code == 303, signed.text


def test_pages_send_a_strict_content_security_policy(app_client: TestClient) -> None:
    response = app_client.get("/")
    assert response.status_code == 200
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert "<script>" not in response.text
    assert "style=" not in response.text
    assert "Content-Security-Policy" not in app_client.get("/docs").headers  # the API explorer keeps working


def test_forms_without_the_csrf_token_are_refused(engine: Engine, app_client: TestClient,
                                                  example_protocol: str) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    forged = app_client.post("/join", data={"pre": "guess", "invite_code": invite}, follow_redirects=False)
    assert (forged.status_code, forged.headers["location"]) == (303, "/?expired=1")
    html = join(app_client, invite)
    refused = app_client.post("/consent", data={"csrf": "0" * 64, "version": "1.1", "typed_signature": "A",
                                                "confirmations": ["read-and-understood", "adult", "voluntary"]},
                              follow_redirects=False)
    assert refused.headers["location"] == "/?expired=1"
    sign(app_client, html)
    assert app_client.get("/", follow_redirects=False).headers["location"] == "/onboarding"


def test_an_optional_confirmation_is_shown_as_optional_and_may_be_ticked(
    engine: Engine, app_client: TestClient, example_protocol: str,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    html = join(app_client, invite)
    box = re.search(r'<input type="checkbox" id="confirm-share-conversation-text"[^>]*>', html)
    assert box, html
    assert "required" not in box.group(0)  # it can be left unticked ...
    assert 'id="confirm-adult" name="confirmations" value="adult" required' in html  # ... unlike these
    assert "(optional)" in html
    signed = app_client.post("/consent", data={
        "csrf": csrf_of(html), "version": "1.1", "typed_signature": "A",
        "confirmations": ["read-and-understood", "adult", "voluntary", "share-conversation-text"]},
        follow_redirects=False)
    assert signed.status_code == 303, signed.text
    copy = app_client.get("/api/v1/me/consent/signed").json()
    assert "share-conversation-text" in copy["confirmations"]


def test_a_revised_consent_is_shown_and_signed_again(engine: Engine, app_client: TestClient,
                                                     example_protocol: str) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    sign(app_client, join(app_client, invite))
    onboarding = app_client.get("/onboarding")
    app_client.post("/onboarding", data={"csrf": csrf_of(onboarding.text), "timezone": "Europe/Paris"})
    revised = example_protocol.replace('version: "1.1"', 'version: "2.0"').replace(
        "answer a few short questionnaires", "answer a few short questionnaires and one interview")
    load_study(engine, revised)
    assert app_client.get("/chat", follow_redirects=False).headers["location"] == "/consent"
    page = app_client.get("/consent")
    assert "The consent was revised" in page.text
    assert "one interview" in page.text
    sign(app_client, page.text, version="2.0")
    assert app_client.get("/chat").status_code == 200


def test_a_closed_or_finished_survey_says_so(engine: Engine, app_client: TestClient, example_protocol: str,
                                             frozen_clock: FrozenClock) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    sign(app_client, join(app_client, invite))
    onboarding = app_client.get("/onboarding")
    app_client.post("/onboarding", data={"csrf": csrf_of(onboarding.text), "timezone": "Europe/Paris"})
    code = re.search(r"<strong>(P[0-9A-Z]+)</strong>", app_client.get("/me").text)
    assert code
    survey = assign_survey(engine, code.group(1), "goal-progress",
                           closes_at=frozen_clock.now() + dt.timedelta(days=1))
    page = app_client.get(f"/surveys/{survey}")
    assert "Part 1 of 1" in page.text
    answered = app_client.post(f"/surveys/{survey}", data={"csrf": csrf_of(page.text), "step": "0",
                                                           "progress": "12", "go": "submit"})
    assert answered.status_code == 422  # out of range: the page names the problem
    assert "must be between" in answered.text
    done = app_client.post(f"/surveys/{survey}", data={"csrf": csrf_of(page.text), "step": "0",
                                                       "progress": "6", "go": "submit"}, follow_redirects=False)
    assert done.headers["location"] == "/done"
    assert "already completed" in app_client.get(f"/surveys/{survey}").text
    frozen_clock.advance(dt.timedelta(days=2))
    late = assign_survey(engine, code.group(1), "goal-progress", closes_at=frozen_clock.now() - dt.timedelta(hours=1))
    assert "closed" in app_client.get(f"/surveys/{late}").text
    forged = app_client.get("/s/not-a-real-link")
    assert forged.status_code == 404
    assert "not valid" in forged.text
