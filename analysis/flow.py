"""The participant flow of a study, CONSORT-style: who joined, consented and was randomized, then
for each wave counted from enrollment, by arm, who answered, missed it, had withdrawn before it or
has it still to come; and who withdrew and whose data were deleted at their request.

    >>> participant_flow(engine, "wellbeing-pilot")     # stage, arm ('all' before randomization), participants

Every count is of participants. The waves come from the panel (``analysis.panel``), whose rule
decides a wave's status at the time the data are read; participants whose data were deleted are
absent from it, so a wave's counts add up to the randomized minus the deleted (the report says so).
Decision-anchored follow-ups (one per decision, so several per participant) are not stages of the
flow: their answers are in the panel and the dropout analysis.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import distinct, func, select

from analysis.reading import Source, connect, resolve_study_id
from study.models import ConsentSignature, Participant

FLOW_COLUMNS = ("order", "stage", "arm", "participants")
# A wave's panel status -> the flow's outcome of that wave
WAVE_OUTCOMES = {"completed": "answered", "expired": "missed", "withdrawn": "withdrawn before it",
                 "cancelled": "withdrawn before it", "open": "still to come", "not_yet_due": "still to come",
                 "overdue": "still to come"}
OUTCOME_ORDER = ("answered", "missed", "withdrawn before it", "still to come")
ALL = "all"


def participant_flow(source: Source, study: int | str, panel_frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """The flow as rows of ``FLOW_COLUMNS`` (``order`` keeps the stages in the order a reader meets
    them). ``panel_frame``: the study's panel when the caller has it (``analysis.panel.panel``)."""
    from analysis.panel import panel

    with connect(source) as connection:
        study_id = resolve_study_id(connection, study)
        joined = connection.scalar(select(func.count()).select_from(Participant)
                                   .where(Participant.study_id == study_id)) or 0
        consented = connection.scalar(
            select(func.count(distinct(ConsentSignature.participant_id)))
            .join(Participant, Participant.id == ConsentSignature.participant_id)
            .where(Participant.study_id == study_id)) or 0
        by_arm = connection.execute(
            select(Participant.arm, func.count(), func.count(Participant.withdrawn_at),
                   func.count(Participant.data_deleted_at))
            .where(Participant.study_id == study_id, Participant.arm.is_not(None))
            .group_by(Participant.arm).order_by(Participant.arm)).all()
    rows: list[dict[str, object]] = [
        {"order": 0, "stage": "joined through an invite", "arm": ALL, "participants": int(joined)},
        {"order": 1, "stage": "signed consent", "arm": ALL, "participants": int(consented)}]
    arms = [str(arm) for arm, *_ in by_arm]
    for arm, randomized, _, _ in by_arm:
        rows.append({"order": 2, "stage": "randomized", "arm": str(arm), "participants": int(randomized)})
    frame = panel(source, study) if panel_frame is None else panel_frame
    baseline = frame[frame["wave"].astype(str) == "baseline"]
    waves = frame[(frame["anchor_key"].astype(str) == "enrollment") & (frame["wave"].astype(str) != "baseline")]
    order = 3
    for wave, whole in [("baseline", baseline), *_in_time_order(waves)]:
        instruments = sorted(whole["instrument_id"].astype(str).unique())
        for instrument in instruments:
            part = whole[whole["instrument_id"].astype(str) == instrument]
            name = wave if len(instruments) == 1 else f"{wave} ({instrument})"
            order = _wave_rows(rows, order, name, part, arms)
    for arm, _, withdrew, deleted in by_arm:
        rows.append({"order": order, "stage": "withdrew (at any time)", "arm": str(arm), "participants": int(withdrew)})
        rows.append({"order": order + 1, "stage": "of whom data deleted at their request", "arm": str(arm),
                     "participants": int(deleted)})
    return pd.DataFrame(rows, columns=list(FLOW_COLUMNS))


def _wave_rows(rows: list[dict[str, object]], order: int, name: str, part: pd.DataFrame, arms: list[str]) -> int:
    """The rows of one wave (and instrument): the participants per outcome and arm; the next order."""
    outcomes = part.assign(outcome=part["response_status"].astype(str).map(WAVE_OUTCOMES).fillna("not sent"))
    counted = outcomes.groupby(["arm", "outcome"], observed=True)["participant_code"].nunique()
    for outcome in (*OUTCOME_ORDER, "not sent"):
        if outcome == "not sent" and not (outcomes["outcome"] == "not sent").any():
            continue
        for arm in arms:
            rows.append({"order": order, "stage": f"{name}: {outcome}", "arm": arm,
                         "participants": int(counted.get((arm, outcome), 0))})
        order += 1
    return order


def _in_time_order(waves: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The enrollment-anchored waves, earliest intended day first."""
    if waves.empty:
        return []
    days = waves.groupby("wave", observed=True)["days_since_enrollment"].median().sort_values()
    return [(str(wave), waves[waves["wave"] == wave]) for wave in days.index]


def flow_table(flow: pd.DataFrame) -> pd.DataFrame:
    """The flow wide: one row per stage, a column per arm and ``all`` (the arms' sum where the stage is
    counted by arm)."""
    wide = flow.pivot_table(index=["order", "stage"], columns="arm", values="participants", aggfunc="sum"
                            ).reset_index()
    arms = [c for c in wide.columns if c not in ("order", "stage", ALL)]
    by_arm = wide[arms].sum(axis=1, min_count=1)
    wide[ALL] = wide[ALL].fillna(by_arm) if ALL in wide else by_arm  # arms empty before randomization
    wide.columns.name = None
    return wide.sort_values("order").drop(columns="order")[["stage", *arms, ALL]].reset_index(drop=True)
