"""Dropping out of follow-ups as survival: Kaplan-Meier curves, log-rank tests and a Cox model
(lifelines), and the odds of completing a follow-up whose window closed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm
from lifelines import CoxPHFitter, KaplanMeierFitter
from lifelines.exceptions import ConvergenceWarning as CoxConvergenceWarning
from lifelines.statistics import multivariate_logrank_test, proportional_hazard_test

from analysis.estimates.common import (
    COMPLETE_CASE,
    LABELS,
    WITHDRAWN,
    Sample,
    StudyData,
    coefficients_table,
    floats,
    indicators,
    pick_reference_arm,
    roles_of,
    sample_of,
    warnings_as_notes,
)

PERSON_FEATURES = ("agree_share", "pushback_rate", "exit_rating", "affirmation_per_100_words")


def _person_features(conversations: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Per participant, over all their conversations: agree share and pushback rate (from the
    summed turns), mean exit rating, affirmation per 100 words (from the summed hits and words)."""
    grouped = conversations.assign(**{c: floats(conversations[c]) for c in conversations.columns
                                      if c.endswith(("_turns", "_hits", "_words")) or c == "exit_rating"}
                                   ).groupby("participant_code")
    out = pd.DataFrame(index=grouped.size().index)

    def ratio(numerators: Sequence[str], denominator: str, scale: float = 1.0) -> pd.Series:
        below = grouped[denominator].sum()
        return scale * sum((grouped[n].sum() for n in numerators), start=pd.Series(0.0, index=below.index)) \
            / below.where(below > 0)

    for name in names:
        if name == "agree_share":
            out[name] = ratio(["agree_turns"], "assistant_turns")
        elif name == "pushback_rate":
            out[name] = ratio(["nudge_turns", "challenge_turns"], "assistant_turns")
        elif name == "exit_rating":
            out[name] = grouped["exit_rating"].mean()
        elif name == "affirmation_per_100_words":
            out[name] = ratio(["affirmation_hits"], "assistant_words", 100.0)
    return out


def _participants(data: StudyData, covariates: Sequence[str] = ()) -> pd.DataFrame:
    """The survival table with baseline covariates from the panel (baseline overall well-being,
    time zone region), the first role ('none' without a conversation) and the per-participant
    conversation features among ``covariates``."""
    frame = data.survival.copy()
    baseline = data.panel.drop_duplicates("participant_code").set_index("participant_code")
    frame["baseline_wellbeing"] = frame["participant_code"].map(floats(baseline["baseline_perma_overall_wellbeing"]))
    if "timezone_region" in baseline:
        frame["timezone_region"] = frame["participant_code"].map(baseline["timezone_region"]).astype(str)
    frame["role"] = roles_of(frame)
    wanted = [name for name in covariates if name in PERSON_FEATURES]
    if wanted:
        frame = frame.join(_person_features(data.conversations, wanted), on="participant_code")
    frame["duration_days"] = floats(frame["duration_days"])
    frame["event"] = floats(frame["event"])
    return frame.sort_values("participant_code", kind="stable").reset_index(drop=True)



def _covariates(frame: pd.DataFrame, covariates: Sequence[str], reference_arm: str) -> pd.DataFrame:
    """The Cox model's covariate columns: numbers as they are, categories as indicators."""
    parts = []
    for name in covariates:
        if name == "arm":
            parts.append(indicators(frame["arm"].astype(str), reference_arm, ""))
        elif name in ("role", "timezone_region"):
            values = frame[name].astype(str)
            reference = "standard" if name == "role" and (values == "standard").any() else values.mode().iloc[0]
            parts.append(indicators(values, reference, f"{name} "))
        elif name in frame:
            parts.append(frame[[name]].astype(float))
        else:
            raise ValueError(f"unknown covariate {name!r}: use baseline_wellbeing, arm, role, timezone_region, "
                             "agree_share, pushback_rate, exit_rating or affirmation_per_100_words")
    return pd.concat(parts, axis=1)


