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
_CHUNK = 65_536  # rows whose products are summed at a time when the participants' sums are built
_SCORED = ("arm", "exit_rating", "features")  # the predictors scored (``base`` is what they are scored beyond)


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
    return _auc_of_counts(score, np.where(positive, weights, 0.0), np.where(positive, 0.0, weights))


def _auc_of_counts(score: np.ndarray, positives: np.ndarray, negatives: np.ndarray) -> float:
    """:func:`_auc` of groups of rows that share a score: each group's ``score`` and the weight of
    its positive and its negative rows (groups with equal scores tie)."""
    w1, w0 = float(positives.sum()), float(negatives.sum())
    if w1 == 0 or w0 == 0:
        return math.nan
    levels, level = np.unique(score, return_inverse=True)
    above = np.bincount(level, weights=positives, minlength=len(levels))
    below = np.bincount(level, weights=negatives, minlength=len(levels))
    negatives_lower = np.cumsum(below) - below
    return float((above * (negatives_lower + below / 2)).sum() / (w1 * w0))


def _r2(y: np.ndarray, predicted: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The share of the outcome's variance the held-out predictions explain: their squared
    correlation with the outcome, negative when they point the wrong way. (1 - SSE/SST of held-out
    predictions is not used: without information its expected value is below 0, so no interval
    would cover the no-information value 0.) ``weights`` as in :func:`_auc`. Computed from the
    weighted sums of products, as the bootstrap computes it (:func:`_r2_of_sums`)."""
    weights = np.ones(len(y)) if weights is None else weights
    columns = np.column_stack([np.ones(len(y)), y, predicted])
    return _r2_of_sums((columns * weights[:, None]).T @ columns, 0, np.array([0.0, 1.0, 0.0]),
                       np.array([0.0, 0.0, 1.0]))


def _r2_of_sums(sums: np.ndarray, one: int, target: np.ndarray, score: np.ndarray) -> float:
    """:func:`_r2` of rows' ``columns @ target`` (the outcome) and ``columns @ score`` (the
    predictions), from the rows' weighted sums of the columns' products (``sums``, d x d; ``one``:
    the column of ones): no pass over the rows."""
    n = sums[one, one]
    t_total, s_total = sums[one] @ target, sums[one] @ score
    tt, ss, ts = target @ sums @ target, score @ sums @ score, target @ sums @ score
    syy, spp = tt - t_total * t_total / n, ss - s_total * s_total / n
    if syy <= 1e-12 * tt or spp <= 1e-12 * max(ss, 1e-300):
        return math.nan
    r = (ts - t_total * s_total / n) / math.sqrt(syy * spp)
    return math.copysign(r * r, r)


@dataclass(frozen=True)
class _Prediction:
    """One outcome's rows for the comparison, as arrays. The outcome, a column of ones and every
    design's columns are the columns of one matrix (``columns``: each distinct column once), and
    ``gram`` holds each participant's sums of their products (the upper triangle of the columns'
    cross-products, summed over the participant's rows). A fold's OLS fit is then a small solve of
    the other folds' sums, and a fold's R² a few quadratic forms of its own sums (a bootstrap replicate
    weights each participant by the times drawn): the same figures as least squares and correlations
    on the duplicated rows, with no pass over the rows but the AUC's."""

    columns: np.ndarray  # rows x distinct columns
    where: dict[str, np.ndarray]  # each design's columns (base, arm, exit_rating, features) in ``columns``
    y: int  # the outcome's column
    one: int  # the column of ones
    gram: np.ndarray  # participants x the upper triangle of the columns' products
    positive: np.ndarray  # the outcome above its median
    positive_within: np.ndarray  # the outcome above its arm x wave cell's median
    person: np.ndarray  # participant index per row, 0..P-1, rows grouped by participant
    people: int
    # Per scored predictor whose rows take few distinct values (the arm's cells, a rating within
    # them): the columns its score uses, their distinct rows and each row's; its AUC then sorts those
    # few values, not the rows.
    distinct: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]

    @classmethod
    def build(cls, y: np.ndarray, positive: np.ndarray, positive_within: np.ndarray, designs: dict[str, np.ndarray],
              person: np.ndarray) -> _Prediction:
        if np.any(np.diff(person) < 0):
            raise ValueError("the rows must be grouped by participant, in order")
        stacked = np.column_stack([np.ones(len(y)), y, *designs.values()])
        _, first, inverse = np.unique(stacked, axis=1, return_index=True, return_inverse=True)
        order = np.argsort(first)  # the distinct columns in the order first seen
        index = np.argsort(order)[np.asarray(inverse).ravel()]
        columns = np.ascontiguousarray(stacked[:, first[order]])
        where, start = {}, 2
        for name, design in designs.items():
            where[name] = index[start:start + design.shape[1]]
            start += design.shape[1]
        people = int(person[-1]) + 1
        upper = np.triu_indices(columns.shape[1])
        gram = np.zeros((people, len(upper[0])))
        for chunk in range(0, len(y), _CHUNK):  # a chunk's products at a time: bounded memory
            part, owners = columns[chunk:chunk + _CHUNK], person[chunk:chunk + _CHUNK]
            heads = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
            gram[owners[heads]] += np.add.reduceat(part[:, upper[0]] * part[:, upper[1]], heads, axis=0)
        distinct = {}
        for name in _SCORED:
            used = np.unique(np.concatenate([where[name], where["base"]]) if name != "arm" else where[name])
            # At most the product of each column's distinct values: a continuous column among them
            # (most rows distinct) is not worth it, and is seen without sorting the rows.
            if np.prod([len(np.unique(columns[:, c])) for c in used], dtype=float) * 8 <= len(y):
                values, row_value = np.unique(columns[:, used], axis=0, return_inverse=True)
                distinct[name] = (used, values, np.asarray(row_value).ravel())
        return cls(columns, where, int(index[1]), int(index[0]), gram, positive, positive_within, person, people,
                    distinct)

    def _square(self, packed: np.ndarray) -> np.ndarray:
        """Sums in the upper-triangle layout of ``gram`` (..., m) as symmetric matrices (..., d, d)."""
        d = self.columns.shape[1]
        upper = np.triu_indices(d)
        square = np.zeros((*packed.shape[:-1], d, d))
        square[..., upper[0], upper[1]] = packed
        square[..., upper[1], upper[0]] = packed
        return square

    def scores(self, times: np.ndarray, fold: np.ndarray, folds: int) -> dict[str, float]:
        """R² and AUC within each held-out fold, averaged with the folds' sizes as weights.
        ``times``: how often each participant counts (0 = not drawn); ``fold``: each participant's
        fold. Within a fold, because the intercept fitted on the other folds moves against the
        held-out fold's own mean: pooled over folds that alone makes a useless predictor look
        worse than useless.

        The exit rating and the features are scored within arm: what their prediction adds to the
        base design's (arm, wave, arm x wave, baseline; fitted on the same folds) against what the
        base leaves of the outcome, and for the AUC against the outcome above its arm x wave cell's
        median. The arm is scored as it is: its predictions against the outcome. Each is a linear
        combination of ``columns``: the score's coefficients (``score``) and the target's
        (``target``), per fold."""
        member = np.where(fold[None, :] == np.arange(folds)[:, None], times[None, :], 0).astype(float)  # fold x person
        held_out = self._square(member @ self.gram)  # fold x d x d, each fold's own sums
        trained = held_out.sum(axis=0) - held_out  # the other folds'
        d = self.columns.shape[1]
        beta = {}
        for name, cols in self.where.items():
            beta[name] = np.zeros((folds, d))
            for f in range(folds):
                beta[name][f, cols] = np.linalg.lstsq(trained[f][np.ix_(cols, cols)], trained[f][cols, self.y],
                                                      rcond=None)[0]
        outcome = np.zeros(d)
        outcome[self.y] = 1.0
        target = {"arm": np.broadcast_to(outcome, (folds, d))}
        score = {"arm": beta["arm"]}
        for name in ("exit_rating", "features"):
            target[name], score[name] = outcome - beta["base"], beta[name] - beta["base"]
        sizes = held_out[:, self.one, self.one]

        rows = np.flatnonzero(times[self.person] > 0)
        row_fold = fold[self.person[rows]]
        by_fold = np.argsort(row_fold.astype(np.int8), kind="stable")
        rows, row_fold = rows[by_fold], row_fold[by_fold]
        bounds = np.searchsorted(row_fold, np.arange(folds + 1))
        weights = times[self.person[rows]].astype(float)
        names = _SCORED
        by_row = [name for name in names if name not in self.distinct]  # scored row by row for the AUC
        drawn = self.columns[rows] if by_row else None
        r2: dict[str, list[float]] = {name: [] for name in names}
        auc: dict[str, list[float]] = {name: [] for name in names}
        for f in range(folds):
            part = slice(bounds[f], bounds[f + 1])
            if part.start == part.stop:
                for name in names:
                    r2[name].append(math.nan)
                    auc[name].append(math.nan)
                continue
            for name in names:
                r2[name].append(_r2_of_sums(held_out[f], self.one, target[name][f], score[name][f]))
                positive = (self.positive if name == "arm" else self.positive_within)[rows[part]]
                # Scores rounded so that rows with the same design tie exactly (float noise must not order them).
                if name in self.distinct:
                    used, values, row_value = self.distinct[name]
                    which = row_value[rows[part]]
                    auc[name].append(_auc_of_counts(
                        np.round(values @ score[name][f][used], 9),
                        np.bincount(which, weights=np.where(positive, weights[part], 0.0), minlength=len(values)),
                        np.bincount(which, weights=np.where(positive, 0.0, weights[part]), minlength=len(values))))
                else:
                    assert drawn is not None
                    auc[name].append(_auc(positive, np.round(drawn[part] @ score[name][f], 9), weights[part]))
        out = {}
        for name in names:
            out[f"r2_{name}"], out[f"auc_{name}"] = _weighted(r2[name], sizes), _weighted(auc[name], sizes)
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

        def fold_of(unique_count: int, rng: np.random.Generator = rng) -> np.ndarray:
            return rng.permutation(np.arange(unique_count) % folds)

        everyone = np.ones(len(people), dtype=np.int64)
        estimate = prediction.scores(everyone, fold_of(len(people)), folds)  # the first draw of the stream
        replicates = []
        for b in range(n_boot):
            times = np.bincount(rng.integers(0, len(people), len(people)), minlength=len(people))
            drawn = np.flatnonzero(times)
            if len(drawn) < folds:
                continue
            fold = np.full(len(people), -1)
            fold[drawn] = fold_of(len(drawn))
            replicates.append({"replicate": b, **prediction.scores(times, fold, folds)})
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
