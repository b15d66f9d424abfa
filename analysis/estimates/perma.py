"""PERMA over the follow-up waves by arm (and role): the linear mixed model of well-being
trajectories (REML: random intercepts by ``analysis.estimates.mixed``, from per-participant sums;
random slopes by statsmodels ``MixedLM``), complete-case or with multiple imputation by chained
equations pooled with Rubin's rules.

Not to be confused with ``analysis.trajectories``: the export of conversations labelled with the
outcomes that followed them (a training signal), not a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats
from statsmodels.imputation.mice import MICEData

from analysis.estimates.common import (
    COMPLETE_CASE,
    OBSERVABLE,
    Sample,
    StudyData,
    floats,
    observed_waves,
    perma_rows,
    pick_reference_arm,
    roles_of,
    sample_of,
    warnings_as_notes,
)
from analysis.estimates.mixed import fit_random_intercept
from analysis.panel import PERMA_SCORES

Z95 = float(stats.norm.ppf(0.975))


@dataclass(frozen=True)
class Estimates:
    """Parameters with their covariance; after multiple imputation, Rubin's rules: the mean of the
    imputations' estimates, the within (mean) and between (sample) covariances."""

    params: pd.Series
    within: np.ndarray
    between: np.ndarray | None = None
    imputations: int = 1
    df_complete: float = np.inf  # the complete-data degrees of freedom (participants - fixed effects)

    def combine(self, weights: np.ndarray) -> pd.DataFrame:
        """Estimate, standard error, 95% interval and p-value of each row of ``weights`` x params.
        Student's t on ``df_complete`` without imputation (normal if infinite); with it, on Rubin's
        degrees of freedom with Barnard and Rubin's (1999) small-sample adjustment toward
        ``df_complete``."""
        weights = np.atleast_2d(weights)
        estimate = weights @ self.params.to_numpy()
        within = np.einsum("ij,jk,ik->i", weights, self.within, weights)
        m = self.imputations
        if self.between is None or m < 2:
            total, df = within, np.full(len(estimate), float(self.df_complete))
        else:
            between = np.einsum("ij,jk,ik->i", weights, self.between, weights)
            total = within + (1 + 1 / m) * between
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = (1 + 1 / m) * between / within
                df = np.where(between > 0, (m - 1) * (1 + 1 / ratio) ** 2, np.inf)
                if np.isfinite(self.df_complete):
                    missing_share = np.where(total > 0, (1 + 1 / m) * between / total, 0.0)
                    observed = ((self.df_complete + 1) / (self.df_complete + 3) * self.df_complete
                                * (1 - missing_share))
                    df = np.where(np.isinf(df), observed, 1 / (1 / df + 1 / observed))
        se = np.sqrt(total)
        critical = np.where(np.isinf(df), Z95, stats.t.ppf(0.975, np.where(np.isinf(df), 1, df)))
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = estimate / se
        p = np.where(np.isinf(df), 2 * stats.norm.sf(np.abs(statistic)),
                     2 * stats.t.sf(np.abs(statistic), np.where(np.isinf(df), 1, df)))
        return pd.DataFrame({"estimate": estimate, "se": se, "ci_low": estimate - critical * se,
                             "ci_high": estimate + critical * se, "statistic": statistic, "p": p, "df": df})


def rubin(params: list[pd.Series], covariances: list[np.ndarray], df_complete: float = np.inf) -> Estimates:
    stacked = np.vstack([p.to_numpy() for p in params])
    between = np.atleast_2d(np.cov(stacked.T, ddof=1))
    return Estimates(pd.Series(stacked.mean(axis=0), index=params[0].index), np.mean(covariances, axis=0),
                      between, len(params), df_complete)


def _groups(frame: pd.DataFrame, by_role: bool) -> pd.Series:
    """The arm, or for arms in the well-being mode with ``by_role``, arm/first role."""
    arm = frame["arm"].astype(str)
    if not by_role:
        return arm
    wellbeing = frame["mode"].astype(str) == "wellbeing"
    return arm.where(~wellbeing, arm + "/" + roles_of(frame))


