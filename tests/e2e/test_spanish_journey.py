"""A participant's whole journey in the second language, in a real browser set to Spanish: the
invite, the consent in Spanish (signed in Spanish), onboarding, the baseline GAD-7 in the study
team's translation (a test fixture here), the role cards and a pushback in the chat, My study, the
language menu, and the follow-up email in Spanish from a real SMTP server, whose link opens the
Spanish survey. Screenshots of each step at phone and desktop width (tests/e2e/artifacts/spanish-*)."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path

import sqlalchemy as sa
from playwright.sync_api import Browser, expect
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from study import i18n
from study.clock import FrozenClock
from study.settings import Settings
from tests.builders import (
    FRAMING,
    SPANISH_CONSENT,
    SPANISH_STUDY,
    bilingual,
    load_spanish_gad7,
    load_study,
    make_invites,
    put_in_arm,
)
from tests.e2e.conftest import Camera
from tests.mail import link_in, smtp_server


def es(text: str, **values: object) -> str:
    """``text`` as the Spanish catalog has it (a test that the page shows it, not the English)."""
    translated = i18n.gettext("es", text, **values)
    assert translated != text % values if values else translated != text, f"not translated: {text!r}"
    return translated


def test_the_whole_journey_in_spanish(browser: Browser, live_server: str, engine: Engine, example_protocol: str,
                                      frozen_clock: FrozenClock, artifacts: Path) -> None:
    load_spanish_gad7(engine)
    slug = load_study(engine, bilingual(example_protocol))
    [invite] = make_invites(engine, slug)
    context = browser.new_context(viewport={"width": 375, "height": 812}, timezone_id="Europe/Madrid",
                                  locale="es-ES")  # the browser asks for Spanish (Accept-Language: es-ES)
    page = context.new_page()
    camera = Camera(page, artifacts, "spanish")

    page.goto(live_server + "/")
    expect(page.locator("html")).to_have_attribute("lang", "es")
    expect(page.get_by_role("heading", name=es("Join the study"))).to_be_visible()
    page.get_by_label(es("Invite code")).fill(invite)
    camera.shot("invite")
    page.get_by_role("button", name=es("Continue"), exact=True).click()

    # The consent in Spanish, signed in Spanish.
    expect(page.get_by_role("heading", name=es("Before you decide"))).to_be_visible()
    expect(page.locator(".consent-text")).to_contain_text("Participar en el piloto de Afterward")
    expect(page.locator(".study-name")).to_have_text(SPANISH_STUDY["public_title"])
    expect(page.get_by_label("Tengo 18 años o más.")).to_be_visible()
    for box in page.get_by_role("checkbox").all():
        box.check()
    page.get_by_label(es("Type your initials to sign")).fill("A. P.")
    camera.shot("consent")
    page.get_by_role("button", name=es("I agree and sign")).click()
    with engine.connect() as connection:
        language, digest = connection.execute(sa.text(
            "SELECT language, signed_text_sha256 FROM consent_signatures")).one()
    assert (language, digest) == ("es", hashlib.sha256(SPANISH_CONSENT["text"].encode()).hexdigest())

    expect(page.get_by_role("heading", name=es("Two details"))).to_be_visible()
    page.get_by_label(re.compile(re.escape(es("Email for follow-up surveys")))).fill("ana@example.org")
    camera.shot("onboarding")
    page.get_by_role("button", name=es("Save and continue")).click()

    # The baseline GAD-7 in the study team's Spanish translation.
    expect(page.get_by_text("Dificultad para relajarte")).to_be_visible()
    camera.shot("baseline")
    while True:  # a screen per block
        for fieldset in page.locator("fieldset.item").all():
            fieldset.locator('input[value="1"], input[value="somewhat"]').first.check()
        submit = page.get_by_role("button", name=es("Submit answers"))
        if submit.count():
            submit.click()
            break
        page.get_by_role("button", name=es("Next")).click()
    expect(page.get_by_role("heading", name=es("Thank you"))).to_be_visible()
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
        assert connection.execute(sa.text("SELECT language FROM survey_responses")).scalar_one() == "es"
    put_in_arm(engine, code, "wellbeing")

    # The role cards and a pushback, in Spanish.
    page.goto(live_server + "/chat")
    expect(page.get_by_role("heading", name=es("How should the assistant work with you?"))).to_be_visible()
    expect(page.locator(".role-card h2", has_text=es("Collaborator"))).to_be_visible()
    expect(page.get_by_text(es("Decide for you")).first).to_be_visible()
    camera.shot("roles")
    page.get_by_role("button", name=es("Choose %(role)s", role=i18n.gettext("es", "Coach"))).click()  # "Coach" in both
    page.get_by_label(es("Your message")).fill(FRAMING)
    page.get_by_role("button", name=es("Send")).click()
    card = page.locator(".pushback.challenge")
    expect(card.get_by_role("heading", name=es("I disagree with part of this"))).to_be_visible()
    expect(card.get_by_role("button", name=es("Go ahead anyway"))).to_be_visible()
    camera.shot("chat")

    # My study, then the language menu: English, and back.
    page.goto(live_server + "/me")
    expect(page.get_by_role("heading", name=es("Stop taking part"))).to_be_visible()
    expect(page.locator("section[aria-labelledby=upcoming] li")).to_have_text(  # the week-1 GAD-7, in Spanish
        "GAD-7: " + es("around %(day)s", day="9 de marzo"))
    camera.shot("my-study")
    page.get_by_label(es("Language")).select_option("en")
    page.get_by_role("button", name=es("Change language")).click()
    expect(page.get_by_role("heading", name="Stop taking part")).to_be_visible()
    expect(page.locator("html")).to_have_attribute("lang", "en")
    page.get_by_label("Language").select_option("es")
    page.get_by_role("button", name="Change language").click()
    expect(page.get_by_role("heading", name=es("Stop taking part"))).to_be_visible()
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT language FROM participants")).scalar_one() == "es"

    # A week later the follow-up arrives by email, in Spanish; its link opens the Spanish survey.
    with smtp_server() as (inbox, port):
        frozen_clock.set(dt.datetime(2026, 3, 9, 9, 5, tzinfo=dt.UTC))  # 10:05 in Madrid
        report = Dispatcher(engine, Settings(smtp_port=port, base_url=live_server), name="e2e").tick()
        assert report.sent == 1, report
        [email] = inbox.to("ana@example.org")
    assert f"GAD-7 ({SPANISH_STUDY['public_title']})" in str(email["Subject"])  # the study's Spanish title
    assert email["Content-Language"] == "es"
    body = email.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert es("It's time for a short follow-up survey in the study you joined.") in body
    assert "de marzo de 2026" in body  # the window's end, written in Spanish
    assert "Hello" not in body
    page.goto(link_in(email))
    expect(page.get_by_text("Sentir miedo, como si algo terrible fuera a pasar")).to_be_visible()
    camera.shot("follow-up")
    for png in ("spanish-01-invite-375.png", "spanish-02-consent-1280.png", "spanish-06-chat-375.png",
                "spanish-08-follow-up-1280.png"):
        assert (artifacts / png).exists(), png
