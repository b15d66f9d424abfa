"""Parameter recovery across ``analysis.estimates``: on panels drawn from a known model the
intervals contain the true effects (and zero without them); bad input gets a clear error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from analysis.estimates import dropout_survival, perma_trajectories, regret_model
from tests.analysis.estimates.drawn import NULL, Truth, covers, draw_study, per_day


@pytest.fixture(scope="module")
def recovered() -> dict[str, Any]:
    drawn = draw_study(seed=11, n=400)
    return {"perma": perma_trajectories(drawn.data), "regret": regret_model(drawn.data),
            "dropout": dropout_survival(drawn.data)}


def test_the_intervals_contain_the_true_effects(recovered: dict[str, Any]) -> None:
    truth = Truth()
    slope, at_enrollment = per_day(truth)  # 0.4 per follow-up at days 7 and 28: 0.4 / 21 per day
    arm_time = recovered["perma"].effect("wellbeing vs control x day")
    assert covers(arm_time, slope)
    assert arm_time["ci_low"] > 0
    assert covers(recovered["perma"].effect("wellbeing vs control"), at_enrollment)
    coach, agree = recovered["regret"].effect("role_coach"), recovered["regret"].effect("agree_share")
    assert covers(coach, truth.regret_coach)
    assert coach["ci_high"] < 0
    assert covers(agree, truth.regret_per_agree_share)
    assert agree["ci_low"] > 0
    cox = recovered["dropout"].cox.set_index("term").loc["baseline_wellbeing"]
    assert cox["coef"] - 1.96 * cox["se"] <= truth.dropout_per_point <= cox["coef"] + 1.96 * cox["se"]
    assert np.log(cox["hr_high"]) < 0
    response = recovered["dropout"].response.set_index("term").loc["baseline_wellbeing"]
    assert covers(response, truth.answer_per_point)
    assert response["ci_low"] > 0


def test_with_no_true_effects_the_intervals_cover_zero() -> None:
    drawn = draw_study(seed=12, n=400, truth=NULL)
    assert covers(perma_trajectories(drawn.data).effect("wellbeing vs control x day"), 0.0)
    regret = regret_model(drawn.data)
    assert covers(regret.effect("role_coach"), 0.0)
    assert covers(regret.effect("agree_share"), 0.0)
    dropout = dropout_survival(drawn.data)
    cox = dropout.cox.set_index("term").loc["baseline_wellbeing"]
    assert cox["hr_low"] <= 1.0 <= cox["hr_high"]
    assert covers(dropout.response.set_index("term").loc["baseline_wellbeing"], 0.0)


def test_bad_input_gets_a_clear_error() -> None:
    drawn = draw_study(seed=31, n=20)
    with pytest.raises(ValueError, match="unknown PERMA score"):
        perma_trajectories(drawn.data, outcomes=["wellness"])
    with pytest.raises(ValueError, match="reference arm 'placebo'"):
        perma_trajectories(drawn.data, reference_arm="placebo")
    with pytest.raises(ValueError, match="unknown feature"):
        regret_model(drawn.data, features=["role", "charm"])
    with pytest.raises(ValueError, match="unknown covariate"):
        dropout_survival(drawn.data, covariates=["shoe_size"])