def _perma_design(frame: pd.DataFrame, contrasts: list[str], reference: str, waves: dict[int, str],
                  wave_term: str) -> pd.DataFrame:
    """Intercept, baseline, time (``day``: a slope per day since enrollment, or one indicator per
    later wave; none with one wave), each group's indicator and its interaction with the time
    terms. ``frame`` has group, baseline, wave_number and day; ``waves``: the waves in the fit."""
    design = pd.DataFrame({"Intercept": 1.0, "baseline": frame["baseline"].astype(float)}, index=frame.index)
    wave_columns: dict[str, pd.Series] = {}
    if wave_term == "linear" and len(waves) > 1:
        wave_columns["day"] = frame["day"].astype(float)
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
    estimates: Estimates
    structure: str
    result: Any
    notes: list[str]



BOUNDARY = "on the boundary"


OPTIMIZERS = (("bfgs", "lbfgs", "cg"), ("powell",), ("nm",))  # statsmodels' default sequence, then derivative-free


def _fit_mixed_once(y: pd.Series, design: pd.DataFrame, groups: pd.Series,
                    slopes: pd.DataFrame | None) -> tuple[Any, list[str], list[str]]:
    """(result or None, problems that make the fit unusable, remarks on a usable fit). Every
    warning of the fit is caught and said in words: none reaches the caller raw. A fit whose
    variance estimate lies on the boundary (a variance of zero, lme4's "singular fit") is
    usable and remarked on; a failed, unconverged fit or one with non-finite standard errors
    is not. statsmodels' default optimizers first, then Powell, then Nelder-Mead, each from the
    start (an optimizer that fails with an error does not stop the next). Random intercepts alone
    (``slopes`` None): ``analysis.estimates.mixed.fit_random_intercept``, the same REML fit from
    per-participant sums, whose one-dimensional optimum needs no fallback."""
    if slopes is None:
        try:
            fitted = fit_random_intercept(y, design, groups)
        except np.linalg.LinAlgError as error:
            return None, [f"the fit failed ({error})"], []
        if not np.all(np.isfinite(fitted.bse_fe)):
            return None, ["some standard errors are not finite (the information matrix is singular)"], []
        return fitted, [], ([f"a variance is estimated {BOUNDARY} of the parameter space (zero), a singular fit"]
                            if fitted.on_boundary else [])
    problems: list[str] = []
    for optimizers in OPTIMIZERS:
        with warnings_as_notes(Warning) as caught:
            try:
                result = sm.MixedLM(y.astype(float), design, groups=groups.to_numpy(), exog_re=slopes).fit(
                    reml=True, method=list(optimizers))
            except (np.linalg.LinAlgError, ValueError) as error:
                problems.append(f"{'/'.join(optimizers)}: the fit failed ({error})")
                continue
        if not result.converged:
            problems.append(f"{'/'.join(optimizers)}: the optimizer did not converge")
            continue
        if not np.all(np.isfinite(np.asarray(result.bse_fe))):
            problems.append(f"{'/'.join(optimizers)}: some standard errors are not finite (the information matrix "
                            "is singular)")
            continue
        remarks = []
        for message in sorted(set(caught)):
            if "boundary" in message.lower():
                remarks.append(f"a variance is estimated {BOUNDARY} of the parameter space (zero), a singular fit")
            elif not any(word in message.lower() for word in ("retrying", "converge", "gradient optimization",
                                                               "covariance is singular")):
                remarks.append(f"statsmodels: {message}")
        if optimizers != OPTIMIZERS[0]:
            remarks.append("fitted with " + "/".join(optimizers) + " after " + "; ".join(problems))
        return result, [], sorted(set(remarks))
    return None, problems, []


