"""How well the immediate exit rating predicts the delayed outcomes (regret, PERMA change) within
arm, next to the conversation features (the arm excluded, and reported on its own): cross-validated
R² and AUC with participant-bootstrap intervals (the headline table)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.estimates.common import (
    COMPLETE_CASE,
    OBSERVABLE,
    REGRET_FEATURES,
    Sample,
    StudyData,
    arm_adjustment,
    floats,
    perma_rows,
    pick_reference_arm,
    roles_of,
    sample_of,
)
from analysis.estimates.regret import regret_frame, resolve_features

# The same features over the conversations before a wave, for PERMA change. Never the arm: the
# comparison is within arm, and the arm is reported on its own.
PERMA_CHANGE_FEATURES = REGRET_FEATURES


def _wave_features(rows: pd.DataFrame, focal_role: str) -> pd.DataFrame:
    """A PERMA wave's conversation features (the panel's conv_* columns, cumulative before the
    wave) under the conversation-feature names, with the arm's mode and the first role."""
    assistant = floats(rows["conv_assistant_turns"])
    return pd.DataFrame({
        "exit_rating": floats(rows["conv_mean_exit_rating"]),
        "wellbeing_mode": (rows["mode"].astype(str) == "wellbeing").astype(float),
        f"role_{focal_role}": (roles_of(rows) == focal_role).astype(float),
        "agree_share": floats(rows["conv_agree_turns"]) / assistant.where(assistant > 0),
        "pushback_rate": floats(rows["conv_pushback_rate"]),
        "overrides": floats(rows["conv_overrides"]),
        "affirmation_per_100_words": floats(rows["conv_affirmation_per_100_words"]),
        "sentiment_change": floats(rows["conv_mean_sentiment_change"]),
        "reassurance_seeking_turns": floats(rows["conv_reassurance_seeking_turns"]),
    }, index=rows.index)


