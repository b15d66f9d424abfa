"""``afterward analyze`` and ``analysis.report``: the report of a study simulated through the real
services, written by the command line, audited, refused to viewers, opened in headless Chromium
with every request recorded (only the file itself may be read); and the report's numbers against
the models' own tables and counts made by hand."""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
from playwright.sync_api import Browser, Request, Route, expect, sync_playwright
from sqlalchemy import select
from sqlalchemy.engine import Engine
from threadpoolctl import threadpool_limits
from typer.testing import CliRunner

from analysis.estimates import (
    StudyData,
    dropout_survival,
    feature_screen,
    immediate_vs_delayed,
    perma_trajectories,
    regret_model,
    subgroup_effects,
)
from analysis.report import ACTION, ReportHeader, fit_models, participant_numbers, render_report
from analysis.simulation.simulate import load_simulated_study, simulate
from analysis.simulation.synthetic import synthetic_study
from api.cli import app
from scheduler.models import FollowUp
from study import clock
from study.db import session_scope
from study.models import AuditEntry, Participant, StaffRole, Study
from study.settings import get_settings
from surveys.models import SurveyAssignment
from tests.builders import make_staff
from tests.conftest import EXAMPLE, module_database
from tests.e2e.conftest import CHROMIUM, FLAGS

START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
WEEKS = 4
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "analysis"  # tests/artifacts is git-ignored
runner = CliRunner()


# Reading tables back out of the page


