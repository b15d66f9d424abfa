"""Dropping out of follow-ups as time to an event: when a participant stops answering, with
withdrawal as a competing event. Kaplan-Meier curves and log-rank tests (lifelines), Aalen-Johansen
cumulative incidence of stopping and of withdrawing, a cause-specific Cox model (lifelines) with the
proportional-hazards test of R's ``cox.zph``, and, optionally, the odds of completing a follow-up
whose window closed.

The estimand (the survival table's rule, ``analysis.panel.STOP_RULE``): time from enrollment to
the close of the first enrollment-anchored follow-up window the participant missed with no answer
to any later window, placed at that wave's scheduled close (the same day for everyone who stops
there); censored at the end of follow-up (the last wave's scheduled close) or at the data cut
(before the first close whose outcome is still to come), and at withdrawal, which is kept as its
own event type (``withdrew``) and treated as a competing event. The Kaplan-Meier curves and the
Cox model are cause-specific: withdrawal censors. So a curve estimates the share still answering
had nobody withdrawn, and a hazard ratio compares the rates of stopping among those still taking
part; the cumulative incidence gives the shares who actually stopped answering and who withdrew,
each in the presence of the other.

The input frames (:data:`SURVIVAL_INPUT`, :data:`PANEL_INPUT`) are checked first: a missing column
is a ValueError naming it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm
from lifelines import CoxPHFitter, KaplanMeierFitter
from lifelines.exceptions import ConvergenceWarning as CoxConvergenceWarning
from lifelines.statistics import multivariate_logrank_test
from scipy import stats
from statsmodels.tools import sm_exceptions

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
STOPPED, WITHDREW = "stopped_answering", "withdrew"
CAUSES = {STOPPED: 1, WITHDREW: 2}  # the competing events' codes in the cumulative incidence

# The input frames, column -> meaning. ``analysis.panel.survival()`` and ``panel()`` give them; a frame
# built by hand needs the required columns, and the optional ones for what they add.
SURVIVAL_INPUT: dict[str, str] = {
    "participant_code": "one row per participant",
    "arm": "the participant's arm",
    "duration_days": "the analysis time, days from enrollment to stopping answering, withdrawal or censoring "
                     "(analysis.panel.survival places stops and ends of follow-up at the wave's scheduled close)",
    "event": "1 = stopped answering, 0 = censored for it (withdrew, end of follow-up, or data cut)",
}
SURVIVAL_OPTIONAL: dict[str, str] = {
    "event_type": "stopped_answering, withdrew or censored: without it there is no competing event, and no "
                  "withdrawal counts in the groups or the cumulative incidence",
    "first_role": "the first conversation's role (curves by first role; 'none' when missing or empty)",
}
PANEL_INPUT: dict[str, str] = {
    "participant_code": "one row per participant x wave",
    "arm": "the participant's arm (the reference arm is picked from the panel's arms)",
    "baseline_perma_overall_wellbeing": "needed for the covariate baseline_wellbeing and the completion model",
    "timezone_region": "needed for the covariate timezone_region",
    "wave": "needed for the completion model",
    "response_status": "needed for the completion model: completed or expired rows are modelled",
    "days_since_enrollment": "needed for the completion model (row order)",
}


def require_columns(frame: pd.DataFrame, columns: Sequence[str], table: str, needed_for: str) -> None:
    """Raise a ValueError naming every column of ``columns`` that ``frame`` lacks."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        names = ", ".join(repr(c) for c in missing)
        raise ValueError(f"the {table} has no column {names}, which {needed_for} needs "
                         "(see analysis.estimates.dropout.SURVIVAL_INPUT and PANEL_INPUT)")


