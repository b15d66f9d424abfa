"""``analysis.estimates.subgroups``: harm to one group is seen, against direct fits."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from analysis.estimates import subgroup_effects
from tests.analysis.estimates.drawn import Truth, covers, draw_study, pick
from tests.analysis.robust_truth import direct_cr2


def test_subgroups_show_harm_to_one_group() -> None:
    truth = Truth(arm_per_wave_by_region={"Europe": 0.6, "America": -0.6, "Asia": 0.6})
    drawn = draw_study(seed=7, n=450, truth=truth, decisions=2)
    fit = subgroup_effects(drawn.data)
    def region(level: str) -> Any:
        return pick(fit.effects, outcome="perma_overall_wellbeing", subgroup="timezone_region", level=level)

    # Averaged over follow-ups 1 and 2 the arm difference is 1.5 x the per-wave effect.
    assert covers(region("America"), -0.9)
    assert region("America")["ci_high"] < 0
    assert region("Europe")["ci_low"] > 0
    assert region("Asia")["ci_low"] > 0
    assert pick(fit.heterogeneity, outcome="perma_overall_wellbeing", subgroup="timezone_region")["p"] < 0.001

    table = drawn.perma[(drawn.perma["response_status"] == "completed") & (drawn.perma["timezone_region"] == "America")]
    design = pd.DataFrame({"Intercept": 1.0, "baseline": table["baseline"],
                           "week4": (table["wave_number"] == 2).astype(float), "wellbeing": table["wellbeing"]})
    direct = direct_cr2(table["y"], design, table["participant_code"]).loc["wellbeing"]
    assert region("America")["estimate"] == pytest.approx(direct["estimate"], rel=1e-10)
    assert region("America")["se"] == pytest.approx(direct["se"], rel=1e-9)

    terciles = fit.effects[(fit.effects["outcome"] == "regret") & (fit.effects["subgroup"] == "baseline_tercile")]
    assert list(terciles["level"]) == ["high", "low", "middle"]
    assert (terciles["ci_high"] < 0).all()  # the coach effect is the same in each: seen in each, no heterogeneity
    assert pick(fit.heterogeneity, outcome="regret", subgroup="baseline_tercile")["p"] > 0.05
    assert fit.subgroups.groupby("subgroup")["participants"].sum()["baseline_tercile"] == 450
