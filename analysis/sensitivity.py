"""Missing data in the open: the report's primary PERMA estimate (the arm x time effect) under other
assumptions about the follow-ups nobody answered.

Estimand: the arm x time effect of ``analysis.estimates.perma`` among every randomized participant
whose follow-up windows have closed, had each of them answered every follow-up (a hypothetical
strategy for missed follow-ups and withdrawals: the scores of those who did not answer belong to the
estimand; they are not left out of it). Estimators:

- complete case (the report's primary fit): unbiased if the missing scores are missing at random
  (MAR) given the baseline, the arm and the participant's observed waves;
- multiple imputation (``perma_trajectories(impute="mice")``: chained equations with predictive
  mean matching on the participant x wave table, ``IMPUTATIONS`` data sets, Rubin's rules with
  Barnard and Rubin's degrees of freedom), also under MAR;
- delta adjustment (a tipping-point analysis for informative dropout, missing not at random): the
  same imputations with every imputed score of the intervention arm(s) (``shift="intervention"``;
  ``"both"``: of every arm) shifted by delta points, the model refitted to each shifted data set
  and pooled again, over a grid of deltas (``DELTAS``). The tipping point is the delta nearest zero
  at which the conclusion at the 95% level (positive, negative, or an interval covering zero)
  differs from the one under MAR, interpolated linearly between the grid's points.

A negative delta says the participants who did not answer were worse off than those like them who
did; how large a delta is plausible is a judgement the report leaves to its reader, giving the
baseline standard deviation for scale.

    >>> sensitivity_analyses(data, suite.perma).tipping_points
"""

from __future__ import annotations

import html
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import statsmodels.api as sm

from analysis.estimates import PermaTrajectories, StudyData, perma_trajectories
from analysis.estimates.common import OBSERVABLE, floats, perma_rows
from analysis.estimates.mixed import RandomInterceptFit, fit_random_intercept
from analysis.estimates.perma import OPTIMIZERS, rubin
from analysis.report_html import _Col, _notes, _table
from analysis.report_plots import figure_html, tipping_plot

IMPUTATIONS = 5  # imputed data sets: a modest number keeps the report's run short (each delta refits each)
DELTAS = (-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)  # points on the PERMA 0-10 scale
SENSITIVITY_TITLE = "Missing data: sensitivity analyses"
Shift = Literal["intervention", "both"]


@dataclass(frozen=True)
class Sensitivity:
    """``comparison``: the complete-case (primary) and multiple-imputation estimates of each arm's
    arm x time term. ``tipping``: the delta-adjusted estimate per arm and delta, with its interval
    and ``conclusion`` (positive, negative, inconclusive). ``tipping_points``: per arm and direction
    (delta below or above zero) the first grid delta whose conclusion differs from MAR's and the
    interpolated delta where the interval's bound crosses zero (NaN: not within the grid).
    ``imputed``: per group and wave, the rows in the imputation and how many were imputed."""

    outcome: str
    reference: str
    shift: Shift
    imputations: int
    baseline_sd: float
    comparison: pd.DataFrame
    tipping: pd.DataFrame
    tipping_points: pd.DataFrame
    imputed: pd.DataFrame
    notes: list[str]

    def tipping_point(self, arm: str | None = None) -> float | None:
        """The interpolated tipping point nearest zero (of ``arm``, by default the first), or None."""
        points = self.tipping_points[self.tipping_points["arm"] == (arm or self.tipping_points["arm"].iloc[0])]
        found = points["interpolated"].dropna()
        return None if found.empty else float(found.iloc[int(np.argmin(np.abs(found.to_numpy())))])

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"comparison": self.comparison, "tipping": self.tipping, "tipping_points": self.tipping_points,
                "imputed": self.imputed}


def conclusion(low: float, high: float) -> str:
    return "positive" if low > 0 else "negative" if high < 0 else "inconclusive"


def imputed_rows(data: StudyData, outcome: str, result: Any, days: dict[int, float]) -> np.ndarray:
    """Which rows of a fit to an imputed data set hold an imputed score: those whose participant and
    wave (the ``day`` column) have no observed score in the panel. The observed ones must equal the
    panel's, or the rows are not the panel's and ValueError is raised."""
    rows, _, _ = perma_rows(data.panel)
    rows = rows[rows["response_status"].astype(str).isin(OBSERVABLE)]
    scores = floats(rows[f"perma_{outcome}"])
    observed = {(str(code), int(k)): float(y) for code, k, y in
                zip(rows["participant_code"], rows["wave_number"], scores, strict=True) if not math.isnan(y)}
    model = result.model
    wave_of = {day: k for k, day in days.items()}
    day = np.asarray(model.exog)[:, list(model.exog_names).index("day")]
    keys = [(str(code), wave_of.get(float(d), -1)) for code, d in zip(model.groups, day, strict=True)]
    imputed = np.array([key not in observed for key in keys])
    shown = np.asarray(model.endog, float)[~imputed]
    if not np.allclose(shown, [observed[key] for key, gone in zip(keys, imputed, strict=True) if not gone]):
        raise ValueError("the imputed data sets' observed scores are not the panel's")
    return imputed


