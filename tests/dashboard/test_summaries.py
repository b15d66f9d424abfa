"""The dashboard's SQL summaries against their truth: each is the panel, the conversation features
or the survival table of the same simulated study (60 participants through the real services:
withdrawals, deleted data, decisions, role switches), counted here with pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import select

from analysis.features import conversation_cells, conversation_features
from analysis.panel import DUE, HEADLINE, PENDING, REGRET, attrition, panel, regret_scores, survey_cells, survival
from study.models import Participant
from tests.dashboard.conftest import Simulated

pytestmark = pytest.mark.usefixtures("dashboard_env")


@pytest.fixture
def truth(simulated: Simulated) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The panel with each row's headline score and its decision's starting role, and the
    conversation features."""
    conversations = conversation_features(simulated.engine, simulated.slug)
    rows = panel(simulated.engine, simulated.slug, conversations=conversations)
    rows["score"] = np.where(rows["instrument_id"] == "perma-profiler", rows[f"perma_{HEADLINE['perma-profiler']}"],
                             rows["regret"])
    role_of = conversations.set_index("conversation_id")["starting_role"]
    rows["starting_role"] = rows["decision_conversation_id"].map(role_of)
    return rows, conversations


def test_survey_cells_count_the_panel(simulated: Simulated, truth: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    rows, _ = truth
    cells = survey_cells(simulated.engine, simulated.slug)
    scored = (rows["response_status"] == "completed") & rows["score"].notna()
    kinds = {"status": (rows, ["wave", "arm", "response_status"]),
             "pending": (rows[rows["response_status"].isin(PENDING)], ["wave", "arm"]),
             "due": (rows[rows["response_status"].isin(DUE)], ["wave", "arm"]),
             "scored": (rows[scored], ["wave", "arm"]),
             "scored_role": (rows[scored & rows["starting_role"].notna()], ["wave", "arm", "starting_role"])}
    assert set(cells["kind"]) == set(kinds)
    for kind, (frame, keys) in kinds.items():
        expected = frame.assign(square=frame["score"] ** 2).groupby(keys).agg(
            surveys=("participant_code", "size"), participants=("participant_code", "nunique"),
            score_sum=("score", "sum"), score_sumsq=("square", "sum")).reset_index()
        found = cells[cells["kind"] == kind][[*keys, "surveys", "participants", "score_sum", "score_sumsq"]]
        found = found.fillna({"score_sum": 0.0, "score_sumsq": 0.0})
        merged = expected.merge(found, on=keys, how="outer", suffixes=("", "_sql"), indicator=True)
        assert (merged["_merge"] == "both").all(), (kind, merged[merged["_merge"] != "both"])
        for column in ("surveys", "participants"):
            assert (merged[column] == merged[f"{column}_sql"]).all(), (kind, column)
        for column in ("score_sum", "score_sumsq"):
            np.testing.assert_allclose(merged[f"{column}_sql"], merged[column], rtol=1e-9, err_msg=kind)
    assert cells[cells["kind"] == "scored_role"]["surveys"].sum() > 0  # regret answers with a role exist
    assert (cells[cells["kind"] == "status"]["response_status"] == "withdrawn").any()


def test_conversation_cells_sum_the_conversation_features(simulated: Simulated,
                                                          truth: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    _, conversations = truth
    codes = panel_ids(simulated)
    expected = conversations.assign(participant_id=conversations["participant_code"].map(codes),
                                    pushback_turns=conversations["nudge_turns"] + conversations["challenge_turns"]) \
        .groupby(["participant_id", "arm", "starting_role"]).agg(
            conversations=("conversation_id", "size"), assistant_turns=("assistant_turns", "sum"),
            pushback_turns=("pushback_turns", "sum"), overrides=("overrides", "sum"),
            reconsiders=("reconsiders", "sum")).reset_index()
    found = conversation_cells(simulated.engine, simulated.slug)
    keys = ["participant_id", "arm", "starting_role"]
    pd.testing.assert_frame_equal(found.sort_values(keys).reset_index(drop=True),
                                  expected.sort_values(keys).reset_index(drop=True), check_dtype=False)
    assert expected["pushback_turns"].sum() > 0
    assert expected["overrides"].sum() > 0


def panel_ids(simulated: Simulated) -> dict[str, int]:
    with simulated.engine.connect() as connection:
        return {code: pid for code, pid in connection.execute(select(Participant.code, Participant.id))}


def test_attrition_counts_the_survival_table(simulated: Simulated) -> None:
    table = survival(simulated.engine, simulated.slug)
    expected = table.groupby(["arm", "event_type"]).size().rename("participants").reset_index()
    found = attrition(simulated.engine, simulated.slug)
    pd.testing.assert_frame_equal(found.reset_index(drop=True), expected, check_dtype=False)
    assert set(expected["event_type"]) >= {"censored", "withdrew"}


def test_regret_scores_are_the_panels(simulated: Simulated, truth: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    rows, _ = truth
    answered = rows[(rows["instrument_id"] == REGRET) & (rows["response_status"] == "completed")
                    & rows["regret"].notna()]
    expected = answered[["wave", "starting_role", "regret"]].astype({"regret": float})
    found = regret_scores(simulated.engine, simulated.slug)
    order = ["wave", "starting_role", "regret"]
    pd.testing.assert_frame_equal(found.sort_values(order).reset_index(drop=True),
                                  expected.sort_values(order).reset_index(drop=True), check_dtype=False)
    assert len(found) > 0
