"""``analysis.estimates.screen``: direct p-values and their Benjamini-Hochberg adjustment."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from analysis.estimates import feature_screen
from tests.analysis.estimates.drawn import draw_study
from tests.analysis.robust_truth import direct_cr2


def test_the_feature_screen_reports_direct_p_values_and_their_benjamini_hochberg_adjustment() -> None:
    drawn = draw_study(seed=6, n=100)
    features = ["agree_share", "role_coach", "overrides", "exit_rating", "sentiment_change", "pushback_rate"]
    screen = feature_screen(drawn.data, regret_features=features,
                            perma_features=["conv_mean_exit_rating", "agree_share", "wellbeing_mode"])
    table = drawn.decisions[drawn.decisions["response_status"] == "completed"]
    raw: dict[str, float] = {}
    for feature in features:
        design = pd.DataFrame({"Intercept": 1.0, feature: table[feature]})
        truth = direct_cr2(table["regret"], design, table["participant_code"]).loc[feature].to_dict()
        raw[feature] = truth["p"]
        row = screen.table[(screen.table["outcome"] == "regret") & (screen.table["feature"] == feature)].iloc[0]
        assert row["estimate"] == pytest.approx(truth["estimate"], rel=1e-10)
        assert row["se"] == pytest.approx(truth["se"], rel=1e-9)
        assert row["estimate_per_sd"] == pytest.approx(truth["estimate"] * table[feature].std(), rel=1e-10)
    regret_rows = screen.table[screen.table["outcome"] == "regret"].set_index("feature")
    np.testing.assert_allclose(regret_rows.loc[features, "p"], [raw[f] for f in features], rtol=1e-8)
    adjusted = multipletests([raw[f] for f in features], alpha=0.05, method="fdr_bh")
    np.testing.assert_allclose(regret_rows.loc[features, "p_bh"], adjusted[1], rtol=1e-10)
    assert list(regret_rows.loc[features, "significant_bh"]) == list(adjusted[0])
    assert regret_rows.loc["role_coach", "significant_bh"]  # a true effect survives the adjustment

    change = drawn.perma[drawn.perma["response_status"] == "completed"]
    change = change.assign(perma_change=change["y"] - change["baseline"])
    used = change["conv_mean_exit_rating"].notna()
    design = pd.DataFrame({"Intercept": 1.0, "x": change.loc[used, "conv_mean_exit_rating"]})
    direct = direct_cr2(change.loc[used, "perma_change"], design, change.loc[used, "participant_code"])
    row = screen.table[(screen.table["outcome"] == "perma_change")
                       & (screen.table["feature"] == "conv_mean_exit_rating")].iloc[0]
    assert row["p"] == pytest.approx(direct.loc["x", "p"], rel=1e-8)
    assert row["observations"] == used.sum()
