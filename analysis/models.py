"""Statistical models that link how conversations went to how people were doing weeks later.

Each model takes the read side's pandas frames (never a database): the participant x wave panel
(``analysis.panel.panel``), the conversation features (``analysis.features.conversation_features``)
and the survival table (``analysis.panel.survival``), held together by :class:`StudyData`. Each
returns a result object with tidy tables (one row per estimate, intervals beside it), the data
for plots (Kaplan-Meier curves, marginal means per wave, forest-plot rows) and, next to the
estimates, who is in the fit: participants, observations, missingness by wave and attrition.

    >>> from analysis.models import StudyData, perma_trajectories, regret_model
    >>> data = StudyData.load(engine, "wellbeing-pilot")
    >>> fit = perma_trajectories(data)
    >>> fit.fixed_effects                       # estimates with 95% intervals
    >>> fit.marginal_means                      # per wave and arm, for the trajectory plot
    >>> regret_model(data).coefficients

A library: nothing is printed or written, and every random step takes a seed.
"""

from __future__ import annotations

import datetime as dt
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import statsmodels.api as sm
from lifelines import CoxPHFitter, KaplanMeierFitter
from lifelines.exceptions import ConvergenceWarning as CoxConvergenceWarning
from lifelines.statistics import multivariate_logrank_test, proportional_hazard_test
from scipy import stats
from statsmodels.imputation.mice import MICEData
from statsmodels.stats.multitest import multipletests
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from analysis.features import FEATURES, conversation_features
from analysis.panel import PERMA, PERMA_SCORES, REGRET, panel, survival
from analysis.reading import Source
from analysis.robust import ClusterRobustFit, cluster_ols
from study.clock import now

# Statuses of a follow-up whose outcome can no longer arrive: completed, or missing for good.
# open, not_yet_due and overdue (planned, not opened yet) are not missing: their window has not closed.
OBSERVABLE = ("completed", "expired", "withdrawn", "cancelled")
WITHDRAWN = "withdrawn"
NO_ROLE = "none"
Z95 = float(stats.norm.ppf(0.975))

# The conversation features the regret model and the immediate-vs-delayed comparison use by default.
# "role" is the focal-role indicator (ended in that role, vs any other). The pushback rate is left out
# because agree share + pushback rate + escalate share = 1: with escalations rare the two are the same
# variable with opposite signs, and a model with both cannot tell them apart.
REGRET_FEATURES = ("role", "agree_share", "overrides", "affirmation_per_100_words", "sentiment_change",
                   "reassurance_seeking_turns")
# The same features over the conversations before a wave, plus the arm's mode, for PERMA change.
PERMA_CHANGE_FEATURES = ("wellbeing_mode", "role", *REGRET_FEATURES[1:])

LABELS = {
    "baseline": "baseline score",
    "baseline_wellbeing": "baseline PERMA overall well-being",
    "agree_share": "share of the assistant's turns that agreed",
    "pushback_rate": "share of the assistant's turns that nudged or challenged",
    "overrides": "pushbacks the participant overrode",
    "affirmation_per_100_words": "affirming words per 100 assistant words",
    "sentiment_change": "sentiment change, first to last message",
    "reassurance_seeking_turns": "reassurance-seeking messages",
    "exit_rating": "exit rating (1-7)",
    "wellbeing_mode": "well-being mode (vs default)",
}
COMPLETE_CASE = ("Complete-case analysis: rows with a missing outcome or covariate are left out. The estimates "
                 "are unbiased if the data are missing at random given the covariates in the model (for the "
                 "mixed model: given them and the participant's observed waves).")
CLUSTER_ROBUST = ("Standard errors are cluster-robust by participant (CR2, with Bell-McCaffrey degrees of freedom "
                  "for the t intervals and p-values).")


# The data


def _empty(columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=object) for name in columns})


@dataclass(frozen=True)
class StudyData:
    """The three frames every model reads: the panel, the conversation features and the survival
    table, each shaped as the read side returns it. Build it from a database with :meth:`load`, or
    from frames (a notebook, a test, a simulated panel) with the constructor."""

    panel: pd.DataFrame
    conversations: pd.DataFrame = field(default_factory=lambda: _empty(list(FEATURES)))
    survival: pd.DataFrame = field(default_factory=lambda: _empty(("participant_code", "duration_days", "event")))
    study: str | int | None = None
    read_at: dt.datetime | None = None

    @classmethod
    def load(cls, source: Source, study: int | str) -> StudyData:
        """Read the study's panel, conversation features and survival table once."""
        read_at = now()
        return cls(panel=panel(source, study), conversations=conversation_features(source, study),
                   survival=survival(source, study), study=study, read_at=read_at)


@dataclass(frozen=True)
class Sample:
    """Who is in a fit. ``eligible`` rows are those whose outcome can no longer arrive (status in
    ``OBSERVABLE``); ``used`` rows are in the fit. ``missingness`` has one row per wave (and a
    total): the count of each response status, then eligible, missing_outcome, missing_covariates
    (outcome there, a covariate missing), imputed and used. ``withdrawn`` counts the eligible
    participants who withdrew (attrition)."""

    participants: int
    observations: int
    eligible_participants: int
    eligible_observations: int
    withdrawn: int
    missingness: pd.DataFrame

    def table(self) -> pd.DataFrame:
        """The counts as a two-column table (quantity, value), for a report."""
        return pd.DataFrame({"quantity": ["participants", "observations", "eligible_participants",
                                          "eligible_observations", "withdrawn_participants"],
                             "value": [self.participants, self.observations, self.eligible_participants,
                                       self.eligible_observations, self.withdrawn]})


def _sample(rows: pd.DataFrame, used: pd.Series, outcome: pd.Series, *, imputed: bool = False,
            by: str = "wave") -> Sample:
    """``rows``: every row the analysis asked for (with participant_code, response_status and
    ``by``); ``used``: in the fit; ``outcome``: the outcome is present."""
    status = rows["response_status"].astype(str) if "response_status" in rows else pd.Series("completed",
                                                                                              index=rows.index)
    eligible = status.isin(OBSERVABLE)
    wave = rows[by].astype(str) if by in rows else pd.Series("all", index=rows.index)
    parts = pd.DataFrame({
        "wave": wave, "status": status, "eligible": eligible,
        "missing_outcome": eligible & ~outcome,
        "missing_covariates": eligible & outcome & ~used if not imputed else pd.Series(False, index=rows.index),
        "imputed": used & ~outcome if imputed else pd.Series(False, index=rows.index),
        "used": used,
    })
    counts = pd.crosstab(parts["wave"], parts["status"]) if len(parts) else pd.DataFrame()
    sums = parts.groupby("wave")[["eligible", "missing_outcome", "missing_covariates", "imputed", "used"]].sum()
    table = counts.join(sums, how="outer").fillna(0).astype("int64")
    table.loc["all"] = table.sum()
    table = table.reset_index().rename(columns={"index": "wave"})
    table.columns.name = None
    codes = rows["participant_code"]
    eligible_codes = set(codes[eligible])
    withdrawn = 0
    if "participant_status" in rows:
        people = rows[eligible].drop_duplicates("participant_code")
        withdrawn = int((people["participant_status"].astype(str) == WITHDRAWN).sum())
    return Sample(participants=int(codes[used].nunique()), observations=int(used.sum()),
                  eligible_participants=len(eligible_codes), eligible_observations=int(eligible.sum()),
                  withdrawn=withdrawn, missingness=table)


def _float(series: pd.Series) -> pd.Series:
    """Numbers as float64 with NaN for missing (nullable Int64/boolean columns included)."""
    if series.dtype == object or pd.api.types.is_string_dtype(series):
        return pd.to_numeric(series, errors="coerce").astype(float)
    return series.astype("Float64").astype(float)


def _label(name: str, focal_role: str) -> str:
    if name == f"role_{focal_role}":
        return f"ended in the {focal_role} role (vs any other)"
    if name in LABELS:
        return LABELS[name]
    base = name.removeprefix("conv_").removeprefix("mean_")
    return FEATURES[base].definition if base in FEATURES else name


# Estimates and intervals


