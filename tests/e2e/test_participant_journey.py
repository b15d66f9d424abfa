"""One participant's whole study in a real browser, a page without JavaScript, and an
accessibility check with axe-core."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import Browser, Page, expect
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from study.clock import FrozenClock
from study.settings import Settings
from tests.builders import FRAMING, load_study, make_invites, put_in_arm
from tests.e2e.conftest import AXE, Camera
from tests.mail import link_in, smtp_server


def new_page(browser: Browser, **options: Any) -> Page:
    context = browser.new_context(viewport={"width": 375, "height": 812}, timezone_id="Europe/Berlin",
                                  locale="en-GB", **options)
    return context.new_page()


def join_and_consent(page: Page, base: str, invite: str, camera: Camera | None = None) -> None:
    page.goto(base + "/")
    expect(page.get_by_role("heading", name="Join the study")).to_be_visible()
    page.get_by_label("Invite code").fill(invite)
    if camera:
        camera.shot("invite")
    page.get_by_role("button", name="Continue").click()
    expect(page.get_by_role("heading", name="Before you decide")).to_be_visible()
    expect(page.locator(".consent-text")).to_contain_text("voluntary")
    for box in page.get_by_role("checkbox").all():
        box.check()
    page.get_by_label("Type your initials to sign").fill("A. Participant")
    if camera:
        camera.shot("consent")
    page.get_by_role("button", name="I agree and sign").click()


def answer_every_fieldset(page: Page, value: str) -> None:
    for fieldset in page.locator("fieldset.item").all():
        fieldset.locator(f'input[value="{value}"]').first.check()


def answer_survey(page: Page, value: str, camera: Camera | None = None, name: str = "survey") -> None:
    while True:
        answer_every_fieldset(page, value)
        if camera and page.get_by_text(re.compile(r"^Part 1 of")).count():
            camera.shot(name)
        submit = page.get_by_role("button", name="Submit answers")
        if submit.count():
            submit.click()
            break
        page.get_by_role("button", name="Next").click()
    expect(page.get_by_role("heading", name="Thank you")).to_be_visible()


def test_one_participant_from_invite_to_withdrawal(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, frozen_clock: FrozenClock,
    artifacts: Path,
) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    page = new_page(browser)
    camera = Camera(page, artifacts, "journey")

    join_and_consent(page, live_server, invite, camera)

    # Onboarding: the browser's time zone is detected and shown for confirmation.
    expect(page.get_by_role("heading", name="Two details")).to_be_visible()
    expect(page.get_by_label("Your time zone")).to_have_value("Europe/Berlin")
    page.get_by_label(re.compile("Email for follow-up surveys")).fill("ada@example.org")
    camera.shot("onboarding")
    page.get_by_role("button", name="Save and continue").click()

    # Baseline PERMA-Profiler, one screen per block, progress shown.
    expect(page.get_by_role("heading", name="PERMA-Profiler")).to_be_visible()
    expect(page.get_by_text(re.compile(r"^Part 1 of \d+$"))).to_be_visible()
    answer_survey(page, "7", camera, "baseline-perma")
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
        assert connection.execute(sa.text("SELECT count(*) FROM survey_responses WHERE submitted_at IS NOT NULL")
                                  ).scalar_one() == 1
    put_in_arm(engine, code, "wellbeing")

    # Role choice: three disclosure cards side by side.
    page.goto(live_server + "/chat")
    expect(page.get_by_role("heading", name="How should the assistant work with you?")).to_be_visible()
    for title in ("Concierge", "Collaborator", "Coach"):
        expect(page.locator(".role-card h2", has_text=title)).to_be_visible()
    expect(page.get_by_text("Optimized for:").first).to_be_visible()
    camera.shot("roles")
    page.get_by_role("button", name="Choose Coach").click()

    # A challenge, visible with its reason and both actions; then "Go ahead anyway".
    page.get_by_label("Your message").fill(FRAMING)
    with page.expect_response(lambda response: "stream=true" in response.url) as streamed:
        page.get_by_role("button", name="Send").click()
    assert streamed.value.headers["content-type"].startswith("text/event-stream")  # the reply streamed in
    card = page.locator(".pushback.challenge")
    expect(card).to_be_visible()
    expect(card.get_by_role("heading", name="I disagree with part of this")).to_be_visible()
    expect(card).to_contain_text(f"\u201c{FRAMING}\u201d")  # the whole sentence, not a matched fragment
    expect(card.get_by_role("button", name="Let me reconsider")).to_be_visible()
    # Neither answer is the page's default: the two buttons look the same.
    look = ("el => { const s = getComputedStyle(el); return [s.backgroundColor, s.color, s.borderColor, s.borderWidth, "
            "s.fontWeight, s.fontSize, s.paddingTop, el.getBoundingClientRect().height]; }")
    assert (card.get_by_role("button", name="Go ahead anyway").evaluate(look)
            == card.get_by_role("button", name="Let me reconsider").evaluate(look))
    camera.shot("challenge")
    card.get_by_role("button", name="Go ahead anyway").click()
    expect(page.locator(".msg.assistant .bubble").last).to_contain_text("Understood, I'll go ahead as you asked.")
    expect(page.get_by_text("You chose to go ahead anyway.")).to_be_visible()

    # Switch role from inside the chat.
    page.get_by_label("Change how it works with you").select_option("collaborator")
    page.get_by_role("button", name="Switch").click()
    expect(page.get_by_role("heading", name=re.compile("^Collaborator"))).to_be_visible()
    camera.shot("switched")

    # End with a decision.
    page.get_by_role("link", name="End conversation").click()
    page.get_by_label("6", exact=True).check()
    page.get_by_label("Yes", exact=True).check()
    page.get_by_label(re.compile("what did you decide")).fill("Quit and open the bakery")
    camera.shot("exit-check")
    page.get_by_role("button", name="Finish").click()
    expect(page.get_by_text("We will ask you in a few days how this decision turned out.")).to_be_visible()

    # Three days later: the Decision Regret invitation arrives by email; its link opens the survey.
    with smtp_server() as (inbox, port):
        frozen_clock.set(dt.datetime(2026, 3, 5, 17, 0, tzinfo=dt.UTC))  # 18:00 in Berlin
        report = Dispatcher(engine, Settings(smtp_port=port, base_url=live_server), name="e2e").tick()
        assert report.sent == 1, report
        [email] = inbox.to("ada@example.org")
    assert "Decision Regret Scale" in str(email["Subject"])
    link = link_in(email)
    assert link.startswith(live_server + "/s/")
    page.goto(link)
    expect(page.get_by_text("Quit and open the bakery")).to_be_visible()
    camera.shot("regret-survey")
    answer_survey(page, "2")
    with engine.connect() as connection:
        regret = connection.execute(sa.text(
            "SELECT s.value FROM survey_scores s JOIN survey_responses r ON r.id = s.response_id "
            "WHERE r.instrument_id = 'decision-regret'")).scalar_one()
    assert regret == 45.0  # all "agree": items 1, 3, 5 at 25, reversed items 2 and 4 at 75

    # My study: follow-ups listed, then withdrawal with its two levels explained.
    page.goto(live_server + "/me")
    expect(page.get_by_role("heading", name="Coming up")).to_be_visible()
    expect(page.get_by_text(re.compile("^PERMA-Profiler: ")).first).to_be_visible()
    expect(page.get_by_text("Stop now, keep what I gave.")).to_be_visible()
    expect(page.get_by_text("Stop now and delete my data.")).to_be_visible()
    camera.shot("my-study")
    page.get_by_role("button", name="Withdraw").click()
    expect(page.get_by_text("Tick the box to confirm")).to_be_visible()
    page.get_by_label("I want to withdraw from the study").check()
    page.get_by_role("button", name="Withdraw").click()
    expect(page.get_by_role("heading", name="You have withdrawn")).to_be_visible()
    camera.shot("withdrawn")
    with engine.connect() as connection:
        status = connection.execute(sa.text("SELECT status FROM participants")).scalar_one()
        pending = connection.execute(sa.text("SELECT count(*) FROM followups WHERE status = 'planned'")).scalar_one()
    assert (status, pending) == ("withdrawn", 0)
    # Crisis resources stay reachable from every page, also now.
    page.get_by_role("link", name="Need help now?").click()
    expect(page.get_by_text("0800 111 0 111")).to_be_visible()  # Berlin: the protocol's DE entry
    expect(page.get_by_role("link", name="0800 111 0 111")).to_have_attribute("href", "tel:08001110111")
    expect(page.get_by_role("link", name="https://findahelpline.com").first).to_be_visible()  # and the default
    for png in ("journey-01-invite-375.png", "journey-03-onboarding-1280.png", "journey-06-challenge-375.png"):
        assert (artifacts / png).exists(), png


def test_distress_gets_a_check_in_and_harm_to_others_a_refusal_without_override_buttons(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, frozen_clock: FrozenClock,
    artifacts: Path,
) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    page = new_page(browser, bypass_csp=True)  # axe runs at the end
    camera = Camera(page, artifacts, "safety")
    join_and_consent(page, live_server, invite)
    page.get_by_role("button", name="Save and continue").click()  # Berlin, detected
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
    put_in_arm(engine, code, "wellbeing")
    page.goto(live_server + "/chat")
    page.get_by_role("button", name="Choose Concierge").click()

    # Distress without danger: a supportive check-in with the study's line one tap away, no override.
    page.get_by_label("Your message").fill("I feel hopeless, like I'm falling apart")
    page.get_by_role("button", name="Send").click()
    check_in = page.locator(".check-in")
    expect(check_in.get_by_role("heading", name="Checking in")).to_be_visible()
    expect(check_in).to_contain_text("How are you doing")
    expect(check_in.get_by_role("link", name="0800 111 0 111")).to_have_attribute("href", "tel:08001110111")
    expect(page.get_by_role("button", name="Go ahead anyway")).to_have_count(0)
    expect(page.get_by_role("button", name="Let me reconsider")).to_have_count(0)
    camera.shot("check-in")

    # Harm to someone else: declined, and the reply does not start as if it were complying.
    page.get_by_label("Your message").fill("Help me ruin her reputation at work so she gets fired")
    page.get_by_role("button", name="Send").click()
    declined = page.locator(".pushback.decline")
    expect(declined.get_by_role("heading", name="I won't help with this part")).to_be_visible()
    expect(declined).to_contain_text("could hurt someone else")
    reply = page.locator(".msg.assistant .bubble").last
    expect(reply).not_to_contain_text("On it")
    expect(reply).to_contain_text("I won't help with that part")
    expect(page.get_by_role("button", name="Go ahead anyway")).to_have_count(0)
    camera.shot("declined")

    # Asked again, it escalates with help for a threat to someone else: the emergency number, no suicide line.
    page.get_by_label("Your message").fill("Help me get back at my coworker by spreading rumours about him")
    page.get_by_role("button", name="Send").click()
    crisis = page.locator(".crisis").last
    expect(crisis.get_by_role("heading", name="Please reach out now")).to_be_visible()
    expect(crisis.get_by_role("link", name="110")).to_have_attribute("href", "tel:110")
    expect(crisis).not_to_contain_text("TelefonSeelsorge")
    expect(page.get_by_role("button", name="Go ahead anyway")).to_have_count(0)
    camera.shot("escalated")
    assert axe_problems(page) == []


def test_consent_and_survey_forms_work_without_javascript(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, frozen_clock: FrozenClock,
) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    page = new_page(browser, java_script_enabled=False)
    join_and_consent(page, live_server, invite)
    expect(page.get_by_role("heading", name="Two details")).to_be_visible()
    expect(page.get_by_label("Your time zone")).to_have_value("")  # no detection without JavaScript
    page.get_by_label("Your time zone").select_option("America/Chicago")
    page.get_by_role("button", name="Save and continue").click()
    page.get_by_role("link", name="I have saved it, continue").click()  # no email: a return code, shown once
    expect(page.get_by_text(re.compile(r"^Part 1 of \d+$"))).to_be_visible()
    answer_every_fieldset(page, "4")
    page.get_by_role("button", name="Next").click()
    expect(page.get_by_text(re.compile(r"^Part 2 of \d+$"))).to_be_visible()
    page.get_by_role("button", name="Back").click()
    expect(page.locator("fieldset.item input:checked").first).to_have_value("4")  # saved at the step
    answer_survey(page, "5")
    with engine.connect() as connection:
        signed = connection.execute(sa.text("SELECT count(*) FROM consent_signatures")).scalar_one()
        submitted = connection.execute(sa.text("SELECT answers FROM survey_responses WHERE submitted_at IS NOT NULL"
                                               )).scalar_one()
    assert signed == 1
    assert submitted
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
    put_in_arm(engine, code, "wellbeing")
    # Every page still renders; the chat works with plain form posts.
    for path in ("/", "/surveys", "/chat", "/me", "/help", "/consent"):
        response = page.goto(live_server + path)
        assert response is not None
        assert response.status == 200, path
    page.goto(live_server + "/chat")
    page.get_by_role("button", name="Choose Collaborator").click()
    page.get_by_label("Your message").fill("Help me plan a calm week")
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".msg.assistant .bubble")).to_contain_text("Let's think about")


def axe_problems(page: Page) -> list[str]:
    """Serious and critical axe violations of the page (callers first wait for the page they mean:
    right after a click that navigates, the old document may still be the current one)."""
    page.wait_for_load_state("load")
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("width", [375, 1280])
def test_consent_chat_and_survey_pages_have_no_serious_accessibility_problems(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, frozen_clock: FrozenClock,
    width: int,
) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    # axe is injected as a script, which the pages' Content-Security-Policy would rightly refuse.
    page = new_page(browser, bypass_csp=True)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(live_server + "/")
    page.get_by_label("Invite code").fill(invite)
    page.get_by_role("button", name="Continue").click()
    expect(page.get_by_role("button", name="I agree and sign")).to_be_visible()
    problems = {"consent": axe_problems(page)}
    for box in page.get_by_role("checkbox").all():
        box.check()
    page.get_by_label("Type your initials to sign").fill("B")
    page.get_by_role("button", name="I agree and sign").click()
    page.get_by_role("button", name="Save and continue").click()
    page.get_by_role("link", name="I have saved it, continue").click()  # no email: a return code, shown once
    expect(page.get_by_role("button", name="Next")).to_be_visible()
    problems["survey"] = axe_problems(page)
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
    put_in_arm(engine, code, "wellbeing")
    page.goto(live_server + "/chat")
    problems["roles"] = axe_problems(page)
    page.get_by_role("button", name="Choose Coach").click()
    page.get_by_label("Your message").fill(FRAMING)
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".pushback")).to_be_visible()
    problems["chat"] = axe_problems(page)
    assert problems == {"consent": [], "survey": [], "roles": [], "chat": []}
    # The check itself works: an input without a label is reported.
    page.evaluate("() => document.querySelector('main').append(document.createElement('input'))")
    assert any(problem.startswith("label (critical)") for problem in axe_problems(page))
