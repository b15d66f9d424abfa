"""The panel and the survival table on a hand-built study run through the real services and the
dispatcher with a frozen clock. Every expected value is worked out by hand below: due times from
the protocol (10:00 local for PERMA, 18:00 local for regret, windows of 3 days), scores from the
answers given."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from analysis.panel import PANEL_COLUMNS, SURVIVAL_COLUMNS, iter_panel, panel, survival
from chat.models import Decision
from study import clock
from study.db import session_scope
from study.models import WithdrawalLevel
from tests.analysis.panel_builders import PanelBuilder, perma_answers

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # enrollment: a Monday, 10:00 in Berlin (CET)
MINUTE = dt.timedelta(minutes=1)
NOW = dt.datetime(2026, 3, 12, 10, 0, tzinfo=dt.UTC)  # when the data are read


def utc(text: str) -> pd.Timestamp:
    return pd.Timestamp(text, tz="UTC")


@dataclass
class Study:
    slug: str
    alice: str  # wellbeing, Berlin: completes week 1 and the regret survey of her decision
    bob: str  # control, Berlin: lets week 1 expire
    carol: str  # wellbeing, New York: withdraws (stop contact) on day 2
    dave: str  # control: withdraws and has his data deleted
    conversation: int
    decision: int


@pytest.fixture
def study(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> Study:
    build = PanelBuilder(engine, example_protocol)
    alice, bob = build.participant("wellbeing"), build.participant("control")
    carol = build.participant("wellbeing", timezone="America/New_York")
    dave = build.participant("control")

    frozen_clock.set(T0 + 10 * MINUTE)
    build.answer(alice, purpose="baseline", instrument="perma-profiler", answers=perma_answers(
        {"P": 6, "E": 5, "R": 7, "M": 8, "A": 4, "N": 3, "H": 6}, loneliness=2, happiness=7))
    build.answer(bob, purpose="baseline", instrument="perma-profiler", answers=perma_answers(
        dict.fromkeys("PERMANH", 5), loneliness=5, happiness=5))
    build.answer(carol, purpose="baseline", instrument="perma-profiler", answers=perma_answers(
        {"P": 2, "E": 3, "R": 4, "M": 3, "A": 2, "N": 7, "H": 4}, loneliness=8, happiness=2))
    build.answer(dave, purpose="baseline", instrument="perma-profiler", answers=perma_answers(
        dict.fromkeys("PERMANH", 9), loneliness=0, happiness=9))

    # Alice decides at 09:30 UTC (10:30 CET): regret-day-3 is due 5 March 18:00 CET = 17:00 UTC.
    frozen_clock.set(T0 + 20 * MINUTE)
    conversation = build.start(alice, "coach")
    frozen_clock.advance(MINUTE)
    build.say(alice, conversation, "Help me plan my week", "Sounds good. Start with Monday.")
    frozen_clock.set(T0 + 30 * MINUTE)
    build.end(alice, conversation, rating=None, decision="Stay at my job")

    frozen_clock.set(T0 + dt.timedelta(hours=1))
    build.withdraw(dave, WithdrawalLevel.DELETE_DATA)
    frozen_clock.set(dt.datetime(2026, 3, 4, 12, 0, tzinfo=dt.UTC))
    build.withdraw(carol, WithdrawalLevel.STOP_CONTACT)

    frozen_clock.set(dt.datetime(2026, 3, 5, 17, 0, tzinfo=dt.UTC))
    build.tick()  # opens alice's regret-day-3
    frozen_clock.set(dt.datetime(2026, 3, 5, 20, 0, tzinfo=dt.UTC))
    # Items 2 and 4 are reversed: 2, 6-4=2, 2, 6-5=1, 1 -> mean 1.6 -> (1.6 - 1) / 4 * 100 = 15.
    build.answer(alice, purpose="followup", instrument="decision-regret",
                 answers={"drs1": 2, "drs2": 4, "drs3": 2, "drs4": 5, "drs5": 1})

    frozen_clock.set(dt.datetime(2026, 3, 9, 9, 0, tzinfo=dt.UTC))
    build.tick()  # opens perma-week-1 for alice and bob (10:00 CET)
    frozen_clock.set(dt.datetime(2026, 3, 9, 12, 0, tzinfo=dt.UTC))
    build.answer(alice, purpose="followup", instrument="perma-profiler", answers=perma_answers(
        {"P": 8, "E": 6, "R": 7, "M": 9, "A": 5, "N": 2, "H": 7}, loneliness=1, happiness=8))

    frozen_clock.set(NOW)
    build.tick()  # bob's week-1 window closed at 12 March 09:00 UTC: expired
    with session_scope(engine) as session:
        decision = session.scalars(select(Decision.id).where(Decision.conversation_id == conversation)).one()
    return Study(build.slug, alice, bob, carol, dave, conversation, decision)


def check(row: Any, expected: dict[str, Any]) -> None:
    for name, value in expected.items():
        actual = row[name]
        if value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
            assert pd.isna(actual), (name, actual)
        elif isinstance(value, float):
            assert actual == pytest.approx(value, abs=1e-9), name
        else:
            assert actual == value, (name, actual, value)


def perma(prefix: str, p: float, e: float, r: float, m: float, a: float, n: float, h: float, lon: float,
          hap: float, overall: float) -> dict[str, float]:
    names = ("positive_emotion", "engagement", "relationships", "meaning", "accomplishment", "negative_emotion",
             "health", "loneliness", "happiness", "overall_wellbeing")
    return {f"{prefix}{name}": value for name, value in zip(names, (p, e, r, m, a, n, h, lon, hap, overall),
                                                               strict=True)}


NO_PERMA = perma("perma_", *[math.nan] * 10)


def test_panel_waves_times_statuses_and_scores(engine: Engine, study: Study) -> None:
    frame = panel(engine, study.slug)
    assert list(frame.columns) == list(PANEL_COLUMNS)
    assert study.dave not in set(frame["participant_code"])  # data deleted: absent
    rows = {(r["participant_code"], r["wave"]): r for _, r in frame.iterrows()}
    order = [(r.participant_code, r.wave) for r in frame.itertuples()]
    assert [wave for code, wave in order if code == study.alice] == [
        "baseline", "regret-day-3", "perma-week-1", "regret-day-14", "perma-week-4"]
    assert [wave for code, wave in order if code == study.bob] == ["baseline", "perma-week-1", "perma-week-4"]
    assert [wave for code, wave in order if code == study.carol] == ["baseline", "perma-week-1", "perma-week-4"]

    # Overall well-being is the mean of the 15 P/E/R/M/A items and 'hap': alice 3*(6+5+7+8+4)+7 = 97 / 16.
    alice_baseline = perma("baseline_perma_", 6, 5, 7, 8, 4, 3, 6, 2, 7, 97 / 16)
    alice = {"arm": "wellbeing", "mode": "wellbeing", "roles_used": "coach", "first_role": "coach",
             "participant_status": "enrolled", "enrolled_at": pd.Timestamp(T0), "withdrawn_at": pd.NaT,
             "timezone": "Europe/Berlin", "timezone_region": "Europe", **alice_baseline}
    check(rows[study.alice, "baseline"], {
        **alice, "anchor_key": "enrollment", "decision_id": None, "instrument_id": "perma-profiler",
        "instrument_version": "2016", "intended_at": pd.Timestamp(T0), "days_since_enrollment": 0.0,
        "opened_at": pd.Timestamp(T0), "response_started_at": pd.Timestamp(T0 + 10 * MINUTE),
        "submitted_at": pd.Timestamp(T0 + 10 * MINUTE), "response_status": "completed",
        **perma("perma_", 6, 5, 7, 8, 4, 3, 6, 2, 7, 97 / 16), "regret": None, "conv_n_conversations": None,
    })
    check(rows[study.alice, "regret-day-3"], {
        **alice, "anchor_key": f"decision:{study.decision}", "decision_id": study.decision,
        "decision_conversation_id": study.conversation, "instrument_id": "decision-regret",
        "instrument_version": "2003", "intended_at": utc("2026-03-05 17:00"), "intended_local": "2026-03-05T18:00",
        "days_since_enrollment": 3 + 8 / 24, "closes_at": utc("2026-03-08 17:00"),
        "opened_at": utc("2026-03-05 17:00"), "invitation_sent_at": utc("2026-03-05 17:00"),
        "submitted_at": utc("2026-03-05 20:00"), "response_status": "completed", "regret": 15.0, **NO_PERMA,
        "conv_n_conversations": 1, "conv_participant_turns": 1, "conv_roles_used": "coach",
        "conv_decisions_made": 1,
    })
    check(rows[study.alice, "perma-week-1"], {
        **alice, "anchor_key": "enrollment", "decision_id": None, "decision_conversation_id": None,
        "intended_at": utc("2026-03-09 09:00"), "intended_local": "2026-03-09T10:00", "days_since_enrollment": 7.0,
        "closes_at": utc("2026-03-12 09:00"), "opened_at": utc("2026-03-09 09:00"),
        "invitation_sent_at": utc("2026-03-09 09:00"), "response_started_at": utc("2026-03-09 12:00"),
        "submitted_at": utc("2026-03-09 12:00"), "response_status": "completed",
        **perma("perma_", 8, 6, 7, 9, 5, 2, 7, 1, 8, 113 / 16), "regret": None, "conv_n_conversations": 1,
    })
    check(rows[study.alice, "regret-day-14"], {
        "decision_id": study.decision, "intended_at": utc("2026-03-16 17:00"), "closes_at": utc("2026-03-20 17:00"),
        "opened_at": pd.NaT, "invitation_sent_at": pd.NaT, "submitted_at": pd.NaT, "instrument_version": None,
        "response_status": "not_yet_due", "regret": None,
    })
    # 30 March is after the change to summer time: 10:00 CEST = 08:00 UTC, 27 days 23 hours after enrollment.
    check(rows[study.alice, "perma-week-4"], {
        "intended_at": utc("2026-03-30 08:00"), "days_since_enrollment": 28 - 1 / 24, "opened_at": pd.NaT,
        "response_status": "not_yet_due", **NO_PERMA,
    })

    bob = {"arm": "control", "mode": "default", "roles_used": "", "first_role": None,
           **perma("baseline_perma_", *[5.0] * 10)}
    check(rows[study.bob, "baseline"], {**bob, "response_status": "completed"})
    check(rows[study.bob, "perma-week-1"], {
        **bob, "intended_at": utc("2026-03-09 09:00"), "closes_at": utc("2026-03-12 09:00"),
        "opened_at": utc("2026-03-09 09:00"), "invitation_sent_at": utc("2026-03-09 09:00"),
        "response_started_at": pd.NaT, "submitted_at": pd.NaT, "response_status": "expired", **NO_PERMA,
        "conv_n_conversations": 0, "conv_participant_turns": 0,
    })
    check(rows[study.bob, "perma-week-4"], {"response_status": "not_yet_due"})

    # Carol, New York: US summer time starts 8 March, so 10:00 on 9 March is 14:00 UTC.
    carol = {"participant_status": "withdrawn", "withdrawn_at": utc("2026-03-04 12:00"),
             "timezone": "America/New_York", "timezone_region": "America",
             **perma("baseline_perma_", 2, 3, 4, 3, 2, 7, 4, 8, 2, 44 / 16)}
    check(rows[study.carol, "baseline"], {**carol, "response_status": "completed",
                                          "submitted_at": pd.Timestamp(T0 + 10 * MINUTE)})
    check(rows[study.carol, "perma-week-1"], {**carol, "intended_at": utc("2026-03-09 14:00"),
                                              "opened_at": pd.NaT, "response_status": "withdrawn"})
    check(rows[study.carol, "perma-week-4"], {**carol, "intended_at": utc("2026-03-30 14:00"),
                                              "response_status": "withdrawn"})


def test_survival_durations_and_censoring(engine: Engine, study: Study) -> None:
    frame = survival(engine, study.slug)
    assert list(frame.columns) == list(SURVIVAL_COLUMNS)
    rows = frame.set_index("participant_code")
    assert sorted(rows.index) == sorted([study.alice, study.bob, study.carol])
    check(rows.loc[study.alice], {  # still has follow-ups pending: censored when read, 10 days 1 hour in
        "arm": "wellbeing", "roles_used": "coach", "first_role": "coach", "event": 0, "event_type": "censored",
        "event_at": pd.Timestamp(NOW), "duration_days": 10 + 1 / 24, "event_wave": None,
        "censored_because": "data_cut",
    })
    # Week 1 expired when its window closed on 12 March 09:00 UTC, but week 4 is still to come: not dropout
    # yet. Censored when read, at one second before week 1's scheduled close, the median over alice and
    # bob (and carol, whose week 1 the withdrawal cancelled) of 10 days, 10 days and 10 days 5 hours.
    check(rows.loc[study.bob], {
        "arm": "control", "mode": "default", "event": 0, "event_type": "censored",
        "event_at": pd.Timestamp(NOW), "duration_days": 10.0 - 1 / 86_400, "event_wave": None,
        "censored_because": "data_cut",
    })
    check(rows.loc[study.carol], {  # withdrew 4 March 12:00, 2 days 3 hours in: the competing event
        "event": 0, "event_type": "withdrew", "event_at": utc("2026-03-04 12:00"), "duration_days": 2.125,
        "event_wave": None, "censored_because": "withdrew",
    })


def test_the_panel_in_chunks_of_participants_is_the_same_panel(engine: Engine, study: Study) -> None:
    whole = panel(engine, study.slug)
    chunks = list(iter_panel(engine, study.slug, chunk_participants=1))
    assert len(chunks) == 4  # one per participant; dave's (data deleted) is empty
    joined = pd.concat([c for c in chunks if not c.empty], ignore_index=True)
    joined = joined.sort_values("participant_code", kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(joined, whole, check_dtype=False)


def test_every_column_is_documented() -> None:
    for table in (PANEL_COLUMNS, SURVIVAL_COLUMNS):
        for name, column in table.items():
            assert column.definition.endswith("."), name
            assert column.type in ("integer", "number", "string", "boolean", "datetime"), name


def test_survival_censors_at_the_end_of_follow_up_once_every_wave_is_done(
        engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> None:
    build = PanelBuilder(engine, example_protocol)
    erin = build.participant("control")
    answers = perma_answers(dict.fromkeys("PERMANH", 6), loneliness=4, happiness=6)
    build.answer(erin, purpose="baseline", instrument="perma-profiler", answers=answers)
    for due in (dt.datetime(2026, 3, 9, 9, 0, tzinfo=dt.UTC), dt.datetime(2026, 3, 30, 8, 0, tzinfo=dt.UTC)):
        frozen_clock.set(due)
        build.tick()
        frozen_clock.set(due + dt.timedelta(hours=2))
        build.answer(erin, purpose="followup", instrument="perma-profiler", answers=answers)
    frozen_clock.set(dt.datetime(2026, 4, 20, 0, 0, tzinfo=dt.UTC))
    build.tick()
    [row] = [r for _, r in survival(engine, build.slug).iterrows()]
    # Week 4's window closes 4 April 08:00 UTC (10:00 CEST on 30 March, plus 5 days): 32 days and 23 hours
    # after enrollment on 2 March 09:00, whenever she answered.
    check(row, {"participant_code": erin, "event": 0, "event_type": "censored",
                "censored_because": "end_of_follow_up", "event_at": utc("2026-04-04 08:00"),
                "event_wave": "perma-week-4", "duration_days": 32 + 23 / 24})
    frame = panel(engine, build.slug).set_index("wave")
    assert frame["response_status"].to_dict() == {
        "baseline": "completed", "perma-week-1": "completed", "perma-week-4": "completed"}
    # No conversation in the whole study: follow-up waves have zero before them, baseline none.
    assert frame["conv_n_conversations"].tolist()[1:] == [0, 0]
    assert frame["conv_n_conversations"].isna().tolist() == [True, False, False]
