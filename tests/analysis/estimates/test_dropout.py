"""``analysis.estimates.dropout`` against direct lifelines and statsmodels fits, and its
proportional-hazards test against the score test it stands for, computed directly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from lifelines import CoxPHFitter, CoxTimeVaryingFitter, KaplanMeierFitter
from lifelines.datasets import load_rossi
from lifelines.statistics import multivariate_logrank_test

from analysis.estimates import dropout_survival
from analysis.estimates.dropout import PH_TRANSFORMS, cox_zph, time_transform
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
    direct = split_score_tests(cox_table, ["baseline_wellbeing", "wellbeing"],
                               {"baseline_wellbeing": ["baseline_wellbeing"], "arm": ["wellbeing"]}, "km")
    assert list(fit.proportional_hazards["term"]) == ["baseline_wellbeing", "arm", "GLOBAL"]
    np.testing.assert_allclose(fit.proportional_hazards["test_statistic"], list(direct.values()), rtol=1e-9)
    assert set(fit.proportional_hazards["transform"]) == {"km"}
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


def split_score_tests(frame: pd.DataFrame, columns: list[str], terms: dict[str, list[str]], transform: str,
                      duration: str = "duration_days", event: str = "event") -> dict[str, float]:
    """What R's cox.zph computes, done the long way (as survival's own tests/cancer.R checks it):
    each row split at every event time before its own, the covariates times g(t) added as
    time-varying covariates, and the score test of their coefficients at (beta-hat, 0) from the
    gradient and Hessian of the Efron partial likelihood of lifelines' time-varying Cox model
    (beta's part of the gradient taken as 0, as R takes it)."""
    fit = CoxPHFitter().fit(frame[[*columns, duration, event]], duration_col=duration, event_col=event)
    beta = fit.params_[columns].to_numpy()
    t, e = frame[duration].to_numpy(float), frame[event].to_numpy(float) == 1
    transformed = time_transform(t, e, transform)
    g = dict(zip(t, transformed - transformed[e].mean(), strict=True))  # centred over the events, as R does
    cuts = np.unique(t[e])
    pieces = []
    for i in range(len(t)):
        bounds = [0.0, *cuts[cuts < t[i]], t[i]]
        pieces += [(i, start, stop, int(e[i] and stop == t[i]))
                   for start, stop in zip(bounds, bounds[1:], strict=False)]
    row, start, stop, died = (np.array(v) for v in zip(*pieces, strict=True))
    x = frame[columns].to_numpy(float)[row]
    expanded = np.column_stack([x, x * np.array([g[s] for s in stop])[:, None]])
    tests = {}
    for name, members in [*terms.items(), ("GLOBAL", columns)]:
        keep = list(range(len(columns))) + [len(columns) + columns.index(m) for m in members]
        hessian, gradient, _ = CoxTimeVaryingFitter._get_gradients(
            expanded[:, keep], died.astype(bool), start, stop, np.ones(len(stop)),
            np.concatenate([beta, np.zeros(len(members))]))
        gradient[: len(columns)] = 0.0  # zero at beta-hat up to the fit's tolerance; R's cox.zph sets it to 0 too
        tests[name] = float(gradient @ np.linalg.solve(-hessian, gradient))
    return tests


@pytest.mark.parametrize("transform", PH_TRANSFORMS)
def test_the_proportional_hazards_test_is_the_score_test_of_r_cox_zph(transform: str) -> None:
    """On lifelines' Rossi data (weekly times, so many tied arrests: Efron's ties matter) with a
    three-level factor (a two-column term, as R's terms=TRUE tests it): each term's and the
    GLOBAL statistic equal the score test computed the long way."""
    rossi = load_rossi()
    priors = pd.cut(rossi["prio"], [-1, 1, 4, 100], labels=["low", "mid", "high"]).astype(str)
    rossi = rossi.assign(**{"prio mid": (priors == "mid").astype(float), "prio high": (priors == "high").astype(float)})
    columns = ["fin", "age", "prio mid", "prio high"]
    terms = {"fin": ["fin"], "age": ["age"], "prio": ["prio mid", "prio high"]}
    direct = split_score_tests(rossi, columns, terms, transform, duration="week", event="arrest")
    beta = CoxPHFitter().fit(rossi[[*columns, "week", "arrest"]], duration_col="week", event_col="arrest").params_
    table = cox_zph(rossi["week"], rossi["arrest"], rossi[columns], beta[columns], terms, transform=transform)
    assert list(table["term"]) == ["fin", "age", "prio", "GLOBAL"]
    assert list(table["df"]) == [1, 1, 2, 4]
    np.testing.assert_allclose(table["test_statistic"], list(direct.values()), rtol=1e-9)
    assert table["test_statistic"].nunique() == 4  # the terms' tests are not one number copied