@dataclass(frozen=True)
class _Estimates:
    """Parameters with their covariance; after multiple imputation, Rubin's rules: the mean of the
    imputations' estimates, the within (mean) and between (sample) covariances."""

    params: pd.Series
    within: np.ndarray
    between: np.ndarray | None = None
    imputations: int = 1

    def combine(self, weights: np.ndarray) -> pd.DataFrame:
        """Estimate, standard error, 95% interval and p-value of each row of ``weights`` x params.
        A normal reference without imputation; with it, Student's t on Rubin's degrees of freedom."""
        weights = np.atleast_2d(weights)
        estimate = weights @ self.params.to_numpy()
        within = np.einsum("ij,jk,ik->i", weights, self.within, weights)
        m = self.imputations
        if self.between is None or m < 2:
            total, df = within, np.full(len(estimate), np.inf)
        else:
            between = np.einsum("ij,jk,ik->i", weights, self.between, weights)
            total = within + (1 + 1 / m) * between
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = (1 + 1 / m) * between / within
                df = np.where(between > 0, (m - 1) * (1 + 1 / ratio) ** 2, np.inf)
        se = np.sqrt(total)
        critical = np.where(np.isinf(df), Z95, stats.t.ppf(0.975, np.where(np.isinf(df), 1, df)))
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = estimate / se
        p = np.where(np.isinf(df), 2 * stats.norm.sf(np.abs(statistic)),
                     2 * stats.t.sf(np.abs(statistic), np.where(np.isinf(df), 1, df)))
        return pd.DataFrame({"estimate": estimate, "se": se, "ci_low": estimate - critical * se,
                             "ci_high": estimate + critical * se, "statistic": statistic, "p": p, "df": df})


def _rubin(params: list[pd.Series], covariances: list[np.ndarray]) -> _Estimates:
    stacked = np.vstack([p.to_numpy() for p in params])
    between = np.atleast_2d(np.cov(stacked.T, ddof=1))
    return _Estimates(pd.Series(stacked.mean(axis=0), index=params[0].index), np.mean(covariances, axis=0),
                      between, len(params))


def _coefficients(result: Any, focal_role: str = "", *, skip: Sequence[str] = ()) -> pd.DataFrame:
    """A statsmodels OLS/Logit result as a tidy table, numbers exactly as statsmodels gives them."""
    interval = result.conf_int()
    table = pd.DataFrame({
        "term": result.params.index, "estimate": result.params.to_numpy(), "se": result.bse.to_numpy(),
        "ci_low": interval.iloc[:, 0].to_numpy(), "ci_high": interval.iloc[:, 1].to_numpy(),
        "statistic": result.tvalues.to_numpy(), "p": result.pvalues.to_numpy()})
    table.insert(1, "label", [_label(term, focal_role) for term in table["term"]])
    return table[~table["term"].isin(skip)].reset_index(drop=True)


def _cluster_ols(y: pd.Series, design: pd.DataFrame, clusters: pd.Series) -> ClusterRobustFit:
    """OLS with standard errors robust to correlation within participants (CR2, Bell-McCaffrey
    degrees of freedom: ``analysis.robust``)."""
    return cluster_ols(y, design, clusters)


# PERMA trajectories


def _perma_rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str], dict[int, float]]:
    """Enrollment-anchored PERMA follow-up rows with ``wave_number`` 1..K in the order of their
    median day since enrollment; the wave names and typical days by number."""
    rows = frame[(frame["instrument_id"] == PERMA) & (frame["wave"] != "baseline")
                 & (frame["anchor_key"] == "enrollment")].copy()
    if rows.empty:
        raise ValueError("the panel has no PERMA follow-up waves to model")
    days = _float(rows["days_since_enrollment"]).groupby(rows["wave"]).median().sort_values(kind="stable")
    numbers = {wave: k for k, wave in enumerate(days.index, start=1)}
    rows["wave_number"] = rows["wave"].map(numbers).astype(int)
    return rows, {k: str(w) for w, k in numbers.items()}, {numbers[w]: float(d) for w, d in days.items()}


def _reference_arm(frame: pd.DataFrame, reference: str | None) -> str:
    arms = sorted(frame["arm"].dropna().astype(str).unique())
    if reference is not None:
        if reference not in arms:
            raise ValueError(f"reference arm {reference!r} is not in the data (arms: {', '.join(arms)})")
        return reference
    if not arms:
        raise ValueError("the panel has no arms")
    modes = dict(zip(frame["arm"].astype(str), frame["mode"].astype(str), strict=True)) if "mode" in frame else {}
    defaults = [arm for arm in arms if arm in modes and modes[arm] == "default"]
    return defaults[0] if defaults else arms[0]


def _roles(frame: pd.DataFrame) -> pd.Series:
    role = frame["first_role"].astype(object) if "first_role" in frame else pd.Series(None, index=frame.index)
    return role.where(role.notna() & (role.astype(str) != ""), NO_ROLE).astype(str)


def _groups(frame: pd.DataFrame, by_role: bool) -> pd.Series:
    """The arm, or for arms in the well-being mode with ``by_role``, arm/first role."""
    arm = frame["arm"].astype(str)
    if not by_role:
        return arm
    wellbeing = frame["mode"].astype(str) == "wellbeing"
    return arm.where(~wellbeing, arm + "/" + _roles(frame))


def _perma_design(frame: pd.DataFrame, contrasts: list[str], reference: str, waves: dict[int, str],
                  wave_term: str) -> pd.DataFrame:
    """Intercept, baseline, wave (a slope, or one indicator per later wave; none with one wave),
    each group's indicator and its interaction with the wave terms. ``frame`` has group, baseline,
    wave_number; ``waves``: the waves in the fit."""
    design = pd.DataFrame({"Intercept": 1.0, "baseline": frame["baseline"].astype(float)}, index=frame.index)
    wave_columns: dict[str, pd.Series] = {}
    if wave_term == "linear" and len(waves) > 1:
        wave_columns["wave"] = frame["wave_number"].astype(float)
    elif wave_term == "categorical":
        for k in sorted(waves)[1:]:
            wave_columns[f"wave {waves[k]}"] = (frame["wave_number"] == k).astype(float)
    for name, column in wave_columns.items():
        design[name] = column
    for group in contrasts:
        indicator = (frame["group"] == group).astype(float)
        design[f"{group} vs {reference}"] = indicator
        for name, column in wave_columns.items():
            design[f"{group} vs {reference} x {name}"] = indicator * column
    return design


@dataclass(frozen=True)
class _Mixed:
    estimates: _Estimates
    structure: str
    result: Any
    notes: list[str]


