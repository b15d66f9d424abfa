"""The analysis report as a reviewer opens it: a study simulated through the real services with its
analysis plan frozen first, ``afterward plan freeze`` then ``afterward analyze``, the page opened in
headless Chromium, and each section (the plan, the participants and their flow, every model, the
diagnostics, the sensitivity analyses, the methods) found, visible, not empty, holding its figures,
and photographed on its own (tests/e2e/artifacts/report-sections/)."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from playwright.sync_api import Browser, expect
from typer.testing import CliRunner

from analysis.simulation.simulate import load_simulated_study, simulate
from api.cli import app
from study import clock
from study.db import session_scope
from study.models import StaffRole, Study
from study.settings import get_settings
from tests.builders import make_staff
from tests.conftest import EXAMPLE, module_database
from tests.e2e.conftest import ARTIFACTS

START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
WEEKS = 6  # the week-4 follow-up closed for most: two waves, so an arm x time effect to check
RESEARCHER = "researcher@uni.example"
runner = CliRunner()

# Each section: its element, and the plots (data-plot) it must hold; None: a section with no figure.
SECTIONS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "plan": ("#plan", None),
    "participants": ("#participants", None),
    "flow": ("#participant-flow", None),
    "headline": ("#headline", ("headline",)),
    "perma": ("#perma", ("trajectory-overall_wellbeing", "trajectory-positive_emotion")),
    "regret": ("#regret", None),
    "screen": ("#screen", ("forest-regret",)),
    "dropout": ("#dropout", ("kaplan-meier",)),
    "subgroups": ("#subgroups", ("subgroups-",)),
    "diagnostics": ("#diagnostics", ("diagnostics-perma-overall_wellbeing", "diagnostics-perma-positive_emotion",
                                     "diagnostics-regret-regret")),
    "sensitivity": ("#sensitivity", ("tipping-wellbeing",)),
    "methods": ("#methods", None),
}


@dataclass(frozen=True)
class Reported:
    report: Path
    output: str


@pytest.fixture(scope="module")
def reported(database_template: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reported]:
    """The example protocol as a simulated study, its plan frozen before any outcome exists, 60
    participants over six weeks through the services, then the report written by the command line."""
    folder = tmp_path_factory.mktemp("sections")
    engine = module_database(database_template, folder)
    slug = load_simulated_study(engine, EXAMPLE.read_text(encoding="utf-8"))
    with session_scope(engine) as session:  # the arms come from the study's randomization: fix it
        session.execute(sa.update(Study).where(Study.slug == slug).values(allocation_seed="report-e2e"))
    make_staff(engine, slug, StaffRole.RESEARCHER, RESEARCHER)
    plan = folder / "plan.yaml"
    plan.write_text(EXAMPLE.with_name("wellbeing-pilot.plan.yaml").read_text(encoding="utf-8")
                    .replace("study: wellbeing-pilot", f"study: {slug}"), encoding="utf-8")
    report = folder / "report.html"
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
            get_settings.cache_clear()
            frozen = runner.invoke(app, ["plan", "freeze", slug, str(plan), "--as", RESEARCHER])
            assert frozen.exit_code == 0, frozen.output
            simulate(engine, slug, participants=60, weeks=WEEKS, seed=11, start=START, tick_minutes=120)
            previous = clock.set_clock(clock.FrozenClock(START + dt.timedelta(weeks=WEEKS)))
            try:
                result = runner.invoke(app, ["analyze", slug, "--out", str(report), "--as", RESEARCHER,
                                             "--bootstrap", "100"])
            finally:
                clock.set_clock(previous)
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    yield Reported(report, result.output)
    engine.dispose()


def test_each_section_of_the_report_is_there_visible_and_holds_its_figures(reported: Reported,
                                                                            browser: Browser) -> None:
    folder = ARTIFACTS / "report-sections"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(reported.report.as_uri(), wait_until="load")
    assert problems == []

    # In the order a reader meets them, each in the contents.
    ids = page.locator("main > section").evaluate_all("(sections) => sections.map((s) => s.id)")
    assert ids == ["plan", "participants", "headline", "perma", "regret", "screen", "dropout", "subgroups",
                   "diagnostics", "sensitivity", "methods"]
    for section in ids:
        expect(page.locator(f'nav a[href="#{section}"]')).to_have_count(1)

    for name, (selector, plots) in SECTIONS.items():
        section = page.locator(selector)
        expect(section).to_have_count(1)
        section.scroll_into_view_if_needed()
        expect(section).to_be_visible()
        text = section.inner_text()
        assert len(text) > 200, (name, text)
        assert "Not estimated" not in text, (name, text[:500])
        assert "Not computed" not in text, (name, text[:500])
        box = section.bounding_box()
        assert box is not None
        assert box["height"] > 100, name
        assert box["width"] > 300, name
        figures = section.locator("svg[data-plot]")
        if plots is None:
            expect(figures).to_have_count(0)
        else:
            keys = figures.evaluate_all("(svgs) => svgs.map((s) => s.dataset.plot)")
            for plot in plots:
                assert any(key.startswith(plot) for key in keys), (name, plot, keys)
            for i in range(figures.count()):
                figure = figures.nth(i)
                expect(figure).to_be_visible()
                shape = figure.bounding_box()
                assert shape is not None
                assert shape["width"] > 300, (name, i)
                assert figure.locator("path").count() > 10, (name, i)  # drawn, not an empty frame
        path = folder / f"{name}.png"
        section.screenshot(path=path)
        assert path.stat().st_size > 10_000, name

    # What the sections say: the plan ran, the estimand comes before the estimator, the tipping point
    # is explained, the methods name what was fitted.
    expect(page.locator("#plan-primary")).to_contain_text("arm x time on overall wellbeing")
    sensitivity = page.locator("#sensitivity").inner_text()
    assert sensitivity.index("Estimand:") < sensitivity.index("Estimators:")
    expect(page.locator("#sensitivity .tipping-meaning")).to_contain_text("Under missing at random")
    expect(page.locator("#sensitivity-tipping tbody tr")).to_have_count(9)
    expect(page.locator("#methods-text")).to_contain_text("fitted by restricted maximum likelihood (REML)")
    expect(page.locator("#methods-text")).to_contain_text("over its secondary analyses, Holm's")
    expect(page.locator("#diagnostics-perma-overall_wellbeing-influence tbody tr")).to_have_count(8)
    context.close()
