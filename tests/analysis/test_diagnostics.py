"""``analysis.diagnostics`` against its truths: the residuals and random effects of a direct
statsmodels fit (and the best linear unbiased predictions by hand), the leave-one-participant-out
changes against refits by hand (generalised least squares with the variance components held, and
statsmodels' MixedLM and OLS refitted without the participant), Cook's distance against statsmodels'
own where each participant is one row, the shape statistics against scipy, and a planted
influential participant found first."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import linalg, stats
from statsmodels.stats.outliers_influence import OLSInfluence

from analysis.diagnostics import TOP, diagnose, diagnostics_section, ols_diagnostics
from analysis.estimates import StudyData, perma_trajectories, regret_model
from analysis.panel import PERMA
from tests.analysis.estimates.drawn import REGRET_COLUMNS, Drawn, agrees, draw_study, perma_table, same

TERM = "wellbeing vs control x day"


@pytest.fixture(scope="module")
def drawn() -> Drawn:
    return draw_study(seed=5, n=90, decisions=2)


def _direct(drawn: Drawn) -> tuple[pd.DataFrame, pd.DataFrame, Any]:
    table, design = perma_table(drawn)
    direct = sm.MixedLM(table["y"], design, groups=table["participant_code"]).fit(reml=True,
                                                                                   method=["bfgs", "lbfgs", "cg"])
    return table, design, direct


def test_residuals_and_random_effects_are_the_fits_own(drawn: Drawn) -> None:
    fit = perma_trajectories(drawn.data, random_slopes=False)
    checks = diagnose(fit, None)
    assert [(d.model, d.outcome, d.term) for d in checks] == [("perma", "overall_wellbeing", TERM)]
    d = checks[0]
    table, design, direct = _direct(drawn)
    agrees(np.asarray(direct.fe_params), np.asarray(fit.fits["overall_wellbeing"].fe_params))

    # The random effects: statsmodels' predictions, and the BLUPs by hand, G Z' V^-1 (y - X beta).
    predicted = d.random_effects.set_index("participant_code")["intercept"]
    expected = pd.Series([float(np.asarray(value)[0]) for value in direct.random_effects.values()],
                         index=[str(code) for code in direct.random_effects])
    agrees(predicted.loc[expected.index], expected)
    beta, tau, sigma2 = np.asarray(direct.fe_params), float(direct.cov_re.iloc[0, 0]), float(direct.scale)
    for code in list(expected.index[:5]):
        rows = (table["participant_code"] == code).to_numpy()
        y, x = table["y"].to_numpy(float)[rows], design.to_numpy(float)[rows]
        v = sigma2 * np.eye(rows.sum()) + tau
        assert predicted[code] == pytest.approx(float(tau * np.ones(rows.sum()) @ np.linalg.solve(v, y - x @ beta)),
                                                rel=1e-6)

    # Conditional residuals: the score less the fixed part and the participant's effect, by hand.
    by_hand = table["y"].to_numpy(float) - design.to_numpy(float) @ beta - predicted.loc[table["participant_code"]
                                                                                         ].to_numpy()
    agrees(d.residuals["residual"], by_hand)
    agrees(d.residuals["fitted"], table["y"].to_numpy(float) - by_hand)
    assert list(d.residuals["participant_code"]) == list(table["participant_code"])

    # Their shape, by scipy from the residuals and effects above.
    shape = d.shape.set_index("quantity")
    for name, values in (("conditional residuals", by_hand), ("random intercept", predicted.to_numpy())):
        row = shape.loc[name]
        assert row["n"] == len(values)
        assert row["sd"] == pytest.approx(np.std(values, ddof=1), rel=1e-8)
        assert row["skewness"] == pytest.approx(stats.skew(values), rel=1e-6, abs=1e-9)
        assert row["excess_kurtosis"] == pytest.approx(stats.kurtosis(values), rel=1e-6, abs=1e-9)
        assert row["shapiro_w"] == pytest.approx(stats.shapiro(values)[0], rel=1e-6)
        assert row["qq_correlation"] == pytest.approx(stats.probplot(values)[1][2], rel=1e-8)


def test_leaving_a_participant_out_equals_refitting_without_them(drawn: Drawn) -> None:
    fit = perma_trajectories(drawn.data, random_slopes=False)
    d = diagnose(fit, None)[0]
    table, design, direct = _direct(drawn)
    influence = d.influence.set_index("participant_code")
    codes = sorted(table["participant_code"].unique())
    assert list(influence.index) == codes
    assert (influence["observations"] == table.groupby("participant_code").size().loc[codes]).all()
    n = len(codes)
    assert d.threshold == pytest.approx(2 / np.sqrt(n))
    assert d.cooks_threshold == pytest.approx(4 / n)

    # Variance components held: generalised least squares without the participant, V from the full fit.
    beta = np.asarray(direct.fe_params)
    tau, sigma2 = float(direct.cov_re.iloc[0, 0]), float(direct.scale)
    information = np.zeros((5, 5))
    for code in codes:
        rows = (table["participant_code"] == code).to_numpy()
        x = design.to_numpy(float)[rows]
        information += x.T @ np.linalg.solve(sigma2 * np.eye(rows.sum()) + tau, x)
    se = float(np.asarray(direct.bse_fe)[4])
    for code in [codes[0], codes[-1], str(d.top().iloc[0]["participant_code"]), codes[n // 2]]:
        keep = (table["participant_code"] != code).to_numpy()
        blocks = [sigma2 * np.eye(size) + tau for size in table[keep].groupby("participant_code", sort=False).size()]
        gls = sm.GLS(table["y"][keep], design[keep], sigma=linalg.block_diag(*blocks)).fit()
        change = np.asarray(gls.params) - beta
        row = influence.loc[code]
        assert row["change"] == pytest.approx(change[4], rel=1e-6, abs=1e-12)
        assert row["dfbetas"] == pytest.approx(change[4] / se, rel=1e-6, abs=1e-10)
        assert row["change_percent"] == pytest.approx(100 * change[4] / abs(beta[4]), rel=1e-6, abs=1e-10)
        assert row["cooks_distance"] == pytest.approx(change @ information @ change / 5, rel=1e-6)
        assert row["influential"] == (abs(change[4] / se) > 2 / np.sqrt(n))

    # The most influential participants refitted by statsmodels without them, variance re-estimated.
    top = d.top()
    assert len(top) == TOP
    assert list(top["dfbetas"].abs()) == sorted(influence["dfbetas"].abs(), reverse=True)[:TOP]
    assert influence["refitted_change"].notna().sum() == TOP
    for code in top["participant_code"][:3]:
        keep = (table["participant_code"] != code).to_numpy()
        again = sm.MixedLM(table["y"][keep], design[keep], groups=table["participant_code"][keep]).fit(
            reml=True, method=["bfgs", "lbfgs", "cg"])
        refitted = float(np.asarray(again.fe_params)[4]) - beta[4]
        assert influence.loc[code, "refitted_change"] == pytest.approx(refitted, rel=1e-5, abs=1e-9)
        # held or re-estimated, the variance components move the change little
        assert influence.loc[code, "change"] == pytest.approx(refitted, rel=0.2)


def test_the_regret_model_refitted_by_ols_and_cooks_distance_as_statsmodels_has_it(drawn: Drawn) -> None:
    regret = regret_model(drawn.data)
    d = diagnose(None, regret)[0]
    assert (d.model, d.term) == ("regret", "role_coach")
    assert d.random_effects.empty
    table = drawn.decisions[drawn.decisions["response_status"] == "completed"].sort_values(
        ["participant_code", "days_since_enrollment", "wave", "decision_id"], kind="stable")
    design = pd.concat([pd.DataFrame({"Intercept": 1.0}, index=table.index), table[REGRET_COLUMNS],
                        (table["wave"] == "regret-day-14").astype(float).rename("day14")], axis=1)
    full = sm.OLS(table["regret"], design).fit()
    same(d.residuals["residual"], full.resid)
    se = float(regret.effect("role_coach")["se"])  # the cluster-robust (CR2) one
    influence = d.influence.set_index("participant_code")
    for code in sorted(table["participant_code"].unique())[:6]:
        keep = table["participant_code"] != code
        without = sm.OLS(table["regret"][keep], design[keep]).fit()
        change = float(without.params["role_coach"] - full.params["role_coach"])
        assert influence.loc[code, "change"] == pytest.approx(change, rel=1e-7, abs=1e-10)
        assert influence.loc[code, "dfbetas"] == pytest.approx(change / se, rel=1e-7, abs=1e-10)

    # One row per participant: leaving a participant out is leaving a row out, statsmodels' Cook's distance.
    rng = np.random.default_rng(3)
    x = pd.DataFrame({"const": 1.0, "a": rng.normal(size=40), "b": rng.normal(size=40)})
    y = x.to_numpy() @ np.array([1.0, 0.5, -0.3]) + rng.normal(size=40)
    ols = sm.OLS(y, x).fit()
    one = ols_diagnostics(y, x, np.array([f"p{i:02d}" for i in range(40)]), "a", float(ols.bse["a"]), "y")
    same(one.influence["cooks_distance"], OLSInfluence(ols).cooks_distance[0])
    same(one.influence["change"], -OLSInfluence(ols).dfbeta[:, 1])  # statsmodels' dfbeta: with minus without
    assert one.top().iloc[0]["participant_code"] == f"p{np.argmax(np.abs(OLSInfluence(ols).dfbeta[:, 1])):02d}"


def test_a_planted_influential_participant_comes_first(drawn: Drawn) -> None:
    panel = drawn.data.panel.copy()
    perma = panel[(panel["instrument_id"] == PERMA) & (panel["arm"] == "wellbeing")
                  & (panel["response_status"] == "completed")]
    both = perma.groupby("participant_code")["wave"].nunique()
    planted = str(both[both == 3].index[0])  # baseline and both follow-ups answered
    rows = panel["participant_code"] == planted
    panel.loc[rows & (panel["wave"] == "perma-week-4"), "perma_overall_wellbeing"] = 10.0
    panel.loc[rows & (panel["wave"] == "perma-week-1"), "perma_overall_wellbeing"] = 0.0
    data = StudyData(panel=panel, conversations=drawn.data.conversations)
    checks = diagnose(perma_trajectories(data, random_slopes=False), regret_model(data))
    d = checks[0]
    top = d.top()
    assert top.iloc[0]["participant_code"] == planted
    assert bool(top.iloc[0]["influential"])
    assert top.iloc[0]["change"] < 0  # without the planted rise the arm's slope is lower
    assert abs(top.iloc[0]["dfbetas"]) > 2 * abs(top.iloc[1]["dfbetas"])
    page = diagnostics_section(checks)
    assert page.count('data-plot="diagnostics-') == 2
    assert f"the largest, {planted}," in page


def test_nothing_to_diagnose_says_why() -> None:
    with pytest.raises(ValueError, match="neither the PERMA model nor the regret model"):
        diagnose(None, None)
    assert "Not computed: the data are thin." in diagnostics_section(None, "the data are thin")
