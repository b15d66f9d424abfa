"""The primary arm x time effect (and the focal-role contrast on regret) within subgroups
(baseline terciles, time zone region, ...), with an interaction test per subgroup variable and
Holm's rule over those tests: a benefit on average that harms one group is seen, and a difference
between groups found by looking at many is not over-read.

Estimand, per subgroup level: the arm x time effect on PERMA overall well-being, the change per day
since enrollment in the difference between an arm and the reference arm (the primary model's
``<arm> vs <reference> x day`` term), among the participants in that level; for regret, the
difference between decisions whose conversation ended in the focal role and the others, adjusted as
``regret_model``. Interaction estimand, per subgroup variable: whether that effect is the same in
every level (the level x arm x day terms are all zero).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis.estimates.common import (
    CLUSTER_ROBUST,
    COMPLETE_CASE,
    OBSERVABLE,
    REGRET_FEATURES,
    StudyData,
    coefficients_table,
    floats,
    observed_waves,
    perma_rows,
    pick_reference_arm,
    wave_dummies,
)
from analysis.estimates.regret import regret_frame
from analysis.robust import cluster_ols

MULTIPLICITY = ("Multiplicity: the interaction tests (one per subgroup variable and contrast) are adjusted together by "
                "Holm's rule (family-wise error {alpha:g}); only a test significant after Holm is evidence that an "
                "effect differs between subgroups. The estimates within levels are descriptive; their p-values are "
                "also shown Benjamini-Hochberg adjusted over the levels of each contrast.")


def _terciles(values: pd.Series) -> tuple[pd.Series, dict[str, str]]:
    """Baseline terciles over participants: low / middle / high, with their ranges."""
    people = values.groupby(level=0).first().dropna()
    bins = pd.qcut(people, 3, labels=False, duplicates="drop")
    names = ["low", "middle", "high"] if bins.nunique() == 3 else [f"bin {i + 1}" for i in range(bins.nunique())]
    labels = bins.map(dict(enumerate(names)))
    ranges = {name: f"{people[labels == name].min():.2f} to {people[labels == name].max():.2f}" for name in names}
    return labels, ranges


@dataclass(frozen=True)
class SubgroupEffects:
    """The arm x time effect on PERMA overall well-being (points per day since enrollment, adjusted
    for the baseline score) and the focal-role contrast on regret (adjusted as ``regret_model``),
    overall (``level`` 'all') and within each level of each subgroup variable: OLS with CR2
    cluster-robust standard errors by participant and Bell-McCaffrey t intervals; ``p_bh``: the
    levels' p-values Benjamini-Hochberg adjusted within each contrast. ``heterogeneity``: per
    subgroup variable and contrast, the interaction test that the effect is the same in every level
    (Wald F on the level x effect terms with the CR2 covariance, referred to F(q, participants - 1)),
    ``p_holm`` adjusted over every interaction test by Holm's rule, ``significant_holm`` at ``alpha``."""

    effects: pd.DataFrame
    heterogeneity: pd.DataFrame
    subgroups: pd.DataFrame
    notes: list[str]
    alpha: float = 0.05

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"effects": self.effects, "heterogeneity": self.heterogeneity, "subgroups": self.subgroups}


