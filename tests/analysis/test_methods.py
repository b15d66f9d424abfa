"""``analysis.methods``: the methods paragraph says what was fitted, checked against the fits
themselves and what a statistician counts by hand: the formula from the statsmodels design, REML
from the fit, the degrees of freedom and the numbers of participants and observations from the
hand-built table, the random-effects structure and its fallback, the plan's multiplicity rule, the
sensitivity analyses' settings and tipping point, and the installed software's versions."""

from __future__ import annotations

import datetime as dt
import platform
from importlib import metadata
from typing import Any

import numpy as np

from analysis.diagnostics import diagnose
from analysis.estimates import perma_trajectories, regret_model
from analysis.methods import methods_paragraphs, methods_section, perma_formula
from analysis.plan import MULTIPLICITY, FrozenPlan, parse_plan
from analysis.plan_report import PlanRun
from analysis.report import ModelSuite
from analysis.sensitivity import sensitivity_analyses
from tests.analysis.estimates.drawn import PERMA_WAVES, Truth, draw_study, perma_table
from tests.conftest import EXAMPLE


def suite_of(**fitted: Any) -> ModelSuite:
    models = dict.fromkeys(("perma", "headline", "regret", "screen", "dropout", "subgroups"))
    return ModelSuite(**{**models, **fitted}, not_estimated={}, seconds={}, options={})


def test_the_paragraph_states_the_model_fitted_with_random_slopes() -> None:
    waves = (*PERMA_WAVES, ("perma-week-8", 3, 56.0))
    drawn = draw_study(seed=3, n=150, truth=Truth(slope_sd=0.4, perma_waves=waves), decisions=1)
    fit = perma_trajectories(drawn.data, random_slopes=True)
    result = fit.fits["overall_wellbeing"]
    assert result.cov_re.shape == (2, 2)  # the slope model was fitted
    text = " ".join(methods_paragraphs(suite_of(perma=fit, regret=regret_model(drawn.data))))

    # The formula, term by term from the fitted design's columns.
    assert list(result.model.exog_names) == ["Intercept", "baseline", "day", "wellbeing vs control",
                                             "wellbeing vs control x day"]
    formula = ("overall_wellbeing ~ 1 + baseline + day + arm[wellbeing] + arm[wellbeing]:day "
               "+ (1 + week | participant)")
    assert perma_formula(result, "overall_wellbeing") == formula
    assert f"modelled as {formula}, fitted by restricted maximum likelihood (REML)" in text
    assert result.method == "REML"
    assert "random effects: participant intercept and time slope" in text

    # Participants, observations and degrees of freedom, counted from the hand-built table.
    table, _ = perma_table(drawn)
    participants = table["participant_code"].nunique()
    assert f"The fit used {len(table):,} observations from {participants:,} participants" in text
    assert f"of {len(drawn.perma):,} eligible observations" in text
    assert f"Student's t on {participants - 5:g} degrees of freedom" in text
    assert "perma-week-8 at day 56.0" in text
    assert "arm[wellbeing]:day, the change per day since enrollment" in text

    # The regret model as fitted, the missing-data handling and the multiplicity without a plan.
    regret = drawn.decisions[drawn.decisions["response_status"] == "completed"]
    assert (f"every response a row ({len(regret):,} from {regret['participant_code'].nunique():,} participants)"
            in text)
    assert "regret ~ 1 + role_coach + agree_share + overrides" in text
    assert "Missing data: the models are fitted to complete cases" in text
    assert "no analysis plan was frozen, so every estimate is exploratory" in text

    # The software that computed it, as installed.
    for name in ("statsmodels", "numpy", "pandas", "scipy", "lifelines"):
        assert f"{name} {metadata.version(name)}" in text
    assert f"Python {platform.python_version()}" in text


def test_a_fallback_the_plan_rule_and_the_sensitivity_analyses_are_said() -> None:
    drawn = draw_study(seed=8, n=120, decisions=1)
    fit = perma_trajectories(drawn.data, random_slopes=True)  # two waves: slopes are not identified
    sensitivity = sensitivity_analyses(drawn.data, fit, imputations=2, deltas=(-4.0, -2.0, 2.0), burn_in=3)
    checks = diagnose(fit, None)
    text = " ".join(methods_paragraphs(suite_of(perma=fit, sensitivity=sensitivity, diagnostics=checks),
                                       version="9.9"))
    influence = checks[0].influence
    over = int((influence["dfbetas"].abs() > 2 / np.sqrt(len(influence))).sum())
    assert (f"PERMA overall_wellbeing: {over} of {len(influence)} participants over "
            f"{2 / np.sqrt(len(influence)):.3f}") in text
    assert "+ (1 | participant), fitted by restricted maximum likelihood (REML)" in text
    assert ("Random slopes on day need at least three waves with data (with two they are not identified): the "
            "model has participant random intercepts only.") in text
    assert "Software: afterward 9.9" in text
    assert "2 imputed data sets" in text
    assert "shifted by delta from -4 to 2 points in 4 steps" in text
    point = sensitivity.tipping_point()
    assert (f"changes at delta of about {point:.2f} points" if point is not None
            else "holds over the whole grid") in text

    plan = parse_plan(EXAMPLE.with_name("wellbeing-pilot.plan.yaml").read_text(encoding="utf-8"))
    frozen = FrozenPlan(1, "0" * 64, "", plan, "plan.yaml", "r@uni.example", dt.datetime(2026, 3, 1, tzinfo=dt.UTC), 0)
    text = " ".join(methods_paragraphs(suite_of(perma=fit), PlanRun(frozen)))
    assert plan.multiplicity == "holm"
    assert (f"the frozen plan's primary analysis is tested alone at alpha 0.05; over its secondary analyses, "
            f"{MULTIPLICITY['holm']}") in text

    # Not fitted, not said; and the reasons the checks were not made.
    missing = ModelSuite(**{**suite_of().__dict__, "not_estimated": {"perma": "too few"},
                            "unchecked": {"sensitivity": "the PERMA model was not estimated"}})
    text = " ".join(methods_paragraphs(missing))
    assert "The PERMA model was not estimated: too few." in text
    assert "The sensitivity analyses were not computed: the PERMA model was not estimated." in text
    assert "Decision regret" not in text
    assert "Diagnostics:" not in text
    assert methods_section(missing).startswith('<section id="methods"')
