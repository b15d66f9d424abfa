"""``analysis.simulation.synthetic``: tables shaped like the real ones, drawn exactly from the generative model.

The truths are the Effects' parameters (and, for the schedule, the planner itself); tolerances
are a few standard errors of the statistic, computed in the test.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy.engine import Engine

from analysis.features import FEATURES, LIST_SEPARATOR, conversation_features
from analysis.panel import PANEL_COLUMNS, SURVIVAL_COLUMNS, panel, survival
from analysis.simulation.population import Effects
from analysis.simulation.simulate import load_simulated_study, simulate
from analysis.simulation.synthetic import SyntheticStudy, load_protocol, null_effects, study_weeks, synthetic_study
from scheduler import planner
from study import clock
from surveys import registry

Z = 4.0  # standard errors allowed: a correct generator fails one of these checks about once in 15,000 runs
NO_WITHDRAWAL: dict[str, Any] = {"withdraw_weekly_logit": -math.inf, "withdraw_per_baseline_point": 0.0}


def kind(dtype: Any) -> str:
    """What a column holds, whatever pandas calls it (str and object both hold strings)."""
    if pd.api.types.is_bool_dtype(dtype):
        return "boolean"
    if pd.api.types.is_integer_dtype(dtype):
        return "integer"
    if pd.api.types.is_float_dtype(dtype):
        return "number"
    if isinstance(dtype, pd.DatetimeTZDtype):  # at us or ns: pandas versions differ, the instants do not
        return f"datetime {dtype.tz}"
    return "string"


@pytest.fixture(scope="module")
def small() -> SyntheticStudy:
    return synthetic_study(300, weeks=6, seed=3)


def test_columns_and_dtypes_are_the_documented_ones(small: SyntheticStudy) -> None:
    for frame, columns in ((small.panel(), PANEL_COLUMNS), (small.conversation_features(), FEATURES),
                           (small.survival(), SURVIVAL_COLUMNS)):
        assert list(frame.columns) == list(columns)
        for name, column in columns.items():
            expected = "datetime UTC" if column.type == "datetime" else column.type
            assert kind(frame[name].dtype) == expected, name


def test_the_same_kinds_as_the_tables_of_a_real_simulated_study(engine: Engine, example_protocol: str) -> None:
    """The real panel, features and survival of a tiny study run through the services, beside
    the synthetic ones: the same columns, each holding the same kind of value."""
    start = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
    slug = load_simulated_study(engine, example_protocol)
    simulate(engine, slug, participants=4, weeks=2, seed=2, start=start, tick_minutes=180)
    previous = clock.set_clock(clock.FrozenClock(start + dt.timedelta(weeks=2)))
    try:
        real = (panel(engine, slug), conversation_features(engine, slug), survival(engine, slug))
    finally:
        clock.set_clock(previous)
    synthetic = synthetic_study(30, weeks=2, seed=2, start=start)
    for ours, theirs in zip((synthetic.panel(), synthetic.conversation_features(), synthetic.survival()), real,
                            strict=True):
        assert list(ours.columns) == list(theirs.columns)
        assert {c: kind(ours[c].dtype) for c in ours} == {c: kind(theirs[c].dtype) for c in theirs}
        assert not theirs.empty
        assert not ours.empty
    statuses = set(real[0]["response_status"])
    assert statuses <= set(synthetic.panel()["response_status"]) | {"overdue"}


def test_a_seed_gives_the_same_tables_and_another_seed_others(small: SyntheticStudy) -> None:
    again = synthetic_study(300, weeks=6, seed=3)
    pd.testing.assert_frame_equal(small.panel(), again.panel())
    pd.testing.assert_frame_equal(small.conversation_features(), again.conversation_features())
    pd.testing.assert_frame_equal(small.survival(), again.survival())
    other = synthetic_study(300, weeks=6, seed=4)
    assert not small.people["latent"].equals(other.people["latent"])


def test_without_chat_the_people_and_their_perma_waves_are_the_same(small: SyntheticStudy) -> None:
    bare = synthetic_study(300, weeks=6, seed=3, chat=False)
    pd.testing.assert_frame_equal(bare.people, small.people)
    enrollment = small.waves[small.waves["anchor_key"] == "enrollment"].reset_index(drop=True)
    pd.testing.assert_frame_equal(bare.waves, enrollment)
    assert bare.conversations.empty
    assert set(bare.panel()["wave"]) == {"baseline", "perma-week-1", "perma-week-4"}


def test_follow_up_times_are_the_planners(small: SyntheticStudy) -> None:
    """Every due time is planner.timing() for the anchor (enrollment, or the decision at the end of
    its conversation) on the participant's wall clock, with the protocol's quiet hours."""
    protocol = small.protocol
    specs = {f.id: f for f in protocol.followups}
    people = small.people.set_index("participant_code")
    ended = small.conversations.set_index("conversation_id")["ended_at"]
    for row in small.waves.sample(400, random_state=1).to_dict("records"):
        person = people.loc[row["participant_code"]]
        anchored = (person["enrolled_at"] if row["anchor_key"] == "enrollment"
                    else ended.loc[row["decision_conversation_id"]])
        timing = planner.timing(specs[row["wave"]], anchored.to_pydatetime(), person["timezone"],
                                protocol.quiet_hours)
        assert row["intended_at"] == pd.Timestamp(timing.due_at)
        assert row["closes_at"] == pd.Timestamp(timing.closes_at)
        assert row["intended_local"] == timing.intended_local


def test_the_wave_columns_roll_up_the_conversations_before_each_wave(small: SyntheticStudy) -> None:
    frame = small.panel()
    conversations = small.conversation_features()
    rows = frame[frame["wave"] != "baseline"].sample(150, random_state=2)
    for row in rows.to_dict("records"):
        before = conversations[(conversations["participant_code"] == row["participant_code"])
                               & (conversations["started_at"] < row["intended_at"])]
        assert row["conv_n_conversations"] == len(before)
        assert row["conv_agree_turns"] == before["agree_turns"].sum()
        assert row["conv_decisions_made"] == before["made_decision"].sum()
        assert row["conv_roles_used"] == LIST_SEPARATOR.join(sorted(
            {r for used in before["roles_used"] for r in used.split(LIST_SEPARATOR) if r}))
        if len(before) and before["assistant_turns"].sum():
            assert row["conv_pushback_rate"] == pytest.approx(
                (before["nudge_turns"].sum() + before["challenge_turns"].sum()) / before["assistant_turns"].sum())
        assert (pd.isna(row["conv_mean_exit_rating"]) if before["exit_rating"].isna().all()
                else row["conv_mean_exit_rating"] == pytest.approx(before["exit_rating"].mean()))
    baseline = frame[frame["wave"] == "baseline"]
    assert baseline["conv_n_conversations"].isna().all()


def test_survival_follows_the_panel_rule(small: SyntheticStudy) -> None:
    """analysis.panel.STOP_RULE, participant by participant from the raw draws: the first missed
    window after the last answered one once none is left to answer; else the withdrawal if it
    cancelled a follow-up; else the last window's close, or the data cut while an outcome is to come
    (no later than a second before the close of the first window whose outcome is unknown)."""
    table = small.survival().set_index("participant_code")
    waves = small.waves[small.waves["anchor_key"] == "enrollment"]
    enrolled = small.people.set_index("participant_code")["enrolled_at"]
    kept = waves[waves["participant_code"].isin(table.index)]
    scheduled = ((kept["closes_at"] - kept["participant_code"].map(enrolled)).dt.total_seconds() / 86_400
                 ).groupby(kept["wave"]).median()
    read_at = pd.Timestamp(small.read_at)
    withdrawals = small.people.set_index("participant_code")["withdrawn_at"]
    seen = set()
    for code, rows in kept[kept["participant_code"].isin(set(table.index[::3]))].groupby("participant_code"):
        row = table.loc[str(code)]
        rows = rows.sort_values("closes_at")
        status = rows["response_status"]
        answered = rows.loc[status == "completed", "closes_at"]
        missed = rows[(status == "expired") & ((rows["closes_at"] > answered.max()) if len(answered) else True)]
        to_come = status.isin(("open", "not_yet_due"))
        withdrawn = withdrawals[str(code)]
        first_miss = len(missed) and (pd.isna(withdrawn) or missed["closes_at"].iloc[0] <= withdrawn)
        if first_miss and not to_come.any():
            expected = ("stopped_answering", missed["closes_at"].iloc[0], scheduled[missed["wave"].iloc[0]])
        elif not first_miss and not pd.isna(withdrawn) and (status == "withdrawn").any():
            expected = ("withdrew", withdrawn, (withdrawn - enrolled[str(code)]).total_seconds() / 86_400)
        elif to_come.any() or rows["closes_at"].max() > read_at:
            unknown = missed["wave"].iloc[0] if first_miss else rows.loc[
                to_come | (rows["closes_at"] > read_at), "wave"].iloc[0]
            expected = ("data_cut", read_at, min((read_at - enrolled[str(code)]).total_seconds() / 86_400,
                                                 scheduled[unknown] - 1 / 86_400))
        else:
            expected = ("end_of_follow_up", rows["closes_at"].max(), scheduled[rows["wave"].iloc[-1]])
        kind, at, days = expected
        assert (row["event_type"] if row["event"] else row["censored_because"], row["event_at"]) == (kind, at), code
        assert row["duration_days"] == pytest.approx(days, abs=1e-9), code
        seen.add(kind)
    assert seen == {"stopped_answering", "withdrew", "data_cut", "end_of_follow_up"}
    assert small.people["data_deleted"].any()  # some withdrew and deleted their data: absent from every table
    deleted = set(small.people.loc[small.people["data_deleted"], "participant_code"])
    assert not deleted & set(small.panel()["participant_code"])
    assert not deleted & set(small.conversation_features()["participant_code"])


# Moments of a large study against the Effects


@pytest.fixture(scope="module")
def large() -> SyntheticStudy:
    # Regret base 50 keeps every draw inside 0-100, so no clipping bends the linear model.
    effects = dataclasses.replace(Effects(), regret_base=50.0, **NO_WITHDRAWAL)
    return synthetic_study(12_000, seed=11, effects=effects)


def clustered_ols(y: np.ndarray, x: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """OLS coefficients and their cluster-robust (sandwich) standard errors, by hand."""
    design = np.column_stack([np.ones(len(y)), x])
    bread = np.linalg.inv(design.T @ design)
    beta = bread @ design.T @ y
    scores = pd.DataFrame(design * (y - design @ beta)[:, None]).groupby(groups).sum().to_numpy()
    covariance = bread @ (scores.T @ scores) @ bread
    return beta, np.sqrt(np.diag(covariance))


def test_baseline_wellbeing_has_the_effects_mean_and_sd(large: SyntheticStudy) -> None:
    e = large.effects
    baseline = large.people["baseline_perma_overall_wellbeing"].to_numpy()
    items = len(next(s for s in registry.builtin()["perma-profiler"].scores if s.name == "overall_wellbeing").items)
    # The score averages the answered items: noise variance item_noise_sd^2 * E[1/M], M ~ Binomial(16, 0.98) > 0.
    keep = 1 - e.item_skip_prob
    weights = [math.comb(items, m) * keep**m * (1 - keep) ** (items - m) for m in range(1, items + 1)]
    inverse = sum(w / m for m, w in zip(range(1, items + 1), weights, strict=True)) / sum(weights)
    sd = math.sqrt(e.baseline_sd**2 + e.item_noise_sd**2 * inverse)
    n = len(baseline)
    assert abs(baseline.mean() - e.baseline_mean) < Z * sd / math.sqrt(n)
    assert abs(baseline.std() - sd) < Z * sd / math.sqrt(2 * n)


def test_regret_recovers_the_coach_and_affirmation_effects(large: SyntheticStudy) -> None:
    e = large.effects
    answered = large.waves[(large.waves["instrument_id"] == "decision-regret")
                           & (large.waves["response_status"] == "completed")]
    source = large.conversations.set_index("conversation_id").loc[answered["decision_conversation_id"].to_numpy()]
    coach = (source["final_role"] == "coach").to_numpy(dtype=float)
    share = (source["agree_turns"] / source["assistant_turns"]).to_numpy(dtype=float)
    beta, se = clustered_ols(answered["regret"].to_numpy(dtype=float), np.column_stack([coach, share]),
                             answered["person"].to_numpy())
    assert abs(beta[1] - e.regret_coach) < Z * se[1]
    assert abs(beta[2] - e.regret_per_agree_share) < Z * se[2]
    assert abs(beta[0] - e.regret_base) < Z * se[0]
    assert se[1] < 0.5  # the check is sharp: a 1.5-point error would fail it


def test_the_wellbeing_arm_gains_its_effect_at_each_perma_wave(large: SyntheticStudy) -> None:
    e = large.effects
    people = large.people.set_index("person")
    for k, wave in enumerate(("perma-week-1", "perma-week-4"), start=1):
        rows = large.waves[(large.waves["wave"] == wave) & (large.waves["response_status"] == "completed")]
        who = people.loc[rows["person"]]
        arm = (who["mode"] == "wellbeing").to_numpy(dtype=float)
        baseline = who["baseline_perma_overall_wellbeing"].to_numpy()
        beta, se = clustered_ols(rows["perma_overall_wellbeing"].to_numpy(), np.column_stack([arm, baseline]),
                                 rows["person"].to_numpy())
        assert abs(beta[1] - e.wellbeing_arm_perma_per_wave * k) < Z * se[1], wave
        assert se[1] < 0.02


def test_follow_ups_are_answered_with_the_effects_probability(large: SyntheticStudy) -> None:
    """Nobody withdraws here, so every follow-up whose window closed before the data were read was
    seen: answered with probability logistic(answer_logit + answer_per_baseline_point x (baseline -
    center)). (Windows still open are left out: their unanswered ones have not expired yet.)"""
    e = large.effects
    closed = large.waves[large.waves["closes_at"] <= pd.Timestamp(large.read_at)]
    assert set(closed["response_status"]) == {"completed", "expired"}
    baseline = large.people["baseline_perma_overall_wellbeing"].to_numpy()[closed["person"].to_numpy()]
    completed = (closed["response_status"] == "completed").to_numpy()
    expected = 1 / (1 + np.exp(-(e.answer_logit + e.answer_per_baseline_point * (baseline - e.baseline_center))))
    for rows in (np.abs(baseline - e.baseline_center) < 0.25, baseline > e.baseline_center + 1,
                 baseline < e.baseline_center - 1):
        p = expected[rows].mean()
        assert abs(completed[rows].mean() - p) < Z * math.sqrt(p * (1 - p) / rows.sum())
    centre = np.abs(baseline - e.baseline_center) < 0.25
    assert abs(expected[centre].mean() - 1 / (1 + math.exp(-e.answer_logit))) < 0.01


def test_withdrawal_follows_the_weekly_hazard() -> None:
    e = Effects()
    study = synthetic_study(12_000, seed=5, effects=e, chat=False)
    people = study.people
    centred = people["baseline_perma_overall_wellbeing"].to_numpy() - e.baseline_center
    weekly = 1 / (1 + np.exp(-(e.withdraw_weekly_logit + e.withdraw_per_baseline_point * centred)))
    enrolled_day = (people["enrolled_at"] - pd.Timestamp(study.start)).dt.days.to_numpy()
    withdrawn_day = (people["withdrawn_at"] - pd.Timestamp(study.start)).dt.days.to_numpy(dtype=float)
    within_week = withdrawn_day - enrolled_day <= 7  # planned each day from the day after enrollment
    assert abs(within_week.mean() - weekly.mean()) < Z * math.sqrt(weekly.mean() * (1 - weekly.mean()) / len(people))
    low = centred < -1  # the hazard depends on baseline: lower well-being, more withdrawal
    assert within_week[low].mean() > within_week[~low].mean()


def test_no_effects_zeroes_every_true_effect_and_the_data_follow() -> None:
    null = null_effects()
    assert all(effect["value"] == 0 for effect in null.true_effects().values())
    assert null.answer_logit == Effects().answer_logit  # only effects change, not the design
    study = synthetic_study(6_000, seed=2, effects=dataclasses.replace(null, regret_base=50.0))
    answered = study.waves[(study.waves["instrument_id"] == "decision-regret")
                           & (study.waves["response_status"] == "completed")]
    source = study.conversations.set_index("conversation_id").loc[answered["decision_conversation_id"].to_numpy()]
    beta, se = clustered_ols(answered["regret"].to_numpy(dtype=float),
                             (source["final_role"] == "coach").to_numpy(dtype=float)[:, None],
                             answered["person"].to_numpy())
    assert abs(beta[1]) < Z * se[1]


def test_rounded_items_are_the_slider_values_and_pull_down_near_the_ceiling() -> None:
    rounded = synthetic_study(500, seed=1, round_items=True, chat=False)
    loneliness = rounded.people["baseline_perma_loneliness"].dropna()
    assert loneliness.between(0, 10).all()
    assert (loneliness == loneliness.round()).all()
    continuous = synthetic_study(500, seed=1, chat=False)
    assert not (continuous.people["baseline_perma_loneliness"].dropna().round() ==
                continuous.people["baseline_perma_loneliness"].dropna()).all()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="participants"):
        synthetic_study(0)
    with pytest.raises(ValueError, match="time zone"):
        synthetic_study(5, start=dt.datetime(2026, 1, 1))  # noqa: DTZ001 - the point of the test
    protocol = load_protocol()
    assert study_weeks(protocol) == 7  # 14 enrollment days + perma-week-4 (28 days, 5-day window) + a margin
    no_baseline = protocol.model_copy(update={"baseline": []})
    with pytest.raises(ValueError, match="perma-profiler at baseline"):
        synthetic_study(5, protocol=no_baseline)