def _refit(result: Any, shift: np.ndarray) -> Any:
    """The imputed data set's model refitted with ``shift`` added to its scores (random intercepts as
    ``analysis.estimates.mixed`` fitted them; random slopes by statsmodels, started from its fit)."""
    model = result.model
    if isinstance(result, RandomInterceptFit):
        return fit_random_intercept(np.asarray(model.endog) + shift, model.exog, model.groups, model.exog_names)
    for optimizers in OPTIMIZERS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                again = sm.MixedLM(np.asarray(model.endog) + shift, model.exog, groups=model.groups,
                                   exog_re=model.exog_re).fit(reml=True, method=list(optimizers),
                                                              start_params=result.params_object)
            except (np.linalg.LinAlgError, ValueError):
                continue
        if again.converged and np.all(np.isfinite(np.asarray(again.bse_fe))):
            return again
    raise ValueError("the mixed model refitted to a delta-shifted imputed data set did not converge")


def _pooled(results: Sequence[Any], names: list[str], terms: list[str], df_complete: float) -> pd.DataFrame:
    """Rubin's rules over ``results`` (``analysis.estimates.perma.rubin``; their fixed effects are
    ``names``), the rows of ``terms``."""
    k = len(names)
    estimates = rubin([pd.Series(np.asarray(r.fe_params), index=names) for r in results],
                      [np.asarray(r.cov_params())[:k, :k] for r in results], df_complete)
    table = estimates.combine(np.eye(k)[[names.index(t) for t in terms]])
    return table.assign(term=terms)


def _tipping_points(tipping: pd.DataFrame) -> pd.DataFrame:
    """Per arm and direction from zero, the first grid delta whose conclusion differs from the one at
    zero, and where the interval's bound that decides it crosses zero (linear between the two deltas)."""
    rows = []
    for arm, grid in tipping.groupby("arm", sort=False):
        grid = grid.sort_values("delta").reset_index(drop=True)
        said = [str(c) for c in grid["conclusion"]]
        delta = grid["delta"].to_numpy(float)
        zero = int(np.flatnonzero(delta == 0.0)[0])
        for direction, steps in (("below zero", range(zero - 1, -1, -1)), ("above zero", range(zero + 1, len(grid)))):
            found: dict[str, Any] = {"arm": arm, "direction": direction, "at_mar": said[zero], "becomes": None,
                                     "grid_delta": np.nan, "interpolated": np.nan}
            previous = zero
            for i in steps:
                if said[i] != said[zero]:
                    bound = grid["ci_low" if "positive" in (said[previous], said[i]) else "ci_high"].to_numpy(float)
                    b0, b1 = bound[previous], bound[i]
                    crossing = delta[previous] + (0 - b0) * (delta[i] - delta[previous]) / (b1 - b0) if b1 != b0 \
                        else delta[i]
                    found.update(becomes=said[i], grid_delta=float(delta[i]), interpolated=float(crossing))
                    break
                previous = i
            rows.append(found)
    return pd.DataFrame(rows)