def _kaplan_meier(frame: pd.DataFrame, by: str) -> tuple[list[pd.DataFrame], dict[str, Any]]:
    curves, summary = [], {}
    for level, part in frame.groupby(by, sort=True):
        label = str(level)
        fitter = KaplanMeierFitter(alpha=0.05).fit(part["duration_days"], part["event"], label=label)
        band = fitter.confidence_interval_
        events = fitter.event_table
        curve = pd.DataFrame({
            "by": by, "group": label, "days": fitter.survival_function_.index.to_numpy(float),
            "survival": fitter.survival_function_[label].to_numpy(float),
            "ci_low": band[f"{label}_lower_0.95"].to_numpy(float),
            "ci_high": band[f"{label}_upper_0.95"].to_numpy(float),
            "at_risk": events["at_risk"].reindex(fitter.survival_function_.index).to_numpy(),
            "events": events["observed"].reindex(fitter.survival_function_.index).to_numpy(),
            "censored": events["censored"].reindex(fitter.survival_function_.index).to_numpy()})
        curves.append(curve)
        summary[label] = {"by": by, "group": label, "participants": len(part), "events": int(part["event"].sum()),
                          "median_days": float(fitter.median_survival_time_)}
    return curves, summary


@dataclass(frozen=True)
class DropoutSurvival:
    """Time from enrollment to dropping out of follow-ups (first missed enrollment-anchored
    follow-up or withdrawal). ``curves``: Kaplan-Meier survival with 95% intervals (exponential
    Greenwood) by arm and by first role, one row per time, with numbers at risk (the plot).
    ``groups``: participants, events and median time per group. ``logrank``: one test per
    grouping. ``cox``: hazard ratios with intervals. ``proportional_hazards``: the Schoenfeld-residual
    test per covariate (lifelines ``proportional_hazard_test``; a small p means the hazard ratio
    changes over time). ``response``: log-odds that a follow-up whose window closed was completed
    (vs expired), cluster-robust by participant."""

    curves: pd.DataFrame
    groups: pd.DataFrame
    logrank: pd.DataFrame
    cox: pd.DataFrame
    proportional_hazards: pd.DataFrame
    response: pd.DataFrame
    sample: Sample
    response_sample: Sample
    notes: list[str]
    cox_fit: Any
    response_fit: Any

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"curves": self.curves, "groups": self.groups, "logrank": self.logrank, "cox": self.cox,
                "proportional_hazards": self.proportional_hazards, "response": self.response}


