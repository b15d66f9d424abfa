"""``analysis.models``, every statistic against a truth: direct statsmodels and lifelines fits of
tables built by hand in the test, parameter recovery on panels drawn here from a known model
(seeded), and a simulated study run through the real services with its stored true effects.

``draw_study`` draws the tables twice over: as the read side shapes them (the panel, the
conversation features, the survival table: what the models take) and as the plain analysis
tables a statistician would build by hand (``Drawn.perma``, ``Drawn.decisions``,
``Drawn.people``: what the direct fits take)."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
import statsmodels.api as sm
from lifelines import CoxPHFitter, KaplanMeierFitter
from lifelines.statistics import multivariate_logrank_test, proportional_hazard_test
from sqlalchemy.engine import Engine
from statsmodels.stats.multitest import multipletests
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from analysis import models
from analysis.models import (
    StudyData,
    dropout_survival,
    feature_screen,
    immediate_vs_delayed,
    perma_trajectories,
    regret_model,
    subgroup_effects,
)
from analysis.panel import PERMA, REGRET
from analysis.simulation.population import Effects
from analysis.simulation.simulate import simulate
from analysis.tables import SimulationRun
from study import clock
from study.db import session_scope
from study.models import Study, WithdrawalLevel
from tests.analysis.panel_builders import PanelBuilder, perma_answers
from tests.analysis.robust_truth import direct_cr2
from tests.builders import load_study

ROLES = ("concierge", "collaborator", "coach")
REGIONS = ("Europe", "America", "Asia")
PERMA_WAVES = (("perma-week-1", 1, 7.0), ("perma-week-4", 2, 28.0))
REGRET_WAVES = (("regret-day-3", 3.0), ("regret-day-14", 14.0))
REGRET_COLUMNS = ["role_coach", "agree_share", "overrides", "affirmation_per_100_words", "sentiment_change",
                  "reassurance_seeking_turns"]


# A panel drawn from a known model


@dataclass(frozen=True)
class Truth:
    """The generative model, with ``analysis.simulation.population.Effects``' structure: PERMA at the k-th
    follow-up = latent level + arm_per_wave * k in the well-being arm (by time zone region if
    ``arm_per_wave_by_region``); regret = 30 + regret_coach (ended in coach) + regret_per_agree_share
    * agree share + person + noise; a follow-up is answered with log-odds 1.4 +
    answer_per_point * (baseline - 6.5); dropout hazard multiplied by exp(dropout_per_point) per
    baseline point. The exit rating follows the agree share, is pure noise, or follows the regret."""

    arm_per_wave: float = 0.4
    regret_coach: float = -12.0
    regret_per_agree_share: float = 15.0
    exit_rating: str = "agree_share"  # or "noise", or "regret"
    dropout_per_point: float = -0.5
    answer_per_point: float = 0.5
    all_answered: bool = False
    arm_per_wave_by_region: Mapping[str, float] = field(default_factory=dict)
    slope_sd: float = 0.0  # a participant's own change per wave (a random slope)
    perma_waves: tuple[tuple[str, int, float], ...] = PERMA_WAVES


NULL = Truth(arm_per_wave=0.0, regret_coach=0.0, regret_per_agree_share=0.0, dropout_per_point=0.0,
             answer_per_point=0.0)


@dataclass(frozen=True)
class Drawn:
    data: StudyData
    perma: pd.DataFrame  # one row per PERMA follow-up: participant, wave, wellbeing, baseline, y, status
    decisions: pd.DataFrame  # one row per regret follow-up: participant, wave, regret, features, status
    people: pd.DataFrame  # one row per participant: baseline, wellbeing, duration, event


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def draw_study(seed: int, n: int = 300, truth: Truth | None = None, decisions: int = 3) -> Drawn:
    truth = truth or Truth()
    rng = np.random.default_rng(seed)
    codes = np.array([f"p{i:04d}" for i in range(n)])
    wellbeing = rng.random(n) < 0.5
    latent = rng.normal(6.5, 1.3, n)
    baseline = np.clip(latent + rng.normal(0, 0.3, n), 0, 10)
    region = rng.choice(REGIONS, n)
    usual = np.where(wellbeing, rng.choice(ROLES, n, p=[0.3, 0.35, 0.35]), "standard")
    answered = (np.ones(n) if truth.all_answered
                else _logistic(1.4 + truth.answer_per_point * (baseline - 6.5)))
    person_regret = rng.normal(0, 8, n)
    slope = rng.normal(0, truth.slope_sd, n) if truth.slope_sd else np.zeros(n)
    person = pd.DataFrame({"participant_code": codes, "arm": np.where(wellbeing, "wellbeing", "control"),
                           "mode": np.where(wellbeing, "wellbeing", "default"), "first_role": usual,
                           "participant_status": "enrolled", "timezone_region": region,
                           "baseline_perma_overall_wellbeing": baseline})

    conversations: list[dict[str, Any]] = []
    regret_rows: list[dict[str, Any]] = []
    for i in range(n):
        for _ in range(decisions):
            cid = len(conversations) + 1
            role = usual[i] if not wellbeing[i] or rng.random() < 0.8 else str(rng.choice(ROLES))
            assistant = 1 + int(rng.poisson(2))
            agree = int(rng.binomial(assistant, 0.95 if role in ("standard", "concierge") else 0.7))
            challenge = int(rng.binomial(assistant - agree, 0.5))
            share = agree / assistant
            latent_regret = (30 + truth.regret_coach * (role == "coach") + truth.regret_per_agree_share * share
                             + person_regret[i] + rng.normal(0, 8))
            if truth.exit_rating == "noise":
                exit_rating = float(rng.integers(1, 8))
            elif truth.exit_rating == "regret":
                exit_rating = float(np.clip(np.round(7 - latent_regret / 12 + rng.normal(0, 0.3)), 1, 7))
            else:
                exit_rating = float(np.clip(np.round(4 + 1.5 * share + rng.normal(0, 1)), 1, 7))
            conversations.append({
                "conversation_id": cid, "participant_code": codes[i], "arm": person["arm"][i],
                "mode": person["mode"][i], "starting_role": role, "final_role": role,
                "participant_turns": assistant, "assistant_turns": assistant, "agree_turns": agree,
                "nudge_turns": assistant - agree - challenge, "challenge_turns": challenge, "escalate_turns": 0,
                "pushback_rate": (assistant - agree) / assistant,
                "overrides": int(rng.binomial(assistant - agree, 0.25)),
                "reassurance_seeking_turns": int(rng.poisson(0.3)),
                "affirmation_per_100_words": float(rng.exponential(3.0 if role == "standard" else 0.2)),
                "sentiment_change": float(rng.normal(0, 0.3)), "exit_rating": exit_rating,
                "made_decision": True, "decision_id": cid, "day": float(rng.uniform(0, 27))})
            for wave, offset in REGRET_WAVES:
                done = rng.random() < answered[i]
                regret = float(np.clip(latent_regret + rng.normal(0, 5), 0, 100))
                regret_rows.append({"participant_code": codes[i], "wave": wave, "anchor_key": f"decision:{cid}",
                                    "instrument_id": REGRET, "decision_id": cid, "decision_conversation_id": cid,
                                    "days_since_enrollment": conversations[-1]["day"] + offset,
                                    "response_status": "completed" if done else "expired",
                                    "regret": regret if done else np.nan})
    talks = pd.DataFrame(conversations)

    perma_rows: list[dict[str, Any]] = []
    for i in range(n):
        effect = truth.arm_per_wave_by_region.get(region[i], truth.arm_per_wave)
        mine = talks[talks["participant_code"] == codes[i]]
        for wave, k, day in truth.perma_waves:
            done = rng.random() < answered[i]
            y = float(np.clip(latent[i] + (effect * wellbeing[i] + slope[i]) * k + rng.normal(0, 0.5), 0, 10))
            before = mine[mine["day"] < day]
            assistant = before["assistant_turns"].sum()
            perma_rows.append({
                "participant_code": codes[i], "wave": wave, "wave_number": k, "anchor_key": "enrollment",
                "instrument_id": PERMA, "days_since_enrollment": day,
                "response_status": "completed" if done else "expired", "perma_overall_wellbeing": y if done else np.nan,
                "conv_n_conversations": len(before), "conv_assistant_turns": assistant,
                "conv_agree_turns": before["agree_turns"].sum(),
                "conv_pushback_rate": (assistant - before["agree_turns"].sum()) / assistant if assistant else np.nan,
                "conv_overrides": before["overrides"].sum(),
                "conv_reassurance_seeking_turns": before["reassurance_seeking_turns"].sum(),
                "conv_affirmation_per_100_words": before["affirmation_per_100_words"].mean(),
                "conv_mean_sentiment_change": before["sentiment_change"].mean(),
                "conv_mean_exit_rating": before["exit_rating"].mean()})
    baseline_rows = person[["participant_code"]].assign(
        wave="baseline", anchor_key="enrollment", instrument_id=PERMA, days_since_enrollment=0.0,
        response_status="completed", perma_overall_wellbeing=baseline)
    panel = pd.concat([baseline_rows, pd.DataFrame(perma_rows).drop(columns="wave_number"),
                       pd.DataFrame(regret_rows)], ignore_index=True)
    panel = person.merge(panel, on="participant_code")
    for column in ("decision_id", "decision_conversation_id"):
        panel[column] = panel[column].astype("Int64")

    hazard = 0.02 * np.exp(truth.dropout_per_point * (baseline - 6.5))
    time = rng.exponential(1 / hazard)
    survival = person[["participant_code", "arm", "mode", "first_role"]].assign(
        duration_days=np.minimum(time, 35.0), event=(time < 35.0).astype(int),
        event_type=np.where(time < 35.0, "missed_followup", "censored"))

    perma = pd.DataFrame(perma_rows).merge(person, on="participant_code")
    perma = perma.assign(wellbeing=(perma["arm"] == "wellbeing").astype(float),
                         baseline=perma["baseline_perma_overall_wellbeing"], y=perma["perma_overall_wellbeing"])
    table = pd.DataFrame(regret_rows).merge(talks.drop(columns=["participant_code", "decision_id"]),
                                            left_on="decision_conversation_id", right_on="conversation_id")
    table["role_coach"] = (table["final_role"] == "coach").astype(float)
    table["agree_share"] = table["agree_turns"] / table["assistant_turns"]
    people = person.assign(wellbeing=wellbeing.astype(float), baseline_wellbeing=baseline,
                           duration_days=survival["duration_days"], event=survival["event"])
    return Drawn(StudyData(panel=panel, conversations=talks.drop(columns="day"), survival=survival),
                 perma, table, people)


def covers(row: Any, value: float) -> bool:
    return bool(row["ci_low"] <= value <= row["ci_high"])


def same(actual: Any, desired: Any) -> None:
    """Equal to a direct fit's numbers up to floating-point noise."""
    np.testing.assert_allclose(np.asarray(actual, dtype=float), np.asarray(desired, dtype=float), rtol=1e-8,
                               atol=1e-10)