class _Tables(HTMLParser):
    """Every ``<table id>`` of a page: its body rows, each cell by ``data-field`` with its text and
    its ``data-value`` / ``data-low`` / ``data-high``."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, dict[str, str | None]]]] = {}
        self._table: str | None = None
        self._cell: dict[str, str | None] | None = None
        self._in_body = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table":
            self._table = found.get("id")
            self.tables[str(self._table)] = []
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body and self._table is not None:
            self.tables[self._table].append({})
        elif tag == "td" and self._in_body and self._table is not None:
            self._cell = {"text": "", "value": found.get("data-value"), "low": found.get("data-low"),
                          "high": found.get("data-high")}
            self.tables[self._table][-1][str(found["data-field"])] = self._cell

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None
        elif tag == "tbody":
            self._in_body = False
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell["text"] = str(self._cell["text"]) + data


def tables_of(page: str) -> dict[str, list[dict[str, dict[str, str | None]]]]:
    parser = _Tables()
    parser.feed(page)
    return parser.tables


def number(text: str | None) -> float:
    assert text is not None
    return float(text)


def equal(shown: str | None, expected: Any) -> bool:
    """A ``data-value`` is the full value: floats read back exactly."""
    if expected is None or expected is pd.NA or (isinstance(expected, float) and math.isnan(expected)):
        return shown == "nan"
    return number(shown) == float(expected)


INTERVALS = {"estimate": ("ci_low", "ci_high"), "mean": ("ci_low", "ci_high"),
             "exit_rating": ("exit_rating_low", "exit_rating_high"), "features": ("features_low", "features_high"),
             "difference": ("difference_low", "difference_high"), "arm": ("arm_low", "arm_high"),
             "hazard_ratio": ("hr_low", "hr_high"),
             "estimate_per_sd": ("ci_low_per_sd", "ci_high_per_sd"), "d": ("d_low", "d_high"),
             "cumulative_incidence": ("ci_low", "ci_high")}


def assert_shows(page: dict[str, list[dict[str, dict[str, str | None]]]], table_id: str,
                 expected: pd.DataFrame) -> int:
    """Each row of the page's table holds the numbers of the model's table, row by row; returns
    how many numbers were compared."""
    rows = page[table_id]
    assert len(rows) == len(expected), table_id
    compared = 0
    for shown, want in zip(rows, expected.to_dict(orient="records"), strict=True):
        for field, cell in shown.items():
            if field not in want:  # a label the report adds (e.g. "PERMA change" for perma_change)
                continue
            if cell["value"] is None:
                assert cell["text"] == str(want[field]) or cell["text"] == "–", (table_id, field)
                continue
            assert equal(cell["value"], want[field]), (table_id, field, cell, want[field])
            compared += 1
            if cell["low"] is not None:
                low, high = INTERVALS[field]
                assert equal(cell["low"], want[low]), (table_id, field)
                assert equal(cell["high"], want[high]), (table_id, field)
                compared += 2
    return compared


# The numbers: the models' tables, the counts by hand


@pytest.fixture(scope="module")
def synthetic() -> tuple[Any, StudyData]:
    study = synthetic_study(300, seed=4)
    return study, StudyData(panel=study.panel(), conversations=study.conversation_features(),
                            survival=study.survival(), read_at=study.read_at)


def header_of(study: Any, data: StudyData, title: str = "Synthetic pilot") -> ReportHeader:
    people = study.people
    deleted = people[people["data_deleted"]].groupby("arm").size().to_dict()
    versions = pd.DataFrame({"version": [1], "loaded_at": [study.start], "sha256": ["0" * 64]})
    assert data.read_at is not None
    return ReportHeader("synthetic-pilot", title, data.read_at, participant_numbers(data.panel, deleted), versions,
                        software="test")


def test_the_report_shows_the_models_numbers(synthetic: tuple[Any, StudyData]) -> None:
    study, data = synthetic
    suite = fit_models(data, n_boot=40, seed=3)
    assert suite.not_estimated == {}
    page = tables_of(render_report(header_of(study, data), suite))

    # Each model fitted again here, with the same arguments and, as fit_models runs them, one BLAS
    # thread (more threads sum in another order: the last digit of a float can differ): the page
    # shows their tables.
    with threadpool_limits(limits=1, user_api="blas"):
        perma = perma_trajectories(data)
        headline = immediate_vs_delayed(data, n_boot=40, seed=3)
        regret = regret_model(data)
        screen = feature_screen(data)
        dropout = dropout_survival(data)
        subgroups = subgroup_effects(data)
    compared = sum(assert_shows(page, table_id, frame) for table_id, frame in (
        ("headline-table", headline.table), ("perma-marginal-means", perma.marginal_means),
        ("perma-contrasts", perma.contrasts), ("perma-fixed-effects", perma.fixed_effects),
        ("perma-random-effects", perma.random_effects), ("regret-coefficients", regret.coefficients),
        ("feature-screen", screen.table), ("dropout-groups", dropout.groups), ("dropout-logrank", dropout.logrank),
        ("dropout-cox", dropout.cox), ("dropout-proportional-hazards", dropout.proportional_hazards),
        ("dropout-response", dropout.response), ("subgroup-effects", subgroups.effects),
        ("dropout-cumulative-incidence", dropout.cumulative_incidence.groupby(["group", "cause"]).tail(1)),
        ("subgroup-heterogeneity", subgroups.heterogeneity),
        ("perma-overall_wellbeing-missingness", perma.samples["overall_wellbeing"].missingness),
        ("regret-missingness", regret.sample.missingness)))
    assert compared > 500
    arm_time = page["perma-fixed-effects"][4]
    assert arm_time["term"]["text"] == "wellbeing vs control x day"
    days = perma.marginal_means.drop_duplicates("wave_number").set_index("wave_number")["days"]
    per_day = study.true_effects["wellbeing_arm_perma_per_wave"]["value"] / (days[2] - days[1])  # by hand
    assert number(arm_time["estimate"]["low"]) <= per_day <= number(arm_time["estimate"]["high"])

    # The participants by arm, counted from the synthetic study's own draws.
    people = study.people
    waves = study.waves
    to_come = set(waves.loc[waves["response_status"].isin(("open", "not_yet_due")), "person"])
    withdrawn = people["participant_status"] == "withdrawn"
    active = ~withdrawn & people["person"].isin(to_come)
    rows = {row["arm"]["text"]: row for row in page["study-numbers"]}
    assert set(rows) == {"control", "wellbeing", "all"}
    for arm in ("control", "wellbeing"):
        mine = people["arm"] == arm
        counts = {"enrolled": mine.sum(), "active": (mine & active).sum(),
                  "completed": (mine & ~withdrawn & ~active).sum(), "withdrawn": (mine & withdrawn).sum(),
                  "data_deleted": (mine & people["data_deleted"]).sum()}
        assert {field: number(rows[arm][field]["value"]) for field in counts} == counts
    assert number(rows["all"]["enrolled"]["value"]) == len(people)
    assert 0 < number(rows["all"]["active"]["value"]) < number(rows["all"]["enrolled"]["value"])
    assert number(rows["all"]["data_deleted"]["value"]) > 0


def test_the_page_is_escaped_self_contained_and_its_ids_unique(synthetic: tuple[Any, StudyData]) -> None:
    study, data = synthetic
    suite = fit_models(data, n_boot=5, seed=1)
    hostile = "<script>alert('x')</script> & <b>co</b>"
    page = render_report(header_of(study, data, title=hostile), suite)
    assert "<script" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;co&lt;/b&gt;" in page
    # No address but the SVG namespaces (names, never fetched); no external reference of any kind.
    assert set(re.findall(r"https?://[^\"'\s)]+", page)) == {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
    assert not re.search(r"<(link|script|img|iframe)\b|@import|src=", page)
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    references = set(re.findall(r'(?:url\(#|href="#)([^")]+)', page))
    assert references <= set(ids)
    assert page.count("<svg ") >= 6


# Through the command line, on a study simulated through the services


@dataclass(frozen=True)
class Analyzed:
    engine: Engine
    slug: str
    report: Path
    output: str
    url: str


@pytest.fixture(scope="module")
def analyzed(database_template: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Analyzed]:
    """60 participants over 4 weeks through the real services (about a minute), then
    ``afterward analyze`` as a researcher, with the clock at the simulated study's end."""
    folder = tmp_path_factory.mktemp("report")
    engine = module_database(database_template, folder)
    slug = load_simulated_study(engine, EXAMPLE.read_text(encoding="utf-8"))
    with session_scope(engine) as session:  # the arms come from the study's randomization: fix it
        session.execute(sa.update(Study).where(Study.slug == slug).values(allocation_seed="report-e2e"))
    simulate(engine, slug, participants=60, weeks=WEEKS, seed=11, start=START, tick_minutes=120)
    make_staff(engine, slug, StaffRole.RESEARCHER, "researcher@uni.example")
    make_staff(engine, slug, StaffRole.VIEWER, "viewer@uni.example")
    report = folder / "out" / "report.html"
    previous = clock.set_clock(clock.FrozenClock(START + dt.timedelta(weeks=WEEKS)))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
            get_settings.cache_clear()
            result = runner.invoke(app, ["analyze", slug, "--out", str(report), "--as", "researcher@uni.example",
                                         "--bootstrap", "200"])
    finally:
        clock.set_clock(previous)
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    yield Analyzed(engine, slug, report, result.output, report.as_uri())
    engine.dispose()