@contextmanager
def _as_notes(category: type[Warning]) -> Iterator[list[str]]:
    """Collect the warnings of ``category`` as messages for the result's notes (a fit states its
    own problems); every other warning goes on to the caller as usual."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield messages
    for warning in caught:
        if issubclass(warning.category, category):
            messages.append(str(warning.message).strip())
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno,
                                   source=warning.source)


def _fit_mixed_once(y: pd.Series, design: pd.DataFrame, groups: pd.Series,
                    slopes: pd.DataFrame | None) -> tuple[Any, list[str]]:
    with _as_notes(ConvergenceWarning) as caught:
        try:
            result = sm.MixedLM(y.astype(float), design, groups=groups.to_numpy(), exog_re=slopes).fit(reml=True)
        except (np.linalg.LinAlgError, ValueError) as error:
            return None, [f"the fit failed: {error}"]
    problems = sorted(set(caught))
    if not result.converged:
        problems.append("the optimizer did not converge")
    if not np.all(np.isfinite(np.asarray(result.bse_fe))):
        problems.append("some standard errors are not finite")
    return result, problems


def _fit_mixed(frame: pd.DataFrame, design: pd.DataFrame, random_slopes: bool) -> _Mixed:
    """Participant random intercepts and, if asked and the fit converges cleanly, random slopes on
    wave; otherwise intercepts only, with the reason in the notes."""
    notes: list[str] = []
    y, groups = frame["y"], frame["participant_code"].astype(str)
    if groups.value_counts().max() == 1:
        # One row per participant: the participant and residual variances cannot be told apart and
        # MixedLM's standard errors are unreliable; the random-intercept model's fixed effects are
        # then those of OLS, whose residual variance is the two variances' sum.
        result = sm.OLS(y.astype(float), design.astype(float)).fit()
        notes.append("One observation per participant: fitted by OLS (the random intercept is not identified).")
        return _Mixed(_Estimates(result.params, np.asarray(result.cov_params())), "none (one row per participant)",
                      result, notes)
    if random_slopes:
        slopes = pd.DataFrame({"Intercept": 1.0, "wave": frame["wave_number"].astype(float)}, index=frame.index)
        result, problems = _fit_mixed_once(y, design, groups, slopes)
        if result is not None and not problems:
            return _Mixed(_mixed_estimates(result, design), "participant intercept and wave slope", result, notes)
        notes.append("Random slopes on wave did not fit (" + "; ".join(problems)
                     + "): the model has participant random intercepts only.")
    result, problems = _fit_mixed_once(y, design, groups, None)
    if result is None:
        raise ValueError("the mixed model could not be fitted: " + "; ".join(problems))
    if problems:
        notes.append("Random-intercept fit: " + "; ".join(problems) + ".")
    return _Mixed(_mixed_estimates(result, design), "participant intercept", result, notes)


def _mixed_estimates(result: Any, design: pd.DataFrame) -> _Estimates:
    k = design.shape[1]  # MixedLM lists the fixed effects first, then the random-effect parameters
    return _Estimates(pd.Series(np.asarray(result.fe_params), index=design.columns),
                      np.asarray(result.cov_params())[:k, :k])


def _random_effects(result: Any) -> pd.DataFrame:
    if not hasattr(result, "cov_re"):  # OLS: one row per participant
        return pd.DataFrame([("residual variance", float(result.scale))], columns=["parameter", "value"])
    cov = np.asarray(result.cov_re, dtype=float)
    rows = [("participant intercept variance", float(cov[0, 0]))]
    if cov.shape[0] > 1:
        rows += [("participant wave-slope variance", float(cov[1, 1])),
                 ("intercept-slope covariance", float(cov[0, 1]))]
    rows.append(("residual variance", float(result.scale)))
    return pd.DataFrame(rows, columns=["parameter", "value"])


@dataclass(frozen=True)
class PermaTrajectories:
    """PERMA over time by arm (and role). ``fixed_effects``: one row per outcome and term with its
    95% interval (terms ``baseline``, ``wave``, ``<arm> vs <reference>`` and ``<arm> vs
    <reference> x wave``, the arm x wave effect). ``marginal_means``: the model's mean per outcome,
    group and wave at the sample's mean baseline, with intervals and the observed means beside
    them (the trajectory plot). ``contrasts``: group minus reference at each wave.
    ``random_effects``: variance components. ``samples``: per outcome. ``fits``: the statsmodels
    results (per imputation with ``method`` mice)."""

    fixed_effects: pd.DataFrame
    marginal_means: pd.DataFrame
    contrasts: pd.DataFrame
    random_effects: pd.DataFrame
    samples: dict[str, Sample]
    notes: list[str]
    fits: dict[str, Any]
    reference: str
    method: str

    def effect(self, term: str, outcome: str = "overall_wellbeing") -> pd.Series:
        """One fixed effect's row, e.g. ``fit.effect("wellbeing vs control x wave")``."""
        rows = self.fixed_effects[(self.fixed_effects["outcome"] == outcome) & (self.fixed_effects["term"] == term)]
        if rows.empty:
            raise KeyError(f"no term {term!r} for {outcome!r}")
        return rows.iloc[0]

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"fixed_effects": self.fixed_effects, "marginal_means": self.marginal_means,
                "contrasts": self.contrasts, "random_effects": self.random_effects}


def perma_trajectories(data: StudyData, *, outcomes: Sequence[str] = ("overall_wellbeing",), by_role: bool = False,
                       wave_term: Literal["linear", "categorical"] = "linear", random_slopes: bool = True,
                       reference_arm: str | None = None, impute: Literal["none", "mice"] = "none",
                       imputations: int = 20, burn_in: int = 10, seed: int = 0) -> PermaTrajectories:
    """Linear mixed model (statsmodels ``MixedLM``, REML) of each PERMA score in ``outcomes`` at the
    enrollment-anchored follow-ups on wave x arm (x the first conversation's role within
    well-being-mode arms, with ``by_role``), adjusted for the baseline score, with participant
    random intercepts and random slopes on wave where they fit.

    ``wave_term`` ``linear`` numbers the follow-ups 1..K (the arm x wave term is the difference that
    grows per wave); ``categorical`` gives each later wave its own terms. ``impute="mice"``: multiple
    imputation by chained equations (statsmodels ``MICEData``, predictive mean matching) of the
    wide participant x wave table, ``imputations`` data sets after ``burn_in`` cycles, the model
    fitted to each and combined with Rubin's rules; seeded by ``seed``.
    """
    unknown = [name for name in outcomes if name not in PERMA_SCORES]
    if unknown:
        raise ValueError(f"unknown PERMA score(s) {', '.join(unknown)}; choose from {', '.join(PERMA_SCORES)}")
    if wave_term not in ("linear", "categorical"):
        raise ValueError("wave_term is 'linear' or 'categorical'")
    if impute not in ("none", "mice"):
        raise ValueError("impute is 'none' or 'mice'")
    rows, waves, days = _perma_rows(data.panel)
    reference = _reference_arm(rows, reference_arm)
    rows["group"] = _groups(rows, by_role)
    contrasts = sorted(g for g in rows["group"].unique() if g != reference)
    if by_role and reference not in set(rows["group"]):
        raise ValueError(f"the reference arm {reference!r} is in the well-being mode; pick a default-mode arm")
    eligible = rows["response_status"].astype(str).isin(OBSERVABLE)
    notes = [COMPLETE_CASE if impute == "none" else
             f"Multiple imputation by chained equations ({imputations} imputations, predictive mean matching on "
             "the wide participant x wave table with baseline and group), combined with Rubin's rules; valid if "
             "the data are missing at random given baseline, group and the observed waves."]
    notes.append(f"Reference group: {reference}; waves numbered in order of their median day since enrollment: "
                 + ", ".join(f"{k} = {w}" for k, w in waves.items()) + ".")
    if by_role:
        notes.append("Role is the starting role of the participant's first conversation ('none' without one).")

    fixed: list[pd.DataFrame] = []
    means: list[pd.DataFrame] = []
    differences: list[pd.DataFrame] = []
    random: list[pd.DataFrame] = []
    samples: dict[str, Sample] = {}
    fits: dict[str, Any] = {}
    for outcome in outcomes:
        frame = rows.assign(y=_float(rows[f"perma_{outcome}"]), baseline=_float(rows[f"baseline_perma_{outcome}"]))
        frame = frame.sort_values(["participant_code", "wave_number"], kind="stable")
        in_fit = eligible.reindex(frame.index)
        fitted, wave_notes = _observed_waves(frame[in_fit & frame["y"].notna()], waves)
        notes += [f"{outcome}: {note}" for note in wave_notes]
        # With two waves a participant's two values give three moments (two variances and a
        # covariance) for four parameters (intercept and slope variances, their covariance and the
        # residual variance): a random slope needs at least three waves.
        slopes = random_slopes and len(fitted) > 2
        if random_slopes and len(fitted) == 2:
            notes.append(f"{outcome}: random slopes on wave need at least three waves with data (with two they "
                         "are not identified): the model has participant random intercepts only.")
        if impute == "none":
            used = in_fit & frame["y"].notna() & frame["baseline"].notna() & frame["wave_number"].isin(list(fitted))
            model_frame = frame[used]
            if model_frame["participant_code"].nunique() < 2:
                raise ValueError(f"too few participants with {outcome} at a follow-up and at baseline to fit")
            design = _perma_design(model_frame, contrasts, reference, fitted, wave_term)
            mixed = _fit_mixed(model_frame, design, slopes)
            estimates, structure, fits[outcome] = mixed.estimates, mixed.structure, mixed.result
            notes += [f"{outcome}: {note}" for note in mixed.notes]
            random.append(_random_effects(mixed.result).assign(outcome=outcome, structure=structure))
            samples[outcome] = _sample(frame, used, frame["y"].notna())
            mean_baseline = float(model_frame["baseline"].mean())
        else:
            used = in_fit & frame["wave_number"].isin(list(fitted))
            estimates, structure, results, mice_notes, mean_baseline = _perma_mice(
                frame[used], contrasts, reference, fitted, wave_term, slopes, imputations, burn_in, seed)
            fits[outcome] = results
            notes += [f"{outcome}: {note}" for note in mice_notes]
            random.append(pd.concat([_random_effects(r) for r in results]).groupby("parameter", sort=False)
                          .mean().reset_index().assign(outcome=outcome, structure=structure))
            samples[outcome] = _sample(frame, used, frame["y"].notna(), imputed=True)

        table = estimates.combine(np.eye(len(estimates.params)))
        table.insert(0, "term", estimates.params.index)
        table.insert(0, "outcome", outcome)
        fixed.append(table)
        grid = pd.DataFrame([(g, k) for g in [reference, *contrasts] for k in fitted],
                            columns=["group", "wave_number"]).assign(baseline=mean_baseline)
        weights = _perma_design(grid, contrasts, reference, fitted, wave_term)[list(estimates.params.index)]
        mean = estimates.combine(weights.to_numpy())
        observed = frame[frame["y"].notna()].groupby(["group", "wave_number"])["y"].agg(["mean", "size"])
        grid_means = pd.concat([grid.reset_index(drop=True), mean[["estimate", "se", "ci_low", "ci_high"]]], axis=1)
        grid_means = grid_means.join(observed.rename(columns={"mean": "observed_mean", "size": "observed_n"}),
                                     on=["group", "wave_number"])
        grid_means["observed_n"] = grid_means["observed_n"].fillna(0).astype("int64")
        grid_means.insert(2, "wave", grid_means["wave_number"].map(waves))
        grid_means.insert(3, "days", grid_means["wave_number"].map(days))
        means.append(grid_means.rename(columns={"estimate": "mean", "baseline": "at_baseline"})
                     .assign(outcome=outcome))
        by_wave = weights.to_numpy().reshape(len(contrasts) + 1, len(fitted), -1)
        for i, group in enumerate(contrasts, start=1):
            difference = estimates.combine(by_wave[i] - by_wave[0])
            difference.insert(0, "wave", list(fitted.values()))
            difference.insert(0, "wave_number", list(fitted))
            differences.append(difference.assign(outcome=outcome, group=group, reference=reference))

    fixed_effects = pd.concat(fixed, ignore_index=True)
    fixed_effects.insert(2, "label", fixed_effects["term"])
    marginal = pd.concat(means, ignore_index=True)
    marginal = marginal[["outcome", "group", "wave", "wave_number", "days", "mean", "se", "ci_low", "ci_high",
                         "observed_mean", "observed_n", "at_baseline"]]
    contrast_table = pd.concat(differences, ignore_index=True) if differences else pd.DataFrame()
    if not contrast_table.empty:
        contrast_table = contrast_table[["outcome", "group", "reference", "wave", "wave_number", "estimate", "se",
                                         "ci_low", "ci_high", "p"]]
    return PermaTrajectories(fixed_effects, marginal, contrast_table,
                             pd.concat(random, ignore_index=True)[["outcome", "structure", "parameter", "value"]],
                             samples, notes, fits, reference, "complete-case" if impute == "none" else "mice")


