"""``analysis.estimates.prediction`` (immediate vs delayed): AUC and R² by hand, the bootstrap
from sums, and an uninformative and an informative exit rating."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.estimates import immediate_vs_delayed
from analysis.estimates.prediction import _auc, _Prediction, _r2
from tests.analysis.estimates.drawn import Truth, draw_study


def test_auc_and_r2_by_hand() -> None:
    positive = np.array([True, True, False, False, True])
    score = np.array([0.9, 0.4, 0.5, 0.1, 0.5])
    # Pairs (positive, negative): 0.9>0.5, 0.9>0.1, 0.4<0.5, 0.4>0.1, 0.5=0.5 (half), 0.5>0.1 -> 4.5 / 6.
    assert _auc(positive, score) == pytest.approx(4.5 / 6)
    # Deviations y: -1, 0, 1; predictions: -1/3, 1/6, 1/6: r = 0.5 / sqrt(2 * 1/6), r² = 0.75.
    y, predicted = np.array([1.0, 2.0, 3.0]), np.array([1.5, 2.0, 2.0])
    assert _r2(y, predicted) == pytest.approx(0.75)
    assert _r2(y, predicted[::-1]) == pytest.approx(-0.75)  # pointing the wrong way


def test_a_bootstrap_replicate_scored_from_sums_equals_least_squares_on_the_duplicated_rows() -> None:
    """The bootstrap weights each participant by the times drawn and fits each fold from the other
    folds' sums of squares; by hand: duplicate the rows, least squares of the base (intercept, arm)
    and of base + features, then the within-arm R² of what the features add against what the base
    leaves, the AUC of that addition for the outcome above its arm's median, and the arm's own R²."""
    rng = np.random.default_rng(5)
    person = np.repeat(np.arange(30), rng.integers(1, 4, 30))
    arm = (np.arange(30) % 2)[person].astype(float)
    x = np.round(rng.normal(size=(len(person), 2)), 1)
    y = x @ np.array([1.0, -0.5]) + 2.0 * arm + rng.normal(size=len(person))
    positive = y > np.median(y)
    within = y > np.where(arm == 1, np.median(y[arm == 1]), np.median(y[arm == 0]))
    base = np.column_stack([np.ones(len(y)), arm])
    designs = {"base": base, "arm": base, "exit_rating": np.column_stack([base, x[:, :1]]),
               "features": np.column_stack([base, x])}
    prediction = _Prediction.build(y, positive, within, designs, person)
    times = np.bincount(rng.integers(0, 30, 30), minlength=30)
    fold = np.where(times > 0, rng.integers(0, 3, 30), -1)
    scores = prediction.scores(times, fold, 3)

    rows = np.concatenate([np.flatnonzero(person == p) for p in range(30) for _ in range(times[p])])
    row_fold = fold[person[rows]]
    r2, auc, r2_arm, sizes = [], [], [], []
    for f in range(3):
        train, test = rows[row_fold != f], rows[row_fold == f]
        fitted = {name: d[test] @ np.linalg.lstsq(d[train], y[train], rcond=None)[0] for name, d in designs.items()}
        r2.append(_r2(y[test] - fitted["base"], fitted["features"] - fitted["base"]))
        auc.append(_auc(within[test], fitted["features"] - fitted["base"]))
        r2_arm.append(_r2(y[test], fitted["arm"]))
        sizes.append(len(test))
    assert scores["r2_features"] == pytest.approx(np.average(r2, weights=sizes), rel=1e-8)
    assert scores["auc_features"] == pytest.approx(np.average(auc, weights=sizes), rel=1e-9)
    assert scores["r2_arm"] == pytest.approx(np.average(r2_arm, weights=sizes), rel=1e-8)
    # Weights are duplicated rows for the two scores as well.
    weights = rng.integers(1, 4, len(y))
    copies = np.repeat(np.arange(len(y)), weights)
    assert _auc(positive, x[:, 0], weights.astype(float)) == pytest.approx(_auc(positive[copies],
                                                                                             x[copies, 0]))
    assert _r2(y, x[:, 0], weights.astype(float)) == pytest.approx(_r2(y[copies], x[copies, 0]))


def test_features_are_compared_within_arm_and_the_arm_is_reported_apart() -> None:
    """PERMA depends on the arm (0.4 per follow-up) and on no feature; the agree share and the
    affirmation rate differ between arms. Within arm the features then carry no information about
    PERMA change (the interval covers 0) while the arm's own R² is above 0; regret depends on the
    coach role and the agree share within arm, which the features carry."""
    drawn = draw_study(seed=21, n=300, truth=Truth(exit_rating="noise"))
    fit = immediate_vs_delayed(drawn.data, n_boot=200, seed=1)
    for outcome in ("regret", "perma_change"):
        r2, auc = fit.row(outcome, "r2"), fit.row(outcome, "auc")
        assert r2["exit_rating_low"] <= 0 <= r2["exit_rating_high"], outcome
        assert auc["exit_rating_low"] <= 0.5 <= auc["exit_rating_high"], outcome
        assert r2["participants"] <= 300
        assert r2["replicates"] == 200
        assert "wellbeing_mode" not in r2["features_used"]
    assert fit.row("regret", "r2")["features_low"] > 0  # the features carry information within arm
    assert fit.row("regret", "r2")["difference_low"] > 0
    perma = fit.row("perma_change", "r2")
    assert perma["features_low"] <= 0 <= perma["features_high"]  # the arm does not stand in
    assert perma["arm_low"] > 0  # the arm, reported on its own
    assert fit.samples["regret"].observations == fit.row("regret", "r2")["observations"]
    with pytest.raises(ValueError, match="wellbeing_mode is the randomized arm"):
        immediate_vs_delayed(drawn.data, perma_features=("wellbeing_mode", "role"), n_boot=10)


def test_an_informative_exit_rating_is_seen() -> None:
    drawn = draw_study(seed=22, n=200, truth=Truth(exit_rating="regret"))
    fit = immediate_vs_delayed(drawn.data, n_boot=100, seed=1)
    r2, auc = fit.row("regret", "r2"), fit.row("regret", "auc")
    assert r2["exit_rating_low"] > 0.3
    assert auc["exit_rating_low"] > 0.7
    assert r2["exit_rating_low"] <= r2["exit_rating"] <= r2["exit_rating_high"]
    again = immediate_vs_delayed(drawn.data, n_boot=100, seed=1)
    pd.testing.assert_frame_equal(again.table, fit.table)  # seeded
    fewer = immediate_vs_delayed(drawn.data, n_boot=10, seed=1)  # the estimates do not depend on the bootstrap
    pd.testing.assert_frame_equal(fewer.table[["exit_rating", "features"]], fit.table[["exit_rating", "features"]])