def _fit_mixed(frame: pd.DataFrame, design: pd.DataFrame, random_slopes: bool) -> _Mixed:
    """Participant random intercepts and, if asked, random slopes on day; when the slope fit fails
    (no convergence, non-finite standard errors) intercepts only, with the reason in the notes (no
    silent fallback). Degrees of freedom: participants minus fixed effects (a cluster-count df)."""
    notes: list[str] = []
    y, groups = frame["y"], frame["participant_code"].astype(str)
    df = float(groups.nunique() - np.linalg.matrix_rank(design.to_numpy(float)))
    if groups.value_counts().max() == 1:
        # One row per participant: the participant and residual variances cannot be told apart and
        # MixedLM's standard errors are unreliable; the random-intercept model's fixed effects are
        # then those of OLS, whose residual variance is the two variances' sum.
        result = sm.OLS(y.astype(float), design.astype(float)).fit()
        notes.append("One observation per participant: fitted by OLS (the random intercept is not identified).")
        return _Mixed(Estimates(result.params, np.asarray(result.cov_params()), df_complete=float(result.df_resid)),
                      "none (one row per participant)", result, notes)
    if random_slopes:
        # The slope's column in weeks: the same model as in days (its variance scaled by 49), and an
        # optimizer's steps of the size it takes (in days the variance is ~1e-4 and statsmodels'
        # gradient methods stop short of it).
        slopes = pd.DataFrame({"Intercept": 1.0, "week": frame["day"].astype(float) / 7}, index=frame.index)
        result, problems, remarks = _fit_mixed_once(y, design, groups, slopes)
        if result is not None and not problems:
            notes += [f"Random-slope fit: {remark}; kept (the fixed effects and their errors are still "
                      "estimated)." for remark in remarks]
            return _Mixed(_mixed_estimates(result, design, df), "participant intercept and time slope", result, notes)
        notes.append("Random slopes on day were asked for but did not fit (" + "; ".join(problems)
                     + "): the model reported has participant random intercepts only.")
    result, problems, remarks = _fit_mixed_once(y, design, groups, None)
    if result is None:  # every optimizer failed
        raise ValueError("the mixed model could not be fitted: " + "; ".join(problems))
    if remarks:
        notes.append("Random-intercept fit: " + "; ".join(remarks) + ".")
    return _Mixed(_mixed_estimates(result, design, df), "participant intercept", result, notes)


def _mixed_estimates(result: Any, design: pd.DataFrame, df: float) -> Estimates:
    k = design.shape[1]  # MixedLM lists the fixed effects first, then the random-effect parameters
    return Estimates(pd.Series(np.asarray(result.fe_params), index=design.columns),
                      np.asarray(result.cov_params())[:k, :k], df_complete=df)


def _random_effects(result: Any) -> pd.DataFrame:
    if not hasattr(result, "cov_re"):  # OLS: one row per participant
        return pd.DataFrame([("residual variance", float(result.scale))], columns=["parameter", "value"])
    cov = np.asarray(result.cov_re, dtype=float)
    rows = [("participant intercept variance", float(cov[0, 0]))]
    if cov.shape[0] > 1:
        rows += [("participant slope variance (per week)", float(cov[1, 1])),
                 ("intercept-slope covariance", float(cov[0, 1]))]
    rows.append(("residual variance", float(result.scale)))
    return pd.DataFrame(rows, columns=["parameter", "value"])