def _observed_waves(observed: pd.DataFrame, waves: dict[int, str]) -> tuple[dict[int, str], list[str]]:
    """The waves with an observed outcome in every group (early in a study, later waves have none
    yet, or only the earliest enrollees of one arm: a wave seen in one group only would make that
    group's difference at the wave inestimable and the model singular)."""
    groups = set(observed["group"])
    seen = observed.groupby("wave_number")["group"].agg(lambda g: set(g) == groups)
    present = set(seen.index[seen.astype(bool)].astype(int).tolist())
    fitted = {k: w for k, w in waves.items() if k in present}
    notes = []
    missing = [w for k, w in waves.items() if k not in set(observed["wave_number"])]
    partial = [f"{w} ({int((observed['wave_number'] == k).sum())} values)" for k, w in waves.items()
               if k not in present and w not in missing]
    if missing:
        notes.append("no observed values yet at " + ", ".join(missing) + ": left out of the model.")
    if partial:
        notes.append("observed in only some groups so far at " + ", ".join(partial) + ": left out of the model.")
    if len(fitted) == 1:
        notes.append(f"one follow-up wave only ({next(iter(fitted.values()))}): no wave terms or random slopes; "
                     "the group terms are the differences at that wave.")
    return fitted, notes


def _perma_mice(frame: pd.DataFrame, contrasts: list[str], reference: str, waves: dict[int, str], wave_term: str,
                random_slopes: bool, imputations: int, burn_in: int,
                seed: int) -> tuple[_Estimates, str, list[Any], list[str], float]:
    """Impute the wide table (one row per participant: baseline, the outcome at each wave, group
    indicators), fit the mixed model to each imputed long table's eligible rows, pool."""
    if imputations < 2:
        raise ValueError("multiple imputation needs at least 2 imputations")
    people = frame.drop_duplicates("participant_code").set_index("participant_code")
    wide = pd.DataFrame({"baseline": people["baseline"]})
    outcome = frame.pivot_table(index="participant_code", columns="wave_number", values="y", aggfunc="first")
    for k in waves:
        column = outcome[k] if k in outcome else pd.Series(np.nan, index=people.index)
        wide[f"y_{k}"] = column.reindex(people.index)
        if wide[f"y_{k}"].isna().all():
            raise ValueError(f"no observed values at wave {waves[k]} to impute from")
    for i, group in enumerate(contrasts):
        wide[f"g_{i}"] = (people["group"] == group).astype(float)
    if wide["baseline"].isna().all():
        raise ValueError("no observed baseline values to impute from")
    if not contrasts:  # one group: a participant with nothing observed has nothing to be imputed from
        wide = wide[wide.notna().any(axis=1)]
        frame = frame[frame["participant_code"].isin(wide.index)]
    codes = list(wide.index)
    wide.columns = pd.Index([str(c) for c in wide.columns], dtype=object)  # MICEData wants object column names
    cells = frame[["participant_code", "wave_number", "group"]].reset_index(drop=True)
    params: list[pd.Series] = []
    covariances: list[np.ndarray] = []
    results: list[Any] = []
    notes: list[str] = []
    baselines: list[float] = []
    structure = ""
    use_slopes = random_slopes
    # MICEData draws from its own generator (a fresh, unseeded one unless given): hand it the seed.
    imputer = MICEData(wide.reset_index(drop=True), rng=np.random.default_rng(seed))
    imputer.update_all(burn_in)
    for m in range(imputations):
        imputer.update_all(4)  # cycles between imputations, so they are less dependent
        filled = imputer.data.set_axis(codes)
        long = cells.assign(
            y=[filled.at[c, f"y_{k}"] for c, k in zip(cells["participant_code"], cells["wave_number"], strict=True)],
            baseline=filled.loc[cells["participant_code"], "baseline"].to_numpy())
        design = _perma_design(long, contrasts, reference, waves, wave_term)
        mixed = _fit_mixed(long, design, use_slopes)
        if m == 0:
            structure = mixed.structure
            use_slopes = "slope" in structure  # the random part is decided on the first imputed data set
            notes += mixed.notes
        params.append(mixed.estimates.params)
        covariances.append(mixed.estimates.within)
        results.append(mixed.result)
        baselines.append(float(long["baseline"].mean()))
    return _rubin(params, covariances), structure, results, notes, float(np.mean(baselines))


# Regret


def _conversation_table(conversations: pd.DataFrame, focal_role: str) -> pd.DataFrame:
    """Conversation features with the derived ones: ``agree_share`` (agree turns / assistant turns)
    and ``role_<focal>`` (1 if the conversation ended in that role)."""
    frame = conversations.copy()
    assistant = _float(frame["assistant_turns"])
    frame["agree_share"] = _float(frame["agree_turns"]) / assistant.where(assistant > 0)
    frame[f"role_{focal_role}"] = (frame["final_role"].astype(str) == focal_role).astype(float)
    frame["conversation_id"] = frame["conversation_id"].astype("Int64")
    return frame


def decision_outcomes(data: StudyData, focal_role: str = "coach") -> pd.DataFrame:
    """One row per decision-regret follow-up (panel rows of the regret instrument) joined to the
    features of the conversation the decision was reported in (``conversation_id``), with
    ``agree_share`` and ``role_<focal_role>`` added."""
    rows = data.panel[data.panel["instrument_id"] == REGRET].copy()
    rows["conversation_id"] = rows["decision_conversation_id"].astype("Int64")
    features = _conversation_table(data.conversations, focal_role)
    overlap = [c for c in features.columns if c in rows.columns and c != "conversation_id"]
    return rows.merge(features.drop(columns=overlap), on="conversation_id", how="left")


def _resolve(features: Sequence[str], focal_role: str) -> list[str]:
    return [f"role_{focal_role}" if name == "role" else name for name in features]


def _wave_dummies(frame: pd.DataFrame) -> pd.DataFrame:
    """One indicator per wave but the earliest (by median day since enrollment)."""
    order = _float(frame["days_since_enrollment"]).groupby(frame["wave"]).median().sort_values(kind="stable")
    return pd.DataFrame({f"wave {w}": (frame["wave"] == w).astype(float) for w in order.index[1:]},
                        index=frame.index)


