"""How the pages look on a 375 px phone: answer scales in even rows, chat bubbles on the speaker's side with a
marker where the role changed, My study naming instruments and decisions once; and the API explorer working
with no internet (the test browser has none)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import sqlalchemy as sa
from playwright.sync_api import Browser, Locator, Page, expect
from sqlalchemy.engine import Engine

from tests.builders import assign_survey, load_study, make_invites, put_in_arm
from tests.e2e.conftest import Camera
from tests.e2e.test_participant_journey import answer_survey, join_and_consent, new_page

DECISION = "Quit and open the bakery"
Box = tuple[float, float, float, float]  # left, top, width, height


def boxes(locator: Locator) -> list[Box]:
    found: list[list[float]] = locator.evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })")
    return [(left, top, width, height) for left, top, width, height in found]


def assert_no_sideways_scroll(page: Page) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]  # type: ignore[index]


def assert_even_grid(scale: Locator) -> int:
    """The scale's points are equal cells in aligned columns, every row full but the last; returns the columns."""
    points = boxes(scale.locator(".point"))
    assert max(w for _, _, w, _ in points) - min(w for _, _, w, _ in points) <= 1, points
    rows: dict[int, list[Box]] = defaultdict(list)
    for point in points:
        rows[round(point[1])].append(point)
    ordered = [sorted(row) for _, row in sorted(rows.items())]
    columns = len(ordered[0])
    assert all(len(row) == columns for row in ordered[:-1]), ordered
    for row in ordered[1:]:
        assert all(abs(a[0] - b[0]) <= 1 for a, b in zip(row, ordered[0], strict=False)), ordered
    return columns


def assert_one_option_per_line(scale: Locator) -> None:
    [(left, _, width, _)] = boxes(scale)
    points = boxes(scale.locator(".point"))
    assert len({round(top) for _, top, _, _ in points}) == len(points)  # each on its own line
    assert all(abs(x - left) <= 1 and abs(w - width) <= 1 for x, _, w, _ in points), (left, width, points)