def test_afterward_analyze_writes_an_audited_report(analyzed: Analyzed, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    assert analyzed.output.splitlines()[0].startswith(
        f"wrote the analysis report of '{analyzed.slug}' to {analyzed.report}")
    assert "R² of the exit rating" in analyzed.output
    page = analyzed.report.read_text(encoding="utf-8")
    tables = tables_of(page)
    with session_scope(analyzed.engine, read_only=True) as session:
        entry = session.scalars(select(AuditEntry).where(AuditEntry.action == ACTION)).one()
        people = session.execute(select(Participant.id, Participant.arm, Participant.status,
                                        Participant.data_deleted_at).where(Participant.arm.is_not(None))).all()
        to_come = set(session.scalars(select(FollowUp.participant_id).where(FollowUp.status.in_(("planned", "sent")))))
        to_come |= set(session.scalars(select(SurveyAssignment.participant_id).where(
            SurveyAssignment.purpose == "baseline", SurveyAssignment.status == "open")))
    assert (entry.actor_type, entry.actor) == ("staff", "researcher@uni.example")
    assert entry.detail["file"] == "report.html"
    assert entry.detail["options"]["n_boot"] == 200
    assert entry.detail["sha256"] == hashlib.sha256(analyzed.report.read_bytes()).hexdigest()

    # The study's numbers at the top, against the participants and follow-ups counted in SQL.
    rows = {row["arm"]["text"]: row for row in tables["study-numbers"]}
    for arm in ("control", "wellbeing"):
        mine = [p for p in people if p.arm == arm]
        withdrawn = [p for p in mine if p.status == "withdrawn"]
        active = [p for p in mine if p.status != "withdrawn" and p.id in to_come]
        counts = {"enrolled": len(mine), "withdrawn": len(withdrawn), "active": len(active),
                  "completed": len(mine) - len(withdrawn) - len(active),
                  "data_deleted": sum(p.data_deleted_at is not None for p in mine)}
        assert {field: number(rows[arm][field]["value"]) for field in counts} == counts
    assert number(rows["all"]["enrolled"]["value"]) == 60
    # The flow: the randomized are the enrolled, and every wave accounts for each of them whose data remain.
    flow = {str(row["stage"]["text"]): row for row in tables["participant-flow"]}
    waves = {stage.split(": ")[0] for stage in flow if ": " in stage}
    assert "baseline" in waves
    assert len(waves) >= 2
    for arm in ("control", "wellbeing"):
        randomized = number(flow["randomized"][arm]["value"])
        assert randomized == number(rows[arm]["enrolled"]["value"])
        for wave in waves:
            total = sum(float(number(flow[stage][arm]["value"])) for stage in flow if stage.startswith(wave + ": "))
            assert total == randomized - number(rows[arm]["data_deleted"]["value"]), (arm, wave)
    assert number(flow["joined through an invite"]["all"]["value"]) >= 60
    assert 'id="software">afterward ' in page
    assert 'id="packages">numpy ' in page
    assert "statsmodels " in page
    assert tables["protocol-versions"][0]["version"]["value"] == "1"
    assert '<dd id="read-at">2026-03-30T00:00:00+00:00</dd>' in page
    assert len(tables["headline-table"]) == 4

    # Bad input: one line, exit 1.
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", analyzed.engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    for words, message in (
        (["--as", "viewer@uni.example"], "viewer@uni.example may not export row-level data of"),
        (["--as", "nobody@uni.example"], "nobody@uni.example has no role in study"),
    ):
        refused = runner.invoke(app, ["analyze", analyzed.slug, "--out", str(tmp_path / "v.html"), *words])
        assert refused.exit_code == 1
        assert message in refused.output
        assert "viewers may export --format aggregates" in refused.output
        assert len(refused.output.strip().splitlines()) == 1
    for words, message in ((["nope", "--out", str(tmp_path / "x.html")], "no study 'nope'"),
                           ([analyzed.slug, "--out", str(tmp_path)], "is a directory"),
                           ([analyzed.slug, "--out", str(tmp_path / "y.html"), "--bootstrap", "0"],
                            "at least 1")):
        bad = runner.invoke(app, ["analyze", *words])
        assert bad.exit_code == 1
        assert message in bad.output
        assert len(bad.output.strip().splitlines()) == 1
    assert not (tmp_path / "v.html").exists()
    with session_scope(analyzed.engine, read_only=True) as session:
        assert session.scalar(select(sa.func.count()).select_from(AuditEntry).where(AuditEntry.action == ACTION)) == 1


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium through Playwright, as the web tests use it."""
    if not Path(CHROMIUM).exists():
        message = f"the report test needs {CHROMIUM} (Debian package chromium); `make test` installs it"
        if os.environ.get("AFTERWARD_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield launched
        launched.close()


def test_the_report_opens_in_chromium_without_the_network(analyzed: Analyzed, browser: Browser) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    requested: list[str] = []
    context.on("request", lambda request: requested.append(request.url))

    def only_the_file(route: Route, request: Request) -> None:
        if request.url == analyzed.url:
            route.continue_()
        else:
            route.abort()

    context.route("**/*", only_the_file)
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(analyzed.url, wait_until="load")
    page.wait_for_load_state("networkidle")

    assert requested == [analyzed.url]  # the file itself, nothing else
    assert problems == []
    expect(page.locator("h1")).to_contain_text("Analysis report")
    expect(page.locator("#headline-table")).to_be_visible()
    expect(page.locator("#headline-table tbody tr")).to_have_count(4)
    expect(page.locator("#study-numbers")).to_be_visible()
    for plot in ("headline", "trajectory-overall_wellbeing", "forest-regret", "kaplan-meier"):
        svg = page.locator(f'svg[data-plot="{plot}"]')
        expect(svg).to_be_visible()
        box = svg.bounding_box()
        assert box is not None
        assert box["width"] > 300
    assert page.locator("svg").count() >= 6
    assert page.locator("svg path").count() > 50  # the plots have content, not just frames
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width in (1280, 375):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=ARTIFACTS / f"report-{width}.png", full_page=True)
    assert (ARTIFACTS / "report-1280.png").stat().st_size > 50_000
    context.close()
