"""How well the immediate exit rating predicts the delayed outcomes (regret, PERMA change), next
to the well-being-mode features: cross-validated R² and AUC with participant-bootstrap intervals
(the headline table)."""

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
    floats,
    perma_rows,
    roles_of,
    sample_of,
)
from analysis.estimates.regret import regret_frame, resolve_features

# The same features over the conversations before a wave, plus the arm's mode, for PERMA change.
PERMA_CHANGE_FEATURES = ("wellbeing_mode", "role", *REGRET_FEATURES[1:])


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
    regret_rows, _, _, regret_columns = regret_frame(data, regret_features, focal_role, extra=("exit_rating",))
    perma = perma_change_outcomes(data, focal_role)
    perma_columns = resolve_features(perma_features, focal_role)
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
        samples[outcome] = sample_of(rows, used, rows[y_column].notna())
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
