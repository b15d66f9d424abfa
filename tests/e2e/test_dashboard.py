"""The staff dashboard in headless Chromium: ``afterward dashboard`` as its own process on a
simulated study, signed in as an admin, every page opened and photographed at 1280 px; axe-core
finds no serious or critical problem on the sign-in page."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy.engine import Engine

from analysis import fits
from analysis.simulation.simulate import load_simulated_study, simulate
from study import audit
from study.models import StaffRole
from tests.builders import make_staff
from tests.dashboard.conftest import PASSWORD
from tests.e2e.test_participant_journey import axe_problems
from tests.mail import free_port
from tests.waiting import WAIT_SECONDS, answers, until

AFTERWARD = Path(sys.executable).parent / "afterward"
PAGES = ["Overview", "Enrollment", "Follow-ups", "Outcomes", "Conversations → outcomes", "Safety review",
         "Conversations", "Data quality", "Exports"]
EMAIL = "admin@uni.example"


@pytest.fixture
def dashboard(engine: Engine, example_protocol: str, tmp_path: Path) -> Iterator[str]:
    """``afterward dashboard`` on a free port, reading a study of 30 simulated participants with
    its models fitted."""
    slug = load_simulated_study(engine, example_protocol)
    # On a thread of its own: the simulation runs an event loop, and Playwright's runs on this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(simulate, engine, slug, participants=30, weeks=4, seed=3, tick_minutes=240).result()  # ends now
    make_staff(engine, slug, StaffRole.ADMIN, EMAIL)
    fit_id = fits.request_fit(engine, slug, requested_by=audit.Actor("staff", EMAIL))  # the models pages show it
    assert fit_id is not None
    fits.run_fit(engine, fit_id)
    port = free_port()
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "AFTERWARD_AUDIT_ANCHOR_PATH": str(tmp_path / "anchors.jsonl")}
    log = (tmp_path / "dashboard.log").open("w")
    process = subprocess.Popen([str(AFTERWARD), "dashboard", "--port", str(port)], env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        until(lambda: answers(f"{base}/_stcore/health"), "the dashboard to start", processes=[process])
    except AssertionError:
        process.kill()
        raise RuntimeError("the dashboard did not start: " + (tmp_path / "dashboard.log").read_text()) from None
    yield base
    process.terminate()
    try:
        process.wait(WAIT_SECONDS)  # Streamlit's shutdown can take a while on a loaded machine; then stop it hard
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    log.close()


def wait_for_page(page: Page, title: str) -> None:
    expect(page.get_by_role("heading", name=title, exact=True).first).to_be_visible(timeout=120_000)
    # Streamlit shows "Running..." in its status widget while the script runs.
    expect(page.get_by_test_id("stStatusWidget")).to_have_count(0, timeout=120_000)
    expect(page.get_by_test_id("stException")).to_have_count(0)
    # Altair charts are drawn after the page's elements arrive: wait for each to have its canvas.
    page.wait_for_function("() => [...document.querySelectorAll('[data-testid=stVegaLiteChart]')]"
                           ".every(chart => chart.querySelector('canvas, svg'))", timeout=60_000)
    # Nothing left from the previous run of the script (faded while stale) or still loading.
    expect(page.locator("[data-stale=true]")).to_have_count(0)
    expect(page.get_by_test_id("stSkeleton")).to_have_count(0)


def test_sign_in_and_every_page(browser: Browser, dashboard: str, artifacts: Path) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-GB", bypass_csp=True)
    page = context.new_page()
    page.goto(dashboard)
    wait_for_page(page, "Afterward staff dashboard")
    assert axe_problems(page) == []
    page.screenshot(path=artifacts / "dashboard-00-sign-in-1280.png", full_page=True)
    page.get_by_role("textbox", name="Email").fill(EMAIL)
    page.get_by_role("textbox", name="Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("email or password is wrong")).to_be_visible(timeout=30_000)
    page.get_by_role("textbox", name="Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    wait_for_page(page, "Overview")
    for number, title in enumerate(PAGES, start=1):
        page.get_by_test_id("stSidebarNav").get_by_role("link", name=title, exact=True).click()
        wait_for_page(page, title)
        expect(page.get_by_test_id("stAlertContentError")).to_have_count(0)
        if title == "Conversations → outcomes":  # the stored fit's tables, not a fit running meanwhile
            expect(page.get_by_text("Models fitted at").first).to_be_visible(timeout=120_000)
            expect(page.get_by_text("running in the background")).to_have_count(0)
        elif title not in ("Conversations", "Exports"):
            expect(page.get_by_text("Refreshed at").first).to_be_visible(timeout=120_000)
        name = title.lower().replace(" → ", "-").replace(" ", "-")
        page.screenshot(path=artifacts / f"dashboard-{number:02d}-{name}-1280.png", full_page=True)
    context.close()
