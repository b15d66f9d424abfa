"""The pre-registered analysis plan: ``afterward plan freeze`` then ``afterward analyze`` on a small
study played through the real services, whose report opens with the plan's primary analysis (its
figure checked against the report's own fixed-effects table and against statsmodels fitted here on
the same rows); a changed plan refused by ``freeze`` and reported as a deviation by ``analyze``; a
report without a frozen plan saying so first; malformed plans refused with the field and the line.

The study: the example protocol, eight participants enrolled at 10:00 UTC on 2 March 2026, PERMA at
baseline, week 1 (day 7) and week 4 (day 28); the well-being arm improves over the weeks, the
control arm stays about where it started.
"""

from __future__ import annotations

import datetime as dt
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import statsmodels.formula.api as smf
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from typer.testing import CliRunner, Result

from analysis.estimates import StudyData
from analysis.estimates.common import OBSERVABLE, floats
from analysis.estimates.perma import OPTIMIZERS
from analysis.plan import ACTION, PlanError, parse_plan, protocol_problems
from analysis.tables import AnalysisPlanRecord
from api.cli import app
from study import clock
from study.db import session_scope
from study.models import AuditEntry, StaffRole
from study.protocol import parse_protocol
from study.settings import get_settings
from tests.analysis.panel_builders import PanelBuilder, perma_answers
from tests.analysis.test_report import tables_of
from tests.builders import make_staff
from tests.conftest import EXAMPLE

T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)
EXAMPLE_PLAN = EXAMPLE.with_name("wellbeing-pilot.plan.yaml")
# arm, then every PERMA item at baseline, week 1 and week 4
PEOPLE = [("wellbeing", 4, 5, 7), ("wellbeing", 5, 6, 8), ("wellbeing", 6, 6, 9), ("wellbeing", 3, 5, 5),
          ("control", 4, 4, 5), ("control", 5, 5, 4), ("control", 6, 7, 6), ("control", 3, 3, 4)]
REGRET_BLOCK = re.compile(r"  - outcome: regret\n(    .*\n)+")
runner = CliRunner()


def day(n: float) -> dt.datetime:
    return T0 + dt.timedelta(days=n)


def answers(score: int) -> dict[str, int]:
    return perma_answers(dict.fromkeys("PERMANH", score), loneliness=10 - score, happiness=score)


def played(engine: Engine, protocol: str, frozen_clock: clock.FrozenClock) -> PanelBuilder:
    """``PEOPLE`` enrolled under ``protocol`` and their PERMA answers at baseline, week 1 and week 4,
    the clock at day 40."""
    build = PanelBuilder(engine, protocol)
    frozen_clock.set(T0)
    codes = [build.participant(arm, timezone="UTC") for arm, *_ in PEOPLE]
    frozen_clock.set(T0 + dt.timedelta(minutes=10))
    for code, (_, baseline, _, _) in zip(codes, PEOPLE, strict=True):
        build.answer(code, purpose="baseline", instrument="perma-profiler", answers=answers(baseline))
    for wave, due, closes in ((2, 7, 10), (3, 28, 33)):
        frozen_clock.set(day(due))
        build.tick()
        frozen_clock.set(day(due) + dt.timedelta(hours=2))
        for code, person in zip(codes, PEOPLE, strict=True):
            build.answer(code, purpose="followup", instrument="perma-profiler", answers=answers(int(person[wave])))
        frozen_clock.set(day(closes) + dt.timedelta(minutes=1))
        build.tick()
    frozen_clock.set(day(40))
    return build