@dataclass(frozen=True)
class RegretModel:
    """Decision Regret (0-100) on the features of the conversation that led to the decision, OLS
    with cluster-robust (participant) standard errors. ``coefficients``: one row per term with its
    95% interval (the forest-plot rows; wave terms are nuisance terms). ``frame``: the rows fitted."""

    coefficients: pd.DataFrame
    sample: Sample
    notes: list[str]
    fit: Any
    frame: pd.DataFrame

    def effect(self, term: str) -> pd.Series:
        rows = self.coefficients[self.coefficients["term"] == term]
        if rows.empty:
            raise KeyError(f"no term {term!r}")
        return rows.iloc[0]

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"coefficients": self.coefficients, "missingness": self.sample.missingness}


def _regret_frame(data: StudyData, features: Sequence[str], focal_role: str,
                  extra: Sequence[str] = ()) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series, list[str]]:
    """(all regret rows with the needed columns as floats, the rows used, used mask, feature columns)."""
    columns = _resolve(features, focal_role)
    rows = decision_outcomes(data, focal_role)
    missing = [c for c in [*columns, *extra] if c not in rows.columns]
    if missing:
        raise ValueError(f"unknown feature(s) {', '.join(missing)}")
    rows["regret"] = _float(rows["regret"])
    for column in [*columns, *extra]:
        rows[column] = _float(rows[column])
    rows = rows.sort_values(["participant_code", "days_since_enrollment", "wave", "decision_id"], kind="stable")
    eligible = rows["response_status"].astype(str).isin(OBSERVABLE)
    used = eligible & rows["regret"].notna() & rows[[*columns, *extra]].notna().all(axis=1)
    return rows, rows[used], used, columns


def regret_model(data: StudyData, *, features: Sequence[str] = REGRET_FEATURES, focal_role: str = "coach",
                 wave_terms: bool = True) -> RegretModel:
    """OLS of each regret response on the conversation's features (``role`` = ended in
    ``focal_role`` vs any other; by default also the agree share, overrides, affirmation,
    sentiment change and reassurance seeking), plus an indicator per regret wave after the first
    when there are several, with standard errors clustered by participant. Every response is a
    row (a decision asked about at day 3 and day 14 gives two); the clustering accounts for that."""
    rows, frame, used, columns = _regret_frame(data, features, focal_role)
    if frame["participant_code"].nunique() < 2:
        raise ValueError("too few participants with a regret score and the conversation's features to fit")
    design = pd.concat([pd.DataFrame({"Intercept": 1.0}, index=frame.index), frame[columns]], axis=1)
    if wave_terms and frame["wave"].nunique() > 1:
        design = design.join(_wave_dummies(frame))
    result = _cluster_ols(frame["regret"], design, frame["participant_code"])
    notes = [COMPLETE_CASE, CLUSTER_ROBUST,
             "agree_share = agree turns / assistant turns of the conversation; the pushback rate is its complement "
             "(with no escalations), so the two are never in the model together."]
    return RegretModel(_coefficients(result, focal_role), _sample(rows, used, rows["regret"].notna()), notes,
                       result, frame.assign(**{c: design[c] for c in design.columns if c.startswith("wave ")}))


# Immediate vs delayed


def _wave_features(rows: pd.DataFrame, focal_role: str) -> pd.DataFrame:
    """A PERMA wave's conversation features (the panel's conv_* columns, cumulative before the
    wave) under the conversation-feature names, with the arm's mode and the first role."""
    assistant = _float(rows["conv_assistant_turns"])
    return pd.DataFrame({
        "exit_rating": _float(rows["conv_mean_exit_rating"]),
        "wellbeing_mode": (rows["mode"].astype(str) == "wellbeing").astype(float),
        f"role_{focal_role}": (_roles(rows) == focal_role).astype(float),
        "agree_share": _float(rows["conv_agree_turns"]) / assistant.where(assistant > 0),
        "pushback_rate": _float(rows["conv_pushback_rate"]),
        "overrides": _float(rows["conv_overrides"]),
        "affirmation_per_100_words": _float(rows["conv_affirmation_per_100_words"]),
        "sentiment_change": _float(rows["conv_mean_sentiment_change"]),
        "reassurance_seeking_turns": _float(rows["conv_reassurance_seeking_turns"]),
    }, index=rows.index)


def perma_change_outcomes(data: StudyData, focal_role: str = "coach") -> pd.DataFrame:
    """One row per enrollment-anchored PERMA follow-up: ``perma_change`` (overall well-being at the
    wave minus at baseline) and the features of the conversations before the wave."""
    rows, _, _ = _perma_rows(data.panel)
    rows["perma_change"] = _float(rows["perma_overall_wellbeing"]) - _float(rows["baseline_perma_overall_wellbeing"])
    features = _wave_features(rows, focal_role)
    return pd.concat([rows.drop(columns=[c for c in features.columns if c in rows.columns]), features], axis=1)


