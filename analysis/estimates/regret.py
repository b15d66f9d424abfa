"""Decision Regret on the conversation that led to the decision: the decision outcome table
(each regret follow-up joined to its conversation's features) and its cluster-robust OLS."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.estimates.common import (
    CLUSTER_ROBUST,
    COMPLETE_CASE,
    OBSERVABLE,
    REGRET_FEATURES,
    Sample,
    StudyData,
    coefficients_table,
    floats,
    sample_of,
    wave_dummies,
)
from analysis.panel import REGRET
from analysis.robust import cluster_ols, not_identified_note


def conversation_table(conversations: pd.DataFrame, focal_role: str) -> pd.DataFrame:
    """Conversation features with the derived ones: ``agree_share`` (agree turns / assistant turns)
    and ``role_<focal>`` (1 if the conversation ended in that role)."""
    frame = conversations.copy()
    assistant = floats(frame["assistant_turns"])
    frame["agree_share"] = floats(frame["agree_turns"]) / assistant.where(assistant > 0)
    frame[f"role_{focal_role}"] = (frame["final_role"].astype(str) == focal_role).astype(float)
    frame["conversation_id"] = frame["conversation_id"].astype("Int64")
    return frame


def decision_outcomes(data: StudyData, focal_role: str = "coach") -> pd.DataFrame:
    """One row per decision-regret follow-up (panel rows of the regret instrument) joined to the
    features of the conversation the decision was reported in (``conversation_id``), with
    ``agree_share`` and ``role_<focal_role>`` added."""
    rows = data.panel[data.panel["instrument_id"] == REGRET].copy()
    rows["conversation_id"] = rows["decision_conversation_id"].astype("Int64")
    features = conversation_table(data.conversations, focal_role)
    overlap = [c for c in features.columns if c in rows.columns and c != "conversation_id"]
    return rows.merge(features.drop(columns=overlap), on="conversation_id", how="left")


def resolve_features(features: Sequence[str], focal_role: str) -> list[str]:
    return [f"role_{focal_role}" if name == "role" else name for name in features]



@dataclass(frozen=True)
class RegretModel:
    """Decision Regret (0-100) on the features of the conversation that led to the decision, OLS
    with cluster-robust (participant) standard errors. ``coefficients``: one row per term with its
    95% interval (the forest-plot rows; wave terms are nuisance terms). ``frame``: the rows fitted."""

    coefficients: pd.DataFrame
    sample: Sample
    notes: list[str]
    fit: Any
    frame: pd.DataFrame

    def effect(self, term: str) -> pd.Series:
        rows = self.coefficients[self.coefficients["term"] == term]
        if rows.empty:
            raise KeyError(f"no term {term!r}")
        return rows.iloc[0]

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"coefficients": self.coefficients, "missingness": self.sample.missingness}


def regret_frame(data: StudyData, features: Sequence[str], focal_role: str,
                  extra: Sequence[str] = ()) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series, list[str]]:
    """(all regret rows with the needed columns as floats, the rows used, used mask, feature columns)."""
    columns = resolve_features(features, focal_role)
    rows = decision_outcomes(data, focal_role)
    missing = [c for c in [*columns, *extra] if c not in rows.columns]
    if missing:
        raise ValueError(f"unknown feature(s) {', '.join(missing)}")
    rows["regret"] = floats(rows["regret"])
    for column in [*columns, *extra]:
        rows[column] = floats(rows[column])
    rows = rows.sort_values(["participant_code", "days_since_enrollment", "wave", "decision_id"], kind="stable")
    eligible = rows["response_status"].astype(str).isin(OBSERVABLE)
    used = eligible & rows["regret"].notna() & rows[[*columns, *extra]].notna().all(axis=1)
    return rows, rows[used], used, columns


def regret_model(data: StudyData, *, features: Sequence[str] = REGRET_FEATURES, focal_role: str = "coach",
                 wave_terms: bool = True) -> RegretModel:
    """OLS of each regret response on the conversation's features (``role`` = ended in
    ``focal_role`` vs any other; by default also the agree share, overrides, affirmation,
    sentiment change and reassurance seeking), plus an indicator per regret wave after the first
    when there are several, with standard errors clustered by participant. Every response is a
    row (a decision asked about at day 3 and day 14 gives two); the clustering accounts for that."""
    rows, frame, used, columns = regret_frame(data, features, focal_role)
    if frame["participant_code"].nunique() < 2:
        raise ValueError("too few participants with a regret score and the conversation's features to fit")
    design = pd.concat([pd.DataFrame({"Intercept": 1.0}, index=frame.index), frame[columns]], axis=1)
    if wave_terms and frame["wave"].nunique() > 1:
        design = design.join(wave_dummies(frame))
    result = cluster_ols(frame["regret"], design, frame["participant_code"])
    notes = [COMPLETE_CASE, CLUSTER_ROBUST,
             "agree_share = agree turns / assistant turns of the conversation; the pushback rate is its complement "
             "(with no escalations), so the two are never in the model together."]
    if (said := not_identified_note(result)) is not None:
        notes.append(said)
    return RegretModel(coefficients_table(result, focal_role), sample_of(rows, used, rows["regret"].notna()), notes,
                       result, frame.assign(**{c: design[c] for c in design.columns if c.startswith("wave ")}))
