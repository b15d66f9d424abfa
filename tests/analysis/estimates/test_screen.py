"""``analysis.estimates.screen``: each feature within arm against direct CR2 fits, the
Benjamini-Hochberg adjustment, and a feature effect within arm recovered without the arm standing in."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from analysis.estimates import StudyData, feature_screen
from tests.analysis.estimates.drawn import covers, draw_study, pick
from tests.analysis.robust_truth import direct_cr2


def test_the_feature_screen_is_a_direct_fit_within_arm_with_benjamini_hochberg() -> None:
    drawn = draw_study(seed=6, n=100)
    features = ["agree_share", "role_coach", "overrides", "exit_rating", "sentiment_change", "pushback_rate"]
    screen = feature_screen(drawn.data, regret_features=features,
                            perma_features=["conv_mean_exit_rating", "agree_share"])
    table = drawn.decisions[drawn.decisions["response_status"] == "completed"].merge(
        drawn.people[["participant_code", "wellbeing"]], on="participant_code")
    raw: dict[str, float] = {}
    for feature in features:  # regret on the feature, the regret wave and the arm
        design = pd.DataFrame({"Intercept": 1.0, "day14": (table["wave"] == "regret-day-14").astype(float),
                               "arm": table["wellbeing"], feature: table[feature]})
        truth = direct_cr2(table["regret"], design, table["participant_code"]).loc[feature].to_dict()
        raw[feature] = truth["p"]
        row = pick(screen.table, outcome="regret", feature=feature)
        assert row["estimate"] == pytest.approx(truth["estimate"], rel=1e-9)
        assert row["se"] == pytest.approx(truth["se"], rel=1e-8)
        assert row["df"] == pytest.approx(truth["df"], rel=1e-8)
        assert row["estimate_per_sd"] == pytest.approx(truth["estimate"] * table[feature].std(), rel=1e-9)
    regret_rows = screen.table[screen.table["outcome"] == "regret"].set_index("feature")
    np.testing.assert_allclose(regret_rows.loc[features, "p"], [raw[f] for f in features], rtol=1e-7)
    adjusted = multipletests([raw[f] for f in features], alpha=0.05, method="fdr_bh")
    np.testing.assert_allclose(regret_rows.loc[features, "p_bh"], adjusted[1], rtol=1e-9)
    assert list(regret_rows.loc[features, "significant_bh"]) == list(adjusted[0])
    assert regret_rows.loc["role_coach", "significant_bh"]  # a true effect survives the adjustment

    # PERMA change on the feature, baseline, wave, arm and arm x wave.
    change = drawn.perma[drawn.perma["response_status"] == "completed"]
    change = change.assign(perma_change=change["y"] - change["baseline"])
    used = change["conv_mean_exit_rating"].notna()
    part = change[used]
    week4 = (part["wave_number"] == 2).astype(float)
    design = pd.DataFrame({"Intercept": 1.0, "baseline": part["baseline"], "week4": week4, "arm": part["wellbeing"],
                           "arm_week4": part["wellbeing"] * week4, "x": part["conv_mean_exit_rating"]})
    direct = direct_cr2(part["perma_change"], design, part["participant_code"])
    row = pick(screen.table, outcome="perma_change", feature="conv_mean_exit_rating")
    assert row["estimate"] == pytest.approx(direct.loc["x", "estimate"], rel=1e-9)
    assert row["p"] == pytest.approx(direct.loc["x", "p"], rel=1e-7)
    assert row["observations"] == used.sum()


def test_the_arm_is_adjusted_for_not_screened() -> None:
    drawn = draw_study(seed=6, n=60)
    with pytest.raises(ValueError, match="wellbeing_mode is the randomized arm"):
        feature_screen(drawn.data, perma_features=["wellbeing_mode"])
    # A feature that is the arm under another name does not vary within arm: skipped, with the reason.
    panel = drawn.data.panel.assign(conv_arm_copy=(drawn.data.panel["arm"] == "wellbeing").astype(float))
    screen = feature_screen(StudyData(panel=panel, conversations=drawn.data.conversations),
                            regret_features=["agree_share"], perma_features=["conv_arm_copy", "agree_share"])
    assert pick(screen.skipped, feature="conv_arm_copy")["reason"] == "does not vary within arm"


def test_a_feature_effect_within_arm_is_recovered_and_the_arm_does_not_stand_in() -> None:
    """An arm x time effect (0.4 per follow-up) and, on PERMA, 1.5 points per unit of the agree share
    of the conversations before the wave: the agree share's interval covers 1.5; the affirmation rate,
    which differs between arms (3.0 against 0.2 affirming words per 100) and has no effect within
    arm, is not significant after BH, as the arm-unadjusted screen made it in most studies."""
    drawn = draw_study(seed=15, n=400)
    panel = drawn.data.panel.copy()
    follow_up = panel["wave"].isin(["perma-week-1", "perma-week-4"])
    share = (panel["conv_agree_turns"] / panel["conv_assistant_turns"]).where(follow_up)
    panel.loc[follow_up, "perma_overall_wellbeing"] += 1.5 * share[follow_up].fillna(0.0)
    data = StudyData(panel=panel, conversations=drawn.data.conversations)
    screen = feature_screen(data, regret_features=["agree_share"],
                            perma_features=["agree_share", "conv_affirmation_per_100_words", "conv_overrides"])
    agree = pick(screen.table, outcome="perma_change", feature="agree_share")
    assert covers(agree, 1.5)
    assert agree["significant_bh"]
    affirmation = pick(screen.table, outcome="perma_change", feature="conv_affirmation_per_100_words")
    assert not affirmation["significant_bh"]
    assert covers(affirmation, 0.0)


def test_a_feature_off_its_usual_value_in_a_few_participants_is_not_screened() -> None:
    """A safety escalation in two participants' conversations: its coefficient would rest on two
    clusters, where CR2 leaves nothing to estimate the variance from; it is skipped, with the reason,
    and a feature seen in five participants is screened."""
    drawn = draw_study(seed=6, n=60)
    panel = drawn.data.panel.copy()
    follow_up = panel["wave"].isin(["perma-week-1", "perma-week-4"]) & (panel["response_status"] == "completed")
    codes = panel.loc[follow_up, "participant_code"].drop_duplicates()
    panel["conv_rare"] = np.where(follow_up, 0.0, np.nan)
    panel["conv_five"] = np.where(follow_up, 0.0, np.nan)
    panel.loc[follow_up & panel["participant_code"].isin(codes.iloc[:2]), "conv_rare"] = 1.0
    panel.loc[follow_up & panel["participant_code"].isin(codes.iloc[:5]), "conv_five"] = 1.0
    screen = feature_screen(StudyData(panel=panel, conversations=drawn.data.conversations),
                            regret_features=["agree_share"], perma_features=["conv_rare", "conv_five"])
    assert pick(screen.skipped, feature="conv_rare")["reason"] == "off its usual value in fewer than 5 participants"
    assert pick(screen.table, feature="conv_five")["participants"] == len(codes)