def pick(frame: pd.DataFrame, **where: Any) -> Any:
    """The one row of ``frame`` whose columns hold the values in ``where``."""
    mask = np.ones(len(frame), dtype=bool)
    for column, value in where.items():
        mask &= (frame[column] == value).to_numpy()
    assert mask.sum() == 1, where
    return frame[mask].iloc[0]


# Direct fits of tables built by hand


def perma_table(drawn: Drawn) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The completed PERMA follow-ups and their design: intercept, baseline, wave 1/2, arm, arm x wave."""
    table = drawn.perma[drawn.perma["response_status"] == "completed"].sort_values(["participant_code", "wave_number"])
    wave = table["wave_number"].astype(float)
    return table, pd.DataFrame({"Intercept": 1.0, "baseline": table["baseline"], "wave": wave,
                                "wellbeing": table["wellbeing"], "wellbeing_wave": table["wellbeing"] * wave})


def test_the_mixed_model_equals_a_direct_statsmodels_fit() -> None:
    drawn = draw_study(seed=1, n=60)
    fit = perma_trajectories(drawn.data, random_slopes=False)

    table, design = perma_table(drawn)
    direct = sm.MixedLM(table["y"], design, groups=table["participant_code"]).fit(reml=True)
    fixed = fit.fixed_effects
    assert list(fixed["term"]) == ["Intercept", "baseline", "wave", "wellbeing vs control",
                                   "wellbeing vs control x wave"]
    same(fixed["estimate"], direct.fe_params)
    same(fixed["se"], direct.bse_fe)
    same(fixed["p"], direct.pvalues.iloc[:5])
    assert fit.random_effects.set_index("parameter").loc["residual variance", "value"] == pytest.approx(direct.scale)

    # The marginal mean of the well-being arm at wave 2 and the arm difference there, by hand.
    beta, cov = direct.fe_params.to_numpy(), np.asarray(direct.cov_params())[:5, :5]
    x = np.array([1.0, table["baseline"].mean(), 2.0, 1.0, 2.0])
    row = pick(fit.marginal_means, group="wellbeing", wave_number=2)
    assert row["mean"] == pytest.approx(x @ beta, rel=1e-10)
    assert row["se"] == pytest.approx(np.sqrt(x @ cov @ x), rel=1e-8)
    assert row["ci_low"] == pytest.approx(x @ beta - 1.959963984540054 * np.sqrt(x @ cov @ x), rel=1e-8)
    assert row["observed_n"] == ((table["wellbeing"] == 1) & (table["wave_number"] == 2)).sum()
    contrast = pick(fit.contrasts, wave_number=2)
    d = np.array([0, 0, 0, 1.0, 2.0])
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
    assert fit.random_effects["structure"].iloc[0] == "participant intercept and wave slope"
    table, design = perma_table(drawn)
    slopes = pd.DataFrame({"Intercept": 1.0, "wave": table["wave_number"] * 1.0})
    direct = sm.MixedLM(table["y"], design, groups=table["participant_code"], exog_re=slopes).fit(reml=True)
    same(fit.fixed_effects["estimate"], direct.fe_params)
    same(fit.fixed_effects["se"], direct.bse_fe)
    variances = fit.random_effects.set_index("parameter")["value"]
    assert variances["participant wave-slope variance"] == pytest.approx(direct.cov_re.iloc[1, 1], rel=1e-6)
    assert 0.4**2 / 2 < variances["participant wave-slope variance"] < 0.4**2 * 2

    # Two waves: a random slope is not identified; the model says so and has intercepts only.
    drawn = draw_study(seed=2, n=60)
    fit = perma_trajectories(drawn.data, random_slopes=True)
    assert fit.random_effects["structure"].iloc[0] == "participant intercept"
    assert any("random slopes on wave need at least three waves" in note for note in fit.notes)
    table, design = perma_table(drawn)
    direct = sm.MixedLM(table["y"], design, groups=table["participant_code"]).fit(reml=True)
    same(fit.fixed_effects["estimate"], direct.fe_params)
    same(fit.fixed_effects["se"], direct.bse_fe)


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
    same(fit.fixed_effects["estimate"], direct.fe_params)
    same(fit.fixed_effects["se"], direct.bse_fe)
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
    left_out = ("observed in only some groups so far" if early else "no observed values yet") + " at perma-week-4"
    assert any(left_out in note for note in fit.notes)
    sample = fit.samples["overall_wellbeing"]
    assert sample.observations == len(table)
    assert pick(sample.missingness, wave="perma-week-4")[["not_yet_due", "eligible", "used"]].tolist() == [
        int(later.sum()), early, 0]
    overall = pick(subgroups.effects, outcome="perma_overall_wellbeing", subgroup="all")
    assert overall["estimate"] == pytest.approx(direct.params["wellbeing"], rel=1e-10)


def test_the_regret_model_equals_a_direct_cluster_robust_ols_fit() -> None:
    drawn = draw_study(seed=4, n=60)
    fit = regret_model(drawn.data)
    table = drawn.decisions[drawn.decisions["response_status"] == "completed"].sort_values(
        ["participant_code", "days_since_enrollment", "wave", "decision_id"], kind="stable")
    design = pd.concat([pd.DataFrame({"Intercept": 1.0}, index=table.index), table[REGRET_COLUMNS],
                        (table["wave"] == "regret-day-14").astype(float).rename("day14")], axis=1)
    direct = direct_cr2(table["regret"], design, table["participant_code"])
    coefficients = fit.coefficients
    assert list(coefficients["term"]) == ["Intercept", *REGRET_COLUMNS, "wave regret-day-14"]
    same(coefficients["estimate"], direct["estimate"])
    same(coefficients["se"], direct["se"])
    same(coefficients[["ci_low", "ci_high"]], direct[["ci_low", "ci_high"]])
    same(coefficients["p"], direct["p"])
    assert fit.sample.observations == len(table)
    assert fit.sample.eligible_observations == len(drawn.decisions)
    assert fit.sample.participants == table["participant_code"].nunique()


def test_kaplan_meier_log_rank_cox_and_response_odds_equal_direct_lifelines_and_statsmodels_fits() -> None:
    drawn = draw_study(seed=5, n=80)
    fit = dropout_survival(drawn.data)
    people = drawn.people.sort_values("participant_code")

    for arm, part in people.groupby("arm"):
        direct = KaplanMeierFitter().fit(part["duration_days"], part["event"], label="km")
        curve = fit.curves[(fit.curves["by"] == "arm") & (fit.curves["group"] == arm)]
        same(curve["days"], direct.survival_function_.index)
        same(curve["survival"], direct.survival_function_["km"])
        same(curve["ci_low"], direct.confidence_interval_["km_lower_0.95"])
        same(curve["ci_high"], direct.confidence_interval_["km_upper_0.95"])
        assert curve["at_risk"].iloc[0] == len(part)
    logrank = multivariate_logrank_test(people["duration_days"], people["first_role"], people["event"])
    row = fit.logrank.set_index("by").loc["role"]
    assert row["test_statistic"] == pytest.approx(logrank.test_statistic, rel=1e-10)
    assert row["p"] == pytest.approx(logrank.p_value, rel=1e-10)
    assert row["df"] == 3  # standard, concierge, collaborator, coach

    cox_table = people[["baseline_wellbeing", "wellbeing", "duration_days", "event"]].reset_index(drop=True)
    cox = CoxPHFitter().fit(cox_table, duration_col="duration_days", event_col="event")
    assert list(fit.cox["term"]) == ["baseline_wellbeing", "wellbeing vs control"]
    same(fit.cox["coef"], cox.params_)
    same(fit.cox["se"], cox.standard_errors_)
    same(fit.cox["hazard_ratio"], np.exp(cox.params_))
    ph = proportional_hazard_test(cox, cox_table, time_transform="rank").summary
    same(fit.proportional_hazards["p"], ph["p"])
    assert fit.sample.participants == len(people)
    assert fit.groups.set_index(["by", "group"]).loc[("arm", "control"), "events"] == \
        people.loc[people["arm"] == "control", "event"].sum()

    asked = pd.concat([drawn.perma[["participant_code", "days_since_enrollment", "wave", "response_status"]],
                       drawn.decisions[["participant_code", "days_since_enrollment", "wave", "response_status"]]])
    asked = asked.merge(people[["participant_code", "baseline_wellbeing", "wellbeing"]], on="participant_code")
    asked = asked.sort_values(["participant_code", "days_since_enrollment", "wave"], kind="stable")
    design = pd.DataFrame({"Intercept": 1.0, "baseline": asked["baseline_wellbeing"], "wellbeing": asked["wellbeing"]})
    logit = sm.Logit((asked["response_status"] == "completed").astype(float), design).fit(
        disp=0, cov_type="cluster", cov_kwds={"groups": pd.factorize(asked["participant_code"])[0]})
    same(fit.response["estimate"], logit.params)
    same(fit.response["se"], logit.bse)


def test_the_feature_screen_reports_direct_p_values_and_their_benjamini_hochberg_adjustment() -> None:
    drawn = draw_study(seed=6, n=100)
    features = ["agree_share", "role_coach", "overrides", "exit_rating", "sentiment_change", "pushback_rate"]
    screen = feature_screen(drawn.data, regret_features=features,
                            perma_features=["conv_mean_exit_rating", "agree_share", "wellbeing_mode"])
    table = drawn.decisions[drawn.decisions["response_status"] == "completed"]
    raw: dict[str, float] = {}
    for feature in features:
        design = pd.DataFrame({"Intercept": 1.0, feature: table[feature]})
        truth = direct_cr2(table["regret"], design, table["participant_code"]).loc[feature].to_dict()
        raw[feature] = truth["p"]
        row = screen.table[(screen.table["outcome"] == "regret") & (screen.table["feature"] == feature)].iloc[0]
        assert row["estimate"] == pytest.approx(truth["estimate"], rel=1e-10)
        assert row["se"] == pytest.approx(truth["se"], rel=1e-9)
        assert row["estimate_per_sd"] == pytest.approx(truth["estimate"] * table[feature].std(), rel=1e-10)
    regret_rows = screen.table[screen.table["outcome"] == "regret"].set_index("feature")
    np.testing.assert_allclose(regret_rows.loc[features, "p"], [raw[f] for f in features], rtol=1e-8)
    adjusted = multipletests([raw[f] for f in features], alpha=0.05, method="fdr_bh")
    np.testing.assert_allclose(regret_rows.loc[features, "p_bh"], adjusted[1], rtol=1e-10)
    assert list(regret_rows.loc[features, "significant_bh"]) == list(adjusted[0])
    assert regret_rows.loc["role_coach", "significant_bh"]  # a true effect survives the adjustment

    change = drawn.perma[drawn.perma["response_status"] == "completed"]
    change = change.assign(perma_change=change["y"] - change["baseline"])
    used = change["conv_mean_exit_rating"].notna()
    design = pd.DataFrame({"Intercept": 1.0, "x": change.loc[used, "conv_mean_exit_rating"]})
    direct = direct_cr2(change.loc[used, "perma_change"], design, change.loc[used, "participant_code"])
    row = screen.table[(screen.table["outcome"] == "perma_change")
                       & (screen.table["feature"] == "conv_mean_exit_rating")].iloc[0]
    assert row["p"] == pytest.approx(direct.loc["x", "p"], rel=1e-8)
    assert row["observations"] == used.sum()


def test_subgroups_show_harm_to_one_group() -> None:
    truth = Truth(arm_per_wave_by_region={"Europe": 0.6, "America": -0.6, "Asia": 0.6})
    drawn = draw_study(seed=7, n=450, truth=truth, decisions=2)
    fit = subgroup_effects(drawn.data)
    def region(level: str) -> Any:
        return pick(fit.effects, outcome="perma_overall_wellbeing", subgroup="timezone_region", level=level)

    # Averaged over follow-ups 1 and 2 the arm difference is 1.5 x the per-wave effect.
    assert covers(region("America"), -0.9)
    assert region("America")["ci_high"] < 0
    assert region("Europe")["ci_low"] > 0
    assert region("Asia")["ci_low"] > 0
    assert pick(fit.heterogeneity, outcome="perma_overall_wellbeing", subgroup="timezone_region")["p"] < 0.001

    table = drawn.perma[(drawn.perma["response_status"] == "completed") & (drawn.perma["timezone_region"] == "America")]
    design = pd.DataFrame({"Intercept": 1.0, "baseline": table["baseline"],
                           "week4": (table["wave_number"] == 2).astype(float), "wellbeing": table["wellbeing"]})
    direct = direct_cr2(table["y"], design, table["participant_code"]).loc["wellbeing"]
    assert region("America")["estimate"] == pytest.approx(direct["estimate"], rel=1e-10)
    assert region("America")["se"] == pytest.approx(direct["se"], rel=1e-9)

    terciles = fit.effects[(fit.effects["outcome"] == "regret") & (fit.effects["subgroup"] == "baseline_tercile")]
    assert list(terciles["level"]) == ["high", "low", "middle"]
    assert (terciles["ci_high"] < 0).all()  # the coach effect is the same in each: seen in each, no heterogeneity
    assert pick(fit.heterogeneity, outcome="regret", subgroup="baseline_tercile")["p"] > 0.05
    assert fit.subgroups.groupby("subgroup")["participants"].sum()["baseline_tercile"] == 450


def test_auc_and_r2_by_hand() -> None:
    positive = np.array([True, True, False, False, True])
    score = np.array([0.9, 0.4, 0.5, 0.1, 0.5])
    # Pairs (positive, negative): 0.9>0.5, 0.9>0.1, 0.4<0.5, 0.4>0.1, 0.5=0.5 (half), 0.5>0.1 -> 4.5 / 6.
    assert models._auc(positive, score) == pytest.approx(4.5 / 6)
    # Deviations y: -1, 0, 1; predictions: -1/3, 1/6, 1/6: r = 0.5 / sqrt(2 * 1/6), r² = 0.75.
    y, predicted = np.array([1.0, 2.0, 3.0]), np.array([1.5, 2.0, 2.0])
    assert models._r2(y, predicted) == pytest.approx(0.75)
    assert models._r2(y, predicted[::-1]) == pytest.approx(-0.75)  # pointing the wrong way


def test_a_bootstrap_replicate_scored_from_sums_equals_least_squares_on_the_duplicated_rows() -> None:
    """The bootstrap weights each participant by the times drawn and fits each fold from the other
    folds' sums of squares; by hand: duplicate the rows, least squares, unweighted R² and AUC."""
    rng = np.random.default_rng(5)
    person = np.repeat(np.arange(30), rng.integers(1, 4, 30))
    x = np.round(rng.normal(size=(len(person), 2)), 1)
    y = x @ np.array([1.0, -0.5]) + rng.normal(size=len(person))
    positive = y > np.median(y)
    design = np.column_stack([np.ones(len(y)), x])
    prediction = models._Prediction.build(y, positive, {"features": design}, person)
    times = np.bincount(rng.integers(0, 30, 30), minlength=30)
    fold = np.where(times > 0, rng.integers(0, 3, 30), -1)
    scores = prediction.scores(times, fold, 3, {"features": prediction._sums(design)})

    rows = np.concatenate([np.flatnonzero(person == p) for p in range(30) for _ in range(times[p])])
    row_fold = fold[person[rows]]
    r2, auc, sizes = [], [], []
    for f in range(3):
        train, test = rows[row_fold != f], rows[row_fold == f]
        beta = np.linalg.lstsq(design[train], y[train], rcond=None)[0]
        r2.append(models._r2(y[test], design[test] @ beta))
        auc.append(models._auc(positive[test], design[test] @ beta))
        sizes.append(len(test))
    assert scores["r2_features"] == pytest.approx(np.average(r2, weights=sizes), rel=1e-9)
    assert scores["auc_features"] == pytest.approx(np.average(auc, weights=sizes), rel=1e-9)
    # Weights are duplicated rows for the two scores as well.
    weights = rng.integers(1, 4, len(y))
    copies = np.repeat(np.arange(len(y)), weights)
    assert models._auc(positive, x[:, 0], weights.astype(float)) == pytest.approx(models._auc(positive[copies],
                                                                                             x[copies, 0]))
    assert models._r2(y, x[:, 0], weights.astype(float)) == pytest.approx(models._r2(y[copies], x[copies, 0]))