def subgroup_effects(data: StudyData, *, by: Sequence[str] = ("baseline_tercile", "timezone_region"),
                     reference_arm: str | None = None, focal_role: str = "coach",
                     regret_features: Sequence[str] = REGRET_FEATURES, min_participants: int = 5,
                     alpha: float = 0.05) -> SubgroupEffects:
    """The primary arm x time effect (and the focal-role contrast on regret) within subgroups, with
    an interaction test per subgroup variable and Holm's rule over the tests.

    Estimand (PERMA): within the level, the change per day since enrollment in the difference in
    overall well-being between an arm and the reference arm, at a given baseline score; time is the
    wave's day (its median day since enrollment), as in ``perma_trajectories``. Estimator: OLS of
    the score at each follow-up on baseline, day, arm and arm x day, CR2 by participant with
    Bell-McCaffrey degrees of freedom. Estimand (regret): the focal-role coefficient of
    ``regret_model`` within the level. Interaction test: one model over every level with each
    level's own intercept, slopes and effect; Wald F that the level x effect terms are zero.

    ``by``: ``baseline_tercile`` (terciles of baseline PERMA overall well-being over participants)
    and any participant-level column of the panel (e.g. ``timezone_region``); a column the panel
    lacks is skipped with a note. A level with fewer than ``min_participants`` participants on
    either side of a contrast, or without two waves in each arm, is reported without an estimate."""
    notes = [COMPLETE_CASE, CLUSTER_ROBUST, MULTIPLICITY.format(alpha=alpha)]
    rows, waves, days = perma_rows(data.panel)
    reference = pick_reference_arm(rows, reference_arm)
    rows["y"] = floats(rows["perma_overall_wellbeing"])
    rows["baseline"] = floats(rows["baseline_perma_overall_wellbeing"])
    rows["day"] = rows["wave_number"].map(days).astype(float)
    perma = rows[rows["response_status"].astype(str).isin(OBSERVABLE) & rows["y"].notna()
                 & rows["baseline"].notna()]
    fitted, wave_notes = observed_waves(perma.assign(group=perma["arm"].astype(str)), waves)
    perma = perma[perma["wave_number"].isin(list(fitted))]
    notes += [f"perma_overall_wellbeing: {note}" for note in wave_notes if "only some groups" in note]
    notes.append("Time: the wave's median day since enrollment (" + ", ".join(
        f"{waves[k]} = day {days[k]:.1f}" for k in fitted) + "); the arm x time effect is per day.")
    _, regret, _, columns = regret_frame(data, regret_features, focal_role)
    role_term = f"role_{focal_role}"
    if role_term not in columns:
        raise ValueError("regret_features must include 'role'")

    baseline = floats(data.panel.set_index("participant_code")["baseline_perma_overall_wellbeing"])
    tercile, ranges = _terciles(baseline)
    people = data.panel.drop_duplicates("participant_code").set_index("participant_code")
    variables: dict[str, pd.Series] = {}
    subgroup_rows = []
    for name in by:
        if name == "baseline_tercile":
            variables[name] = tercile
            subgroup_rows += [{"subgroup": name, "level": level, "definition": f"baseline overall well-being "
                               f"{span}", "participants": int((tercile == level).sum())}
                              for level, span in ranges.items()]
        elif name in people:
            values = people[name].astype(str).where(people[name].notna())
            variables[name] = values.dropna()
            subgroup_rows += [{"subgroup": name, "level": level, "definition": f"{name} = {level}",
                               "participants": int(count)} for level, count in values.value_counts().sort_index()
                              .items()]
        else:
            notes.append(f"Subgroup variable {name!r} is not in the panel: skipped.")

    arms = sorted(a for a in perma["arm"].astype(str).unique() if a != reference)
    arm_terms = [f"{a} vs {reference} x day" for a in arms]

    def perma_design(frame: pd.DataFrame) -> pd.DataFrame:
        design = pd.DataFrame({"Intercept": 1.0, "baseline": frame["baseline"], "day": frame["day"]},
                              index=frame.index)
        for arm in arms:
            indicator = (frame["arm"].astype(str) == arm).astype(float)
            design[f"{arm} vs {reference}"] = indicator
            design[f"{arm} vs {reference} x day"] = indicator * frame["day"]
        return design

    def regret_design(frame: pd.DataFrame) -> pd.DataFrame:
        design = pd.concat([pd.DataFrame({"Intercept": 1.0}, index=frame.index), frame[columns]], axis=1)
        return design.join(wave_dummies(frame)) if frame["wave"].nunique() > 1 else design

    def perma_identified(frame: pd.DataFrame, term: str) -> bool:
        arm = term.split(" vs ")[0]
        sides = [frame[frame["arm"].astype(str) == a] for a in (arm, reference)]
        return all(side["wave_number"].nunique() >= 2 for side in sides)

    contrasts: list[tuple[str, pd.DataFrame, str, Callable[[pd.DataFrame], pd.DataFrame], list[str],
                          Callable[[pd.DataFrame, str], pd.Series], Callable[[pd.DataFrame, str], bool]]] = [
        ("perma_overall_wellbeing", perma, "y", perma_design, arm_terms,
         lambda f, term: f["arm"].astype(str) == term.split(" vs ")[0], perma_identified),
        ("regret", regret, "regret", regret_design, [role_term], lambda f, term: f[role_term] == 1.0,
         lambda f, term: True),
    ]
    if len(fitted) < 2:
        contrasts = contrasts[1:]
        notes.append("perma_overall_wellbeing: fewer than two follow-up waves with data, so no arm x time effect "
                     "to estimate within subgroups yet.")
    effects, heterogeneity = [], []
    for outcome, frame, y_column, design_of, terms, exposed, identified in contrasts:
        levels: list[tuple[str, str, pd.DataFrame]] = [("all", "all", frame)]
        for name, values in variables.items():
            level_of = frame["participant_code"].map(values)
            levels += [(name, str(level), frame[level_of == level]) for level in sorted(level_of.dropna().unique())]
        for name, level, part in levels:
            for term in terms:
                treated = exposed(part, term)
                comparison = part[~treated] if outcome == "regret" else part[part["arm"].astype(str) == reference]
                counts = (part.loc[treated, "participant_code"].nunique(), comparison["participant_code"].nunique())
                row: dict[str, Any] = {"outcome": outcome, "contrast": _contrast_label(term, focal_role),
                                       "term": term, "subgroup": name, "level": level,
                                       "participants": part["participant_code"].nunique(),
                                       "observations": len(part)}
                if min(counts) < min_participants:
                    effects.append({**row, "note": f"fewer than {min_participants} participants on a side"})
                    continue
                if not identified(part, term):
                    effects.append({**row, "note": "fewer than two waves in an arm: no arm x time effect"})
                    continue
                result = cluster_ols(part[y_column], design_of(part), part["participant_code"], df_for=[term])
                table = coefficients_table(result, focal_role).set_index("term")
                numbers = ["estimate", "se", "ci_low", "ci_high", "p"]
                values = table.loc[[term], numbers].to_numpy(float)[0].tolist()
                effects.append({**row, **dict(zip(numbers, values, strict=True)), "df": float(result.df[term]),
                                "note": "" if term not in result.not_identified else
                                "not estimable in this subgroup: its data do not tell the arms' courses apart"})
        for name, values in variables.items():
            heterogeneity += _heterogeneity(frame, values, name, outcome, y_column, design_of, terms, focal_role)
    table = pd.DataFrame(effects)
    for column in ("estimate", "se", "df", "ci_low", "ci_high", "p"):
        if column not in table:
            table[column] = np.nan
    table["p_bh"] = np.nan
    for _, rows_of in table[table["p"].notna()].groupby(["outcome", "term"]):
        table.loc[rows_of.index, "p_bh"] = multipletests(rows_of["p"].to_numpy(float), method="fdr_bh")[1]
    table = table[["outcome", "contrast", "term", "subgroup", "level", "estimate", "se", "df", "ci_low", "ci_high",
                   "p", "p_bh", "participants", "observations", "note"]]
    tests = pd.DataFrame(heterogeneity, columns=["outcome", "contrast", "subgroup", "levels", "statistic", "df",
                                                 "df_denominator", "p"])
    if not tests.empty:
        reject, holm, _, _ = multipletests(tests["p"].to_numpy(float), alpha=alpha, method="holm")
        tests["p_holm"], tests["significant_holm"] = holm, reject
    else:
        tests["p_holm"], tests["significant_holm"] = pd.Series(dtype=float), pd.Series(dtype=bool)
    return SubgroupEffects(table, tests, pd.DataFrame(subgroup_rows), notes, alpha)


