"""What participants are told about the study: its public title and description, and who runs it
(principal investigator, ethics board contact, protocol number). The internal title, which may name
the hypothesis, stays with staff."""

from __future__ import annotations

import datetime as dt
import html
from urllib.parse import urlsplit

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from study.clock import FrozenClock
from study.models import StaffRole
from study.settings import Settings
from tests.builders import csrf_of, join, load_study, make_invites, make_staff
from tests.mail import link_in, smtp_server

INTERNAL_TITLE = "Well-being mode pilot: does honest pushback leave people better off?"
INTERNAL_WORDS = ("Well-being mode pilot", "honest pushback", "Half get the well-being mode")
PUBLIC_TITLE = "Conversations with an AI assistant: a four-week study"
PI = "Dr. Jane Example, Department of Psychology, Example University"
IRB = "Example University Research Ethics Board, ethics@example.org, +44 20 7946 0000"
PROTOCOL_NUMBER = "REB-2026-0142"




def sign(client: TestClient, consent_page: str) -> None:
    signed = client.post("/consent", data={
        "csrf": csrf_of(consent_page), "version": "1.2", "typed_signature": "A. Person",
        "confirmations": ["read-and-understood", "adult", "voluntary"]}, follow_redirects=False)
    assert signed.status_code == 303, signed.text


def shown_to_participant(text: str) -> str:
    text = html.unescape(text)
    for words in INTERNAL_WORDS:
        assert words not in text, words
    return text


def test_consent_page_and_signed_copy_show_who_runs_the_study(engine: Engine, app_client: TestClient,
                                                               example_protocol: str) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    consent_page = shown_to_participant(join(app_client, invite))
    for shown in (PUBLIC_TITLE, "Principal investigator", PI, IRB, "Protocol number", PROTOCOL_NUMBER):
        assert shown in consent_page, shown
    sign(app_client, consent_page)
    after = shown_to_participant(app_client.get("/consent").text)
    assert PROTOCOL_NUMBER in after  # still there once signed

    copy = app_client.get("/api/v1/me/consent/signed?download=true")
    assert copy.status_code == 200, copy.text
    text = shown_to_participant(copy.text)
    assert text.startswith(f"{PUBLIC_TITLE}\n\n# Taking part in the Afterward pilot")
    for line in (f"Principal investigator: {PI}", f"Ethics board (IRB) contact: {IRB}",
                 f"Protocol number: {PROTOCOL_NUMBER}"):
        assert line in text.splitlines(), line
    about = app_client.get("/api/v1/me/consent/signed").json()["about"]
    assert about == {"study_title": PUBLIC_TITLE, "study_description": about["study_description"],
                     "principal_investigator": PI, "irb_contact": IRB, "protocol_number": PROTOCOL_NUMBER}
    assert app_client.get("/api/v1/me/consent").json()["current"]["about"]["protocol_number"] == PROTOCOL_NUMBER


def test_participants_never_see_the_internal_title(engine: Engine, app_client: TestClient, example_protocol: str,
                                                   frozen_clock: FrozenClock) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    sign(app_client, shown_to_participant(join(app_client, invite)))
    onboarding = app_client.get("/onboarding").text
    done = app_client.post("/onboarding", data={"csrf": csrf_of(onboarding), "timezone": "Europe/Berlin",
                                                "contact_email": "someone@example.org"}, follow_redirects=False)
    assert done.status_code == 303, done.text
    baseline = done.headers["location"]
    home = shown_to_participant(app_client.get("/").text)
    assert f"<h1>{PUBLIC_TITLE}</h1>" in home
    assert "tell us over the next four" in home  # the public description
    assert PUBLIC_TITLE in shown_to_participant(app_client.get("/me").text)
    for path in ("/consent", "/surveys", baseline, "/chat", "/help", "/api/v1/me", "/api/v1/me/consent",
                 "/api/v1/me/consent/signed", "/api/v1/me/followups"):
        response = app_client.get(path)
        assert response.status_code == 200, (path, response.text)
        shown_to_participant(response.text)

    # The follow-up email: subject and body carry the public title; the survey page it links to neither.
    with smtp_server() as (inbox, port):
        frozen_clock.set(dt.datetime(2026, 3, 9, 12, 0, tzinfo=dt.UTC))
        Dispatcher(engine, Settings(smtp_port=port), name="test").tick()
        inbox.wait_for(1)
    [invitation] = inbox.to("someone@example.org")
    assert PUBLIC_TITLE in str(invitation["Subject"])
    shown_to_participant(str(invitation["Subject"]))
    for part in ("plain", "html"):
        body = invitation.get_body((part,))
        assert body is not None
        assert PUBLIC_TITLE in html.unescape(shown_to_participant(body.get_content()))
    survey = app_client.get(urlsplit(link_in(invitation)).path)
    assert survey.status_code == 200, survey.text
    shown_to_participant(survey.text)

    # Staff still see the internal title.
    token = make_staff(engine, slug, StaffRole.RESEARCHER, "r@example.org")
    studies = app_client.get("/api/v1/staff/studies", headers={"Authorization": f"Bearer {token}"}).json()
    assert studies[0]["title"] == INTERNAL_TITLE