# Parameter recovery


@pytest.fixture(scope="module")
def recovered() -> dict[str, Any]:
    drawn = draw_study(seed=11, n=400)
    return {"perma": perma_trajectories(drawn.data), "regret": regret_model(drawn.data),
            "dropout": dropout_survival(drawn.data)}


def test_the_intervals_contain_the_true_effects(recovered: dict[str, Any]) -> None:
    truth = Truth()
    arm_wave = recovered["perma"].effect("wellbeing vs control x wave")
    assert covers(arm_wave, truth.arm_per_wave)
    assert arm_wave["ci_low"] > 0
    assert covers(recovered["perma"].effect("wellbeing vs control"), 0.0)  # no difference before the first wave
    coach, agree = recovered["regret"].effect("role_coach"), recovered["regret"].effect("agree_share")
    assert covers(coach, truth.regret_coach)
    assert coach["ci_high"] < 0
    assert covers(agree, truth.regret_per_agree_share)
    assert agree["ci_low"] > 0
    cox = recovered["dropout"].cox.set_index("term").loc["baseline_wellbeing"]
    assert cox["coef"] - 1.96 * cox["se"] <= truth.dropout_per_point <= cox["coef"] + 1.96 * cox["se"]
    assert np.log(cox["hr_high"]) < 0
    response = recovered["dropout"].response.set_index("term").loc["baseline_wellbeing"]
    assert covers(response, truth.answer_per_point)
    assert response["ci_low"] > 0