def _auc(positive: np.ndarray, score: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Area under the ROC curve: the chance a random positive scores above a random negative
    (ties count half). ``weights``: each row counts that many times (a participant drawn twice in
    a bootstrap replicate)."""
    weights = np.ones(len(score)) if weights is None else weights
    w1, w0 = float(weights[positive].sum()), float(weights[~positive].sum())
    if w1 == 0 or w0 == 0:
        return math.nan
    levels, level = np.unique(score, return_inverse=True)
    above = np.bincount(level, weights=np.where(positive, weights, 0.0), minlength=len(levels))
    below = np.bincount(level, weights=np.where(positive, 0.0, weights), minlength=len(levels))
    negatives_lower = np.cumsum(below) - below
    return float((above * (negatives_lower + below / 2)).sum() / (w1 * w0))


def _r2(y: np.ndarray, predicted: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The share of the outcome's variance the held-out predictions explain: their squared
    correlation with the outcome, negative when they point the wrong way. (1 - SSE/SST of held-out
    predictions is not used: without information its expected value is below 0, so no interval
    would cover the no-information value 0.) ``weights`` as in :func:`_auc`."""
    weights = np.ones(len(y)) if weights is None else weights
    dy = y - np.average(y, weights=weights)
    dp = predicted - np.average(predicted, weights=weights)
    syy, spp = float(weights @ (dy * dy)), float(weights @ (dp * dp))
    if syy <= 1e-12 * float(weights @ (y * y)) or spp <= 1e-12 * max(float(weights @ (predicted * predicted)), 1e-300):
        return math.nan
    r = float(weights @ (dy * dp)) / math.sqrt(syy * spp)
    return math.copysign(r * r, r)


@dataclass(frozen=True)
class _Prediction:
    """One outcome's rows for the comparison, as arrays, with each participant's sums of squares
    and cross-products for both designs: a fold's OLS fit is then a small solve of the other
    folds' sums (a bootstrap replicate weights each participant by the times drawn), the same
    fit as least squares on the duplicated rows at a fraction of the cost."""

    y: np.ndarray
    positive: np.ndarray
    designs: dict[str, np.ndarray]  # exit_rating: intercept, exit rating; features: intercept, the features
    person: np.ndarray  # participant index per row, 0..P-1
    people: int

    @classmethod
    def build(cls, y: np.ndarray, positive: np.ndarray, designs: dict[str, np.ndarray],
              person: np.ndarray) -> _Prediction:
        return cls(y, positive, designs, person, int(person.max()) + 1)

    def _sums(self, design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = design.shape[1]
        cross = np.zeros((self.people, k * k))
        np.add.at(cross, self.person, (design[:, :, None] * design[:, None, :]).reshape(len(design), k * k))
        moment = np.zeros((self.people, k))
        np.add.at(moment, self.person, design * self.y[:, None])
        return cross, moment

    def scores(self, times: np.ndarray, fold: np.ndarray, folds: int,
               sums: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
        """R² and AUC within each held-out fold, averaged with the folds' sizes as weights.
        ``times``: how often each participant counts (0 = not drawn); ``fold``: each participant's
        fold. Within a fold, because the intercept fitted on the other folds moves against the
        held-out fold's own mean: pooled over folds that alone makes a useless predictor look
        worse than useless."""
        member = np.where(fold[None, :] == np.arange(folds)[:, None], times[None, :], 0).astype(float)  # fold x person
        rows = np.flatnonzero(times[self.person] > 0)
        row_fold = fold[self.person[rows]]
        by_fold = np.argsort(row_fold, kind="stable")
        rows, row_fold = rows[by_fold], row_fold[by_fold]
        bounds = np.searchsorted(row_fold, np.arange(folds + 1))
        parts = [slice(bounds[f], bounds[f + 1]) for f in range(folds)]
        y, positive, weights = self.y[rows], self.positive[rows], times[self.person[rows]].astype(float)
        sizes = np.array([weights[part].sum() for part in parts])
        out = {}
        for name, design in self.designs.items():
            cross, moment = sums[name]
            k = design.shape[1]
            # einsum, not BLAS: on a busy machine OpenBLAS's threads make these small products 20x slower.
            fold_cross, fold_moment = np.einsum("fp,pk->fk", member, cross), np.einsum("fp,pk->fk", member, moment)
            train_cross = (fold_cross.sum(axis=0) - fold_cross).reshape(folds, k, k)
            train_moment = fold_moment.sum(axis=0) - fold_moment
            beta = np.stack([np.linalg.lstsq(train_cross[f], train_moment[f], rcond=None)[0] for f in range(folds)])
            # Rounded so that rows with the same design tie exactly (float noise must not order them).
            predicted = np.round(np.einsum("ij,ij->i", design[rows], beta[row_fold]), 9)
            r2, auc = [], []
            for part in parts:
                empty = part.start == part.stop
                r2.append(math.nan if empty else _r2(y[part], predicted[part], weights[part]))
                auc.append(math.nan if empty else _auc(positive[part], predicted[part], weights[part]))
            out[f"r2_{name}"], out[f"auc_{name}"] = _weighted(r2, sizes), _weighted(auc, sizes)
        return out


def _weighted(values: list[float], weights: np.ndarray) -> float:
    array = np.array(values)
    known = ~np.isnan(array)
    return float(np.average(array[known], weights=weights[known])) if known.any() else math.nan


@dataclass(frozen=True)
class ImmediateVsDelayed:
    """How well the immediate rating predicts the life afterwards, next to the well-being-mode
    features: the headline table. ``table``: one row per outcome (``regret``, ``perma_change``) and
    metric (``r2``, ``auc``): the exit rating's value and 95% interval, the features', their
    difference (features minus exit rating) and its interval, the no-information value (0 for R²,
    0.5 for AUC), observations and participants. ``bootstrap``: every replicate (for plots)."""

    table: pd.DataFrame
    bootstrap: pd.DataFrame
    samples: dict[str, Sample]
    notes: list[str]

    def row(self, outcome: str, metric: str) -> pd.Series:
        rows = self.table[(self.table["outcome"] == outcome) & (self.table["metric"] == metric)]
        if rows.empty:
            raise KeyError(f"no {metric!r} row for {outcome!r}")
        return rows.iloc[0]

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"immediate_vs_delayed": self.table}


def immediate_vs_delayed(data: StudyData, *, regret_features: Sequence[str] = REGRET_FEATURES,
                         perma_features: Sequence[str] = PERMA_CHANGE_FEATURES, focal_role: str = "coach",
                         high_regret: float | None = None, folds: int = 5, n_boot: int = 500,
                         seed: int = 0) -> ImmediateVsDelayed:
    """Out-of-sample R² and AUC of two linear predictors of each delayed outcome: the exit rating
    alone, and the well-being-mode features; with participant-bootstrap 95% intervals.

    Outcomes: each decision's regret (predicted from its conversation's exit rating, or its
    features), and each PERMA follow-up's change in overall well-being from baseline (from the
    mean exit rating of the conversations before the wave, or their features). Both predictors are
    scored on the same rows (those where both are known).

    Scores are cross-validated, so a predictor with more terms gains nothing by chance: folds of
    participants (``folds``), OLS fitted on the others, predictions for the held-out ones, scored
    within each fold and averaged (weighted by the folds' sizes). R² = the squared correlation of
    the predictions with the outcome, signed (below 0 if they point the wrong way; 0 without
    information); AUC = the predictions' AUC for the dichotomized outcome: regret above its median
    (or at least ``high_regret`` if given), PERMA change above its median (0.5 without information).
    Intervals: percentile bootstrap over participants (``n_boot`` replicates, the whole
    cross-validation redone in each, duplicates of a participant kept in one fold), seeded by
    ``seed``.
    """
    if folds < 2:
        raise ValueError("folds must be at least 2")
    rows_out, boots, samples = [], [], {}
    notes = ["R² (signed squared correlation) and AUC are of out-of-fold predictions (OLS, folds of participants), so "
             "the larger feature set is not favoured by chance; intervals are percentile bootstraps over participants.",
             COMPLETE_CASE]
    regret_rows, _, _, regret_columns = _regret_frame(data, regret_features, focal_role, extra=("exit_rating",))
    perma = perma_change_outcomes(data, focal_role)
    perma_columns = _resolve(perma_features, focal_role)
    unknown = [c for c in perma_columns if c not in perma.columns]
    if unknown:
        raise ValueError(f"unknown PERMA-change feature(s) {', '.join(unknown)}")
    outcomes = (("regret", regret_rows, "regret", regret_columns),
                ("perma_change", perma, "perma_change", perma_columns))
    for index, (outcome, rows, y_column, columns) in enumerate(outcomes):
        # A stream per outcome: its estimate does not depend on the other outcome or on n_boot.
        rng = np.random.default_rng([seed, index])
        rows = rows.sort_values(["participant_code", "wave"], kind="stable")
        eligible = rows["response_status"].astype(str).isin(OBSERVABLE)
        used = eligible & rows[[y_column, "exit_rating", *columns]].notna().all(axis=1)
        samples[outcome] = _sample(rows, used, rows[y_column].notna())
        frame = rows[used]
        if frame["participant_code"].nunique() < folds:
            notes.append(f"{outcome}: fewer participants than folds; not estimated.")
            continue
        y = frame[y_column].to_numpy(float)
        if outcome == "regret" and high_regret is not None:
            positive, definition = y >= high_regret, f"regret >= {high_regret:g}"
        else:
            median = float(np.median(y))
            positive, definition = y > median, f"{y_column} above its median ({median:g})"
        people, person = np.unique(frame["participant_code"].astype(str).to_numpy(), return_inverse=True)
        ones = np.ones((len(y), 1))
        prediction = _Prediction.build(y, positive, {
            "exit_rating": np.hstack([ones, frame[["exit_rating"]].to_numpy(float)]),
            "features": np.hstack([ones, frame[columns].to_numpy(float)])}, person)
        sums = {name: prediction._sums(design) for name, design in prediction.designs.items()}

        def fold_of(unique_count: int, rng: np.random.Generator = rng) -> np.ndarray:
            return rng.permutation(np.arange(unique_count) % folds)

        everyone = np.ones(len(people), dtype=np.int64)
        estimate = prediction.scores(everyone, fold_of(len(people)), folds, sums)  # the first draw of the stream
        replicates = []
        for b in range(n_boot):
            times = np.bincount(rng.integers(0, len(people), len(people)), minlength=len(people))
            drawn = np.flatnonzero(times)
            if len(drawn) < folds:
                continue
            fold = np.full(len(people), -1)
            fold[drawn] = fold_of(len(drawn))
            replicates.append({"replicate": b, **prediction.scores(times, fold, folds, sums)})
        boot = pd.DataFrame(replicates)
        for metric, no_information in (("r2", 0.0), ("auc", 0.5)):
            a, f = f"{metric}_exit_rating", f"{metric}_features"
            boot[f"{metric}_difference"] = boot[f] - boot[a]
            row: dict[str, Any] = {"outcome": outcome, "metric": metric, "no_information": no_information,
                                   "definition": definition if metric == "auc"
                                   else "signed squared correlation of out-of-fold predictions with the outcome"}
            for name, value in (("exit_rating", estimate[a]), ("features", estimate[f]),
                                ("difference", estimate[f] - estimate[a])):
                low, high = np.nanpercentile(boot[f"{metric}_{name}"], [2.5, 97.5])
                row.update({name: value, f"{name}_low": float(low), f"{name}_high": float(high)})
            row.update({"observations": len(y), "participants": len(people), "replicates": len(boot),
                        "features_used": ", ".join(columns)})
            rows_out.append(row)
        boots.append(boot.assign(outcome=outcome))
    return ImmediateVsDelayed(pd.DataFrame(rows_out), pd.concat(boots, ignore_index=True) if boots
                              else pd.DataFrame(), samples, notes)


# Dropout


PERSON_FEATURES = ("agree_share", "pushback_rate", "exit_rating", "affirmation_per_100_words")


def _person_features(conversations: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Per participant, over all their conversations: agree share and pushback rate (from the
    summed turns), mean exit rating, affirmation per 100 words (from the summed hits and words)."""
    grouped = conversations.assign(**{c: _float(conversations[c]) for c in conversations.columns
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
    frame["baseline_wellbeing"] = frame["participant_code"].map(_float(baseline["baseline_perma_overall_wellbeing"]))
    if "timezone_region" in baseline:
        frame["timezone_region"] = frame["participant_code"].map(baseline["timezone_region"]).astype(str)
    frame["role"] = _roles(frame)
    wanted = [name for name in covariates if name in PERSON_FEATURES]
    if wanted:
        frame = frame.join(_person_features(data.conversations, wanted), on="participant_code")
    frame["duration_days"] = _float(frame["duration_days"])
    frame["event"] = _float(frame["event"])
    return frame.sort_values("participant_code", kind="stable").reset_index(drop=True)


def _indicators(values: pd.Series, reference: str, prefix: str) -> pd.DataFrame:
    levels = sorted(v for v in values.unique() if v != reference)
    return pd.DataFrame({f"{prefix}{level} vs {reference}": (values == level).astype(float) for level in levels},
                        index=values.index)


def _covariates(frame: pd.DataFrame, covariates: Sequence[str], reference_arm: str) -> pd.DataFrame:
    """The Cox model's covariate columns: numbers as they are, categories as indicators."""
    parts = []
    for name in covariates:
        if name == "arm":
            parts.append(_indicators(frame["arm"].astype(str), reference_arm, ""))
        elif name in ("role", "timezone_region"):
            values = frame[name].astype(str)
            reference = "standard" if name == "role" and (values == "standard").any() else values.mode().iloc[0]
            parts.append(_indicators(values, reference, f"{name} "))
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
    reference = _reference_arm(data.panel, reference_arm)
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
        with _as_notes(CoxConvergenceWarning) as caught:
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
    sample = _sample(people, used, frame["duration_days"].notna())
    response, response_sample, response_fit = _response_model(data, reference)
    return DropoutSurvival(pd.concat(curves, ignore_index=True), pd.DataFrame(groups), pd.DataFrame(tests), cox,
                           hazards, response, sample, response_sample, notes, fitter, response_fit)


def _response_model(data: StudyData, reference: str) -> tuple[pd.DataFrame, Sample, Any]:
    """Logit of completed (vs expired) for every follow-up whose window closed while the
    participant was in the study, on baseline overall well-being and arm; clustered by participant."""
    rows = data.panel[(data.panel["wave"] != "baseline")].copy()
    status = rows["response_status"].astype(str)
    rows["baseline_wellbeing"] = _float(rows["baseline_perma_overall_wellbeing"])
    asked = status.isin(("completed", "expired"))
    used = asked & rows["baseline_wellbeing"].notna()
    frame = rows[used].sort_values(["participant_code", "days_since_enrollment", "wave"], kind="stable")
    sample = _sample(rows, used, asked)
    if frame.empty or frame["participant_code"].nunique() < 2:
        return pd.DataFrame(), sample, None
    design = pd.concat([pd.DataFrame({"Intercept": 1.0, "baseline_wellbeing": frame["baseline_wellbeing"]}),
                        _indicators(frame["arm"].astype(str), reference, "")], axis=1)
    completed = (frame["response_status"].astype(str) == "completed").astype(float)
    result = sm.Logit(completed.to_numpy(), design.astype(float)).fit(
        disp=0, cov_type="cluster", cov_kwds={"groups": pd.factorize(frame["participant_code"])[0]})
    return _coefficients(result), sample, result


# Subgroups


def _terciles(values: pd.Series) -> tuple[pd.Series, dict[str, str]]:
    """Baseline terciles over participants: low / middle / high, with their ranges."""
    people = values.groupby(level=0).first().dropna()
    bins = pd.qcut(people, 3, labels=False, duplicates="drop")
    names = ["low", "middle", "high"] if bins.nunique() == 3 else [f"bin {i + 1}" for i in range(bins.nunique())]
    labels = bins.map(dict(enumerate(names)))
    ranges = {name: f"{people[labels == name].min():.2f} to {people[labels == name].max():.2f}" for name in names}
    return labels, ranges


@dataclass(frozen=True)
class SubgroupEffects:
    """The arm contrast on PERMA overall well-being at follow-up (adjusted for baseline and wave,
    averaged over waves) and the focal-role contrast on regret (adjusted as ``regret_model``),
    overall (``level`` 'all') and within each level of each subgroup variable, cluster-robust by
    participant; ``heterogeneity``: the Wald test that the contrast is the same in every level."""

    effects: pd.DataFrame
    heterogeneity: pd.DataFrame
    subgroups: pd.DataFrame
    notes: list[str]

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"effects": self.effects, "heterogeneity": self.heterogeneity, "subgroups": self.subgroups}


def subgroup_effects(data: StudyData, *, by: Sequence[str] = ("baseline_tercile", "timezone_region"),
                     reference_arm: str | None = None, focal_role: str = "coach",
                     regret_features: Sequence[str] = REGRET_FEATURES, min_participants: int = 5) -> SubgroupEffects:
    """Each contrast within subgroups, so a benefit on average that harms one group is seen.
    ``by``: ``baseline_tercile`` (terciles of baseline PERMA overall well-being over participants)
    and any participant-level column of the panel (e.g. ``timezone_region``); a column the panel
    lacks is skipped with a note. A level with fewer than ``min_participants`` participants on either
    side of a contrast is reported without an estimate."""
    notes = [COMPLETE_CASE, CLUSTER_ROBUST]
    rows, waves, _ = _perma_rows(data.panel)
    reference = _reference_arm(rows, reference_arm)
    rows["y"] = _float(rows["perma_overall_wellbeing"])
    rows["baseline"] = _float(rows["baseline_perma_overall_wellbeing"])
    perma = rows[rows["response_status"].astype(str).isin(OBSERVABLE) & rows["y"].notna()
                 & rows["baseline"].notna()]
    fitted, wave_notes = _observed_waves(perma.assign(group=perma["arm"].astype(str)), waves)
    perma = perma[perma["wave_number"].isin(list(fitted))]
    notes += [f"perma_overall_wellbeing: {note}" for note in wave_notes if "only some groups" in note]
    _, regret, _, columns = _regret_frame(data, regret_features, focal_role)
    role_term = f"role_{focal_role}"
    if role_term not in columns:
        raise ValueError("regret_features must include 'role'")

    baseline = _float(data.panel.set_index("participant_code")["baseline_perma_overall_wellbeing"])
    tercile, ranges = _terciles(baseline)
    people = data.panel.drop_duplicates("participant_code").set_index("participant_code")
    variables: dict[str, pd.Series] = {}
    subgroup_rows = []
    for name in by:
        if name == "baseline_tercile":
            variables[name] = tercile
            subgroup_rows += [{"subgroup": name, "level": level, "definition": f"baseline overall well-being "
                               f"{span}", "participants": int((tercile == level).sum())}
                              for level, span in ranges.items()]
        elif name in people:
            values = people[name].astype(str).where(people[name].notna())
            variables[name] = values.dropna()
            subgroup_rows += [{"subgroup": name, "level": level, "definition": f"{name} = {level}",
                               "participants": int(count)} for level, count in values.value_counts().sort_index()
                              .items()]
        else:
            notes.append(f"Subgroup variable {name!r} is not in the panel: skipped.")

    arms = sorted(a for a in perma["arm"].astype(str).unique() if a != reference)

    def perma_design(frame: pd.DataFrame) -> pd.DataFrame:
        design = pd.DataFrame({"Intercept": 1.0, "baseline": frame["baseline"]}, index=frame.index)
        for k in sorted(set(frame["wave_number"]))[1:]:  # the waves with data in this frame
            design[f"wave {waves[k]}"] = (frame["wave_number"] == k).astype(float)
        return design.join(_indicators(frame["arm"].astype(str), reference, "").reindex(
            columns=[f"{a} vs {reference}" for a in arms], fill_value=0.0))

    def regret_design(frame: pd.DataFrame) -> pd.DataFrame:
        design = pd.concat([pd.DataFrame({"Intercept": 1.0}, index=frame.index), frame[columns]], axis=1)
        return design.join(_wave_dummies(frame)) if frame["wave"].nunique() > 1 else design

    contrasts: list[tuple[str, pd.DataFrame, str, Callable[[pd.DataFrame], pd.DataFrame], list[str],
                          Callable[[pd.DataFrame, str], pd.Series]]] = [
        ("perma_overall_wellbeing", perma, "y", perma_design, [f"{a} vs {reference}" for a in arms],
         lambda f, term: f["arm"].astype(str) == term.split(" vs ")[0]),
        ("regret", regret, "regret", regret_design, [role_term], lambda f, term: f[role_term] == 1.0),
    ]
    effects, heterogeneity = [], []
    for outcome, frame, y_column, design_of, terms, exposed in contrasts:
        levels: list[tuple[str, str, pd.DataFrame]] = [("all", "all", frame)]
        for name, values in variables.items():
            level_of = frame["participant_code"].map(values)
            levels += [(name, str(level), frame[level_of == level]) for level in sorted(level_of.dropna().unique())]
        for name, level, part in levels:
            for term in terms:
                treated = exposed(part, term)
                comparison = part[~treated] if outcome == "regret" else part[part["arm"].astype(str) == reference]
                counts = (part.loc[treated, "participant_code"].nunique(), comparison["participant_code"].nunique())
                row: dict[str, Any] = {"outcome": outcome, "contrast": _contrast_label(term, focal_role),
                                       "term": term, "subgroup": name, "level": level,
                                       "participants": part["participant_code"].nunique(),
                                       "observations": len(part)}
                if min(counts) < min_participants:
                    effects.append({**row, "note": f"fewer than {min_participants} participants on a side"})
                    continue
                result = _cluster_ols(part[y_column], design_of(part), part["participant_code"])
                table = _coefficients(result, focal_role).set_index("term")
                numbers = ["estimate", "se", "ci_low", "ci_high", "p"]
                values = table.loc[[term], numbers].to_numpy(float)[0].tolist()
                effects.append({**row, **dict(zip(numbers, values, strict=True)), "note": ""})
        for name, values in variables.items():
            heterogeneity += _heterogeneity(frame, values, name, outcome, y_column, design_of, terms, focal_role)
    table = pd.DataFrame(effects)
    for column in ("estimate", "se", "ci_low", "ci_high", "p"):
        if column not in table:
            table[column] = np.nan
    table = table[["outcome", "contrast", "term", "subgroup", "level", "estimate", "se", "ci_low", "ci_high", "p",
                   "participants", "observations", "note"]]
    return SubgroupEffects(table, pd.DataFrame(heterogeneity), pd.DataFrame(subgroup_rows), notes)


def _contrast_label(term: str, focal_role: str) -> str:
    return f"ended in the {focal_role} role vs any other" if term == f"role_{focal_role}" else term


def _heterogeneity(frame: pd.DataFrame, values: pd.Series, name: str, outcome: str, y_column: str,
                   design_of: Callable[[pd.DataFrame], pd.DataFrame], terms: list[str],
                   focal_role: str) -> list[dict[str, Any]]:
    """Wald test (chi-squared, cluster-robust covariance) that every term x level interaction is 0."""
    level = frame["participant_code"].map(values)
    part = frame[level.notna()]
    level = level[level.notna()].astype(str)
    levels = sorted(level.unique())
    if len(levels) < 2 or part.empty:
        return []
    design = design_of(part)
    interactions = []
    for other in levels[1:]:
        indicator = (level == other).astype(float)
        design[f"{name}={other}"] = indicator
        for term in terms:
            design[f"{term} x {name}={other}"] = design[term] * indicator
            interactions.append(f"{term} x {name}={other}")
    design = design.loc[:, design.std(ddof=0).gt(0) | (design.columns == "Intercept")]
    interactions = [c for c in interactions if c in design]
    if not interactions:
        return []
    result = _cluster_ols(part[y_column], design, part["participant_code"])
    restriction = np.zeros((len(interactions), design.shape[1]))
    for i, column in enumerate(interactions):
        restriction[i, list(design.columns).index(column)] = 1.0
    beta = restriction @ result.params.to_numpy()
    covariance = restriction @ np.asarray(result.cov_params()) @ restriction.T
    statistic = float(beta @ np.linalg.pinv(covariance) @ beta)
    return [{"outcome": outcome, "contrast": ", ".join(_contrast_label(t, focal_role) for t in terms),
             "subgroup": name, "levels": len(levels), "statistic": statistic, "df": len(interactions),
             "p": float(stats.chi2.sf(statistic, len(interactions)))}]


# Many features at once


def _screen_candidates(frame: pd.DataFrame, exclude: Sequence[str]) -> list[str]:
    return [c for c in frame.columns if c not in exclude and (
        pd.api.types.is_numeric_dtype(frame[c]) or pd.api.types.is_bool_dtype(frame[c]))]


@dataclass(frozen=True)
class FeatureScreen:
    """Each feature's association with each outcome, one at a time (OLS of the outcome on the
    feature, cluster-robust by participant): per unit and per standard deviation of the feature
    (the forest plot), raw p-values and Benjamini-Hochberg adjusted ones (``p_bh``, within each
    outcome), ``significant_bh`` at ``alpha``. Features that are constant or missing are listed
    in ``skipped``."""

    table: pd.DataFrame
    skipped: pd.DataFrame
    notes: list[str]
    alpha: float

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"feature_screen": self.table, "skipped": self.skipped}


def feature_screen(data: StudyData, *, regret_features: Sequence[str] | None = None,
                   perma_features: Sequence[str] | None = None, focal_role: str = "coach",
                   alpha: float = 0.05) -> FeatureScreen:
    """Screen many conversation features at once against regret (per decision, the conversation's
    features) and PERMA change (per follow-up, the conversations before it), with both raw and
    Benjamini-Hochberg adjusted p-values (statsmodels ``multipletests``, ``fdr_bh``). By default
    every numeric conversation feature and the derived agree share and focal-role indicator."""
    regret = decision_outcomes(data, focal_role)
    perma = perma_change_outcomes(data, focal_role)
    ids = ("conversation_id", "decision_id", "decision_conversation_id", "regret", "days_since_enrollment",
           "wave_number", "perma_change")
    if regret_features is None:
        regret_features = _screen_candidates(_conversation_table(data.conversations, focal_role), ids)
    if perma_features is None:  # the panel's conv_* columns, and the derived ones they lack
        perma_features = ["wellbeing_mode", f"role_{focal_role}", "agree_share",
                          *[c for c in _screen_candidates(perma, ids) if c.startswith("conv_")]]
    rows, skipped = [], []
    for outcome, frame, y_column, features in (("regret", regret, "regret", regret_features),
                                               ("perma_change", perma, "perma_change", perma_features)):
        frame = frame[frame["response_status"].astype(str).isin(OBSERVABLE)]
        y = _float(frame[y_column])
        part: list[dict[str, Any]] = []
        for feature in features:
            if feature not in frame:
                raise ValueError(f"unknown feature {feature!r} for {outcome}")
            x = _float(frame[feature])
            used = y.notna() & x.notna()
            if used.sum() < 3 or x[used].std(ddof=0) == 0 or frame.loc[used, "participant_code"].nunique() < 2:
                skipped.append({"outcome": outcome, "feature": feature,
                                "reason": "constant" if used.sum() >= 3 else "too few observations"})
                continue
            design = pd.DataFrame({"Intercept": 1.0, feature: x[used]})
            result = _cluster_ols(y[used], design, frame.loc[used, "participant_code"])
            sd = float(x[used].std(ddof=1))
            low, high = result.conf_int().loc[feature].to_numpy(dtype=float)
            part.append({"outcome": outcome, "feature": feature, "label": _label(feature, focal_role),
                         "estimate": float(result.params[feature]), "se": float(result.bse[feature]),
                         "ci_low": float(low), "ci_high": float(high), "feature_sd": sd,
                         "estimate_per_sd": float(result.params[feature]) * sd, "ci_low_per_sd": float(low) * sd,
                         "ci_high_per_sd": float(high) * sd, "p": float(result.pvalues[feature]),
                         "observations": int(used.sum()),
                         "participants": int(frame.loc[used, "participant_code"].nunique())})
        if part:
            reject, adjusted, _, _ = multipletests([r["p"] for r in part], alpha=alpha, method="fdr_bh")
            for r, p_bh, significant in zip(part, adjusted, reject, strict=True):
                r.update(p_bh=float(p_bh), significant_bh=bool(significant))
        rows += part
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table.sort_values(["outcome", "p"], kind="stable").reset_index(drop=True)
    notes = [f"One model per feature and outcome; Benjamini-Hochberg false discovery rate {alpha:g} within each "
             "outcome. Association, not effect: features are not randomized.", COMPLETE_CASE]
    return FeatureScreen(table, pd.DataFrame(skipped, columns=["outcome", "feature", "reason"]), notes, alpha)