def sensitivity_analyses(data: StudyData, primary: PermaTrajectories | None, *, outcome: str | None = None,
                         imputations: int = IMPUTATIONS, deltas: Sequence[float] = DELTAS,
                         shift: Shift = "intervention", burn_in: int = 10,
                         seed: int = 0) -> Sensitivity:
    """The primary estimate complete-case (``primary``, the report's fit), by multiple imputation
    and delta-adjusted over ``deltas`` (zero always included), for ``outcome`` (by default the
    first fitted). Raises ValueError when there is no arm x time term (one wave, one arm) or the
    imputed data sets cannot be fitted."""
    if primary is None:
        raise ValueError("the PERMA model was not estimated")
    if shift not in ("intervention", "both"):
        raise ValueError("shift is 'intervention' or 'both'")
    if primary.method != "complete-case":
        raise ValueError("the primary fit is complete-case; this one is not")
    outcome = outcome or next(iter(primary.fits))
    fixed = primary.fixed_effects[primary.fixed_effects["outcome"] == outcome]
    terms = [t for t in fixed["term"] if t.endswith(" x day") and " vs " in t]
    if not terms:
        raise ValueError(f"the PERMA model of {outcome} has no arm x time term (one follow-up wave, or one arm)")
    mi = perma_trajectories(data, outcomes=[outcome], impute="mice", imputations=imputations, burn_in=burn_in,
                            seed=seed, reference_arm=primary.reference)
    results = list(mi.fits[outcome])
    if not hasattr(results[0], "random_effects"):
        raise ValueError("one observation per participant: the imputed data sets were fitted by OLS")
    _, waves, days = perma_rows(data.panel)
    imputed = imputed_rows(data, outcome, results[0], days)
    model = results[0].model
    names, exog = list(model.exog_names), np.asarray(model.exog)
    arms = [t.removesuffix(" x day") for t in terms]
    in_arms = np.any([exog[:, names.index(a)] == 1 for a in arms], axis=0)
    moved = (imputed & in_arms) if shift == "intervention" else imputed
    df_complete = float(len(np.unique(model.groups)) - np.linalg.matrix_rank(exog))

    pooled = []
    for delta in sorted({0.0, *map(float, deltas)}):
        fits = results if delta == 0 else [_refit(r, delta * moved) for r in results]
        pooled.append(_pooled(fits, names, terms, df_complete).assign(delta=delta))
    tipping = pd.concat(pooled, ignore_index=True)
    tipping["arm"] = tipping["term"].str.split(" vs ").str[0]
    tipping["conclusion"] = [conclusion(lo, hi) for lo, hi in zip(tipping["ci_low"], tipping["ci_high"], strict=True)]
    tipping = tipping[["arm", "term", "delta", "estimate", "se", "ci_low", "ci_high", "df", "p", "conclusion"]]

    def row(fit: PermaTrajectories, label: str, term: str) -> dict[str, Any]:
        effect = fit.effect(term, outcome)
        sample = fit.samples[outcome]
        return {"analysis": label, "arm": term.split(" vs ")[0], "term": term,
                **{c: float(effect[c]) for c in ("estimate", "se", "ci_low", "ci_high", "df", "p")},
                "participants": sample.participants, "observations": sample.observations,
                "imputed": int(sample.missingness.loc[sample.missingness["wave"] == "all", "imputed"].sum())}

    comparison = pd.DataFrame([row(f, label, t) for t in terms for f, label in (
        (primary, "complete case (the primary analysis)"), (mi, f"multiple imputation, {imputations} data sets"))])
    groups = np.full(len(exog), primary.reference, dtype=object)
    for arm in arms:
        groups[exog[:, names.index(arm)] == 1] = arm.split(" vs ")[0]
    wave_of = {day: waves[k] for k, day in days.items()}
    cells = pd.DataFrame({"group": groups, "wave": [wave_of[d] for d in exog[:, names.index("day")]],
                          "imputed": imputed, "shifted": moved})
    counts = cells.groupby(["group", "wave"], sort=False).agg(rows=("imputed", "size"), imputed=("imputed", "sum"),
                                                              shifted=("shifted", "sum")).reset_index()
    counts["share_imputed"] = counts["imputed"] / counts["rows"]
    contrasts = primary.contrasts
    spread = (float(contrasts.loc[contrasts["outcome"] == outcome, "baseline_sd"].iloc[0])
              if not contrasts.empty and (contrasts["outcome"] == outcome).any() else math.nan)
    notes = [note for note in mi.notes if "imputation" in note.lower() or "random slopes" in note.lower()]
    return Sensitivity(outcome, primary.reference, shift, imputations, spread, comparison, tipping,
                       _tipping_points(tipping), counts, notes)


# The report's section

COMPARISON_COLS = [_Col("analysis", "analysis", "text"), _Col("term", "term", "text"),
                   _Col("estimate (95% CI)", "estimate", "interval", "ci_low", "ci_high"), _Col("SE", "se"),
                   _Col("df", "df"), _Col("p", "p", "p"), _Col("participants", "participants", "count"),
                   _Col("observations", "observations", "count"), _Col("of them imputed", "imputed", "count")]
TIPPING_COLS = [_Col("arm", "arm", "text"), _Col("delta (points)", "delta"),
                _Col("estimate (95% CI)", "estimate", "interval", "ci_low", "ci_high"), _Col("SE", "se"),
                _Col("df", "df"), _Col("p", "p", "p"), _Col("conclusion", "conclusion", "text")]
IMPUTED_COLS = [_Col("group", "group", "text"), _Col("wave", "wave", "text"), _Col("rows", "rows", "count"),
                _Col("imputed", "imputed", "count"), _Col("share imputed", "share_imputed"),
                _Col("shifted by delta", "shifted", "count")]