def test_with_no_true_effects_the_intervals_cover_zero() -> None:
    drawn = draw_study(seed=12, n=400, truth=NULL)
    assert covers(perma_trajectories(drawn.data).effect("wellbeing vs control x wave"), 0.0)
    regret = regret_model(drawn.data)
    assert covers(regret.effect("role_coach"), 0.0)
    assert covers(regret.effect("agree_share"), 0.0)
    dropout = dropout_survival(drawn.data)
    cox = dropout.cox.set_index("term").loc["baseline_wellbeing"]
    assert cox["hr_low"] <= 1.0 <= cox["hr_high"]
    assert covers(dropout.response.set_index("term").loc["baseline_wellbeing"], 0.0)


def test_multiple_imputation_covers_the_complete_data_truth() -> None:
    drawn = draw_study(seed=13, n=300, truth=Truth(all_answered=True), decisions=1)
    complete = perma_trajectories(drawn.data, random_slopes=False).effect("wellbeing vs control x wave")
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
    effect = fit.effect("wellbeing vs control x wave")
    assert covers(effect, Truth().arm_per_wave)
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
    sample = fit.samples["overall_wellbeing"]
    assert sample.missingness.set_index("wave").loc["all", "imputed"] == removed.sum()
    assert sample.observations == follow_up.sum()
    # The same seed gives the same imputations.
    again = perma_trajectories(data, impute="mice", imputations=8, burn_in=5, random_slopes=False, seed=3)
    assert again.effect("wellbeing vs control x wave")["estimate"] == effect["estimate"]


