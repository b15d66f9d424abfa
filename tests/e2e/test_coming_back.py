"""Coming back in a real browser: a participant whose cookie is gone (a new phone: a new browser
context) asks for a sign-in link, receives it on the loopback SMTP server and reaches chat and My
study; the link does not work a second time; without email, the return code gets them back in."""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy as sa
from playwright.sync_api import Browser, expect
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from study.clock import FrozenClock
from study.settings import Settings
from tests.builders import load_study, make_invites, put_in_arm
from tests.e2e.conftest import Camera
from tests.e2e.test_participant_journey import axe_problems, join_and_consent, new_page
from tests.mail import smtp_server

SIGN_IN_LINK = re.compile(r"https?://\S+/sign-in/link/\S+")


def participant_code(engine: Engine) -> str:
    with engine.connect() as connection:
        code: str = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
    return code


def test_a_participant_without_the_cookie_comes_back_by_an_emailed_link_once(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, frozen_clock: FrozenClock,
    artifacts: Path,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    first_phone = new_page(browser)
    join_and_consent(first_phone, live_server, invite)
    first_phone.get_by_label(re.compile("Email for follow-up surveys")).fill("ada@example.org")
    first_phone.get_by_role("button", name="Save and continue").click()
    expect(first_phone.get_by_role("heading", name="PERMA-Profiler")).to_be_visible()
    code = participant_code(engine)
    put_in_arm(engine, code, "wellbeing")
    first_phone.context.close()

    # A new phone: no cookie. Chat sends them home, where they can ask for a link.
    phone = new_page(browser, bypass_csp=True)  # axe runs on the new pages
    camera = Camera(phone, artifacts, "coming-back")
    phone.goto(live_server + "/chat")
    expect(phone.get_by_text("Your session ended.")).to_be_visible()
    expect(phone.get_by_role("heading", name="Already taking part?")).to_be_visible()
    assert axe_problems(phone) == []
    phone.get_by_label("Your email address").fill("Ada@example.org")
    camera.shot("ask-for-link")
    phone.get_by_role("button", name="Email me a sign-in link").click()
    expect(phone.get_by_role("heading", name="Check your email")).to_be_visible()
    expect(phone.get_by_text("a sign-in link is on its way")).to_be_visible()
    camera.shot("check-email")

    with smtp_server() as (inbox, port):
        report = Dispatcher(engine, Settings(smtp_port=port, base_url=live_server), name="e2e").tick()
        assert report.sign_in_sent == 1, report
        [email] = inbox.to("ada@example.org")
    body = email.get_body(("plain",))
    assert body is not None
    [link] = SIGN_IN_LINK.findall(body.get_content())
    assert link.startswith(live_server + "/sign-in/link/")

    phone.goto(link)
    expect(phone.get_by_role("heading", name="Sign in")).to_be_visible()
    assert axe_problems(phone) == []
    camera.shot("confirm")
    phone.get_by_role("button", name="Sign in").click()
    expect(phone.get_by_role("link", name="Start a conversation")).to_be_visible()

    phone.get_by_role("link", name="My study").click()
    expect(phone.get_by_role("heading", name="My study")).to_be_visible()
    expect(phone.get_by_text(code)).to_be_visible()
    expect(phone.get_by_role("heading", name="Signing in again")).to_be_visible()
    camera.shot("my-study")
    phone.get_by_role("link", name="Chat").click()
    phone.get_by_role("button", name="Choose Collaborator").click()
    phone.get_by_label("Your message").fill("Help me plan a calm week")
    phone.get_by_role("button", name="Send").click()
    expect(phone.locator(".msg.assistant .bubble")).to_contain_text("Let's think about")

    # Someone else with the same email (forwarded, or read over a shoulder): the link is used up.
    elsewhere = new_page(browser, bypass_csp=True)
    response = elsewhere.goto(link)
    assert response is not None
    assert response.status == 410
    expect(elsewhere.get_by_text("already used")).to_be_visible()
    expect(elsewhere.get_by_role("button", name="Email me a new sign-in link")).to_be_visible()
    assert axe_problems(elsewhere) == []
    Camera(elsewhere, artifacts, "coming-back-used").shot("refused")
    with engine.connect() as connection:
        actions = connection.execute(sa.text(
            "SELECT action FROM audit_log WHERE action LIKE 'participant.sign%' ORDER BY seq")).scalars().all()
    assert actions == ["participant.sign_in_link_requested", "participant.signed_in"]


def test_a_participant_without_email_comes_back_with_the_return_code(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, frozen_clock: FrozenClock,
    artifacts: Path,
) -> None:
    [invite] = make_invites(engine, load_study(engine, example_protocol))
    first_phone = new_page(browser, bypass_csp=True)
    camera = Camera(first_phone, artifacts, "return-code")
    join_and_consent(first_phone, live_server, invite)
    first_phone.get_by_role("button", name="Save and continue").click()  # no email address

    expect(first_phone.get_by_role("heading", name="Your return code")).to_be_visible()
    return_code = first_phone.locator(".return-code strong").inner_text()
    assert re.fullmatch(r"[A-Z0-9]{4}(-[A-Z0-9]{4}){3}", return_code), return_code
    assert axe_problems(first_phone) == []
    camera.shot("shown-once")
    first_phone.get_by_role("link", name="I have saved it, continue").click()
    expect(first_phone.get_by_role("heading", name="PERMA-Profiler")).to_be_visible()  # the baseline survey
    put_in_arm(engine, participant_code(engine), "wellbeing")
    first_phone.context.close()

    phone = new_page(browser)
    phone.goto(live_server + "/")
    phone.get_by_label("Your return code").fill("ABCD-EFGH-JKMN-PQRS")
    phone.get_by_role("button", name="Sign in with the code").click()
    expect(phone.get_by_role("alert")).to_contain_text("not known")
    phone.get_by_label("Your return code").fill(return_code.lower().replace("-", " "))  # as typed from a note
    camera = Camera(phone, artifacts, "return-code-back")
    camera.shot("enter-code")
    phone.get_by_role("button", name="Sign in with the code").click()
    expect(phone.get_by_role("link", name="Start a conversation")).to_be_visible()
    phone.goto(live_server + "/chat")
    expect(phone.get_by_role("heading", name="How should the assistant work with you?")).to_be_visible()
    phone.goto(live_server + "/me")
    expect(phone.get_by_text("sign in on the home page with the return code")).to_be_visible()

    # Lost it? A new one, shown once; the old one stops working.
    phone.get_by_role("button", name="Make a new return code").click()
    expect(phone.get_by_text("your previous code no longer works")).to_be_visible()
    assert phone.locator(".return-code strong").inner_text() != return_code
    camera.shot("new-code")
    later = new_page(browser)
    later.goto(live_server + "/")
    later.get_by_label("Your return code").fill(return_code)
    later.get_by_role("button", name="Sign in with the code").click()
    expect(later.get_by_role("alert")).to_contain_text("not known")