def meaning(result: Sensitivity, arm: str) -> str:
    """What the analyses say, in a few sentences: whether imputation changes the primary conclusion,
    and where the conclusion tips."""
    points = result.tipping_points[result.tipping_points["arm"] == arm]
    mar = str(points["at_mar"].iloc[0])
    lows, highs = result.tipping["delta"].min(), result.tipping["delta"].max()
    who = f"the {arm} arm" if result.shift == "intervention" else "every arm"
    scale = (f" For scale, the baseline score's standard deviation is {result.baseline_sd:.2f} points."
             if math.isfinite(result.baseline_sd) else "")
    states = {"positive": "positive (its 95% interval above zero)",
              "negative": "negative (its 95% interval below zero)",
              "inconclusive": "not shown to differ from zero (its 95% interval covers zero)"}
    state = states[mar]
    rows = result.comparison[(result.comparison["arm"] == arm)
                             & result.comparison["analysis"].str.startswith("complete case")]
    primary = conclusion(float(rows["ci_low"].iloc[0]), float(rows["ci_high"].iloc[0])) if len(rows) else mar
    agree = ("The complete-case (primary) estimate reaches the same conclusion. " if primary == mar else
             f"The complete-case (primary) estimate is {states[primary]}: with the missing scores imputed the "
             "conclusion differs, so it rests on the rows the complete-case fit leaves out. ")
    found = points.dropna(subset=["interpolated"])
    if found.empty:
        return agree + (f"Under missing at random the arm x time effect of {arm} is {state}, and it stays so for every "
                f"delta from {lows:g} to {highs:g} points: no shift of the imputed scores of {who} within the grid "
                f"changes the conclusion.{scale}")
    becomes = {"positive": "the effect would be shown positive (its interval above zero)",
               "negative": "the effect would be shown negative (its interval below zero)",
               "inconclusive": "the 95% interval would cover zero (no effect shown)"}
    parts = []
    for item in found.to_dict(orient="records"):
        direction = "lower" if item["interpolated"] < 0 else "higher"
        parts.append(f"a delta of about {item['interpolated']:.2f} points (on the grid first at "
                     f"{item['grid_delta']:g}): "
                     f"were the missing scores of {who} on average more than {abs(item['interpolated']):.2f} points "
                     f"{direction} than those imputed under missing at random, {becomes[item['becomes']]}")
    return (agree + f"Under missing at random the arm x time effect of {arm} is {state}. Tipping point: "
            + "; and ".join(parts) + f".{scale}")


def sensitivity_section(result: Sensitivity | None, reason: str | None = None) -> str:
    head = ('<section id="sensitivity" aria-labelledby="sensitivity-title">'
            f'<h2 id="sensitivity-title">{SENSITIVITY_TITLE}</h2>')
    if result is None:
        return head + f'<p class="not-estimated">Not computed: {html.escape(reason or "not asked for")}.</p></section>'
    outcome = result.outcome.replace("_", " ")
    who = ("the intervention arm(s), every arm but the reference arm " + result.reference
           if result.shift == "intervention" else "every arm")
    intro = (f"<p>Estimand: the primary arm x time effect on PERMA {html.escape(outcome)} (how much the difference "
             f"from {html.escape(result.reference)}, at a given baseline, changes per day since enrollment) among "
             "all randomized participants whose follow-up windows have closed, had every one of them answered every "
             "follow-up: the scores of those who missed a follow-up or withdrew belong to the estimand. Estimators: "
             "the complete-case mixed model (the primary analysis; valid if the missing scores are missing at random, "
             "MAR, given the baseline, the arm and the observed waves); multiple imputation by chained equations "
             f"({result.imputations} imputed data sets, predictive mean matching, Rubin's rules; also MAR); and a "
             "delta-adjusted tipping-point analysis for informative dropout (missing not at random): the imputed "
             f"scores of {html.escape(who)} shifted by delta points, the model refitted to each imputed data set and "
             "pooled again, delta over a grid.</p>")
    parts = [intro, _table(result.comparison, COMPARISON_COLS, "sensitivity-comparison",
                           "The primary estimate complete-case and by multiple imputation")]
    for arm in dict.fromkeys(result.tipping["arm"]):
        rows = result.tipping[result.tipping["arm"] == arm]
        parts.append(f'<p class="tipping-meaning" data-arm="{html.escape(str(arm))}">'
                     f"{html.escape(meaning(result, str(arm)))}</p>")
        parts.append(figure_html(tipping_plot(rows, result.tipping_point(str(arm)), f"tipping-{arm}",
                                              f"Tipping-point analysis of the {arm} arm"),
                                 "The arm x time effect per day with its 95% interval as the imputed scores are "
                                 "shifted by delta (zero: missing at random); dotted: the tipping point."))
    parts.append(_table(result.tipping, TIPPING_COLS, "sensitivity-tipping",
                        "Delta-adjusted multiple imputation: the primary estimate per delta"))
    parts.append(_table(result.imputed, IMPUTED_COLS, "sensitivity-imputed",
                        "Imputed scores by group and wave (in the imputation: every follow-up whose window closed)"))
    return head + "".join(parts) + _notes(result.notes) + "</section>"