# Immediate vs delayed


def test_an_uninformative_exit_rating_shows_no_information() -> None:
    drawn = draw_study(seed=21, n=300, truth=Truth(exit_rating="noise"))
    fit = immediate_vs_delayed(drawn.data, n_boot=200, seed=1)
    for outcome in ("regret", "perma_change"):
        r2, auc = fit.row(outcome, "r2"), fit.row(outcome, "auc")
        assert r2["exit_rating_low"] <= 0 <= r2["exit_rating_high"], outcome
        assert auc["exit_rating_low"] <= 0.5 <= auc["exit_rating_high"], outcome
        assert r2["features_low"] > 0, outcome  # the features do carry information
        assert r2["difference_low"] > 0, outcome
        assert r2["participants"] <= 300
        assert r2["replicates"] == 200
    assert fit.samples["regret"].observations == fit.row("regret", "r2")["observations"]


def test_an_informative_exit_rating_is_seen() -> None:
    drawn = draw_study(seed=22, n=200, truth=Truth(exit_rating="regret"))
    fit = immediate_vs_delayed(drawn.data, n_boot=100, seed=1)
    r2, auc = fit.row("regret", "r2"), fit.row("regret", "auc")
    assert r2["exit_rating_low"] > 0.3
    assert auc["exit_rating_low"] > 0.7
    assert r2["exit_rating_low"] <= r2["exit_rating"] <= r2["exit_rating_high"]
    again = immediate_vs_delayed(drawn.data, n_boot=100, seed=1)
    pd.testing.assert_frame_equal(again.table, fit.table)  # seeded
    fewer = immediate_vs_delayed(drawn.data, n_boot=10, seed=1)  # the estimates do not depend on the bootstrap
    pd.testing.assert_frame_equal(fewer.table[["exit_rating", "features"]], fit.table[["exit_rating", "features"]])


