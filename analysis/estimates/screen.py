"""Many conversation features at once, each against regret and PERMA change within arm, with raw
and Benjamini-Hochberg adjusted p-values (associations, not effects).

Estimand, per feature and outcome: the difference in the outcome per unit of the feature between
rows of the same arm (and, for PERMA change, the same wave and baseline score): the coefficient of
the feature in a regression that also holds the randomized arm (x wave) fixed. A feature that
only differs between arms (the arm standing in for it) has no such difference; the arm's own
effect is the mixed model's (``analysis.estimates.perma``), not the screen's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from statsmodels.stats.multitest import multipletests

from analysis.estimates.common import (
    COMPLETE_CASE,
    OBSERVABLE,
    StudyData,
    arm_adjustment,
    floats,
    label_of,
    pick_reference_arm,
    within,
)
from analysis.estimates.prediction import perma_change_outcomes
from analysis.estimates.regret import conversation_table, decision_outcomes
from analysis.robust import cluster_ols

# Columns that describe the arm itself: the arm is adjusted for, never screened as a feature.
ARM_COLUMNS = ("wellbeing_mode",)
ADJUSTED_FOR = {"regret": "arm and regret wave",
                "perma_change": "baseline overall well-being, wave, arm and arm x wave"}


def _screen_candidates(frame: pd.DataFrame, exclude: Sequence[str]) -> list[str]:
    return [c for c in frame.columns if c not in exclude and c not in ARM_COLUMNS and (
        pd.api.types.is_numeric_dtype(frame[c]) or pd.api.types.is_bool_dtype(frame[c]))]


@dataclass(frozen=True)
class FeatureScreen:
    """Each feature's association with each outcome within arm, one feature at a time: OLS of the
    outcome on the feature and the adjustment terms (``adjusted_for``: for regret the arm and the
    regret wave; for PERMA change the baseline score, the wave, the arm and arm x wave), CR2
    cluster-robust by participant with Bell-McCaffrey degrees of freedom. Per unit and per standard
    deviation of the feature (the forest plot), raw p-values and Benjamini-Hochberg adjusted ones
    (``p_bh``, over the features of each outcome), ``significant_bh`` at ``alpha``. Features that
    are constant, missing or do not vary within arm are listed in ``skipped``."""

    table: pd.DataFrame
    skipped: pd.DataFrame
    notes: list[str]
    alpha: float

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"feature_screen": self.table, "skipped": self.skipped}


def feature_screen(data: StudyData, *, regret_features: Sequence[str] | None = None,
                   perma_features: Sequence[str] | None = None, focal_role: str = "coach",
                   reference_arm: str | None = None, alpha: float = 0.05, min_participants: int = 5) -> FeatureScreen:
    """Screen many conversation features at once against regret (per decision, the conversation's
    features) and PERMA change (per follow-up, the conversations before it), each within arm.

    Estimand: for feature X and outcome Y, the coefficient of X in E[Y | X, arm, wave] (regret) or
    E[Y | X, arm x wave, baseline] (PERMA change): how Y differs per unit of X between rows of the
    same arm and wave, not between arms. Estimator: OLS with those terms, CR2 standard errors by
    participant and Bell-McCaffrey t intervals; p-values Benjamini-Hochberg adjusted over the
    features of each outcome (statsmodels ``multipletests``, ``fdr_bh``). A feature off its most
    common value in fewer than ``min_participants`` participants is skipped (its coefficient would
    rest on those few clusters, whose CR2 variance is then all but zero). By default every numeric
    conversation feature and the derived agree share and focal-role indicator; the arm
    (``wellbeing_mode``) is adjusted for and refused as a feature."""
    regret = decision_outcomes(data, focal_role)
    perma = perma_change_outcomes(data, focal_role)
    reference = pick_reference_arm(data.panel, reference_arm)
    ids = ("conversation_id", "decision_id", "decision_conversation_id", "regret", "days_since_enrollment",
           "wave_number", "perma_change")
    if regret_features is None:
        regret_features = _screen_candidates(conversation_table(data.conversations, focal_role), ids)
    if perma_features is None:  # the panel's conv_* columns, and the derived ones they lack
        perma_features = [f"role_{focal_role}", "agree_share",
                          *[c for c in _screen_candidates(perma, ids) if c.startswith("conv_")]]
    arm_like = [f for f in [*regret_features, *perma_features] if f in ARM_COLUMNS]
    if arm_like:
        raise ValueError(f"{', '.join(sorted(set(arm_like)))} is the randomized arm: the screen adjusts for it "
                         "(its effect is the PERMA model's), so it cannot be screened as a feature")
    rows, skipped = [], []
    for outcome, frame, y_column, features in (("regret", regret, "regret", regret_features),
                                               ("perma_change", perma, "perma_change", perma_features)):
        frame = frame[frame["response_status"].astype(str).isin(OBSERVABLE)]
        y = floats(frame[y_column])
        baseline = "baseline_perma_overall_wellbeing" if outcome == "perma_change" else None
        known = y.notna() & frame["arm"].notna()
        if baseline is not None:
            known &= floats(frame[baseline]).notna()
        part: list[dict[str, Any]] = []
        for feature in features:
            if feature not in frame:
                raise ValueError(f"unknown feature {feature!r} for {outcome}")
            x = floats(frame[feature])
            used = known & x.notna()
            if used.sum() < 3 or frame.loc[used, "participant_code"].nunique() < 2:
                skipped.append({"outcome": outcome, "feature": feature, "reason": "too few observations"})
                continue
            if x[used].std(ddof=0) == 0:
                skipped.append({"outcome": outcome, "feature": feature, "reason": "constant"})
                continue
            # A feature off its usual value in a handful of participants (a safety escalation) is
            # estimated from those few clusters alone, where CR2 has nothing left to estimate the
            # variance from (it rejected 80% of the time in null studies): not screened.
            unusual = x[used] != x[used].mode().iloc[0]
            varying = frame.loc[used[used].index[unusual.to_numpy()], "participant_code"].nunique()
            if varying < min_participants:
                skipped.append({"outcome": outcome, "feature": feature,
                                "reason": f"off its usual value in fewer than {min_participants} participants"})
                continue
            adjustment = arm_adjustment(frame[used], reference, by_wave=outcome == "perma_change", baseline=baseline)
            if within(x[used], adjustment).std(ddof=0) <= 1e-9 * max(float(x[used].std(ddof=0)), 1.0):
                skipped.append({"outcome": outcome, "feature": feature, "reason": "does not vary within arm"})
                continue
            design = adjustment.assign(**{feature: x[used]})
            result = cluster_ols(y[used], design, frame.loc[used, "participant_code"], df_for=[feature])
            sd = float(x[used].std(ddof=1))
            low, high = result.conf_int().loc[feature].to_numpy(dtype=float)
            part.append({"outcome": outcome, "feature": feature, "label": label_of(feature, focal_role),
                         "estimate": float(result.params[feature]), "se": float(result.bse[feature]),
                         "df": float(result.df[feature]),
                         "ci_low": float(low), "ci_high": float(high), "feature_sd": sd,
                         "estimate_per_sd": float(result.params[feature]) * sd, "ci_low_per_sd": float(low) * sd,
                         "ci_high_per_sd": float(high) * sd, "p": float(result.pvalues[feature]),
                         "adjusted_for": ADJUSTED_FOR[outcome], "observations": int(used.sum()),
                         "participants": int(frame.loc[used, "participant_code"].nunique())})
        if part:
            reject, adjusted, _, _ = multipletests([r["p"] for r in part], alpha=alpha, method="fdr_bh")
            for r, p_bh, significant in zip(part, adjusted, reject, strict=True):
                r.update(p_bh=float(p_bh), significant_bh=bool(significant))
        rows += part
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table.sort_values(["outcome", "p"], kind="stable").reset_index(drop=True)
    notes = [f"Estimand: each feature's difference in the outcome per unit within arm (one model per feature and "
             f"outcome, adjusted for the arm, and for PERMA change also for the wave, arm x wave and the baseline "
             f"score; reference arm {reference}), so a feature cannot stand in for the randomized arm. "
             f"Benjamini-Hochberg false discovery rate {alpha:g} over the features of each outcome. CR2 "
             "cluster-robust standard errors by participant with Bell-McCaffrey degrees of freedom. Association, "
             "not effect: features are not randomized.", COMPLETE_CASE]
    return FeatureScreen(table, pd.DataFrame(skipped, columns=["outcome", "feature", "reason"]), notes, alpha)