@dataclass(frozen=True)
class PermaTrajectories:
    """PERMA over time by arm (and role). ``fixed_effects``: one row per outcome and term with its
    95% interval and degrees of freedom (terms ``baseline``, ``day``, ``<arm> vs <reference>``, the
    difference at enrollment, and ``<arm> vs <reference> x day``, the arm x time effect per day since
    enrollment). ``marginal_means``: the model's mean per outcome,
    group and wave at the sample's mean baseline, with intervals and the observed means beside
    them (the trajectory plot). ``contrasts``: group minus reference at each wave.
    ``random_effects``: variance components. ``samples``: per outcome. ``fits``: the fit results
    (``analysis.estimates.mixed.RandomInterceptFit`` for random intercepts, statsmodels' for random
    slopes or OLS; per imputation with ``method`` mice)."""

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
        """One fixed effect's row, e.g. ``fit.effect("wellbeing vs control x day")``."""
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
    """Linear mixed model (REML; ``analysis.estimates.mixed`` for random intercepts, statsmodels
    ``MixedLM`` with random slopes) of each PERMA score in ``outcomes`` at the
    enrollment-anchored follow-ups on time x arm (x the first conversation's role within
    well-being-mode arms, with ``by_role``), adjusted for the baseline score, with participant
    random intercepts and random slopes on time where they are identified and fit.

    Estimand (the primary one): the arm x time effect, how much the difference in the score between
    an arm and the reference arm, at a given baseline, changes per day since enrollment (term
    ``<arm> vs <reference> x day``); beside it, the difference at each wave (``contrasts``).

    Time is the wave's day since enrollment (its median over participants, the protocol's offset
    plus the local send time), not the wave's index: with follow-ups at days 7 and 28 a per-wave
    slope would treat three weeks as one. ``wave_term`` ``linear``: the score is linear in that day;
    ``categorical`` gives each later wave its own terms. Random slopes (on day) are fitted only with
    at least three waves (with two they are not identified); a slope fit that fails falls back to
    random intercepts and says so in ``notes``, and a variance estimated at zero is kept and said.
    Intervals and p-values: Student's t on the participants minus the fixed effects (a
    cluster-count degrees of freedom; Satterthwaite and Kenward-Roger are not in statsmodels).

    ``impute="mice"``: multiple imputation by chained equations (statsmodels ``MICEData``,
    predictive mean matching) of the wide participant x wave table, ``imputations`` data sets
    after ``burn_in`` cycles, the model fitted to each and combined with Rubin's rules; seeded by
    ``seed``.
    """
    unknown = [name for name in outcomes if name not in PERMA_SCORES]
    if unknown:
        raise ValueError(f"unknown PERMA score(s) {', '.join(unknown)}; choose from {', '.join(PERMA_SCORES)}")
    if wave_term not in ("linear", "categorical"):
        raise ValueError("wave_term is 'linear' or 'categorical'")
    if impute not in ("none", "mice"):
        raise ValueError("impute is 'none' or 'mice'")
    rows, waves, days = perma_rows(data.panel)
    reference = pick_reference_arm(rows, reference_arm)
    rows["group"] = _groups(rows, by_role)
    rows["day"] = rows["wave_number"].map(days).astype(float)
    contrasts = sorted(g for g in rows["group"].unique() if g != reference)
    if by_role and reference not in set(rows["group"]):
        raise ValueError(f"the reference arm {reference!r} is in the well-being mode; pick a default-mode arm")
    eligible = rows["response_status"].astype(str).isin(OBSERVABLE)
    notes = [COMPLETE_CASE if impute == "none" else
             f"Multiple imputation by chained equations ({imputations} imputations, predictive mean matching on "
             "the wide participant x wave table with baseline and group), combined with Rubin's rules; valid if "
             "the data are missing at random given baseline, group and the observed waves."]
    notes.append(f"Reference group: {reference}. Time is the wave's day since enrollment (its median over "
                 "participants: the protocol's offset plus the local send time): "
                 + ", ".join(f"{w} = day {days[k]:.1f}" for k, w in waves.items())
                 + (". The arm x time terms are per day." if wave_term == "linear" else
                    ". Each later wave has its own terms."))
    notes.append("Intervals and p-values: Student's t on the participants minus the fixed effects (a cluster-count "
                 "degrees of freedom, conservative for within-participant terms; Satterthwaite and Kenward-Roger "
                 "are not in statsmodels)" + ("" if impute == "none" else
                                              ", with Barnard and Rubin's adjustment after imputation") + ".")
    if by_role:
        notes.append("Role is the starting role of the participant's first conversation ('none' without one).")

    fixed: list[pd.DataFrame] = []
    means: list[pd.DataFrame] = []
    differences: list[pd.DataFrame] = []
    random: list[pd.DataFrame] = []
    samples: dict[str, Sample] = {}
    fits: dict[str, Any] = {}
    for outcome in outcomes:
        frame = rows.assign(y=floats(rows[f"perma_{outcome}"]), baseline=floats(rows[f"baseline_perma_{outcome}"]))
        frame = frame.sort_values(["participant_code", "wave_number"], kind="stable")
        in_fit = eligible.reindex(frame.index)
        fitted, wave_notes = observed_waves(frame[in_fit & frame["y"].notna()], waves)
        notes += [f"{outcome}: {note}" for note in wave_notes]
        # With two waves a participant's two values give three moments (two variances and a
        # covariance) for four parameters (intercept and slope variances, their covariance and the
        # residual variance): a random slope needs at least three waves.
        slopes = random_slopes and len(fitted) > 2
        if random_slopes and len(fitted) == 2:
            notes.append(f"{outcome}: random slopes on day need at least three waves with data (with two they "
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
            samples[outcome] = sample_of(frame, used, frame["y"].notna())
            mean_baseline = float(model_frame["baseline"].mean())
        else:
            used = in_fit & frame["wave_number"].isin(list(fitted))
            estimates, structure, results, mice_notes, mean_baseline = _perma_mice(
                frame[used], contrasts, reference, fitted, wave_term, slopes, imputations, burn_in, seed)
            fits[outcome] = results
            notes += [f"{outcome}: {note}" for note in mice_notes]
            random.append(pd.concat([_random_effects(r) for r in results]).groupby("parameter", sort=False)
                          .mean().reset_index().assign(outcome=outcome, structure=structure))
            samples[outcome] = sample_of(frame, used, frame["y"].notna(), imputed=True)

        table = estimates.combine(np.eye(len(estimates.params)))
        table.insert(0, "term", estimates.params.index)
        table.insert(0, "outcome", outcome)
        fixed.append(table)
        grid = pd.DataFrame([(g, k) for g in [reference, *contrasts] for k in fitted],
                            columns=["group", "wave_number"]).assign(baseline=mean_baseline)
        grid["day"] = grid["wave_number"].map(days).astype(float)
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
        # Standardized: in units of the baseline score's standard deviation over the participants
        # in the model (one baseline each), a fixed scale: the interval is the raw one divided by it.
        spread = float(frame[used].drop_duplicates("participant_code")["baseline"].std(ddof=1))
        for i, group in enumerate(contrasts, start=1):
            difference = estimates.combine(by_wave[i] - by_wave[0])
            difference.insert(0, "wave", list(fitted.values()))
            difference.insert(0, "wave_number", list(fitted))
            scaled = {f"d{suffix}": difference[column] / spread if spread > 0 else np.nan
                      for suffix, column in (("", "estimate"), ("_low", "ci_low"), ("_high", "ci_high"))}
            differences.append(difference.assign(outcome=outcome, group=group, reference=reference,
                                                 baseline_sd=spread, **scaled))

    fixed_effects = pd.concat(fixed, ignore_index=True)
    fixed_effects.insert(2, "label", fixed_effects["term"])
    marginal = pd.concat(means, ignore_index=True)
    marginal = marginal[["outcome", "group", "wave", "wave_number", "days", "mean", "se", "ci_low", "ci_high",
                         "observed_mean", "observed_n", "at_baseline"]]
    contrast_table = pd.concat(differences, ignore_index=True) if differences else pd.DataFrame()
    if not contrast_table.empty:
        contrast_table = contrast_table[["outcome", "group", "reference", "wave", "wave_number", "estimate", "se",
                                         "ci_low", "ci_high", "p", "baseline_sd", "d", "d_low", "d_high"]]
        notes.append("Standardized differences (d): the difference at a wave divided by the standard deviation of "
                     "the baseline score over the participants in the model, its interval divided likewise (the "
                     "standard deviation taken as a fixed scale).")
    return PermaTrajectories(fixed_effects, marginal, contrast_table,
                             pd.concat(random, ignore_index=True)[["outcome", "structure", "parameter", "value"]],
                             samples, notes, fits, reference, "complete-case" if impute == "none" else "mice")



def _perma_mice(frame: pd.DataFrame, contrasts: list[str], reference: str, waves: dict[int, str], wave_term: str,
                random_slopes: bool, imputations: int, burn_in: int,
                seed: int) -> tuple[Estimates, str, list[Any], list[str], float]:
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
    cells = frame[["participant_code", "wave_number", "day", "group"]].reset_index(drop=True)
    params: list[pd.Series] = []
    covariances: list[np.ndarray] = []
    results: list[Any] = []
    notes: list[str] = []
    baselines: list[float] = []
    structure = ""
    use_slopes = random_slopes
    df_complete = np.inf
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
            structure, df_complete = mixed.structure, mixed.estimates.df_complete
            use_slopes = "slope" in structure  # the random part is decided on the first imputed data set
            notes += mixed.notes
        params.append(mixed.estimates.params)
        covariances.append(mixed.estimates.within)
        results.append(mixed.result)
        baselines.append(float(long["baseline"].mean()))
    return rubin(params, covariances, df_complete), structure, results, notes, float(np.mean(baselines))