def _contrast_label(term: str, focal_role: str) -> str:
    if term == f"role_{focal_role}":
        return f"ended in the {focal_role} role vs any other"
    return f"{term} (arm x time, per day)" if term.endswith(" x day") else term


def _heterogeneity(frame: pd.DataFrame, values: pd.Series, name: str, outcome: str, y_column: str,
                   design_of: Callable[[pd.DataFrame], pd.DataFrame], terms: list[str],
                   focal_role: str) -> list[dict[str, Any]]:
    """The interaction test: one model over every level in which each level has its own terms
    (every column of the design times the level's indicator); Wald statistic W of the level x
    effect terms with the CR2 covariance, F = W / q on (q, participants - 1) degrees of freedom."""
    level = frame["participant_code"].map(values)
    part = frame[level.notna()]
    level = level[level.notna()].astype(str)
    levels = sorted(level.unique())
    if len(levels) < 2 or part.empty:
        return []
    base = design_of(part)
    design = base.copy()
    interactions = []
    for other in levels[1:]:
        indicator = (level == other).astype(float)
        for column in base.columns:
            product = f"{column} x {name}={other}"
            design[product] = base[column] * indicator
            if column in terms:
                interactions.append(product)
    design = design.loc[:, design.std(ddof=0).gt(0) | (design.columns == "Intercept")]
    interactions = [c for c in interactions if c in design]
    if not interactions:
        return []
    result = cluster_ols(part[y_column], design, part["participant_code"], df_for=())  # a Wald F: no t
    restriction = np.zeros((len(interactions), design.shape[1]))
    for i, column in enumerate(interactions):
        restriction[i, list(design.columns).index(column)] = 1.0
    beta = restriction @ result.params.to_numpy()
    covariance = restriction @ np.asarray(result.cov_params()) @ restriction.T
    statistic = float(beta @ np.linalg.pinv(covariance) @ beta) / len(interactions)
    denominator = max(result.clusters - 1, 1)
    return [{"outcome": outcome, "contrast": ", ".join(_contrast_label(t, focal_role) for t in terms),
             "subgroup": name, "levels": len(levels), "statistic": statistic, "df": len(interactions),
             "df_denominator": denominator, "p": float(stats.f.sf(statistic, len(interactions), denominator))}]