@pytest.fixture
def study(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The study played to day 40, a researcher and a viewer, and the command line on its database."""
    build = played(engine, example_protocol, frozen_clock)
    make_staff(engine, build.slug, StaffRole.RESEARCHER, "researcher@uni.example")
    make_staff(engine, build.slug, StaffRole.VIEWER, "viewer@uni.example")
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    yield build.slug
    get_settings.cache_clear()


def plan_file(folder: Path, text: str | None = None) -> Path:
    """The example plan without its regret analysis (this study has no decisions), in ``folder``."""
    path = folder / "plan.yaml"
    path.write_text(text if text is not None else REGRET_BLOCK.sub("", EXAMPLE_PLAN.read_text(encoding="utf-8")),
                    encoding="utf-8")
    return path


def cli(*words: str) -> Result:
    return runner.invoke(app, list(words))


def analyze(slug: str, out: Path, *extra: str) -> str:
    result = cli("analyze", slug, "--out", str(out), "--as", "researcher@uni.example", "--bootstrap", "20", *extra)
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8")


def first_section(page: str) -> str:
    start = page.index("<section")
    return page[start:page.index("</section>", start)]


def test_the_example_plan_fits_the_example_protocol() -> None:
    plan = parse_plan(EXAMPLE_PLAN.read_text(encoding="utf-8"))
    assert plan.study == "wellbeing-pilot"
    assert (plan.primary.outcome, plan.primary.estimand) == ("overall_wellbeing", "arm_x_time")
    assert protocol_problems(plan, parse_protocol(EXAMPLE.read_text(encoding="utf-8"))) == []


def test_freeze_then_analyze_opens_with_the_primary_analysis(study: str, engine: Engine, tmp_path: Path) -> None:
    path = plan_file(tmp_path)
    frozen = cli("plan", "freeze", study, str(path), "--as", "researcher@uni.example")
    assert frozen.exit_code == 0, frozen.output
    assert "froze the analysis plan" in frozen.output
    again = cli("plan", "freeze", study, str(path))  # idempotent: nothing new recorded
    assert again.exit_code == 0, again.output
    assert "already frozen with this file" in again.output
    with session_scope(engine, read_only=True) as session:
        record = session.scalars(select(AnalysisPlanRecord)).one()
        entries = session.scalars(select(AuditEntry).where(AuditEntry.action == ACTION)).all()
    assert record.source_text == path.read_text(encoding="utf-8")
    assert record.outcome_reads_before == 0
    assert [(e.actor, e.detail["sha256"]) for e in entries] == [("researcher@uni.example", record.sha256)]

    page = analyze(study, tmp_path / "report.html")
    section = first_section(page)
    assert section.startswith('<section id="plan"')
    assert "Alpha 0.05" in section
    assert "Holm&#x27;s step-down rule over the secondary analyses" in section
    assert "arm x time on overall wellbeing" in section
    assert 'id="plan-no-deviations"' in section
    tables = tables_of(page)
    [primary] = tables["plan-primary-table"]
    [fixed] = [row for row in tables["perma-fixed-effects"]
               if row["outcome"]["text"] == "overall_wellbeing" and row["term"]["text"] == "wellbeing vs control x day"]
    # The figure is the report's own fixed effect, interval included (alpha 0.05: its 95% interval).
    assert float(str(primary["estimate"]["value"])) == float(str(fixed["estimate"]["value"]))
    assert float(str(primary["estimate"]["low"])) == pytest.approx(float(str(fixed["estimate"]["low"])), rel=1e-12)
    assert float(str(primary["estimate"]["high"])) == pytest.approx(float(str(fixed["estimate"]["high"])), rel=1e-12)

    # ... and statsmodels' mixed model fitted here, on the same rows: two waves, random intercepts.
    panel = StudyData.load(engine, study).panel
    rows = panel[(panel["instrument_id"] == "perma-profiler") & (panel["wave"] != "baseline")
                 & panel["response_status"].astype(str).isin(OBSERVABLE)].copy()
    rows["y"] = floats(rows["perma_overall_wellbeing"])
    rows["baseline"] = floats(rows["baseline_perma_overall_wellbeing"])
    rows["day"] = floats(rows["days_since_enrollment"]).groupby(rows["wave"]).transform("median")
    rows["w"] = (rows["arm"].astype(str) == "wellbeing").astype(float)
    rows = rows.dropna(subset=["y", "baseline"])
    assert rows["participant_code"].nunique() == 8
    assert len(rows) == 16
    with warnings.catch_warnings():  # a variance on the boundary is said by the report; here only the figure counts
        warnings.simplefilter("ignore")
        # statsmodels' optimizers, then the derivative-free ones, as the platform tries them (OPTIMIZERS)
        fits = (smf.mixedlm("y ~ baseline + day + w + w:day", rows, groups=rows["participant_code"].astype(str))
                .fit(reml=True, method=list(optimizers)) for optimizers in OPTIMIZERS)
        direct = next(fit for fit in fits if fit.converged)
    assert float(str(primary["estimate"]["value"])) == pytest.approx(direct.params["w:day"], rel=1e-4)
    assert direct.params["w:day"] > 0  # the well-being arm improves faster, as played
    assert primary["participants"]["value"] == "8"
    assert primary["observations"]["value"] == "16"

    # Every other section says whether the plan named it.
    labels = dict(re.findall(r'data-plan="(\w+)">([^<]*)<', page))
    assert labels["perma"].startswith("Pre-registered (primary: arm x time on overall wellbeing")
    assert all(labels[name].startswith("Exploratory") for name in ("headline", "regret", "screen", "dropout",
                                                                     "subgroups"))
    assert len(tables["plan-secondary-table"]) == 2
    with session_scope(engine, read_only=True) as session:
        analyzed = session.scalars(select(AuditEntry).where(AuditEntry.action == "study.analyze")).one()
    assert analyzed.detail["plan_sha256"] == record.sha256
    assert analyzed.detail["plan_deviations"] == 0


def test_a_changed_plan_is_refused_by_freeze_and_reported_by_analyze(study: str, engine: Engine,
                                                                     tmp_path: Path) -> None:
    # Without a frozen plan, the report says so first; that run is a read of the outcomes.
    section = first_section(analyze(study, tmp_path / "before.html"))
    assert "No analysis plan was frozen for this study" in section
    assert "every analysis in this report is exploratory" in section

    path = plan_file(tmp_path)
    frozen = cli("plan", "freeze", study, str(path))
    assert frozen.exit_code == 0, frozen.output
    assert "1 read(s) of the study's outcomes were audited before this freeze" in frozen.output
    original = path.read_text(encoding="utf-8")
    path.write_text(original.replace("alpha: 0.05", "alpha: 0.01").replace("multiplicity: holm",
                                                                           "multiplicity: bonferroni"),
                    encoding="utf-8")

    refused = cli("plan", "freeze", study, str(path))
    assert refused.exit_code == 1
    assert "is never replaced" in refused.output
    assert "alpha: 0.05 -> 0.01" in refused.output
    assert "multiplicity: holm -> bonferroni" in refused.output
    assert "Traceback" not in refused.output
    with session_scope(engine, read_only=True) as session:
        assert session.scalar(select(func.count()).select_from(AnalysisPlanRecord)) == 1
        assert session.scalars(select(AnalysisPlanRecord.source_text)).one() == original

    shown = cli("plan", "show", study)
    assert shown.exit_code == 0, shown.output
    assert "DOES NOT MATCH" in shown.output
    assert "alpha: 0.05 -> 0.01" in shown.output
    assert "alpha: 0.05\n" in shown.output  # the frozen plan's text

    page = analyze(study, tmp_path / "after.html")
    section = first_section(page)
    deviations = section[section.index('id="plan-deviations"'):]
    assert "changed after freezing" in deviations
    assert "alpha: 0.05 -&gt; 0.01" in deviations
    assert "The report runs the plan as it was frozen." in deviations
    assert "frozen after 1 read(s) of the study&#x27;s outcomes" in deviations
    assert "Alpha 0.05" in section  # the frozen alpha, not the file's
    # Put back, the file matches again and only the late freeze remains a deviation.
    path.write_text(original, encoding="utf-8")
    assert "matches the frozen plan" in cli("plan", "show", study).output
    section = first_section(analyze(study, tmp_path / "again.html"))
    assert "changed after freezing" not in section
    assert "frozen after 1 read(s)" in section


def test_a_malformed_plan_gets_a_clear_error(study: str, engine: Engine, tmp_path: Path) -> None:
    good = plan_file(tmp_path).read_text(encoding="utf-8")
    for text, message in (
        (good.replace("outcome: overall_wellbeing\n  estimand", "outcome: wellbeing\n  estimand"),
         "primary.outcome (line 21): 'wellbeing' is not an outcome the report fits; write one of"),
        (good.replace("    wave: perma-week-4\n", ""),
         "secondary[0].wave (line 26): name the follow-up the difference is taken at"),
        (good.replace("wave: perma-week-4", "wave: perma-week-9"),
         "secondary[0].wave: 'perma-week-9' is not an enrollment-anchored perma-profiler follow-up of the protocol; "
         "write one of perma-week-1, perma-week-4"),
        (good.replace("reference_arm: control", "reference_arm: wellbeing"),
         "arm (line 10): the arm and the reference arm must differ"),
        (good.replace("covariates: [baseline]", "covariates: [baseline, age]"),
         "primary.covariates (line 23): the PERMA mixed model adjusts for the baseline score and nothing else"),
        (good.replace("multiplicity: holm", "multiplicity: fdr"), "multiplicity (line 16): Input should be"),
        (good.replace("study: wellbeing-pilot", "study: another-study"), "the plan is for 'another-study'"),
        ("primary: [unclosed", "not valid YAML"),
    ):
        bad = plan_file(tmp_path, text)
        result = cli("plan", "freeze", study, str(bad))
        assert result.exit_code == 1, text
        assert message in result.output, result.output
        assert "Traceback" not in result.output
        assert isinstance(result.exception, SystemExit)  # a refusal, not an error escaping the command
    with pytest.raises(PlanError) as caught:
        parse_plan(good.replace("estimand: arm_x_time\n  covariates", "estimand: focal_role_effect\n  covariates"))
    assert caught.value.problems == ["primary.estimand (line 22): focal_role_effect is an estimand of regret (write "
                                     "outcome: regret), for overall_wellbeing write arm_x_time or "
                                     "arm_difference_at_wave"]
    viewer = cli("plan", "freeze", study, str(plan_file(tmp_path)), "--as", "viewer@uni.example")
    assert viewer.exit_code == 1
    assert "may not freeze its analysis plan" in viewer.output
    missing = cli("plan", "show", study)
    assert missing.exit_code == 1
    assert "no analysis plan is frozen" in missing.output
    with session_scope(engine, read_only=True) as session:
        assert session.scalar(select(func.count()).select_from(AnalysisPlanRecord)) == 0
        assert session.scalar(select(func.count()).select_from(AuditEntry).where(AuditEntry.action == ACTION)) == 0