def test_pages_at_375_px(browser: Browser, live_server: str, engine: Engine, example_protocol: str,
                         artifacts: Path) -> None:
    slug = load_study(engine, example_protocol)
    [invite] = make_invites(engine, slug)
    page = new_page(browser)
    camera = Camera(page, artifacts, "layout")
    join_and_consent(page, live_server, invite)
    page.get_by_label(re.compile("Email for follow-up surveys")).fill("ada@example.org")
    page.get_by_role("button", name="Save and continue").click()

    # PERMA-Profiler's 0-10: eleven equal cells in full rows (two rows on a phone, one on a desktop).
    expect(page.get_by_role("heading", name="PERMA-Profiler")).to_be_visible()
    scales = page.locator("fieldset.item .scale")
    assert scales.count() > 1
    for i in range(scales.count()):
        assert assert_even_grid(scales.nth(i)) == 6
    assert_no_sideways_scroll(page)
    camera.shot("perma")
    page.set_viewport_size({"width": 1280, "height": 900})
    assert assert_even_grid(scales.first) == 11
    page.set_viewport_size({"width": 375, "height": 812})
    answer_survey(page, "7")
    with engine.connect() as connection:
        code = connection.execute(sa.text("SELECT code FROM participants")).scalar_one()
    put_in_arm(engine, code, "wellbeing")

    # Chat: the participant on the right, the assistant on the left, and a line where the role changed.
    page.goto(live_server + "/chat")
    page.get_by_role("button", name="Choose Coach").click()
    page.get_by_label("Your message").fill("Should I move to another city for a job?")
    page.get_by_role("button", name="Send").click()
    reply_shown = page.locator("li.msg.assistant[data-latest]")  # once the page reloaded with the stored reply
    expect(reply_shown).to_have_attribute("id", "turn-2")
    page.get_by_label("Change how it works with you").select_option("collaborator")
    page.get_by_role("button", name="Switch").click()
    expect(page.get_by_role("heading", name=re.compile("^Collaborator"))).to_be_visible()
    page.get_by_label("Your message").fill("What would I be giving up?")
    page.get_by_role("button", name="Send").click()
    expect(reply_shown).to_have_attribute("id", "turn-4")
    items = page.locator("[data-messages] > li")
    kinds = items.evaluate_all("els => els.map(e => e.className)")
    assert kinds == ["msg participant", "msg assistant", "role-change", "msg participant", "msg assistant"], kinds
    expect(items.nth(2)).to_have_text("You switched the assistant from Coach to Collaborator")
    [(list_left, _, list_width, _)] = boxes(page.locator("[data-messages]"))
    for left, _, width, _ in boxes(page.locator(".msg.participant .bubble")):
        assert abs(left + width - (list_left + list_width)) <= 1  # flush right
        assert left > list_left + 0.1 * list_width  # and not across the whole width
    for left, _, width, _ in boxes(page.locator(".msg.assistant .bubble")):
        assert abs(left - list_left) <= 1  # flush left
        assert left + width < list_left + list_width - 0.1 * list_width
    assert_no_sideways_scroll(page)
    camera.shot("chat")

    # The exit check's 1-7: the same even grid, its two end words in the legend.
    page.get_by_role("link", name="End conversation").click()
    assert assert_even_grid(page.locator(".scale.numbers")) == 7
    expect(page.locator(".scale-legend")).to_have_text("1 = Not at all7 = Extremely")
    page.get_by_label("1 Not at all").check()  # the words are still each point's accessible name
    page.get_by_label("Yes", exact=True).check()
    page.get_by_label(re.compile("what did you decide")).fill(DECISION)
    assert_no_sideways_scroll(page)
    camera.shot("exit-check")
    page.get_by_role("button", name="Finish").click()
    expect(page.get_by_text("We will ask you in a few days how this decision turned out.")).to_be_visible()

    # My study: the instrument's title, and the decision once for its two regret follow-ups.
    page.goto(live_server + "/me")
    upcoming = page.locator("section[aria-labelledby=upcoming] li")
    expect(upcoming).to_have_count(2)  # soonest first: regret after 3 days, PERMA after 7
    expect(upcoming.first).to_have_text(re.compile(
        rf"^Decision Regret Scale about your decision “{DECISION}”: around \d+ \w+, then around \d+ \w+$"))
    expect(upcoming.nth(1)).to_have_text(re.compile(r"^PERMA-Profiler: around \d+ \w+, then around \d+ \w+$"))
    assert page.locator("main").inner_text().count(DECISION) == 1
    expect(page.get_by_text("Perma profiler")).to_have_count(0)
    camera.shot("my-study")

    # The Decision Regret Scale's 1-5 agreement: every point worded, so one full-width option per line.
    survey = assign_survey(engine, code, "decision-regret", context={"decision": DECISION})
    page.goto(f"{live_server}/surveys/{survey}")
    scales = page.locator("fieldset.item .scale")
    assert scales.count() == 5
    for i in range(scales.count()):
        assert_one_option_per_line(scales.nth(i))
    expect(page.get_by_label("Neither agree nor disagree").first).to_be_visible()
    assert_no_sideways_scroll(page)
    camera.shot("regret")


def test_the_api_explorer_works_offline(browser: Browser, live_server: str) -> None:
    page = new_page(browser)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(live_server + "/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Afterward")
    expect(page.locator(".opblock").first).to_be_visible()
    page.goto(live_server + "/redoc")
    expect(page.get_by_role("heading", name=re.compile("^Afterward"))).to_be_visible()
    assert requested
    # Nothing asked of anyone else (ReDoc's logo, which its script takes from a CDN, is served from here).
    assert [url for url in requested if not url.startswith((live_server, f"blob:{live_server}"))] == []
