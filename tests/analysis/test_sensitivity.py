"""``analysis.sensitivity`` against its truths: at delta 0 the tipping-point analysis is the multiple
imputation estimate of ``perma_trajectories(impute="mice")``; on a study with a known dropout
mechanism the delta shift moves the arm x time estimate by exactly what the imputed shares give by
hand; the tipping point is where the table's interval crosses zero, found and interpolated by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.estimates import StudyData, perma_trajectories
from analysis.panel import PERMA
from analysis.sensitivity import Shift, meaning, sensitivity_analyses, sensitivity_section
from tests.analysis.estimates.drawn import Drawn, Truth, draw_study

TERM = "wellbeing vs control x day"
DAYS = 28.0 - 7.0  # the drawn study's two follow-ups


def _dropout(drawn: Drawn, seed: int) -> tuple[StudyData, pd.DataFrame]:
    """Everyone answered; then, a known mechanism: in the well-being arm the week-4 score is missing
    for those whose score fell most since week 1 (the arm's bottom 40%), informative dropout that
    the observed scores cannot predict; in the control arm a fifth of each wave at random. Returns
    the data and each follow-up row with whether it was removed."""
    rng = np.random.default_rng(seed)
    panel = drawn.data.panel.copy()
    follow_up = (panel["instrument_id"] == PERMA) & (panel["wave"] != "baseline")
    score = panel["perma_overall_wellbeing"].astype(float)
    week1 = score[follow_up & (panel["wave"] == "perma-week-1")].groupby(panel["participant_code"]).first()
    week4 = follow_up & (panel["wave"] == "perma-week-4") & (panel["arm"] == "wellbeing")
    change = score - panel["participant_code"].map(week1)
    worst = week4 & (change < change[week4].quantile(0.4))
    at_random = follow_up & (panel["arm"] == "control") & (rng.random(len(panel)) < 0.2)
    removed = worst | at_random
    panel.loc[removed, "perma_overall_wellbeing"] = np.nan
    panel.loc[removed, "response_status"] = "expired"
    return StudyData(panel=panel, conversations=drawn.data.conversations), panel[follow_up].assign(removed=removed)


def test_at_delta_zero_the_tipping_point_analysis_is_the_multiple_imputation_estimate() -> None:
    drawn = draw_study(seed=21, n=160, decisions=1)  # follow-ups missed more by those with a low baseline (MAR)
    primary = perma_trajectories(drawn.data)
    result = sensitivity_analyses(drawn.data, primary, imputations=3, deltas=(-1.0, 1.0), burn_in=5, seed=4)
    mi = perma_trajectories(drawn.data, impute="mice", imputations=3, burn_in=5, seed=4).effect(TERM)
    zero = result.tipping[result.tipping["delta"] == 0.0].iloc[0]
    for column in ("estimate", "se", "ci_low", "ci_high", "df", "p"):
        assert zero[column] == mi[column], column
    assert sorted(result.tipping["delta"]) == [-1.0, 0.0, 1.0]  # zero always in the grid

    # Beside it, the complete-case estimate is the primary fit's own row.
    rows = result.comparison.set_index("analysis")
    complete = primary.effect(TERM)
    cc = rows.loc["complete case (the primary analysis)"]
    assert (cc["estimate"], cc["ci_low"], cc["ci_high"]) == (complete["estimate"], complete["ci_low"],
                                                             complete["ci_high"])
    assert cc["imputed"] == 0
    imputed = rows.loc["multiple imputation, 3 data sets"]
    assert imputed["estimate"] == mi["estimate"]
    expired = (drawn.perma["response_status"] == "expired").sum()
    assert imputed["imputed"] == expired == result.imputed["imputed"].sum()
    assert imputed["observations"] == len(drawn.perma)


@pytest.mark.parametrize("shift", ["intervention", "both"])
def test_the_shift_moves_the_estimate_by_the_imputed_share_computed_by_hand(shift: Shift) -> None:
    drawn = draw_study(seed=22, n=240, truth=Truth(all_answered=True), decisions=1)
    complete = float(perma_trajectories(drawn.data).effect(TERM)["estimate"])  # before anything went missing
    data, rows = _dropout(drawn, seed=5)
    result = sensitivity_analyses(data, perma_trajectories(data), imputations=3, deltas=(-1.5, -0.5, 1.0),
                                  shift=shift, burn_in=5, seed=1)

    # By hand: with every participant at both waves (imputed where missing) the arm x day term is the
    # arm difference in each participant's week-4 minus week-1 score over 21 days; shifting the
    # imputed scores of an arm by delta moves that arm's mean change by delta x (its share imputed at
    # week 4 - its share imputed at week 1), in every imputed data set alike.
    share = {(str(r["arm"]), str(r["wave"])): float(r["removed"]) for r in
             rows.groupby(["arm", "wave"])["removed"].mean().reset_index().to_dict(orient="records")}
    moved = {arm: share[(arm, "perma-week-4")] - share[(arm, "perma-week-1")] for arm in ("wellbeing", "control")}
    per_point = (moved["wellbeing"] - (moved["control"] if shift == "both" else 0.0)) / DAYS
    estimate = dict(zip(result.tipping["delta"].to_numpy(float), result.tipping["estimate"].to_numpy(float),
                        strict=True))
    for delta in (-1.5, -0.5, 1.0):
        assert estimate[delta] - estimate[0.0] == pytest.approx(delta * per_point, rel=1e-6, abs=1e-10)
    counts = result.imputed.to_dict(orient="records")
    assert len(counts) == len(share) == 4
    for count in counts:
        key = (str(count["group"]), str(count["wave"]))
        assert count["share_imputed"] == pytest.approx(share[key])
        assert count["shifted"] == (count["imputed"] if shift == "both" or key[0] == "wellbeing" else 0)

    # The mechanism: those whose well-being fell most left the well-being arm at week 4, so under
    # missing at random its change looks better than it was, and the shift that corrects it is below zero.
    assert moved["wellbeing"] == pytest.approx(0.4, abs=0.01)
    assert estimate[0.0] > complete
    assert estimate[-1.5] < estimate[0.0]


def test_the_tipping_point_is_where_the_interval_crosses_zero() -> None:
    drawn = draw_study(seed=23, n=200, truth=Truth(all_answered=True, arm_per_wave=0.25), decisions=1)
    data, _ = _dropout(drawn, seed=6)
    grid = tuple(float(d) for d in np.arange(-6.0, 6.5, 1.5))
    result = sensitivity_analyses(data, perma_trajectories(data), imputations=3, deltas=grid, burn_in=5, seed=2)
    table = result.tipping.sort_values("delta")
    delta, low = table["delta"].to_numpy(float), table["ci_low"].to_numpy(float)
    said_at = [str(c) for c in table["conclusion"]]
    zero = int(np.flatnonzero(delta == 0.0)[0])
    assert said_at[zero] == "positive"  # the effect is found under missing at random
    # By hand: walk down from zero to the first delta whose interval reaches zero; interpolate the bound.
    below = next(i for i in range(zero - 1, -1, -1) if low[i] <= 0)
    d0, d1, b0, b1 = delta[below + 1], delta[below], low[below + 1], low[below]
    by_hand = d0 + (0 - b0) * (d1 - d0) / (b1 - b0)
    points = {str(r["direction"]): r for r in result.tipping_points.to_dict(orient="records")}
    assert points["below zero"]["grid_delta"] == d1
    assert points["below zero"]["becomes"] == said_at[below]
    assert points["below zero"]["interpolated"] == pytest.approx(by_hand, rel=1e-12)
    assert d1 < by_hand < d0
    assert result.tipping_point() == pytest.approx(by_hand, rel=1e-12)
    # Above zero the effect only grows: the conclusion never changes there.
    assert set(said_at[zero:]) == {"positive"}
    assert np.isnan(points["above zero"]["interpolated"])
    said = meaning(result, "wellbeing")
    complete_low = float(result.comparison["ci_low"].iloc[0])  # positive too, or not: said either way
    assert ("The complete-case (primary) estimate reaches the same conclusion." in said) == (complete_low > 0)
    assert f"a delta of about {by_hand:.2f} points" in said
    assert f"on average more than {abs(by_hand):.2f} points lower" in said
    page = sensitivity_section(result)
    assert page.index("Estimand:") < page.index("Estimators:")
    assert 'data-plot="tipping-wellbeing"' in page


def test_without_an_arm_x_time_term_it_says_why() -> None:
    drawn = draw_study(seed=24, n=60, truth=Truth(perma_waves=(("perma-week-4", 1, 28.0),)), decisions=1)
    with pytest.raises(ValueError, match="no arm x time term"):
        sensitivity_analyses(drawn.data, perma_trajectories(drawn.data))
    with pytest.raises(ValueError, match="the PERMA model was not estimated"):
        sensitivity_analyses(drawn.data, None)
    assert "Not computed: too early." in sensitivity_section(None, "too early")