def dropout_survival(data: StudyData, *, covariates: Sequence[str] = ("baseline_wellbeing", "arm"),
                     reference_arm: str | None = None, ph_transform: str = "rank") -> DropoutSurvival:
    """Kaplan-Meier curves by arm and first role, log-rank tests (lifelines
    ``multivariate_logrank_test``), a Cox model (lifelines ``CoxPHFitter``, Efron ties) on
    ``covariates`` with its proportional-hazards test, and a logistic model of completing a
    follow-up on baseline well-being and arm. Covariates: ``baseline_wellbeing`` (baseline PERMA
    overall), ``arm``, ``role`` (first role), ``timezone_region``, or a per-participant
    conversation feature (``agree_share``, ``pushback_rate``, ``exit_rating``,
    ``affirmation_per_100_words``; over all the participant's conversations, so they partly reflect
    how long someone stayed: read them as associations)."""
    frame = _participants(data, covariates)
    if frame.empty:
        raise ValueError("the survival table is empty")
    reference = pick_reference_arm(data.panel, reference_arm)
    notes = ["Dropout: the first missed enrollment-anchored follow-up or withdrawal; censored otherwise.",
             f"Cox model: {COMPLETE_CASE}"]
    curves, groups, tests = [], [], []
    for by in ("arm", "role"):
        by_curves, summary = _kaplan_meier(frame, by)
        curves += by_curves
        groups += list(summary.values())
        if len(summary) > 1:
            test = multivariate_logrank_test(frame["duration_days"], frame[by], frame["event"])
            tests.append({"by": by, "groups": len(summary), "test_statistic": float(test.test_statistic),
                          "df": int(test.degrees_of_freedom), "p": float(test.p_value)})

    design = _covariates(frame, covariates, reference)
    used = design.notna().all(axis=1) & frame["duration_days"].notna()
    cox_frame = pd.concat([design[used], frame.loc[used, ["duration_days", "event"]]], axis=1)
    cox = pd.DataFrame(columns=["term", "label", "coef", "se", "hazard_ratio", "hr_low", "hr_high", "z", "p"])
    hazards = pd.DataFrame(columns=["term", "test_statistic", "p", "transform"])
    fitter = None
    if cox_frame["event"].sum() < 1:
        notes.append("No dropout events: the Cox model is not estimated.")
    else:
        with warnings_as_notes(CoxConvergenceWarning) as caught:
            fitter = CoxPHFitter().fit(cox_frame, duration_col="duration_days", event_col="event")
            test = proportional_hazard_test(fitter, cox_frame, time_transform=ph_transform)
        notes += sorted({f"Cox model: {message}" for message in caught})
        s = fitter.summary
        cox = pd.DataFrame({"term": s.index.astype(str), "label": [LABELS.get(t, t) for t in s.index.astype(str)],
                            "coef": s["coef"].to_numpy(), "se": s["se(coef)"].to_numpy(),
                            "hazard_ratio": s["exp(coef)"].to_numpy(), "hr_low": s["exp(coef) lower 95%"].to_numpy(),
                            "hr_high": s["exp(coef) upper 95%"].to_numpy(), "z": s["z"].to_numpy(),
                            "p": s["p"].to_numpy()})
        ph = test.summary
        hazards = pd.DataFrame({"term": [str(i[0] if isinstance(i, tuple) else i) for i in ph.index],
                                "test_statistic": ph["test_statistic"].to_numpy(), "p": ph["p"].to_numpy(),
                                "transform": ph_transform})
    people = frame.assign(wave="all")
    if "event_type" in frame:
        people["participant_status"] = np.where(frame["event_type"].astype(str) == "withdrew", WITHDRAWN, "enrolled")
    sample = sample_of(people, used, frame["duration_days"].notna())
    response, response_sample, response_fit = _response_model(data, reference)
    return DropoutSurvival(pd.concat(curves, ignore_index=True), pd.DataFrame(groups), pd.DataFrame(tests), cox,
                           hazards, response, sample, response_sample, notes, fitter, response_fit)


def _response_model(data: StudyData, reference: str) -> tuple[pd.DataFrame, Sample, Any]:
    """Logit of completed (vs expired) for every follow-up whose window closed while the
    participant was in the study, on baseline overall well-being and arm; clustered by participant."""
    rows = data.panel[(data.panel["wave"] != "baseline")].copy()
    status = rows["response_status"].astype(str)
    rows["baseline_wellbeing"] = floats(rows["baseline_perma_overall_wellbeing"])
    asked = status.isin(("completed", "expired"))
    used = asked & rows["baseline_wellbeing"].notna()
    frame = rows[used].sort_values(["participant_code", "days_since_enrollment", "wave"], kind="stable")
    sample = sample_of(rows, used, asked)
    if frame.empty or frame["participant_code"].nunique() < 2:
        return pd.DataFrame(), sample, None
    design = pd.concat([pd.DataFrame({"Intercept": 1.0, "baseline_wellbeing": frame["baseline_wellbeing"]}),
                        indicators(frame["arm"].astype(str), reference, "")], axis=1)
    completed = (frame["response_status"].astype(str) == "completed").astype(float)
    result = sm.Logit(completed.to_numpy(), design.astype(float)).fit(
        disp=0, cov_type="cluster", cov_kwds={"groups": pd.factorize(frame["participant_code"])[0]})
    return coefficients_table(result), sample, result