def perma_change_outcomes(data: StudyData, focal_role: str = "coach") -> pd.DataFrame:
    """One row per enrollment-anchored PERMA follow-up: ``perma_change`` (overall well-being at the
    wave minus at baseline) and the features of the conversations before the wave."""
    rows, _, _ = perma_rows(data.panel)
    rows["perma_change"] = floats(rows["perma_overall_wellbeing"]) - floats(rows["baseline_perma_overall_wellbeing"])
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
    positive: np.ndarray  # the outcome above its median
    positive_within: np.ndarray  # the outcome above its arm x wave cell's median
    designs: dict[str, np.ndarray]  # base (the adjustment), arm, exit_rating (base + rating), features (base + them)
    person: np.ndarray  # participant index per row, 0..P-1
    people: int

    @classmethod
    def build(cls, y: np.ndarray, positive: np.ndarray, positive_within: np.ndarray, designs: dict[str, np.ndarray],
              person: np.ndarray) -> _Prediction:
        return cls(y, positive, positive_within, designs, person, int(person.max()) + 1)

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
        worse than useless.

        The exit rating and the features are scored within arm: what their prediction adds to the
        base design's (arm, wave, arm x wave, baseline; fitted on the same folds) against what the
        base leaves of the outcome, and for the AUC against the outcome above its arm x wave cell's
        median. The arm is scored as it is: its predictions against the outcome."""
        member = np.where(fold[None, :] == np.arange(folds)[:, None], times[None, :], 0).astype(float)  # fold x person
        rows = np.flatnonzero(times[self.person] > 0)
        row_fold = fold[self.person[rows]]
        by_fold = np.argsort(row_fold, kind="stable")
        rows, row_fold = rows[by_fold], row_fold[by_fold]
        bounds = np.searchsorted(row_fold, np.arange(folds + 1))
        parts = [slice(bounds[f], bounds[f + 1]) for f in range(folds)]
        y, weights = self.y[rows], times[self.person[rows]].astype(float)
        sizes = np.array([weights[part].sum() for part in parts])
        predicted: dict[str, np.ndarray] = {}
        for name, design in self.designs.items():
            cross, moment = sums[name]
            k = design.shape[1]
            # einsum, not BLAS: on a busy machine OpenBLAS's threads make these small products 20x slower.
            fold_cross, fold_moment = np.einsum("fp,pk->fk", member, cross), np.einsum("fp,pk->fk", member, moment)
            train_cross = (fold_cross.sum(axis=0) - fold_cross).reshape(folds, k, k)
            train_moment = fold_moment.sum(axis=0) - fold_moment
            beta = np.stack([np.linalg.lstsq(train_cross[f], train_moment[f], rcond=None)[0] for f in range(folds)])
            predicted[name] = np.einsum("ij,ij->i", design[rows], beta[row_fold])
        # Rounded so that rows with the same design tie exactly (float noise must not order them).
        scored = {"arm": (y, np.round(predicted["arm"], 9), self.positive[rows])}
        for name in ("exit_rating", "features"):
            scored[name] = (y - predicted["base"], np.round(predicted[name] - predicted["base"], 9),
                            self.positive_within[rows])
        out = {}
        for name, (target, score, positive) in scored.items():
            r2, auc = [], []
            for part in parts:
                empty = part.start == part.stop
                r2.append(math.nan if empty else _r2(target[part], score[part], weights[part]))
                auc.append(math.nan if empty else _auc(positive[part], score[part], weights[part]))
            out[f"r2_{name}"], out[f"auc_{name}"] = _weighted(r2, sizes), _weighted(auc, sizes)
        return out


def _weighted(values: list[float], weights: np.ndarray) -> float:
    array = np.array(values)
    known = ~np.isnan(array)
    return float(np.average(array[known], weights=weights[known])) if known.any() else math.nan


@dataclass(frozen=True)
class ImmediateVsDelayed:
    """How well the immediate rating predicts the life afterwards within arm, next to the
    conversation features (the arm excluded), with the arm reported on its own: the headline table.
    ``table``: one row per outcome (``regret``, ``perma_change``) and metric (``r2``, ``auc``): the exit
    rating's value and 95% interval, the features', their difference (features minus exit rating)
    and its interval, the arm's (``arm``: how well the randomized arm alone predicts the outcome), the
    no-information value (0 for R², 0.5 for AUC), observations and participants. ``bootstrap``: every
    replicate (for plots)."""

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
                         reference_arm: str | None = None, high_regret: float | None = None, folds: int = 5,
                         n_boot: int = 500, seed: int = 0) -> ImmediateVsDelayed:
    """Out-of-sample R² and AUC, within arm, of two linear predictors of each delayed outcome: the
    exit rating alone, and the conversation features (never the arm); and of the arm alone; with
    participant-bootstrap 95% intervals.

    Estimand (exit rating and features): how much of the outcome's variation between rows of the
    same arm (and wave and baseline score) the predictor explains out of sample. The base design
    holds the randomized arm fixed: for regret the arm and the regret wave; for PERMA change the
    baseline score, the wave, the arm and arm x wave. Each predictor's model is the base plus the
    predictor; R² = the signed squared correlation of what the predictor adds to the base's
    out-of-fold prediction with what the base leaves of the outcome (0 without information within
    arm, whatever the arm does); AUC = that addition's AUC for the outcome above the median of its
    arm x wave cell (0.5 without information). So a feature that only stands in for the arm scores
    nothing. Estimand (arm): R² and AUC of the arm (x wave) model's own out-of-fold predictions of
    the outcome (the arm's effect as a predictor, reported separately).

    Outcomes: each decision's regret (from its conversation's exit rating or features), and each
    PERMA follow-up's change in overall well-being from baseline (from the mean exit rating of the
    conversations before the wave, or their features); every predictor is scored on the same rows.

    Cross-validated, so a predictor with more terms gains nothing by chance: folds of participants
    (``folds``), OLS fitted on the others, scored within each held-out fold and averaged (weighted
    by the folds' sizes). AUC outcome: regret above its median (or at least ``high_regret``), PERMA
    change above its median. Intervals: percentile bootstrap over participants (``n_boot``
    replicates, the whole cross-validation redone in each, duplicates of a participant kept in one
    fold), seeded by ``seed``.
    """
    if folds < 2:
        raise ValueError("folds must be at least 2")
    arm_like = [f for f in [*regret_features, *perma_features] if f == "wellbeing_mode"]
    if arm_like:
        raise ValueError("wellbeing_mode is the randomized arm: the headline compares the exit rating with the "
                         "conversation features within arm and reports the arm on its own, so it is no feature")
    rows_out, boots, samples = [], [], {}
    notes = ["The exit rating and the features are compared within arm: both are scored on what they add, out of "
             "fold, to a model of the arm (regret: arm and regret wave; PERMA change: arm x wave and the baseline "
             "score), so a feature that differs between arms cannot stand in for the arm. The arm's own R² and AUC "
             "are reported beside them.",
             "R² (signed squared correlation) and AUC are of out-of-fold predictions (OLS, folds of participants), so "
             "the larger feature set is not favoured by chance; intervals are percentile bootstraps over participants.",
             COMPLETE_CASE]
    reference = pick_reference_arm(data.panel, reference_arm)
    regret_rows, _, _, regret_columns = regret_frame(data, regret_features, focal_role, extra=("exit_rating",))
    perma = perma_change_outcomes(data, focal_role)
    perma_columns = resolve_features(perma_features, focal_role)
    unknown = [c for c in perma_columns if c not in perma.columns]
    if unknown:
        raise ValueError(f"unknown PERMA-change feature(s) {', '.join(unknown)}")
    outcomes = (("regret", regret_rows, "regret", regret_columns, None),
                ("perma_change", perma, "perma_change", perma_columns, "baseline_perma_overall_wellbeing"))
    for index, (outcome, rows, y_column, columns, baseline) in enumerate(outcomes):
        # A stream per outcome: its estimate does not depend on the other outcome or on n_boot.
        rng = np.random.default_rng([seed, index])
        rows = rows.sort_values(["participant_code", "wave"], kind="stable")
        eligible = rows["response_status"].astype(str).isin(OBSERVABLE)
        needed = [y_column, "exit_rating", *columns, *([baseline] if baseline else [])]
        used = eligible & rows[needed].notna().all(axis=1) & rows["arm"].notna()
        samples[outcome] = sample_of(rows, used, rows[y_column].notna())
        frame = rows[used]
        if frame["participant_code"].nunique() < folds:
            notes.append(f"{outcome}: fewer participants than folds; not estimated.")
            continue
        y = frame[y_column].to_numpy(float)
        cell = frame["arm"].astype(str) + "/" + frame["wave"].astype(str)
        within_median = frame[y_column].astype(float).groupby(cell).transform("median").to_numpy(float)
        if outcome == "regret" and high_regret is not None:
            positive, definition = y >= high_regret, f"regret >= {high_regret:g}"
        else:
            median = float(np.median(y))
            positive, definition = y > median, f"{y_column} above its median ({median:g})"
        base = arm_adjustment(frame, reference, by_wave=outcome == "perma_change", baseline=baseline)
        arm = arm_adjustment(frame, reference, by_wave=outcome == "perma_change")
        people, person = np.unique(frame["participant_code"].astype(str).to_numpy(), return_inverse=True)
        prediction = _Prediction.build(y, positive, y > within_median, {
            "base": base.to_numpy(float), "arm": arm.to_numpy(float),
            "exit_rating": np.hstack([base.to_numpy(float), frame[["exit_rating"]].to_numpy(float)]),
            "features": np.hstack([base.to_numpy(float), frame[columns].to_numpy(float)])}, person)
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
                                   "definition": (f"{definition}; within arm: above its arm x wave cell's median"
                                                  if metric == "auc" else "signed squared correlation of "
                                                  "out-of-fold predictions with the outcome (within arm for the "
                                                  "exit rating and the features)")}
            for name, value in (("exit_rating", estimate[a]), ("features", estimate[f]),
                                ("difference", estimate[f] - estimate[a]), ("arm", estimate[f"{metric}_arm"])):
                low, high = np.nanpercentile(boot[f"{metric}_{name}"], [2.5, 97.5])
                row.update({name: value, f"{name}_low": float(low), f"{name}_high": float(high)})
            row.update({"observations": len(y), "participants": len(people), "replicates": len(boot),
                        "features_used": ", ".join(columns),
                        "adjusted_for": ", ".join(c for c in base.columns if c != "Intercept")})
            rows_out.append(row)
        boots.append(boot.assign(outcome=outcome))
    return ImmediateVsDelayed(pd.DataFrame(rows_out), pd.concat(boots, ignore_index=True) if boots
                              else pd.DataFrame(), samples, notes)
