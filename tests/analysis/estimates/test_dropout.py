"""``analysis.estimates.dropout`` against direct lifelines and statsmodels fits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from lifelines import CoxPHFitter, KaplanMeierFitter
from lifelines.statistics import multivariate_logrank_test, proportional_hazard_test

from analysis.estimates import dropout_survival
from tests.analysis.estimates.drawn import draw_study, same


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