def test_bad_input_gets_a_clear_error() -> None:
    drawn = draw_study(seed=31, n=20)
    with pytest.raises(ValueError, match="unknown PERMA score"):
        perma_trajectories(drawn.data, outcomes=["wellness"])
    with pytest.raises(ValueError, match="reference arm 'placebo'"):
        perma_trajectories(drawn.data, reference_arm="placebo")
    with pytest.raises(ValueError, match="unknown feature"):
        regret_model(drawn.data, features=["role", "charm"])
    with pytest.raises(ValueError, match="unknown covariate"):
        dropout_survival(drawn.data, covariates=["shoe_size"])


# Through the database


T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # enrollment: a Monday, 10:00 in Berlin


def overall(domains: int, happiness: int) -> float:
    """Overall well-being when every PERMA item is ``domains`` and 'hap' is ``happiness``."""
    return (15 * domains + happiness) / 16


# arm, baseline (domains, happiness), week 1, week 4 (None: left to expire; "withdrew": withdrew before it)
PEOPLE: list[tuple[str, tuple[int, int], Any, Any]] = [
    ("wellbeing", (6, 7), (7, 8), (7, 7)),
    ("control", (4, 5), (4, 4), (5, 5)),
    ("wellbeing", (7, 6), (8, 8), (9, 8)),
    ("control", (5, 6), (5, 5), (4, 5)),
    ("wellbeing", (5, 4), (6, 6), None),
    ("control", (8, 7), (7, 7), "withdrew"),
    ("wellbeing", (4, 3), None, (6, 5)),
    ("control", (7, 8), None, None),
]


