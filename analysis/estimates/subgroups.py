"""The arm and focal-role contrasts within subgroups (baseline terciles, time zone region, ...),
with the Wald test that a contrast is the same in every level: a benefit on average that harms
one group is seen."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analysis.estimates.common import (
    CLUSTER_ROBUST,
    COMPLETE_CASE,
    OBSERVABLE,
    REGRET_FEATURES,
    StudyData,
    coefficients_table,
    floats,
    indicators,
    observed_waves,
    perma_rows,
    pick_reference_arm,
    wave_dummies,
)
from analysis.estimates.regret import regret_frame
from analysis.robust import cluster_ols


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
    """The arm contrast on PERMA overall well-being at follow-up (adjusted for baseline and wave,
    averaged over waves) and the focal-role contrast on regret (adjusted as ``regret_model``),
    overall (``level`` 'all') and within each level of each subgroup variable, cluster-robust by
    participant; ``heterogeneity``: the Wald test that the contrast is the same in every level."""

    effects: pd.DataFrame
    heterogeneity: pd.DataFrame
    subgroups: pd.DataFrame
    notes: list[str]

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"effects": self.effects, "heterogeneity": self.heterogeneity, "subgroups": self.subgroups}


def subgroup_effects(data: StudyData, *, by: Sequence[str] = ("baseline_tercile", "timezone_region"),
                     reference_arm: str | None = None, focal_role: str = "coach",
                     regret_features: Sequence[str] = REGRET_FEATURES, min_participants: int = 5) -> SubgroupEffects:
    """Each contrast within subgroups, so a benefit on average that harms one group is seen.
    ``by``: ``baseline_tercile`` (terciles of baseline PERMA overall well-being over participants)
    and any participant-level column of the panel (e.g. ``timezone_region``); a column the panel
    lacks is skipped with a note. A level with fewer than ``min_participants`` participants on either
    side of a contrast is reported without an estimate."""
    notes = [COMPLETE_CASE, CLUSTER_ROBUST]
    rows, waves, _ = perma_rows(data.panel)
    reference = pick_reference_arm(rows, reference_arm)
    rows["y"] = floats(rows["perma_overall_wellbeing"])
    rows["baseline"] = floats(rows["baseline_perma_overall_wellbeing"])
    perma = rows[rows["response_status"].astype(str).isin(OBSERVABLE) & rows["y"].notna()
                 & rows["baseline"].notna()]
    fitted, wave_notes = observed_waves(perma.assign(group=perma["arm"].astype(str)), waves)
    perma = perma[perma["wave_number"].isin(list(fitted))]
    notes += [f"perma_overall_wellbeing: {note}" for note in wave_notes if "only some groups" in note]
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

    def perma_design(frame: pd.DataFrame) -> pd.DataFrame:
        design = pd.DataFrame({"Intercept": 1.0, "baseline": frame["baseline"]}, index=frame.index)
        for k in sorted(set(frame["wave_number"]))[1:]:  # the waves with data in this frame
            design[f"wave {waves[k]}"] = (frame["wave_number"] == k).astype(float)
        return design.join(indicators(frame["arm"].astype(str), reference, "").reindex(
            columns=[f"{a} vs {reference}" for a in arms], fill_value=0.0))

    def regret_design(frame: pd.DataFrame) -> pd.DataFrame:
        design = pd.concat([pd.DataFrame({"Intercept": 1.0}, index=frame.index), frame[columns]], axis=1)
        return design.join(wave_dummies(frame)) if frame["wave"].nunique() > 1 else design

    contrasts: list[tuple[str, pd.DataFrame, str, Callable[[pd.DataFrame], pd.DataFrame], list[str],
                          Callable[[pd.DataFrame, str], pd.Series]]] = [
        ("perma_overall_wellbeing", perma, "y", perma_design, [f"{a} vs {reference}" for a in arms],
         lambda f, term: f["arm"].astype(str) == term.split(" vs ")[0]),
        ("regret", regret, "regret", regret_design, [role_term], lambda f, term: f[role_term] == 1.0),
    ]
    effects, heterogeneity = [], []
    for outcome, frame, y_column, design_of, terms, exposed in contrasts:
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
                result = cluster_ols(part[y_column], design_of(part), part["participant_code"])
                table = coefficients_table(result, focal_role).set_index("term")
                numbers = ["estimate", "se", "ci_low", "ci_high", "p"]
                values = table.loc[[term], numbers].to_numpy(float)[0].tolist()
                effects.append({**row, **dict(zip(numbers, values, strict=True)), "note": ""})
        for name, values in variables.items():
            heterogeneity += _heterogeneity(frame, values, name, outcome, y_column, design_of, terms, focal_role)
    table = pd.DataFrame(effects)
    for column in ("estimate", "se", "ci_low", "ci_high", "p"):
        if column not in table:
            table[column] = np.nan
    table = table[["outcome", "contrast", "term", "subgroup", "level", "estimate", "se", "ci_low", "ci_high", "p",
                   "participants", "observations", "note"]]
    return SubgroupEffects(table, pd.DataFrame(heterogeneity), pd.DataFrame(subgroup_rows), notes)


def _contrast_label(term: str, focal_role: str) -> str:
    return f"ended in the {focal_role} role vs any other" if term == f"role_{focal_role}" else term


def _heterogeneity(frame: pd.DataFrame, values: pd.Series, name: str, outcome: str, y_column: str,
                   design_of: Callable[[pd.DataFrame], pd.DataFrame], terms: list[str],
                   focal_role: str) -> list[dict[str, Any]]:
    """Wald test (chi-squared, cluster-robust covariance) that every term x level interaction is 0."""
    level = frame["participant_code"].map(values)
    part = frame[level.notna()]
    level = level[level.notna()].astype(str)
    levels = sorted(level.unique())
    if len(levels) < 2 or part.empty:
        return []
    design = design_of(part)
    interactions = []
    for other in levels[1:]:
        indicator = (level == other).astype(float)
        design[f"{name}={other}"] = indicator
        for term in terms:
            design[f"{term} x {name}={other}"] = design[term] * indicator
            interactions.append(f"{term} x {name}={other}")
    design = design.loc[:, design.std(ddof=0).gt(0) | (design.columns == "Intercept")]
    interactions = [c for c in interactions if c in design]
    if not interactions:
        return []
    result = cluster_ols(part[y_column], design, part["participant_code"])
    restriction = np.zeros((len(interactions), design.shape[1]))
    for i, column in enumerate(interactions):
        restriction[i, list(design.columns).index(column)] = 1.0
    beta = restriction @ result.params.to_numpy()
    covariance = restriction @ np.asarray(result.cov_params()) @ restriction.T
    statistic = float(beta @ np.linalg.pinv(covariance) @ beta)
    return [{"outcome": outcome, "contrast": ", ".join(_contrast_label(t, focal_role) for t in terms),
             "subgroup": name, "levels": len(levels), "statistic": statistic, "df": len(interactions),
             "p": float(stats.chi2.sf(statistic, len(interactions)))}]
