"""``analysis.estimates.regret`` against a direct cluster-robust OLS fit."""

from __future__ import annotations

import pandas as pd

from analysis.estimates import regret_model
from tests.analysis.estimates.drawn import REGRET_COLUMNS, draw_study, same
from tests.analysis.robust_truth import direct_cr2


def test_the_regret_model_equals_a_direct_cluster_robust_ols_fit() -> None:
    drawn = draw_study(seed=4, n=60)
    fit = regret_model(drawn.data)
    table = drawn.decisions[drawn.decisions["response_status"] == "completed"].sort_values(
        ["participant_code", "days_since_enrollment", "wave", "decision_id"], kind="stable")
    design = pd.concat([pd.DataFrame({"Intercept": 1.0}, index=table.index), table[REGRET_COLUMNS],
                        (table["wave"] == "regret-day-14").astype(float).rename("day14")], axis=1)
    direct = direct_cr2(table["regret"], design, table["participant_code"])
    coefficients = fit.coefficients
    assert list(coefficients["term"]) == ["Intercept", *REGRET_COLUMNS, "wave regret-day-14"]
    same(coefficients["estimate"], direct["estimate"])
    same(coefficients["se"], direct["se"])
    same(coefficients[["ci_low", "ci_high"]], direct[["ci_low", "ci_high"]])
    same(coefficients["p"], direct["p"])
    assert fit.sample.observations == len(table)
    assert fit.sample.eligible_observations == len(drawn.decisions)
    assert fit.sample.participants == table["participant_code"].nunique()