def test_the_pipeline_on_a_hand_built_study_equals_direct_fits(engine: Engine, example_protocol: str,
                                                                frozen_clock: clock.FrozenClock) -> None:
    build = PanelBuilder(engine, example_protocol)
    codes = [build.participant(arm) for arm, *_ in PEOPLE]
    frozen_clock.set(T0 + dt.timedelta(minutes=10))
    for code, (_, (d, h), _, _) in zip(codes, PEOPLE, strict=True):
        build.answer(code, purpose="baseline", instrument="perma-profiler",
                     answers=perma_answers(dict.fromkeys("PERMANH", d), loneliness=3, happiness=h))
    # Week 1 is due 9 March 10:00 Berlin (09:00 UTC), its window closes 12 March; week 4 is due 30 March
    # 10:00 CEST (08:00 UTC) and closes 4 April.
    for due, index, closes in ((dt.datetime(2026, 3, 9, 9, tzinfo=dt.UTC), 2, dt.datetime(2026, 3, 13, tzinfo=dt.UTC)),
                               (dt.datetime(2026, 3, 30, 8, tzinfo=dt.UTC), 3,
                                dt.datetime(2026, 4, 5, 12, tzinfo=dt.UTC))):
        frozen_clock.set(due)
        build.tick()
        frozen_clock.set(due + dt.timedelta(hours=2))
        for code, person in zip(codes, PEOPLE, strict=True):
            answer: Any = person[index]
            if isinstance(answer, tuple):
                d, h = answer
                build.answer(code, purpose="followup", instrument="perma-profiler",
                             answers=perma_answers(dict.fromkeys("PERMANH", int(d)), loneliness=3, happiness=int(h)))
        frozen_clock.set(closes)
        build.tick()  # the unanswered ones expire
        if index == 2:
            frozen_clock.set(dt.datetime(2026, 3, 20, 12, tzinfo=dt.UTC))
            build.withdraw(codes[5], WithdrawalLevel.STOP_CONTACT)

    data = StudyData.load(engine, build.slug)
    assert data.read_at == dt.datetime(2026, 4, 5, 12, tzinfo=dt.UTC)

    # The mixed model: the completed follow-ups, by hand.
    rows: list[dict[str, Any]] = []
    for code, (arm, (bd, bh), *waves) in zip(codes, PEOPLE, strict=True):
        for k, answer in enumerate(waves, start=1):
            if isinstance(answer, tuple):
                rows.append({"participant": code, "wave": float(k), "baseline": overall(bd, bh),
                             "wellbeing": float(arm == "wellbeing"), "y": overall(*answer)})
    table = pd.DataFrame(rows).sort_values(["participant", "wave"]).reset_index(drop=True)
    assert len(table) == 11
    design = pd.DataFrame({"Intercept": 1.0, "baseline": table["baseline"], "wave": table["wave"],
                           "wellbeing": table["wellbeing"], "wellbeing_wave": table["wellbeing"] * table["wave"]})
    # Seven people, eleven rows: the participant variance is estimated at its boundary (0). The
    # direct fit warns; the pipeline says so in its notes instead.
    with pytest.warns(ConvergenceWarning, match="boundary"):
        direct = sm.MixedLM(table["y"], design, groups=table["participant"]).fit(reml=True)
    fit = perma_trajectories(data, random_slopes=False)
    same(fit.fixed_effects["estimate"], direct.fe_params)
    same(fit.fixed_effects["se"], direct.bse_fe)
    assert any("boundary of the parameter space" in note for note in fit.notes)
    sample = fit.samples["overall_wellbeing"]
    assert (sample.participants, sample.observations) == (7, 11)
    assert (sample.eligible_participants, sample.eligible_observations, sample.withdrawn) == (8, 16, 1)
    week1, week4 = pick(sample.missingness, wave="perma-week-1"), pick(sample.missingness, wave="perma-week-4")
    assert week1[["completed", "expired", "used"]].tolist() == [6, 2, 6]
    assert week4[["completed", "expired", "withdrawn", "used"]].tolist() == [5, 2, 1, 5]

    # Survival, by hand: completed everything -> censored at the last submission (28 days 1 hour);
    # missed week 4 -> its window's close (32 days 23 hours); withdrew on 20 March 12:00 (18.125
    # days); missed week 1 -> 12 March 09:00 (10 days).
    duration = [28 + 1 / 24] * 4 + [32 + 23 / 24, 18.125, 10.0, 10.0]
    event = [0, 0, 0, 0, 1, 1, 1, 1]
    people = pd.DataFrame({"participant": codes, "duration_days": duration, "event": event,
                           "baseline_wellbeing": [overall(*p[1]) for p in PEOPLE],
                           "wellbeing": [float(p[0] == "wellbeing") for p in PEOPLE]}).sort_values("participant")
    survival = dropout_survival(data)
    for arm in ("wellbeing", "control"):
        part = people[people["wellbeing"] == float(arm == "wellbeing")]
        km = KaplanMeierFitter().fit(part["duration_days"], part["event"], label="km")
        curve = survival.curves[(survival.curves["by"] == "arm") & (survival.curves["group"] == arm)]
        same(curve["survival"], km.survival_function_["km"])
        same(curve["ci_low"], km.confidence_interval_["km_lower_0.95"])
    cox = CoxPHFitter().fit(people[["baseline_wellbeing", "wellbeing", "duration_days", "event"]],
                            duration_col="duration_days", event_col="event")
    same(survival.cox["coef"], cox.params_)
    same(survival.cox["se"], cox.standard_errors_)
    assert survival.sample.withdrawn == 1


