"""The on-call email's link on a phone: a participant's message escalates, the dispatcher sends the
notice to the real loopback SMTP server, and a clinician opens its link in headless Chromium at
375 px (``afterward dashboard`` as its own process), signs in and lands on the event: its category,
the turns before and after the flagged one, the review form, and nothing wider than the screen. A
staff member of another study following the same link sees nothing of it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, Page, ViewportSize, expect
from sqlalchemy.engine import Engine

from scheduler.dispatcher import Dispatcher
from study.models import StaffRole
from study.settings import Settings
from tests.builders import load_study, make_staff
from tests.dashboard.conftest import PASSWORD
from tests.dashboard.test_oncall_link import also_in
from tests.e2e.test_dashboard import wait_for_page
from tests.mail import free_port, smtp_server
from tests.scheduler.test_oncall import CRISIS, EARLIER, ONCALL, body_of, escalate
from tests.waiting import WAIT_SECONDS, answers, until

AFTERWARD = Path(sys.executable).parent / "afterward"
CLINICIAN = "clinician@uni.example"
OUTSIDER = "outsider@other.example"
PHONE: ViewportSize = {"width": 375, "height": 812}

# Every element that reaches past the right edge of the screen, or scrolls sideways within it.
OVERFLOW = """() => [...document.querySelectorAll('body *')].filter(e => {
    const box = e.getBoundingClientRect();
    if (box.width === 0 || box.height === 0 || box.right <= 0) return false;  // not shown, or a closed sidebar
    const style = getComputedStyle(e);
    const scrolls = ['auto', 'scroll'].includes(style.overflowX) && e.scrollWidth > e.clientWidth + 1;
    return box.right > innerWidth + 1 || scrolls;
}).map(e => `${e.tagName.toLowerCase()}[data-testid=${e.dataset.testid}] ${e.className}`.slice(0, 160))"""


@pytest.fixture
def dashboard(engine: Engine, tmp_path: Path) -> Iterator[str]:
    """``afterward dashboard`` on a free port, reading this test's database."""
    port = free_port()
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "AFTERWARD_AUDIT_ANCHOR_PATH": str(tmp_path / "anchors.jsonl")}
    log_path = tmp_path / "dashboard.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([str(AFTERWARD), "dashboard", "--port", str(port)], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            until(lambda: answers(f"{base}/_stcore/health"), "the dashboard to start", processes=[process])
            yield base
        finally:
            process.terminate()
            try:
                process.wait(WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@pytest.fixture
def emailed_link(engine: Engine, app_client: TestClient, example_protocol: str, dashboard: str) -> str:
    """The link of the on-call email about one escalation, as the clinician's mailbox received it."""
    slug = load_study(engine, example_protocol)
    make_staff(engine, slug, StaffRole.RESEARCHER, CLINICIAN)
    other = load_study(engine, example_protocol.replace("id: wellbeing-pilot", "id: other-study", 1))
    also_in(engine, other, CLINICIAN)  # listed first: the link chooses the event's study
    make_staff(engine, other, StaffRole.RESEARCHER, OUTSIDER)
    escalate(engine, app_client, slug)
    with smtp_server() as (inbox, port):
        settings = Settings(smtp_port=port, dashboard_url=dashboard)
        assert Dispatcher(engine, settings, name="e2e").tick().notified == 1
        [message] = inbox.to(ONCALL)
    [link] = re.findall(r"https?://\S+", body_of(message))
    assert link.startswith(f"{dashboard}/safety?")
    return link


def open_and_sign_in(browser: Browser, link: str, email: str) -> Page:
    page = browser.new_context(viewport=PHONE, locale="en-GB", is_mobile=True, has_touch=True).new_page()
    page.goto(link)
    wait_for_page(page, "Afterward staff dashboard")
    expect(page.get_by_text("Page not found")).to_have_count(0)
    page.get_by_role("textbox", name="Email").fill(email)
    page.get_by_role("textbox", name="Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    return page


def test_the_emailed_link_opens_the_event_on_a_phone(browser: Browser, emailed_link: str, artifacts: Path) -> None:
    event_id = int(emailed_link.rsplit("=", 1)[1])
    page = browser.new_context(viewport=PHONE, locale="en-GB", is_mobile=True, has_touch=True).new_page()
    page.goto(emailed_link)
    wait_for_page(page, "Afterward staff dashboard")
    expect(page.get_by_text(f"Sign in to open safety event #{event_id}.")).to_be_visible()
    page.context.close()

    page = open_and_sign_in(browser, emailed_link, CLINICIAN)
    wait_for_page(page, "Safety review")
    expect(page.get_by_role("heading", name=f"Safety event #{event_id}")).to_be_visible()
    expect(page.get_by_text("risk to self", exact=False).first).to_be_visible()
    expect(page.get_by_text(EARLIER, exact=True)).to_be_visible()  # the participant's turn before the flagged one
    expect(page.get_by_text(CRISIS, exact=True)).to_be_visible()
    expect(page.get_by_text("⚠ triggered the event")).to_be_visible()
    expect(page.get_by_role("textbox", name="What was done")).to_be_visible()
    expect(page.get_by_role("button", name="Record review")).to_be_visible()
    page.screenshot(path=artifacts / "oncall-link-event-375.png", full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert page.evaluate(OVERFLOW) == []
    page.context.close()


def test_a_staff_member_of_another_study_sees_nothing_of_the_event(browser: Browser, emailed_link: str) -> None:
    page = open_and_sign_in(browser, emailed_link, OUTSIDER)
    wait_for_page(page, "Safety review")
    expect(page.get_by_text(f"your account ({OUTSIDER}) has no role", exact=False)).to_be_visible()
    expect(page.get_by_text("No safety event waits for review.")).to_be_visible()  # their own study's queue
    expect(page.get_by_text(CRISIS)).to_have_count(0)
    expect(page.get_by_text(EARLIER)).to_have_count(0)
    page.context.close()
