"""``analysis.estimates.subgroups``: the arm x time effect within subgroups against direct CR2 fits,
the interaction test by hand, Holm's rule over the tests, and harm to one group seen."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis.estimates import subgroup_effects
from tests.analysis.estimates.drawn import Truth, covers, draw_study, per_day, pick
from tests.analysis.robust_truth import direct_cr2


def test_subgroups_estimate_the_arm_x_time_effect_and_show_harm_to_one_group() -> None:
    truth = Truth(arm_per_wave_by_region={"Europe": 0.6, "America": -0.6, "Asia": 0.6})
    drawn = draw_study(seed=7, n=450, truth=truth, decisions=2)
    fit = subgroup_effects(drawn.data)

    def region(level: str) -> Any:
        return pick(fit.effects, outcome="perma_overall_wellbeing", subgroup="timezone_region", level=level)

    # -0.6 per follow-up at days 7 and 28: -0.6 / 21 per day in America, +0.6 / 21 elsewhere.
    assert covers(region("America"), per_day(truth, -0.6)[0])
    assert region("America")["ci_high"] < 0
    assert covers(region("Europe"), per_day(truth, 0.6)[0])
    assert region("Europe")["ci_low"] > 0
    assert region("Asia")["ci_low"] > 0
    tests = fit.heterogeneity
    assert pick(tests, outcome="perma_overall_wellbeing", subgroup="timezone_region")["significant_holm"]
    np.testing.assert_allclose(tests["p_holm"], multipletests(tests["p"], method="holm")[1], rtol=1e-12)

    # The level's estimate: a direct CR2 fit of the level's rows on baseline, day, arm and arm x day.
    table = drawn.perma[(drawn.perma["response_status"] == "completed") & (drawn.perma["timezone_region"] == "America")]
    day = table["days_since_enrollment"]
    design = pd.DataFrame({"Intercept": 1.0, "baseline": table["baseline"], "day": day, "wellbeing": table["wellbeing"],
                           "wellbeing_day": table["wellbeing"] * day})
    direct = direct_cr2(table["y"], design, table["participant_code"]).loc["wellbeing_day"]
    assert region("America")["estimate"] == pytest.approx(direct["estimate"], rel=1e-9)
    assert region("America")["se"] == pytest.approx(direct["se"], rel=1e-8)
    assert region("America")["df"] == pytest.approx(direct["df"], rel=1e-8)

    # The interaction test by hand: every term per level, Wald on the level x arm x day terms, F(2, G - 1).
    rows = drawn.perma[drawn.perma["response_status"] == "completed"]
    day = rows["days_since_enrollment"]
    base = pd.DataFrame({"Intercept": 1.0, "baseline": rows["baseline"], "day": day, "wellbeing": rows["wellbeing"],
                         "wellbeing_day": rows["wellbeing"] * day})
    full = base.copy()
    for level in ("Asia", "Europe"):
        indicator = (rows["timezone_region"] == level).astype(float)
        for column in base.columns:
            full[f"{column}:{level}"] = base[column] * indicator
    x = full.to_numpy(float)
    beta = np.linalg.lstsq(x, rows["y"].to_numpy(float), rcond=None)[0]
    covariance = _cr2_covariance(x, rows["y"].to_numpy(float) - x @ beta, rows["participant_code"])
    index = [list(full.columns).index(f"wellbeing_day:{level}") for level in ("Asia", "Europe")]
    b, v = beta[index], covariance[np.ix_(index, index)]
    statistic = float(b @ np.linalg.solve(v, b)) / 2
    test = pick(tests, outcome="perma_overall_wellbeing", subgroup="timezone_region")
    assert test["statistic"] == pytest.approx(statistic, rel=1e-7)
    participants = rows["participant_code"].nunique()
    assert test["p"] == pytest.approx(stats.f.sf(statistic, 2, participants - 1), rel=1e-6)

    terciles = fit.effects[(fit.effects["outcome"] == "regret") & (fit.effects["subgroup"] == "baseline_tercile")]
    assert list(terciles["level"]) == ["high", "low", "middle"]
    assert (terciles["ci_high"] < 0).all()  # the coach effect is the same in each: seen in each
    assert not pick(tests, outcome="regret", subgroup="baseline_tercile")["significant_holm"]
    assert fit.subgroups.groupby("subgroup")["participants"].sum()["baseline_tercile"] == 450
    assert any("Holm" in note for note in fit.notes)


def _cr2_covariance(x: np.ndarray, residuals: np.ndarray, clusters: pd.Series) -> np.ndarray:
    """CR2 by hand, one cluster at a time with n x n matrices."""
    bread = np.linalg.inv(x.T @ x)
    residual_maker = np.eye(len(x)) - x @ bread @ x.T
    groups = pd.factorize(clusters)[0]
    meat = np.zeros((x.shape[1], x.shape[1]))
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        values, vectors = np.linalg.eigh(residual_maker[np.ix_(rows, rows)])
        adjust = vectors @ np.diag(values ** -0.5) @ vectors.T
        score = x[rows].T @ adjust @ residuals[rows]
        meat += np.outer(score, score)
    return bread @ meat @ bread