def test_a_simulated_study_recovers_the_coach_effect_on_regret(engine: Engine, example_protocol: str) -> None:
    """Through the real services (about 40 s): the stored true coach effect lies in the interval.
    Regret noise is lowered from the defaults so 50 participants over 3 weeks are enough."""
    slug = load_study(engine, example_protocol)
    with session_scope(engine) as session:  # the arms come from the study's randomization: fix it
        session.execute(sa.update(Study).where(Study.slug == slug).values(allocation_seed="models-e2e"))
    effects = Effects(regret_coach=-15.0, regret_person_sd=3.0, regret_noise_sd=3.0, regret_wave_sd=2.0,
                      decision_prob=1.0, conversations_per_week=3.0, extra_messages_mean=1.0,
                      role_weights={"concierge": 1.0, "collaborator": 1.0, "coach": 2.0})
    result = simulate(engine, slug, participants=50, weeks=3, seed=5, effects=effects, start=T0.replace(hour=0),
                      tick_minutes=120)
    with session_scope(engine, read_only=True) as session:
        run = session.get(SimulationRun, result.run_id)
        assert run is not None
        truth = run.true_effects["regret_coach"]["value"]
    assert truth == -15.0
    fit = regret_model(StudyData.load(engine, slug))
    coach = fit.effect("role_coach")
    assert coach["ci_low"] <= truth <= coach["ci_high"]
    assert coach["ci_high"] < 0
    assert fit.sample.participants > 30
