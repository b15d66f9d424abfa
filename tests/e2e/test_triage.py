"""Triage in a real browser (headless Chromium at 375 px, JavaScript on): three participants each
write a message that shows a risk to themselves and get resources and a short check-in at once.

- One answers "no", once in the message box and then with the buttons: the page says what happens
  next, nothing escalates, the dispatcher's poll pages nobody, and the event waits in the staff
  queue at level check-in, for review later.
- One answers "yeah i have a plan": an escalation, with the crisis resources, and the on-call
  email arrives on the real loopback SMTP server within one dispatcher poll.
- One does not answer: once the injected clock passes the protocol's 30 minutes, the next poll
  makes the check-in unanswered, pages the on-call contact and shows the participant the
  protocol's follow-up.

A clinician then signs in to ``afterward dashboard`` (its own process) and the safety review
queue shows each event with its level. The check-in card passes axe-core and fits the screen."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import sqlalchemy as sa
from playwright.sync_api import Browser, Page, expect
from sqlalchemy.engine import Engine

from chat import triage
from scheduler.dispatcher import Dispatcher
from study.clock import FrozenClock
from study.models import StaffRole
from study.settings import Settings
from tests.builders import load_study, make_invites, make_staff, put_in_arm
from tests.dashboard.conftest import PASSWORD
from tests.e2e.conftest import Camera
from tests.e2e.test_dashboard import wait_for_page
from tests.e2e.test_oncall_link import OVERFLOW, PHONE, dashboard  # noqa: F401 - the dashboard fixture
from tests.e2e.test_participant_journey import axe_problems, join_and_consent
from tests.mail import Inbox, smtp_server
from tests.scheduler.test_oncall import ONCALL, body_of

HOPELESS = "I feel hopeless, like I'm falling apart"
CLINICIAN = "clinician@uni.example"


def checked_in(browser: Browser, base: str, engine: Engine, slug: str, artifacts: Path, name: str) -> tuple[Page,
                                                                                                            Camera]:
    """A new participant of the wellbeing arm, on a phone, whose first message gets a check-in."""
    [invite] = make_invites(engine, slug)
    page = browser.new_context(viewport=PHONE, timezone_id="Europe/Berlin", locale="en-GB",
                               bypass_csp=True).new_page()  # axe is injected as a script
    camera = Camera(page, artifacts, f"triage-{name}")
    join_and_consent(page, base, invite)
    page.get_by_role("button", name="Save and continue").click()  # Berlin, detected; no email
    expect(page.get_by_role("link", name="I have saved it, continue")).to_be_visible()
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants ORDER BY id DESC LIMIT 1")).scalar_one()
    put_in_arm(engine, code, "wellbeing")
    page.goto(base + "/chat")
    page.get_by_role("button", name="Choose Concierge").click()
    page.get_by_label("Your message").fill(HOPELESS)
    page.get_by_role("button", name="Send").click()
    # Resources at once, and the first question of the check-in, with three real buttons.
    expect(page.locator(".check-in").get_by_role("link", name="0800 111 0 111")).to_be_visible()
    card = page.locator("section.triage")
    expect(card.get_by_role("heading", name="A few questions for you")).to_be_visible()
    question = card.get_by_role("group", name=triage.RISK_TO_SELF[0].text)
    for label in ("Yes", "No", "Prefer not to say"):
        expect(question.get_by_role("button", name=label, exact=True)).to_be_visible()
    return page, camera


def levels(engine: Engine) -> list[tuple[int, str, bool]]:
    with engine.connect() as connection:
        return [(row[0], row[1], bool(row[2])) for row in connection.execute(sa.text(
            "SELECT id, level, page_since IS NOT NULL FROM safety_events ORDER BY id"))]


def poll(engine: Engine, port: int, dashboard_url: str) -> Dispatcher:
    return Dispatcher(engine, Settings(smtp_port=port, dashboard_url=dashboard_url), name="e2e")


def answered_no(page: Page, camera: Camera) -> None:
    card = page.locator("section.triage")
    page.get_by_label("Your message").fill("no")  # in words, right after the check-in
    page.get_by_role("button", name="Send").click()
    expect(card.get_by_role("group", name=triage.RISK_TO_SELF[1].text)).to_be_visible()
    expect(card).to_contain_text("(from your message)")
    camera.shot("second-question")
    card.get_by_role("button", name="No", exact=True).click()  # thoughts: then only recent behaviour is asked
    expect(card.get_by_role("group", name=triage.RISK_TO_SELF[5].text)).to_be_visible()
    expect(card).to_contain_text("Question 3 of 3")
    card.get_by_role("button", name="No", exact=True).click()
    next_step = card.locator(".next-step")
    expect(next_step.get_by_role("heading", name="What happens next")).to_be_visible()
    expect(next_step).to_contain_text("look over this check-in later")
    expect(card.get_by_role("button")).to_have_count(0)
    expect(page.locator(".crisis")).to_have_count(0)  # nothing escalated
    camera.shot("answered-no")


def test_a_check_in_answered_no_one_with_a_plan_and_one_unanswered_each_reach_staff_at_their_level(
    browser: Browser, live_server: str, engine: Engine, example_protocol: str, frozen_clock: FrozenClock,
    dashboard: str, artifacts: Path,  # noqa: F811 - the dashboard fixture
) -> None:
    slug = load_study(engine, example_protocol)
    make_staff(engine, slug, StaffRole.RESEARCHER, CLINICIAN)
    inbox: Inbox
    with smtp_server() as (inbox, port):
        # 1. "No": the answers settle it at level check-in; the poll pages nobody.
        first, camera = checked_in(browser, live_server, engine, slug, artifacts, "no")
        camera.shot("check-in")
        assert axe_problems(first) == []
        assert first.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        assert first.evaluate(OVERFLOW) == []
        answered_no(first, camera)
        assert axe_problems(first) == []
        report = poll(engine, port, dashboard).tick()
        assert (report.notified, report.errors) == (0, [])  # the poll is over: it sent nothing
        assert inbox.to(ONCALL) == []
        assert levels(engine) == [(1, "check_in", False)]

        # 2. "Yeah i have a plan": an escalation, and the on-call email within one poll.
        frozen_clock.advance(dt.timedelta(minutes=1))
        second, camera = checked_in(browser, live_server, engine, slug, artifacts, "plan")
        second.get_by_label("Your message").fill("yeah i have a plan")
        second.get_by_role("button", name="Send").click()
        crisis = second.locator(".crisis").last
        expect(crisis.get_by_role("heading", name="Please reach out now")).to_be_visible()
        expect(crisis.get_by_role("link", name="0800 111 0 111")).to_be_visible()
        expect(second.locator(".msg.assistant .bubble").last).to_contain_text("on-call team is being told")
        expect(second.locator("section.triage .next-step")).to_contain_text("on-call team is being told")
        camera.shot("plan")
        assert axe_problems(second) == []
        assert levels(engine)[1] == (2, "escalation", True)
        report = poll(engine, port, dashboard).tick()
        assert (report.notified, report.errors) == (1, [])
        [escalation] = inbox.to(ONCALL)  # kept by the server before it answered: here when the poll returns
        assert str(escalation["Subject"]).startswith("Safety escalation (risk to self)")
        assert f"{dashboard}/safety?study={slug}&event=2" in body_of(escalation)
        assert "plan" not in body_of(escalation)

        # 3. Unanswered: past the deadline the next poll pages and the participant sees the follow-up.
        frozen_clock.advance(dt.timedelta(minutes=1))
        third, camera = checked_in(browser, live_server, engine, slug, artifacts, "unanswered")
        frozen_clock.advance(dt.timedelta(minutes=29))
        report = poll(engine, port, dashboard).tick()
        assert (report.unanswered, report.notified) == (0, 0)  # not due yet: nothing happened in this poll
        frozen_clock.advance(dt.timedelta(minutes=1, seconds=1))
        report = poll(engine, port, dashboard).tick()
        assert (report.unanswered, report.notified, report.errors) == (1, 1, [])
        unanswered = inbox.to(ONCALL)[-1]
        assert str(unanswered["Subject"]).startswith("Unanswered safety check-in (risk to self)")
        third.reload()
        follow_up = third.locator("section.triage .notice")
        expect(follow_up).to_have_text(triage.FOLLOW_UP)
        expect(third.locator("section.triage").get_by_role("button", name="Yes", exact=True)).to_be_visible()
        camera.shot("follow-up")
        assert levels(engine)[2] == (3, "unanswered", True)
        assert len(inbox.to(ONCALL)) == 2

    # The staff queue: each event at its level.
    staff = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-GB").new_page()
    staff.goto(f"{dashboard}/safety")
    wait_for_page(staff, "Afterward staff dashboard")
    staff.get_by_role("textbox", name="Email").fill(CLINICIAN)
    staff.get_by_role("textbox", name="Password").fill(PASSWORD)
    staff.get_by_role("button", name="Sign in").click()
    wait_for_page(staff, "Safety review")  # signed in where the address asked
    expect(staff.get_by_text("3 safety event(s) wait for review, newest first.")).to_be_visible()
    expect(staff.get_by_text("Level: unanswered check-in (paging)")).to_be_visible()  # the newest, chosen
    staff.get_by_role("combobox", name="Event to review").click()
    options = staff.get_by_role("option")
    expect(options).to_have_count(3)
    labels = [re.sub(r"\s+", " ", text) for text in options.all_inner_texts()]
    assert [label.split(" · ")[:2] for label in labels] == [
        ["#3", "unanswered check-in"], ["#2", "escalation"], ["#1", "check-in"]]
    options.filter(has_text="#1 · check-in").click()
    wait_for_page(staff, "Safety review")
    expect(staff.get_by_text("Level: check-in", exact=True)).to_be_visible()
    expect(staff.get_by_text("answered · the answers say: all no")).to_be_visible()
    staff.screenshot(path=artifacts / "triage-staff-queue-1280.png", full_page=True)
    staff.context.close()