def _check_inputs(data: StudyData, covariates: Sequence[str], completion_model: bool) -> None:
    require_columns(data.survival, list(SURVIVAL_INPUT), "survival table", "dropout_survival")
    panel = ["participant_code", "arm"]
    if "baseline_wellbeing" in covariates or completion_model:
        panel.append("baseline_perma_overall_wellbeing")
    if "timezone_region" in covariates:
        panel.append("timezone_region")
    if completion_model:
        panel += ["wave", "response_status", "days_since_enrollment"]
    require_columns(data.panel, panel, "panel",
                    "dropout_survival" + (" with completion_model=True" if completion_model else ""))
    events = floats(data.survival["event"]).dropna()
    if not events.isin((0.0, 1.0)).all():
        raise ValueError("the survival table's event must be 0 or 1 (1 = stopped answering)")
    if "event_type" in data.survival:
        types = set(data.survival["event_type"].dropna().astype(str)) - {STOPPED, WITHDREW, "censored"}
        if types:
            raise ValueError(f"unknown event_type {sorted(types)}: use stopped_answering, withdrew or censored")


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


def _participants(data: StudyData, covariates: Sequence[str]) -> pd.DataFrame:
    """The survival table with the competing-event code (``cause``: 0 censored, 1 stopped
    answering, 2 withdrew), the baseline covariates from the panel (baseline overall well-being,
    time zone region) it needs, the first role ('none' without a conversation) and the
    per-participant conversation features among ``covariates``."""
    frame = data.survival.copy()
    frame["duration_days"] = floats(frame["duration_days"])
    frame["event"] = floats(frame["event"])
    withdrew = (frame["event_type"].astype(str) == WITHDREW) if "event_type" in frame else False
    frame["cause"] = np.where(frame["event"] == 1, CAUSES[STOPPED], np.where(withdrew, CAUSES[WITHDREW], 0))
    baseline = data.panel.drop_duplicates("participant_code").set_index("participant_code")
    if "baseline_perma_overall_wellbeing" in baseline:
        frame["baseline_wellbeing"] = frame["participant_code"].map(
            floats(baseline["baseline_perma_overall_wellbeing"]))
    if "timezone_region" in baseline:
        frame["timezone_region"] = frame["participant_code"].map(baseline["timezone_region"]).astype(str)
    frame["role"] = roles_of(frame)
    wanted = [name for name in covariates if name in PERSON_FEATURES]
    if wanted:
        frame = frame.join(_person_features(data.conversations, wanted), on="participant_code")
    return frame.sort_values("participant_code", kind="stable").reset_index(drop=True)


_NOT_COVARIATES = {*SURVIVAL_INPUT, *SURVIVAL_OPTIONAL, "cause", "event_at", "event_wave", "censored_because",
                   "enrolled_at", "mode", "roles_used"}


def _covariates(frame: pd.DataFrame, covariates: Sequence[str], reference_arm: str
                ) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """The Cox model's covariate columns (numbers as they are, categories as indicators) and the
    columns of each covariate (a term, as R's ``terms``)."""
    parts, terms = [], {}
    for name in covariates:
        if name == "arm":
            part = indicators(frame["arm"].astype(str), reference_arm, "")
        elif name in ("role", "timezone_region"):
            values = frame[name].astype(str)
            reference = "standard" if name == "role" and (values == "standard").any() else values.mode().iloc[0]
            part = indicators(values, reference, f"{name} ")
        elif name in frame and name not in _NOT_COVARIATES:
            part = frame[[name]].astype(float)
        else:
            raise ValueError(f"unknown covariate {name!r}: use baseline_wellbeing, arm, role, timezone_region, "
                             "agree_share, pushback_rate, exit_rating or affirmation_per_100_words")
        parts.append(part)
        terms[name] = list(part.columns)
    return pd.concat(parts, axis=1), terms


def _kaplan_meier(frame: pd.DataFrame, by: str) -> tuple[list[pd.DataFrame], list[dict[str, Any]]]:
    curves, summary = [], []
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
        summary.append({"by": by, "group": label, "participants": len(part), "events": int(part["event"].sum()),
                        "withdrew": int((part["cause"] == CAUSES[WITHDREW]).sum()),
                        "still_answering": float(curve["survival"].iloc[-1]),
                        "median_days": float(fitter.median_survival_time_)})
    return curves, summary


