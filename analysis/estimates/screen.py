"""Many conversation features at once, each against regret and PERMA change, with raw and
Benjamini-Hochberg adjusted p-values (associations, not effects)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from statsmodels.stats.multitest import multipletests

from analysis.estimates.common import COMPLETE_CASE, OBSERVABLE, StudyData, floats, label_of
from analysis.estimates.prediction import perma_change_outcomes
from analysis.estimates.regret import conversation_table, decision_outcomes
from analysis.robust import cluster_ols


def _screen_candidates(frame: pd.DataFrame, exclude: Sequence[str]) -> list[str]:
    return [c for c in frame.columns if c not in exclude and (
        pd.api.types.is_numeric_dtype(frame[c]) or pd.api.types.is_bool_dtype(frame[c]))]


@dataclass(frozen=True)
class FeatureScreen:
    """Each feature's association with each outcome, one at a time (OLS of the outcome on the
    feature, cluster-robust by participant): per unit and per standard deviation of the feature
    (the forest plot), raw p-values and Benjamini-Hochberg adjusted ones (``p_bh``, within each
    outcome), ``significant_bh`` at ``alpha``. Features that are constant or missing are listed
    in ``skipped``."""

    table: pd.DataFrame
    skipped: pd.DataFrame
    notes: list[str]
    alpha: float

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"feature_screen": self.table, "skipped": self.skipped}


def feature_screen(data: StudyData, *, regret_features: Sequence[str] | None = None,
                   perma_features: Sequence[str] | None = None, focal_role: str = "coach",
                   alpha: float = 0.05) -> FeatureScreen:
    """Screen many conversation features at once against regret (per decision, the conversation's
    features) and PERMA change (per follow-up, the conversations before it), with both raw and
    Benjamini-Hochberg adjusted p-values (statsmodels ``multipletests``, ``fdr_bh``). By default
    every numeric conversation feature and the derived agree share and focal-role indicator."""
    regret = decision_outcomes(data, focal_role)
    perma = perma_change_outcomes(data, focal_role)
    ids = ("conversation_id", "decision_id", "decision_conversation_id", "regret", "days_since_enrollment",
           "wave_number", "perma_change")
    if regret_features is None:
        regret_features = _screen_candidates(conversation_table(data.conversations, focal_role), ids)
    if perma_features is None:  # the panel's conv_* columns, and the derived ones they lack
        perma_features = ["wellbeing_mode", f"role_{focal_role}", "agree_share",
                          *[c for c in _screen_candidates(perma, ids) if c.startswith("conv_")]]
    rows, skipped = [], []
    for outcome, frame, y_column, features in (("regret", regret, "regret", regret_features),
                                               ("perma_change", perma, "perma_change", perma_features)):
        frame = frame[frame["response_status"].astype(str).isin(OBSERVABLE)]
        y = floats(frame[y_column])
        part: list[dict[str, Any]] = []
        for feature in features:
            if feature not in frame:
                raise ValueError(f"unknown feature {feature!r} for {outcome}")
            x = floats(frame[feature])
            used = y.notna() & x.notna()
            if used.sum() < 3 or x[used].std(ddof=0) == 0 or frame.loc[used, "participant_code"].nunique() < 2:
                skipped.append({"outcome": outcome, "feature": feature,
                                "reason": "constant" if used.sum() >= 3 else "too few observations"})
                continue
            design = pd.DataFrame({"Intercept": 1.0, feature: x[used]})
            result = cluster_ols(y[used], design, frame.loc[used, "participant_code"])
            sd = float(x[used].std(ddof=1))
            low, high = result.conf_int().loc[feature].to_numpy(dtype=float)
            part.append({"outcome": outcome, "feature": feature, "label": label_of(feature, focal_role),
                         "estimate": float(result.params[feature]), "se": float(result.bse[feature]),
                         "ci_low": float(low), "ci_high": float(high), "feature_sd": sd,
                         "estimate_per_sd": float(result.params[feature]) * sd, "ci_low_per_sd": float(low) * sd,
                         "ci_high_per_sd": float(high) * sd, "p": float(result.pvalues[feature]),
                         "observations": int(used.sum()),
                         "participants": int(frame.loc[used, "participant_code"].nunique())})
        if part:
            reject, adjusted, _, _ = multipletests([r["p"] for r in part], alpha=alpha, method="fdr_bh")
            for r, p_bh, significant in zip(part, adjusted, reject, strict=True):
                r.update(p_bh=float(p_bh), significant_bh=bool(significant))
        rows += part
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table.sort_values(["outcome", "p"], kind="stable").reset_index(drop=True)
    notes = [f"One model per feature and outcome; Benjamini-Hochberg false discovery rate {alpha:g} within each "
             "outcome. Association, not effect: features are not randomized.", COMPLETE_CASE]
    return FeatureScreen(table, pd.DataFrame(skipped, columns=["outcome", "feature", "reason"]), notes, alpha)
