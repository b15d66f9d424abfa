"""``analysis.estimates.perma``: the mixed model of PERMA trajectories against direct statsmodels
fits of tables built by hand, early-study waves, and multiple imputation against the complete data."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from analysis.estimates import StudyData, perma_trajectories, subgroup_effects
from analysis.panel import PERMA
from tests.analysis.estimates.drawn import (
    PERMA_WAVES,
    ROLES,
    Truth,
    agrees,
    covers,
    draw_study,
    per_day,
    perma_table,
    pick,
    same,
)


def test_the_mixed_model_equals_a_direct_statsmodels_fit_with_time_in_days_and_t_intervals() -> None:
    drawn = draw_study(seed=1, n=60)
    fit = perma_trajectories(drawn.data, random_slopes=False)

    table, design = perma_table(drawn)
    direct = sm.MixedLM(table["y"], design, groups=table["participant_code"]).fit(reml=True)
    fixed = fit.fixed_effects
    assert list(fixed["term"]) == ["Intercept", "baseline", "day", "wellbeing vs control",
                                   "wellbeing vs control x day"]
    agrees(fixed["estimate"], direct.fe_params)
    agrees(fixed["se"], direct.bse_fe)
    # Student's t on participants minus fixed effects, by hand (statsmodels' own p-values are z).
    df = table["participant_code"].nunique() - 5
    assert (fixed["df"] == df).all()
    agrees(fixed["p"], 2 * stats.t.sf(np.abs(direct.fe_params / direct.bse_fe), df))
    agrees(fixed["ci_low"], direct.fe_params - stats.t.ppf(0.975, df) * direct.bse_fe)
    assert (fixed["ci_high"] - fixed["ci_low"] > 2 * 1.959963984540054 * fixed["se"]).all()  # wider than z
    assert fit.random_effects.set_index("parameter").loc["residual variance", "value"] == pytest.approx(direct.scale,
                                                                                                        rel=1e-4)

    # The marginal mean of the well-being arm at day 28 and the arm difference there, by hand.
    # (from the fit's own estimates, which equal statsmodels' above to its optimizer's tolerance)
    result = fit.fits["overall_wellbeing"]
    beta, cov = np.asarray(result.fe_params), np.asarray(result.cov_params())[:5, :5]
    x = np.array([1.0, table["baseline"].mean(), 28.0, 1.0, 28.0])
    row = pick(fit.marginal_means, group="wellbeing", wave_number=2)
    assert row["days"] == 28.0
    assert row["mean"] == pytest.approx(x @ beta, rel=1e-10)
    assert row["se"] == pytest.approx(np.sqrt(x @ cov @ x), rel=1e-8)
    assert row["ci_low"] == pytest.approx(x @ beta - stats.t.ppf(0.975, df) * np.sqrt(x @ cov @ x), rel=1e-8)
    assert row["observed_n"] == ((table["wellbeing"] == 1) & (table["wave_number"] == 2)).sum()
    contrast = pick(fit.contrasts, wave_number=2)
    d = np.array([0, 0, 0, 1.0, 28.0])
    assert contrast["estimate"] == pytest.approx(d @ beta, rel=1e-10)
    assert contrast["se"] == pytest.approx(np.sqrt(d @ cov @ d), rel=1e-8)

    # Who is in it: every follow-up row was due; the expired ones are the missing outcomes.
    sample = fit.samples["overall_wellbeing"]
    assert sample.observations == len(table)
    assert sample.participants == table["participant_code"].nunique()
    assert sample.eligible_observations == len(drawn.perma)
    total = sample.missingness.set_index("wave").loc["all"]
    assert total["missing_outcome"] == (drawn.perma["response_status"] == "expired").sum()
    assert total["used"] == len(table)


def test_random_slopes_are_fitted_from_three_waves_and_otherwise_stated() -> None:
    waves = (*PERMA_WAVES, ("perma-week-8", 3, 56.0))
    drawn = draw_study(seed=3, n=150, truth=Truth(slope_sd=0.4, perma_waves=waves), decisions=1)
    fit = perma_trajectories(drawn.data, random_slopes=True)
    assert fit.random_effects["structure"].iloc[0] == "participant intercept and time slope"
    table, design = perma_table(drawn)
    slopes = pd.DataFrame({"Intercept": 1.0, "week": table["days_since_enrollment"] / 7})
    model = sm.MixedLM(table["y"], design, groups=table["participant_code"], exog_re=slopes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = model.fit(reml=True)  # statsmodels' gradient methods stop short here (lme4 fits it)
        direct = model.fit(reml=True, method=["powell"])
    assert not default.converged
    assert direct.converged
    assert direct.llf >= default.llf
    assert any("fitted with powell after" in note for note in fit.notes)  # said, not silent
    same(fit.fixed_effects["estimate"], direct.fe_params)
    same(fit.fixed_effects["se"], direct.bse_fe)
    variances = fit.random_effects.set_index("parameter")["value"]
    assert variances["participant slope variance (per week)"] == pytest.approx(direct.cov_re.iloc[1, 1], rel=1e-6)
    # The drawn slope is 0.4 per wave over waves at days 7, 28 and 56: about 0.4 / 3.5 per week.
    assert (0.4 / 3.5) ** 2 / 3 < variances["participant slope variance (per week)"] < (0.4 / 3.5) ** 2 * 3

    # Two waves: a random slope is not identified; the model says so and has intercepts only.
    drawn = draw_study(seed=2, n=60)
    fit = perma_trajectories(drawn.data, random_slopes=True)
    assert fit.random_effects["structure"].iloc[0] == "participant intercept"
    assert any("random slopes on day need at least three waves" in note for note in fit.notes)
    table, design = perma_table(drawn)
    direct = sm.MixedLM(table["y"], design, groups=table["participant_code"]).fit(reml=True)
    agrees(fit.fixed_effects["estimate"], direct.fe_params)
    agrees(fit.fixed_effects["se"], direct.bse_fe)


def test_categorical_waves_and_roles_within_the_wellbeing_arm() -> None:
    drawn = draw_study(seed=3, n=90)
    fit = perma_trajectories(drawn.data, random_slopes=False, wave_term="categorical", by_role=True)
    table = drawn.perma[drawn.perma["response_status"] == "completed"].sort_values(["participant_code", "wave_number"])
    week4 = (table["wave_number"] == 2).astype(float)
    columns: dict[str, Any] = {"Intercept": 1.0, "baseline": table["baseline"], "week4": week4}
    for role in sorted(ROLES):
        indicator = ((table["arm"] == "wellbeing") & (table["first_role"] == role)).astype(float)
        columns[role], columns[f"{role}_week4"] = indicator, indicator * week4
    direct = sm.MixedLM(table["y"], pd.DataFrame(columns), groups=table["participant_code"]).fit(reml=True)
    assert list(fit.fixed_effects["term"])[:5] == ["Intercept", "baseline", "wave perma-week-4",
                                                   "wellbeing/coach vs control",
                                                   "wellbeing/coach vs control x wave perma-week-4"]
    agrees(fit.fixed_effects["estimate"], direct.fe_params)
    agrees(fit.fixed_effects["se"], direct.bse_fe)
    assert set(fit.marginal_means["group"]) == {"control", "wellbeing/coach", "wellbeing/collaborator",
                                                "wellbeing/concierge"}


@pytest.mark.parametrize("early", [0, 2])
def test_early_in_a_study_a_wave_without_data_is_left_out(early: int) -> None:
    """Week 4 not due yet for anyone (or answered by ``early`` participants of one arm only, who
    enrolled first): one observation per participant, so the random-intercept model is OLS of
    week 1 on baseline and arm; the subgroup models get no empty wave term."""
    drawn = draw_study(seed=8, n=120)
    panel = drawn.data.panel.copy()
    later = panel["wave"] == "perma-week-4"
    answered = panel.index[later & (panel["arm"] == "wellbeing") & panel["perma_overall_wellbeing"].notna()][:early]
    later &= ~panel.index.isin(answered)
    panel.loc[later, "perma_overall_wellbeing"] = np.nan
    panel.loc[later, "response_status"] = "not_yet_due"
    data = StudyData(panel=panel, conversations=drawn.data.conversations, survival=drawn.data.survival)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no singular designs, no convergence trouble
        fit = perma_trajectories(data)
        subgroups = subgroup_effects(data)

    table = drawn.perma[(drawn.perma["response_status"] == "completed") & (drawn.perma["wave_number"] == 1)]
    direct = sm.OLS(table["y"], pd.DataFrame({"Intercept": 1.0, "baseline": table["baseline"],
                                              "wellbeing": table["wellbeing"]})).fit()
    assert list(fit.fixed_effects["term"]) == ["Intercept", "baseline", "wellbeing vs control"]
    same(fit.fixed_effects["estimate"], direct.params)
    same(fit.fixed_effects["se"], direct.bse)
    assert set(fit.marginal_means["wave"]) == {"perma-week-1"}
    assert list(fit.contrasts["estimate"]) == pytest.approx([direct.params["wellbeing"]], rel=1e-10)
    # Standardized: the difference over the standard deviation of the model's participants' baselines.
    spread = float(table["baseline"].std(ddof=1))
    contrast = fit.contrasts.iloc[0]
    assert contrast["baseline_sd"] == pytest.approx(spread, rel=1e-12)
    assert contrast["d"] == pytest.approx(direct.params["wellbeing"] / spread, rel=1e-10)
    assert (contrast["d_low"], contrast["d_high"]) == pytest.approx(
        (contrast["ci_low"] / spread, contrast["ci_high"] / spread), rel=1e-12)
    left_out = ("observed in only some groups so far" if early else "no observed values yet") + " at perma-week-4"
    assert any(left_out in note for note in fit.notes)
    sample = fit.samples["overall_wellbeing"]
    assert sample.observations == len(table)
    assert pick(sample.missingness, wave="perma-week-4")[["not_yet_due", "eligible", "used"]].tolist() == [
        int(later.sum()), early, 0]
    # One wave: no arm x time effect to estimate within subgroups, and the subgroups say so.
    assert "perma_overall_wellbeing" not in set(subgroups.effects["outcome"])
    assert any("no arm x time effect" in note for note in subgroups.notes)


def test_multiple_imputation_covers_the_complete_data_truth() -> None:
    drawn = draw_study(seed=13, n=300, truth=Truth(all_answered=True), decisions=1)
    complete = perma_trajectories(drawn.data, random_slopes=False).effect("wellbeing vs control x day")
    rng = np.random.default_rng(99)
    panel = drawn.data.panel.copy()
    follow_up = (panel["instrument_id"] == PERMA) & (panel["wave"] != "baseline")
    removed = follow_up & (rng.random(len(panel)) < 0.3)  # completely at random
    panel.loc[removed, ["perma_overall_wellbeing"]] = np.nan
    panel.loc[removed, "response_status"] = "expired"
    people = panel["participant_code"].drop_duplicates()
    no_baseline = set(people[rng.random(len(people)) < 0.1])
    panel.loc[panel["participant_code"].isin(no_baseline), "baseline_perma_overall_wellbeing"] = np.nan
    data = StudyData(panel=panel, conversations=drawn.data.conversations, survival=drawn.data.survival)

    fit = perma_trajectories(data, impute="mice", imputations=8, burn_in=5, random_slopes=False, seed=3)
    effect = fit.effect("wellbeing vs control x day")
    assert covers(effect, per_day(Truth())[0])
    assert covers(effect, complete["estimate"])
    assert fit.method == "mice"
    # Rubin's rules by hand from the fits to the imputed data sets.
    results = fit.fits["overall_wellbeing"]
    assert len(results) == 8
    estimates = np.array([np.asarray(r.fe_params)[4] for r in results])
    within = np.mean([np.asarray(r.cov_params())[4, 4] for r in results])
    total = within + (1 + 1 / 8) * estimates.var(ddof=1)
    assert effect["estimate"] == pytest.approx(estimates.mean(), rel=1e-10)
    assert effect["se"] == pytest.approx(np.sqrt(total), rel=1e-10)
    # Barnard and Rubin's degrees of freedom, by hand from the complete-data df (participants - 5).
    between = (1 + 1 / 8) * estimates.var(ddof=1)
    rubin_df = 7 * (1 + within / between) ** 2
    complete_df = panel["participant_code"].nunique() - 5
    observed_df = (complete_df + 1) / (complete_df + 3) * complete_df * (1 - between / total)
    assert effect["df"] == pytest.approx(1 / (1 / rubin_df + 1 / observed_df), rel=1e-10)
    assert effect["ci_low"] == pytest.approx(effect["estimate"] - stats.t.ppf(0.975, effect["df"]) * effect["se"],
                                             rel=1e-10)
    sample = fit.samples["overall_wellbeing"]
    assert sample.missingness.set_index("wave").loc["all", "imputed"] == removed.sum()
    assert sample.observations == follow_up.sum()
    # The same seed gives the same imputations.
    again = perma_trajectories(data, impute="mice", imputations=8, burn_in=5, random_slopes=False, seed=3)
    assert again.effect("wellbeing vs control x day")["estimate"] == effect["estimate"]