def aalen_johansen(durations: Any, causes: Any, cause: int, *, alpha: float = 0.05) -> pd.DataFrame:
    """The Aalen-Johansen cumulative incidence of ``cause`` among competing ``causes`` (0 =
    censored), at time 0 and at every distinct duration: F(t) = sum over t_j <= t of S(t_j-) d_cj / n_j,
    S the Kaplan-Meier of any event. Ties, within or across causes, are counted at the same time (no
    jitter). The variance is Collett's (Modelling Survival Data in Medical Research, 3rd ed., p. 411;
    lifelines' ``AalenJohansenFitter`` computes the same), the 95% interval on the log(-log) scale.
    Columns days, cumulative_incidence, ci_low, ci_high, at_risk, events (of ``cause``)."""
    t = np.asarray(durations, dtype=float)
    c = np.asarray(causes, dtype=int)
    times, inverse = np.unique(t, return_inverse=True)
    removed = np.bincount(inverse, minlength=len(times)).astype(float)
    n = removed[::-1].cumsum()[::-1]  # at risk: duration >= t
    d = np.bincount(inverse, weights=(c != 0).astype(float), minlength=len(times))
    dk = np.bincount(inverse, weights=(c == cause).astype(float), minlength=len(times))
    survival = np.cumprod(1.0 - d / n)
    before = np.concatenate(([1.0], survival[:-1]))
    f = np.cumsum(before * dk / n)
    a = np.divide(d, n * (n - d), out=np.zeros_like(d), where=n > d)  # n == d: the last time, (F(t) - F(t_j)) = 0
    b = before * dk / n**2
    variance = (f**2 * np.cumsum(a) - 2 * f * np.cumsum(a * f) + np.cumsum(a * f**2)
                + np.cumsum(before**2 * dk * (n - dk) / n**3) - 2 * (f * np.cumsum(b) - np.cumsum(b * f)))
    z = stats.norm.ppf(1 - alpha / 2)
    inside = (f > 0) & (f < 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        centre = np.log(-np.log(f))
        se = np.sqrt(np.maximum(variance, 0.0)) / (f * np.abs(np.log(f)))
        low = np.where(inside, np.exp(-np.exp(centre + z * se)), np.nan)
        high = np.where(inside, np.exp(-np.exp(centre - z * se)), np.nan)
    out = pd.DataFrame({"days": times, "cumulative_incidence": f, "ci_low": low, "ci_high": high,
                        "at_risk": n.astype("int64"), "events": dk.astype("int64")})
    if not len(times) or times[0] > 0:
        out = pd.concat([pd.DataFrame({"days": [0.0], "cumulative_incidence": [0.0], "ci_low": [np.nan],
                                       "ci_high": [np.nan], "at_risk": [len(t)], "events": [0]}), out],
                        ignore_index=True)
    return out


def _cumulative_incidence(frame: pd.DataFrame, by: str) -> pd.DataFrame:
    parts = []
    for level, part in frame.groupby(by, sort=True):
        for name, code in CAUSES.items():
            table = aalen_johansen(part["duration_days"], part["cause"], code)
            parts.append(table.assign(by=by, group=str(level), cause=name))
    columns = ["by", "group", "cause", "days", "cumulative_incidence", "ci_low", "ci_high", "at_risk", "events"]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


# The proportional-hazards test of R's survival (>= 3.0) cox.zph

PH_TRANSFORMS = ("km", "rank", "identity", "log")
PH_METHOD = ("score test for adding covariate x g(t), full information matrix, Efron ties: R survival >= 3.0 "
             "cox.zph")


def time_transform(durations: np.ndarray, events: np.ndarray, transform: str) -> np.ndarray:
    """g(t) of every row as R's ``cox.zph`` computes it: ``km`` 1 - KM(t-) (the Kaplan-Meier of
    all rows, left-continuous), ``rank`` the average rank of t among all rows, ``identity`` t,
    ``log`` log t."""
    if transform == "km":
        times, inverse = np.unique(durations, return_inverse=True)
        at_risk = np.bincount(inverse, minlength=len(times))[::-1].cumsum()[::-1].astype(float)
        dead = np.bincount(inverse, weights=events.astype(float), minlength=len(times))
        before = np.concatenate(([1.0], np.cumprod(1.0 - dead / at_risk)[:-1]))
        return 1.0 - before[inverse]
    if transform == "rank":
        return np.asarray(stats.rankdata(durations), dtype=float)
    if transform == "identity":
        return durations.astype(float)
    if transform == "log":
        if (durations[events] <= 0).any():
            raise ValueError("the log time transform needs every event time above 0")
        with np.errstate(divide="ignore"):
            return np.asarray(np.log(durations), dtype=float)
    raise ValueError(f"unknown time transform {transform!r}: use one of {', '.join(PH_TRANSFORMS)}")


def cox_zph(durations: Any, events: Any, design: pd.DataFrame, beta: Any, terms: Mapping[str, Sequence[str]],
            *, transform: str = "km") -> pd.DataFrame:
    """R's ``cox.zph(fit, transform=...)`` (survival >= 3.0, ``terms=TRUE``, ``global=TRUE``) for a
    Cox model with Efron ties fitted to ``design`` with coefficients ``beta``: per term, and for
    all, the score test at (beta, 0) for adding the covariates times g(t), with the full 2p x 2p
    information matrix (R's C routine ``zph1``), g = ``time_transform`` centred at its mean over
    the events. Columns term, columns, test_statistic, df, p, transform, method; the last row is
    GLOBAL. A term whose information matrix is singular has no statistic (NaN). Raises ValueError
    when the events fall at fewer than two distinct times (g is then constant: nothing to test)."""
    t = np.asarray(durations, dtype=float)
    e = np.asarray(events, dtype=float) == 1
    if len(np.unique(t[e])) < 2:
        raise ValueError("the events fall at fewer than two distinct times, so a hazard ratio changing over time "
                         "cannot be seen")
    x = design.to_numpy(dtype=float)
    x = x - x.mean(axis=0)
    p = x.shape[1]
    g = time_transform(t, e, transform)
    g = g - g[e].mean()
    eta = x @ np.asarray(beta, dtype=float)
    risk = np.exp(eta - eta.max())  # a common factor cancels in every ratio

    order = np.argsort(-t, kind="stable")  # backwards in time: the risk set accumulates
    x_sorted, r_sorted = x[order], risk[order]
    outer = np.einsum("ni,nj->nij", x_sorted, x_sorted)
    r0 = np.cumsum(r_sorted)
    r1 = np.cumsum(r_sorted[:, None] * x_sorted, axis=0)
    r2 = np.cumsum(r_sorted[:, None, None] * outer, axis=0)
    event_times = np.unique(t[e])
    last = len(t) - np.searchsorted(np.sort(t), event_times, side="left") - 1  # the risk set: rows 0..last
    dead_rows = [np.flatnonzero(e & (t == time)) for time in event_times]
    deaths = np.array([len(rows) for rows in dead_rows])
    d0 = np.array([risk[rows].sum() for rows in dead_rows])
    d1 = np.array([(risk[rows, None] * x[rows]).sum(axis=0) for rows in dead_rows])
    d2 = np.array([np.einsum("n,ni,nj->ij", risk[rows], x[rows], x[rows]) for rows in dead_rows])
    step = np.repeat(np.arange(len(event_times)), deaths)  # Efron: one step per death, k/d of the tied deaths out
    fraction = np.concatenate([np.arange(k) / k for k in deaths])
    denominator = r0[last][step] - fraction * d0[step]
    mean = (r1[last][step] - fraction[:, None] * d1[step]) / denominator[:, None]
    variance = ((r2[last][step] - fraction[:, None, None] * d2[step]) / denominator[:, None, None]
                - np.einsum("ni,nj->nij", mean, mean))
    g_time = g[[rows[0] for rows in dead_rows]][step]
    score = (np.concatenate([x[rows] for rows in dead_rows]) - mean) * g_time[:, None]
    u = np.concatenate([np.zeros(p), score.sum(axis=0)])
    information = np.block([[variance.sum(axis=0), (g_time[:, None, None] * variance).sum(axis=0)],
                            [(g_time[:, None, None] * variance).sum(axis=0),
                             (g_time[:, None, None] ** 2 * variance).sum(axis=0)]])
    columns = list(design.columns)
    rows = []
    for name, members in [*terms.items(), ("GLOBAL", columns)]:
        keep = list(range(p)) + [p + columns.index(c) for c in members]
        part = u[keep]
        try:
            statistic = float(part @ np.linalg.solve(information[np.ix_(keep, keep)], part))
        except np.linalg.LinAlgError:  # e.g. a covariate constant in every risk set
            statistic = math.nan
        rows.append({"term": name, "columns": "; ".join(members), "test_statistic": statistic, "df": len(members),
                     "p": float(stats.chi2.sf(statistic, len(members))), "transform": transform,
                     "method": PH_METHOD})
    return pd.DataFrame(rows)


# The completion model

_COMPLETION_WARNINGS = (sm_exceptions.PerfectSeparationWarning, sm_exceptions.ConvergenceWarning,
                        sm_exceptions.HessianInversionWarning, RuntimeWarning)


def _completion_model(data: StudyData, reference: str) -> tuple[pd.DataFrame, Sample, Any, list[str]]:
    """Logit of completed (vs expired) for every follow-up whose window closed while the
    participant was in the study, on baseline overall well-being and arm, clustered by participant.
    Skipped, with a sentence why, when the outcome does not vary (overall or within an arm) or the
    fit meets perfect separation or does not converge."""
    rows = data.panel[(data.panel["wave"] != "baseline")].copy()
    status = rows["response_status"].astype(str)
    rows["baseline_wellbeing"] = floats(rows["baseline_perma_overall_wellbeing"])
    asked = status.isin(("completed", "expired"))
    used = asked & rows["baseline_wellbeing"].notna()
    frame = rows[used].sort_values(["participant_code", "days_since_enrollment", "wave"], kind="stable")
    sample = sample_of(rows, used, asked)
    skipped = "Completion model (log-odds that a follow-up whose window closed was completed): not estimated, "
    if frame.empty or frame["participant_code"].nunique() < 2:
        return pd.DataFrame(), sample, None, [skipped + "fewer than two participants have a follow-up whose "
                                              "window closed and a baseline score."]
    completed = (frame["response_status"].astype(str) == "completed").astype(float)
    if completed.nunique() < 2:
        every = "every" if completed.iloc[0] == 1 else "no"
        return pd.DataFrame(), sample, None, [skipped + f"{every} follow-up whose window closed was completed, so "
                                              "there is nothing to model."]
    by_arm = completed.groupby(frame["arm"].astype(str)).agg(["min", "max"])
    constant = by_arm[by_arm["min"] == by_arm["max"]]
    if len(constant):
        arms = "; ".join(f"in arm {arm} every follow-up whose window closed was "
                         + ("completed" if row["min"] == 1 else "missed") for arm, row in constant.iterrows())
        return pd.DataFrame(), sample, None, [skipped + arms + ", so the arm's log-odds are infinite (perfect "
                                              "separation)."]
    design = pd.concat([pd.DataFrame({"Intercept": 1.0, "baseline_wellbeing": frame["baseline_wellbeing"]}),
                        indicators(frame["arm"].astype(str), reference, "")], axis=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = sm.Logit(completed.to_numpy(), design.astype(float)).fit(
                disp=0, cov_type="cluster", cov_kwds={"groups": pd.factorize(frame["participant_code"])[0]})
        except (np.linalg.LinAlgError, sm_exceptions.PerfectSeparationError) as exc:
            return pd.DataFrame(), sample, None, [skipped + f"the fit failed ({exc})."]
    problems = [w for w in caught if issubclass(w.category, _COMPLETION_WARNINGS)]
    for other in (w for w in caught if not issubclass(w.category, _COMPLETION_WARNINGS)):
        warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    if problems:
        reasons = "; ".join(sorted({str(w.message).strip().splitlines()[0] for w in problems}))
        return pd.DataFrame(), sample, None, [skipped + "the fit did not settle: the outcome separates (nearly) "
                                              f"perfectly on the covariates or did not converge ({reasons})."]
    return coefficients_table(result), sample, result, []


# The model


@dataclass(frozen=True)
class DropoutSurvival:
    """Time from enrollment to stopping answering follow-ups, withdrawal competing (the module's
    estimand). ``curves``: Kaplan-Meier share still answering (withdrawal censored) with 95%
    intervals (exponential Greenwood), by arm and by first role, one row per time, with numbers at
    risk. ``groups``: participants, stoppers (``events``), withdrawals, the curve's last value
    (``still_answering``) and median time per group. ``cumulative_incidence``: Aalen-Johansen
    share who stopped answering and who withdrew by each time, by arm, with 95% intervals.
    ``logrank``: one test per grouping. ``cox``: cause-specific hazard ratios of stopping with
    intervals. ``proportional_hazards``: R's ``cox.zph`` test per term and GLOBAL (``cox_zph``,
    transform in its ``transform`` column). ``response``: log-odds that a follow-up whose window
    closed was completed (vs expired), cluster-robust by participant; empty when not asked for or
    not estimated (the notes say why)."""

    curves: pd.DataFrame
    groups: pd.DataFrame
    cumulative_incidence: pd.DataFrame
    logrank: pd.DataFrame
    cox: pd.DataFrame
    proportional_hazards: pd.DataFrame
    response: pd.DataFrame
    sample: Sample
    response_sample: Sample | None
    notes: list[str]
    cox_fit: Any
    response_fit: Any

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"curves": self.curves, "groups": self.groups, "cumulative_incidence": self.cumulative_incidence,
                "logrank": self.logrank, "cox": self.cox, "proportional_hazards": self.proportional_hazards,
                "response": self.response}


ESTIMAND = ("Dropout is the time from enrollment until a participant stops answering: the close of the first "
            "enrollment-anchored follow-up window they missed without answering any later one, placed at that "
            "wave's scheduled close (the median close over participants, the same day for everyone). Those who "
            "answer to the end are censored at the end of follow-up (their last wave's scheduled close). A missed "
            "window followed by an answer is not dropout, and one with a later window still to come is not dropout "
            "yet: read before follow-up ends, such participants, and everyone else still in follow-up, are "
            "censored at the data cut or, if earlier, just before the first close whose outcome is not known yet.")
COMPETING = ("Withdrawal is a competing event: it censors the Kaplan-Meier curves, log-rank tests and Cox model "
             "(cause-specific: the share still answering had nobody withdrawn, and hazard ratios of stopping "
             "among those still taking part); the cumulative incidence (Aalen-Johansen) gives the shares who "
             "stopped answering and who withdrew, each with the other competing.")


def dropout_survival(data: StudyData, *, covariates: Sequence[str] = ("baseline_wellbeing", "arm"),
                     reference_arm: str | None = None, ph_transform: str = "km",
                     completion_model: bool = True) -> DropoutSurvival:
    """Kaplan-Meier curves by arm and first role, log-rank tests (lifelines
    ``multivariate_logrank_test``), Aalen-Johansen cumulative incidence of stopping and of
    withdrawing by arm, a cause-specific Cox model (lifelines ``CoxPHFitter``, Efron ties) on
    ``covariates`` with R's ``cox.zph`` proportional-hazards test (``ph_transform``: km, R's
    default, or rank, identity, log), and, with ``completion_model``, a logistic model of
    completing a follow-up on baseline well-being and arm (skipped with a note when the outcome
    does not vary or separates). Covariates: ``baseline_wellbeing`` (baseline PERMA overall),
    ``arm``, ``role`` (first role), ``timezone_region``, or a per-participant conversation feature
    (``agree_share``, ``pushback_rate``, ``exit_rating``, ``affirmation_per_100_words``; over all
    the participant's conversations, so they partly reflect how long someone stayed: read them as
    associations), or another numeric column of the survival table. Input: ``data.survival`` with
    the columns of :data:`SURVIVAL_INPUT` (and :data:`SURVIVAL_OPTIONAL`), ``data.panel`` with those
    of :data:`PANEL_INPUT` the options need; a missing one is a ValueError naming it."""
    if ph_transform not in PH_TRANSFORMS:
        raise ValueError(f"unknown time transform {ph_transform!r}: use one of {', '.join(PH_TRANSFORMS)}")
    _check_inputs(data, covariates, completion_model)
    frame = _participants(data, covariates)
    if frame.empty:
        raise ValueError("the survival table is empty")
    reference = pick_reference_arm(data.panel, reference_arm)
    notes = [ESTIMAND, COMPETING, f"Cox model: {COMPLETE_CASE}"]
    if "event_type" not in data.survival:
        notes.append("The survival table has no event_type: no withdrawal is known, so none competes.")
    known = frame["duration_days"].notna()
    curves, groups, tests = [], [], []
    for by in ("arm", "role"):
        by_curves, summary = _kaplan_meier(frame[known], by)
        curves += by_curves
        groups += summary
        if len(summary) > 1:
            test = multivariate_logrank_test(frame.loc[known, "duration_days"], frame.loc[known, by],
                                             frame.loc[known, "event"])
            tests.append({"by": by, "groups": len(summary), "test_statistic": float(test.test_statistic),
                          "df": int(test.degrees_of_freedom), "p": float(test.p_value)})
    incidence = _cumulative_incidence(frame[known], "arm")

    design, terms = _covariates(frame, covariates, reference)
    used = design.notna().all(axis=1) & known
    cox_frame = pd.concat([design[used], frame.loc[used, ["duration_days", "event"]]], axis=1)
    cox = pd.DataFrame(columns=["term", "label", "coef", "se", "hazard_ratio", "hr_low", "hr_high", "z", "p"])
    hazards = pd.DataFrame(columns=["term", "columns", "test_statistic", "df", "p", "transform", "method"])
    fitter = None
    if cox_frame["event"].sum() < 1:
        notes.append("No one stopped answering: the Cox model is not estimated.")
    else:
        with warnings_as_notes(CoxConvergenceWarning) as caught:
            fitter = CoxPHFitter().fit(cox_frame, duration_col="duration_days", event_col="event")
        notes += sorted({f"Cox model: {message}" for message in caught})
        s = fitter.summary
        cox = pd.DataFrame({"term": s.index.astype(str), "label": [LABELS.get(t, t) for t in s.index.astype(str)],
                            "coef": s["coef"].to_numpy(), "se": s["se(coef)"].to_numpy(),
                            "hazard_ratio": s["exp(coef)"].to_numpy(), "hr_low": s["exp(coef) lower 95%"].to_numpy(),
                            "hr_high": s["exp(coef) upper 95%"].to_numpy(), "z": s["z"].to_numpy(),
                            "p": s["p"].to_numpy()})
        try:
            hazards = cox_zph(cox_frame["duration_days"], cox_frame["event"], design[used],
                              fitter.params_[list(design.columns)], terms, transform=ph_transform)
        except ValueError as exc:
            notes.append(f"Proportional hazards: not tested: {exc}.")
        else:
            notes.append(f"Proportional hazards: {PH_METHOD}, time transform '{ph_transform}'"
                         + (" (1 - KM(t-), R's default)" if ph_transform == "km" else "") + ". lifelines' "
                         "proportional_hazard_test is the older approximation (scaled Schoenfeld residuals with an "
                         "averaged variance, R survival < 3.0) with transform 'rank' by default, so its numbers "
                         "differ.")
            untested = hazards.loc[hazards["test_statistic"].isna(), "term"].tolist()
            if untested:
                notes.append("Proportional hazards: no test of " + ", ".join(untested) + " (its information "
                             "matrix is singular, e.g. a covariate constant among those at risk).")
    people = frame.assign(wave="all", participant_status=np.where(frame["cause"] == CAUSES[WITHDREW], WITHDRAWN,
                                                                  "enrolled"))
    sample = sample_of(people, used, known)
    response, response_sample, response_fit = pd.DataFrame(), None, None
    if completion_model:
        response, response_sample, response_fit, skipped = _completion_model(data, reference)
        notes += skipped
    return DropoutSurvival(pd.concat(curves, ignore_index=True), pd.DataFrame(groups), incidence,
                           pd.DataFrame(tests), cox, hazards, response, sample, response_sample, notes, fitter,
                           response_fit)
