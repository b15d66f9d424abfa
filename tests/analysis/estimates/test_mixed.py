"""``analysis.estimates.mixed``: the random-intercept REML fit from per-participant sums against
statsmodels' ``MixedLM(...).fit(reml=True)`` on the same data: the fixed effects, their standard
errors and covariance, the random-intercept and residual variances, the REML log-likelihood, the
predicted intercepts and the conditional residuals, to three decimals (and to statsmodels'
optimizer tolerance, 1e-4 relative), on a hand-built table, an unbalanced panel with missing waves
and the synthetic 10,000-participant study's PERMA model."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from statsmodels.regression.mixed_linear_model import MixedLMParams

from analysis.estimates import StudyData, perma_trajectories
from analysis.estimates.mixed import RandomInterceptFit, fit_random_intercept
from analysis.simulation.synthetic import synthetic_study
from tests.analysis.estimates.drawn import agrees


def three_decimals(actual: Any, desired: Any) -> None:
    np.testing.assert_allclose(np.asarray(actual, dtype=float), np.asarray(desired, dtype=float), rtol=0, atol=5e-4)


def equal_to_statsmodels(fit: RandomInterceptFit, y: Any, x: Any, groups: Any) -> Any:
    direct = sm.MixedLM(np.asarray(y, float), np.asarray(x, float), groups=np.asarray(groups)).fit(reml=True)
    assert direct.converged
    k = len(fit.fe_params)
    for ours, theirs in ((fit.fe_params, direct.fe_params), (fit.bse_fe, direct.bse_fe),
                         (fit.cov_params()[:k, :k], np.asarray(direct.cov_params())[:k, :k]),
                         (fit.cov_re, direct.cov_re), (fit.scale, direct.scale), (fit.llf, direct.llf)):
        three_decimals(ours, theirs)
        agrees(ours, theirs)
    # The exact optimum is at least as high as where statsmodels' optimizer stopped.
    assert fit.llf >= direct.llf - 1e-8
    return direct


def test_a_hand_built_table() -> None:
    # Five participants with 1 to 4 rows (one has a single row), two covariates.
    table = pd.DataFrame({
        "participant": ["a", "a", "a", "b", "b", "c", "c", "c", "c", "d", "e", "e"],
        "x": [0.0, 1.0, 2.0, 0.0, 2.0, 0.0, 1.0, 2.0, 3.0, 1.0, 0.0, 3.0],
        "arm": [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
        "y": [5.1, 6.3, 6.8, 3.9, 4.4, 6.0, 6.2, 7.5, 7.9, 4.8, 3.1, 5.0],
    })
    x = pd.DataFrame({"Intercept": 1.0, "x": table["x"], "arm": table["arm"]})
    fit = fit_random_intercept(table["y"], x, table["participant"])
    assert list(fit.fe_params.index) == ["Intercept", "x", "arm"]
    assert fit.method == "REML"
    assert float(np.asarray(fit.cov_re)[0, 0]) > 0  # the participants differ beyond the residual noise here
    direct = equal_to_statsmodels(fit, table["y"], x, table["participant"])
    predicted = fit.predicted_intercepts().set_index("participant_code")["intercept"]
    three_decimals(predicted.loc[["a", "b", "c", "d", "e"]], [float(direct.random_effects[c].iloc[0]) for c in "abcde"])
    three_decimals(fit.fittedvalues, direct.fittedvalues)
    three_decimals(fit.resid, direct.resid)
    # The covariance comes from statsmodels' Hessian (profiled over the residual variance, in the
    # fixed effects and the variance ratio): the same matrix at the same point.
    model = sm.MixedLM(table["y"], x, groups=table["participant"])
    at = MixedLMParams.from_components(fit.fe_params.to_numpy(), cov_re=np.array([[fit.gamma]]))
    hessian, _ = model.hessian(at)
    np.testing.assert_allclose(fit.cov_params(), np.linalg.inv(-hessian), rtol=1e-8)


def test_an_unbalanced_panel_with_missing_waves() -> None:
    rng = np.random.default_rng(11)
    people, waves = 400, 4
    rows = pd.DataFrame([(p, w) for p in range(people) for w in range(waves)], columns=["participant", "wave"])
    rows = rows[rng.random(len(rows)) > 0.35 + 0.1 * rows["wave"]]  # later waves missed more, some people at one
    sizes = rows.groupby("participant").size()
    assert sorted(sizes.unique()) == [1, 2, 3, 4]  # every size from a single row to every wave
    arm = (rows["participant"] % 2).astype(float)
    baseline = rng.normal(6, 1.5, people)[rows["participant"]]
    x = pd.DataFrame({"Intercept": 1.0, "baseline": baseline, "wave": rows["wave"].astype(float), "arm": arm,
                      "arm x wave": arm * rows["wave"]})
    effect = rng.normal(0, 0.7, people)[rows["participant"]]
    y = x.to_numpy() @ np.array([2.0, 0.6, 0.1, 0.3, 0.2]) + effect + rng.normal(0, 1.0, len(rows))
    groups = rows["participant"].map(lambda p: f"P{p:04d}")
    fit = fit_random_intercept(y, x, groups)
    direct = equal_to_statsmodels(fit, y, x, groups)
    predicted = fit.predicted_intercepts().set_index("participant_code")["intercept"]
    three_decimals(predicted.loc[list(direct.random_effects)],
                   [float(value.iloc[0]) for value in direct.random_effects.values()])
    # Rows in any order: the same fit.
    order = rng.permutation(len(y))
    again = fit_random_intercept(y[order], x.iloc[order], groups.iloc[order])
    np.testing.assert_allclose(again.fe_params, fit.fe_params, rtol=1e-6)
    np.testing.assert_allclose(again.bse_fe, fit.bse_fe, rtol=1e-6)


def test_rows_of_a_participant_pulling_apart_put_the_variance_on_the_boundary() -> None:
    # Each participant's two residuals are of opposite sign (a negative within-participant
    # correlation): the REML optimum of a variance that cannot be negative is zero, and the fit is OLS.
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(300), 2)
    x = np.column_stack([np.ones(600), rng.normal(size=600)])
    noise = np.repeat(rng.normal(size=300), 2) * np.tile([1.0, -1.0], 300) + 0.3 * rng.normal(size=600)
    y = x @ [1.0, 0.5] + noise
    fit = fit_random_intercept(y, x, groups)
    assert fit.gamma == 0
    assert fit.on_boundary
    ols = sm.OLS(y, x).fit()
    np.testing.assert_allclose(fit.fe_params, ols.params, rtol=1e-10)
    assert fit.scale == pytest.approx(ols.scale, rel=1e-10)  # REML's residual variance at zero is OLS's
    # statsmodels' gradient methods do not converge here (they creep towards the boundary): the
    # optimum found is at least as high as where they stop.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct = sm.MixedLM(y, x, groups=groups).fit(reml=True)
    assert fit.llf >= direct.llf - 1e-8
    assert np.all(fit.predicted_intercepts()["intercept"] == 0)


def test_a_design_without_full_rank_is_refused() -> None:
    x = np.column_stack([np.ones(6), np.arange(6.0), 2 * np.arange(6.0)])
    with pytest.raises(np.linalg.LinAlgError):
        fit_random_intercept(np.arange(6.0), x, np.repeat([1, 2, 3], 2))


def test_the_synthetic_studys_perma_model_at_10000_participants() -> None:
    study = synthetic_study(10_000, seed=1)
    data = StudyData(panel=study.panel(), conversations=study.conversation_features(), survival=study.survival())
    fit = perma_trajectories(data)
    result = fit.fits["overall_wellbeing"]
    assert isinstance(result, RandomInterceptFit)  # two follow-up waves: random intercepts only
    model = result.model
    assert len(np.unique(model.groups)) > 5_000
    direct = equal_to_statsmodels(result, model.endog, model.exog, model.groups)
    fixed = fit.fixed_effects.set_index("term")
    three_decimals(fixed["estimate"], direct.fe_params)
    three_decimals(fixed["se"], direct.bse_fe)
    variances = fit.random_effects.set_index("parameter")["value"]
    three_decimals(variances["participant intercept variance"], np.asarray(direct.cov_re)[0, 0])
    three_decimals(variances["residual variance"], direct.scale)
