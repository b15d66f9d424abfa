"""Dropout done by hand: a small study run through the real services and dispatcher with a frozen
clock, whose survival table, Kaplan-Meier curves, log-rank test, cumulative incidence, Cox
estimate and proportional-hazards test are worked out below with pencil and paper; and the
example study drawn with no dropout effect, whose curves stay at the completion rate.

The hand-built study (``THREE_WAVES``): PERMA at days 7, 14 and 28 after enrollment, windows of 3,
3 and 5 days, sent at 10:00 in the participant's zone (UTC). Everyone enrolls on 2 March 2026 at
10:00 UTC, so every window closes on the same day for everyone: day 10, day 17 and day 33.

    A wellbeing  answers every wave                    censored, end of follow-up, day 33
    B control    answers every wave                    censored, end of follow-up, day 33
    C wellbeing  answers every wave                    censored, end of follow-up, day 33
    D control    answers week 1, withdraws on day 12   withdrew (competing), day 12
    E wellbeing  answers weeks 1 and 2, misses week 4  stopped answering, day 33 (the final wave)
    F wellbeing  misses week 2, answers week 4         censored, end of follow-up, day 33
    G control    misses every wave                     stopped answering, day 10
"""

from __future__ import annotations

import datetime as dt
import math
import warnings
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd
import pytest
from lifelines import AalenJohansenFitter
from scipy import stats
from sqlalchemy.engine import Engine

from analysis.estimates import StudyData, dropout_survival
from analysis.estimates.dropout import PH_TRANSFORMS, aalen_johansen
from analysis.features import conversation_features
from analysis.panel import SURVIVAL_COLUMNS, attrition, panel, survival
from analysis.simulation.synthetic import null_effects, synthetic_study
from study import clock
from study.models import WithdrawalLevel
from tests.analysis.panel_builders import PanelBuilder, perma_answers

T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)
ANSWERS = perma_answers(dict.fromkeys("PERMANH", 6), loneliness=4, happiness=6)
WEEK_2 = """  - id: perma-week-2
    instrument: perma-profiler
    anchor: enrollment
    offset: P14D
    window: P3D
    reminders: [P1D]
    send_at_local: "10:00"
  - id: perma-week-4
"""
# arm, and which of week 1, 2, 4 each answers (or "withdraws" on day 12, after week 1)
PEOPLE = {"A": ("wellbeing", "124"), "B": ("control", "124"), "C": ("wellbeing", "124"),
          "D": ("control", "1 withdraws"), "E": ("wellbeing", "12"), "F": ("wellbeing", "14"), "G": ("control", "")}


def day(n: float) -> dt.datetime:
    return T0 + dt.timedelta(days=n)


@dataclass
class Built:
    slug: str
    codes: dict[str, str]  # letter -> participant code

    def letters(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` indexed by the people's letters."""
        back = {code: letter for letter, code in self.codes.items()}
        return frame.assign(who=frame["participant_code"].map(back)).set_index("who").sort_index()


def play(engine: Engine, protocol: str, frozen_clock: clock.FrozenClock, until: float) -> Built:
    """The study through the services, played up to day ``until``, when it is read."""
    assert protocol.count("  - id: perma-week-4\n") == 1
    build = PanelBuilder(engine, protocol.replace("  - id: perma-week-4\n", WEEK_2))
    frozen_clock.set(T0)
    codes = {letter: build.participant(arm, timezone="UTC") for letter, (arm, _) in PEOPLE.items()}
    frozen_clock.set(T0 + dt.timedelta(minutes=10))
    for code in codes.values():
        build.answer(code, purpose="baseline", instrument="perma-profiler", answers=ANSWERS)
    for wave, due, closes in (("1", 7, 10), ("2", 14, 17), ("4", 28, 33)):
        if due > until:
            break
        frozen_clock.set(day(due))
        build.tick()  # opens the wave for everyone still taking part
        frozen_clock.set(day(due) + dt.timedelta(hours=2))
        for letter, (_, answers) in PEOPLE.items():
            if wave in answers.split(" ")[0]:
                build.answer(codes[letter], purpose="followup", instrument="perma-profiler", answers=ANSWERS)
        frozen_clock.set(day(closes) + dt.timedelta(minutes=1))
        build.tick()  # the unanswered ones expire
        if wave == "1":
            frozen_clock.set(day(12))
            build.withdraw(codes["D"], WithdrawalLevel.STOP_CONTACT)
    frozen_clock.set(day(until))
    return Built(build.slug, codes)


@pytest.fixture
def built(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> Built:
    return play(engine, example_protocol, frozen_clock, until=40)


def test_the_survival_table_by_hand(engine: Engine, built: Built) -> None:
    table = survival(engine, built.slug)
    assert list(table.columns) == list(SURVIVAL_COLUMNS)
    rows = built.letters(table)
    expected = {  # event, event_type, censored_because, event_wave, event_at (days after T0), duration_days
        "A": (0, "censored", "end_of_follow_up", "perma-week-4", 33, 33.0),
        "B": (0, "censored", "end_of_follow_up", "perma-week-4", 33, 33.0),
        "C": (0, "censored", "end_of_follow_up", "perma-week-4", 33, 33.0),
        "D": (0, "withdrew", "withdrew", None, 12, 12.0),
        "E": (1, "stopped_answering", None, "perma-week-4", 33, 33.0),
        "F": (0, "censored", "end_of_follow_up", "perma-week-4", 33, 33.0),
        "G": (1, "stopped_answering", None, "perma-week-1", 10, 10.0),
    }
    for letter, (event, kind, because, wave, at, duration) in expected.items():
        row = rows.loc[letter]
        assert (row["event"], row["event_type"]) == (event, kind), letter
        assert (row["censored_because"] if pd.notna(row["censored_because"]) else None) == because, letter
        assert (row["event_wave"] if pd.notna(row["event_wave"]) else None) == wave, letter
        assert row["event_at"] == pd.Timestamp(day(at)), letter
        assert row["duration_days"] == pytest.approx(duration, abs=1e-9), letter
    counts = attrition(engine, built.slug).set_index(["arm", "event_type"])["participants"].to_dict()
    assert counts == {("control", "censored"): 1, ("control", "stopped_answering"): 1, ("control", "withdrew"): 1,
                      ("wellbeing", "censored"): 3, ("wellbeing", "stopped_answering"): 1}


def test_read_before_follow_up_ends_a_miss_with_a_window_to_come_is_censored_just_before_its_close(
        engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> None:
    """Read on day 20, week 4 still to come: F has missed week 2 and G weeks 1 and 2, but either may
    answer week 4 (F will), so neither has stopped yet. Each is censored one second before the close
    of the window whose outcome is unknown (day 17, day 10), so nobody counts as still answering
    past it; those who answered both are censored at the data cut, day 20."""
    built = play(engine, example_protocol, frozen_clock, until=20)
    rows = built.letters(survival(engine, built.slug))
    second = 1 / 86_400
    for letter, days in {"F": 17 - second, "G": 10 - second, "A": 20.0, "B": 20.0, "C": 20.0, "E": 20.0}.items():
        assert list(rows.loc[letter, ["event", "censored_because"]]) == [0, "data_cut"], letter
        assert rows.loc[letter, "event_at"] == pd.Timestamp(day(20)), letter
        assert rows.loc[letter, "duration_days"] == pytest.approx(days, abs=1e-9), letter
    assert list(rows.loc["D", ["event_type", "duration_days"]]) == ["withdrew", 12.0]
    assert set(attrition(engine, built.slug)["event_type"]) == {"censored", "withdrew"}


def test_the_curves_tests_and_cox_estimate_by_hand(engine: Engine, built: Built) -> None:
    data = StudyData(panel=panel(engine, built.slug), conversations=conversation_features(engine, built.slug),
                     survival=survival(engine, built.slug))
    fit = dropout_survival(data, covariates=["arm"], completion_model=False)

    # Kaplan-Meier (withdrawal censored). Control (B, D, G): at day 10, 1 of 3 stops -> 2/3; D is
    # censored at 12 and B at 33. Wellbeing (A, C, E, F): at day 33, 1 of 4 stops -> 3/4. Everyone
    # (first role 'none', nobody chatted): 6/7 at day 10, then 6/7 x 4/5 = 24/35 at day 33.
    def curve(by: str, group: str) -> pd.DataFrame:
        return fit.curves[(fit.curves["by"] == by) & (fit.curves["group"] == group)]

    control, wellbeing, everyone = curve("arm", "control"), curve("arm", "wellbeing"), curve("role", "none")
    assert control["days"].tolist() == [0.0, 10.0, 12.0, 33.0]
    np.testing.assert_allclose(control["survival"], [1, 2 / 3, 2 / 3, 2 / 3])
    assert control["at_risk"].tolist() == [3, 3, 2, 1]
    assert wellbeing["days"].tolist() == [0.0, 33.0]
    np.testing.assert_allclose(wellbeing["survival"], [1, 3 / 4])
    np.testing.assert_allclose(everyone["survival"], [1, 6 / 7, 6 / 7, 24 / 35])
    groups = fit.groups.set_index(["by", "group"])
    assert list(groups.loc[("arm", "control"), ["participants", "events", "withdrew"]]) == [3, 1, 1]
    assert list(groups.loc[("arm", "wellbeing"), ["participants", "events", "withdrew"]]) == [4, 1, 0]
    assert groups.loc[("arm", "wellbeing"), "still_answering"] == pytest.approx(3 / 4)
    assert np.isinf(groups["median_days"]).all()  # not reached: never below one half

    # Log-rank by arm. Day 10: 7 at risk, 3 control, the one stopper is control: E = 3/7, V = 3*4*1*6/(49*6).
    # Day 33: 5 at risk (B and A, C, E, F), 1 control, the stopper is wellbeing: E = 1/5, V = 1*4*1*4/(25*4).
    # O - E = 1 - 22/35 = 13/35, V = 12/49 + 4/25 = 496/1225, chi-square = 169/496.
    logrank = fit.logrank.set_index("by").loc["arm"]
    assert logrank["test_statistic"] == pytest.approx(169 / 496, rel=1e-12)
    assert logrank["p"] == pytest.approx(stats.chi2.sf(169 / 496, 1), rel=1e-9)

    # Cox, x = 1 for wellbeing (control is the reference, its mode being default). No tied stops, so
    # Efron's likelihood is Cox's. With y = exp(beta) the score is
    #   (0 - 4y / (4y + 3)) + (1 - 4y / (4y + 1)) = 0  ->  16 y^2 = 3  ->  beta = log(sqrt(3) / 4),
    # and the information is the sum of p(1 - p) over the two risk sets, p = 4y/(4y+3) and 4y/(4y+1):
    # 2 sqrt(3) / (sqrt(3) + 3) * 3 / (sqrt(3) + 3) = 2 sqrt(3) - 3.
    [cox] = fit.cox.to_dict(orient="records")
    assert cox["term"] == "wellbeing vs control"
    assert cox["coef"] == pytest.approx(math.log(math.sqrt(3) / 4), abs=1e-7)
    assert cox["hazard_ratio"] == pytest.approx(math.sqrt(3) / 4, abs=1e-7)
    assert cox["se"] == pytest.approx(1 / math.sqrt(2 * math.sqrt(3) - 3), abs=1e-6)
    assert fit.sample.participants == 7
    assert fit.sample.withdrawn == 1

    # R's cox.zph: g = 1 - KM(t-) over everyone is 0 at day 10 and 1/7 at day 33; centred over the two
    # stops, -1/14 and 1/14. Both risk sets have the same variance v = p(1 - p) (p at day 33 is 1 - p at
    # day 10), so I_bg = 0, I_gg = 2v/196, u_g = (p + 1 - (1 - p)) / 14 = p / 7 with p = sqrt(3)/(sqrt(3)+3),
    # and the statistic (p/7)^2 / (2v/196) = 2p / (1 - p) = 2 / sqrt(3). With two event times every
    # transform is a line through the same two points, so each gives the same.
    for transform in PH_TRANSFORMS:
        table = dropout_survival(data, covariates=["arm"], ph_transform=transform,
                                 completion_model=False).proportional_hazards
        assert table["term"].tolist() == ["arm", "GLOBAL"]
        np.testing.assert_allclose(table["test_statistic"], [2 / math.sqrt(3)] * 2, rtol=1e-6)
        assert set(table["transform"]) == {transform}

    # Cumulative incidence (Aalen-Johansen), control: G stops at day 10 (1/3); D withdraws at day 12,
    # 2 at risk after 2/3 still in: 2/3 * 1/2 = 1/3. Wellbeing: 1/4 stop at day 33, nobody withdraws.
    incidence = fit.cumulative_incidence.groupby(["group", "cause"])["cumulative_incidence"].last()
    assert incidence.to_dict() == pytest.approx({("control", "stopped_answering"): 1 / 3,
                                                 ("control", "withdrew"): 1 / 3,
                                                 ("wellbeing", "stopped_answering"): 1 / 4,
                                                 ("wellbeing", "withdrew"): 0.0})
    assert fit.response.empty  # the completion model was not asked for
    assert fit.response_sample is None
    assert not any("Completion model" in note for note in fit.notes)


def test_the_cumulative_incidence_is_lifelines_aalen_johansen() -> None:
    """On a frame typed by hand (no stop and withdrawal at the same time, so lifelines does not
    jitter): the same estimate and 95% interval at every time."""
    durations = [2, 3, 3, 4, 5, 5, 6, 7, 8, 9, 9, 10]
    causes = [1, 0, 1, 2, 1, 1, 0, 2, 1, 0, 0, 1]
    ours = aalen_johansen(durations, causes, 1).set_index("days")
    theirs = AalenJohansenFitter(calculate_variance=True).fit(durations, causes, event_of_interest=1)
    np.testing.assert_allclose(ours["cumulative_incidence"], theirs.cumulative_density_["CIF_1"].to_numpy(),
                               rtol=1e-12)
    band = theirs.confidence_interval_.to_numpy()
    # lifelines has no interval at day 0 (incidence 0) nor at day 10, where the one left at risk stops:
    # its variance term d / (n (n - d)) (F(t) - F(t_j))^2 is infinity times 0 there, and the limit 0 is ours.
    inside = ~np.isnan(band).any(axis=1)
    assert ours.index[~inside].tolist() == [0, 10]
    assert ours["ci_low"].notna().tolist() == [False] + [True] * (len(ours) - 1)
    np.testing.assert_allclose(ours.loc[inside, "ci_low"], band[inside].min(axis=1), rtol=1e-9)
    np.testing.assert_allclose(ours.loc[inside, "ci_high"], band[inside].max(axis=1), rtol=1e-9)


# The input frames, and the completion model when there is nothing to model


def small_frames(statuses: dict[str, list[str]]) -> StudyData:
    """A panel and survival table built by hand: participant -> statuses of their two follow-ups
    (p1, p2 control; p3, p4 wellbeing)."""
    arms = {"p1": "control", "p2": "control", "p3": "wellbeing", "p4": "wellbeing"}
    rows = [{"participant_code": code, "arm": arms[code], "mode": "default" if arms[code] == "control" else "wellbeing",
             "wave": wave, "days_since_enrollment": days, "response_status": status,
             "baseline_perma_overall_wellbeing": 5.0 + i}
            for i, (code, waves) in enumerate(statuses.items())
            for (wave, days), status in zip((("baseline", 0.0), ("w1", 7.0), ("w2", 28.0)), ["completed", *waves],
                                            strict=True)]
    people = pd.DataFrame({"participant_code": list(arms), "arm": list(arms.values()),
                           "duration_days": [10.0, 33.0, 33.0, 33.0], "event": [1, 0, 0, 0]})
    return StudyData(panel=pd.DataFrame(rows), survival=people)


@pytest.mark.parametrize(("statuses", "sentence"), [
    ({"p1": ["completed", "completed"], "p2": ["completed", "completed"], "p3": ["completed", "completed"],
      "p4": ["completed", "completed"]}, "every follow-up whose window closed was completed, so there is nothing"),
    ({"p1": ["expired", "completed"], "p2": ["completed", "expired"], "p3": ["completed", "completed"],
      "p4": ["completed", "completed"]}, "in arm wellbeing every follow-up whose window closed was completed, so the "
                                         "arm's log-odds are infinite (perfect separation)"),
])
def test_the_completion_model_is_skipped_with_a_sentence_and_no_warning(statuses: dict[str, list[str]],
                                                                       sentence: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = dropout_survival(small_frames(statuses), covariates=["arm"])
    assert [str(w.message) for w in caught] == []
    assert fit.response.empty
    assert fit.response_fit is None
    [note] = [n for n in fit.notes if n.startswith("Completion model")]
    assert sentence in note
    assert not dropout_survival(small_frames(statuses), covariates=["arm"], completion_model=False).response_sample


def test_a_missing_input_column_is_named() -> None:
    data = small_frames({"p1": ["expired", "completed"], "p2": ["completed", "expired"],
                         "p3": ["completed", "expired"], "p4": ["completed", "completed"]})
    with pytest.raises(ValueError, match="survival table has no column 'duration_days'"):
        dropout_survival(StudyData(panel=data.panel, survival=data.survival.drop(columns="duration_days")))
    without_status = data.panel.drop(columns="response_status")
    with pytest.raises(ValueError, match="panel has no column 'response_status', which dropout_survival with "
                                         "completion_model=True needs"):
        dropout_survival(StudyData(panel=without_status, survival=data.survival), covariates=["arm"])
    fit = dropout_survival(StudyData(panel=without_status, survival=data.survival), covariates=["arm"],
                           completion_model=False)
    assert fit.cox["term"].tolist() == ["wellbeing vs control"]
    with pytest.raises(ValueError, match="event must be 0 or 1"):
        dropout_survival(StudyData(panel=data.panel, survival=data.survival.assign(event=2)))


# The example study with no dropout effect


def test_on_the_example_study_with_no_dropout_effect_the_curves_stay_at_the_completion_rate() -> None:
    """The example protocol (week 1 and week 4) drawn for 3,000 people with every effect zero: each
    follow-up answered with the same chance whoever you are, withdrawal likewise. A participant is
    still answering at the end exactly when they answer week 4, so each arm's curve ends at the
    share of closed week-4 follow-ups that were completed (within a few of its standard errors: the
    two are estimated from the same people, the curve counting a week-1 miss followed by withdrawal
    as stopping). Every step is at one of the two waves' scheduled closes; the hazard ratios cover 1;
    with everyone followed to the end the cumulative incidences are the shares who stopped and
    withdrew."""
    study = synthetic_study(3000, seed=21, effects=null_effects(), chat=False)
    data = StudyData(panel=study.panel(), survival=study.survival(), read_at=study.read_at)
    fit = dropout_survival(data)
    table = data.survival
    assert set(table["censored_because"].dropna()) == {"end_of_follow_up", "withdrew"}  # read after every close
    scheduled = table.groupby("event_wave")["duration_days"].unique()
    assert {wave: len(days) for wave, days in scheduled.items()} == {"perma-week-1": 1, "perma-week-4": 1}

    week4 = data.panel[data.panel["wave"] == "perma-week-4"]
    for arm, rows in week4.groupby("arm"):
        closed = rows["response_status"].isin(("completed", "expired"))
        rate = (rows["response_status"] == "completed").sum() / closed.sum()
        se = math.sqrt(rate * (1 - rate) / closed.sum())
        curve = fit.curves[(fit.curves["by"] == "arm") & (fit.curves["group"] == arm)]
        assert 0.7 < rate < 0.9
        assert abs(curve["survival"].iloc[-1] - rate) < 3 * se, (arm, curve["survival"].iloc[-1], rate)
        assert curve["survival"].min() == curve["survival"].iloc[-1] > rate - 3 * se
        steps = curve.loc[curve["events"] > 0, "days"]
        assert sorted(steps) == sorted(float(days[0]) for days in scheduled), arm
        people = table[table["arm"] == arm]
        final = fit.cumulative_incidence[(fit.cumulative_incidence["group"] == arm)].groupby("cause").last()
        assert final.loc["stopped_answering", "cumulative_incidence"] == pytest.approx(
            (people["event_type"] == "stopped_answering").mean(), rel=1e-9)
        assert final.loc["withdrew", "cumulative_incidence"] == pytest.approx(
            (people["event_type"] == "withdrew").mean(), rel=1e-9)
    assert (fit.cox["hr_low"] < 1).all()
    assert (fit.cox["hr_high"] > 1).all()
    assert np.isinf(fit.groups["median_days"]).all()  # not reached: never below one half


def test_the_participant_flow_by_hand(engine: Engine, built: Built) -> None:
    """The CONSORT-style flow of the hand-built study read on day 40: seven joined, consented and were
    randomized (wellbeing A, C, E, F; control B, D, G); every wave by arm as the docstring's table
    says, D counted as withdrawn before weeks 2 and 4."""
    from analysis.flow import flow_table, participant_flow

    flow = flow_table(participant_flow(engine, built.slug)).set_index("stage")
    assert list(flow.columns) == ["control", "wellbeing", "all"]

    def row(stage: str) -> tuple[int, ...]:
        counts = cast(pd.Series, flow.loc[stage, ["control", "wellbeing", "all"]])
        return tuple(counts.astype(int).tolist())

    for stage in ("joined through an invite", "signed consent"):  # before randomization: no arm yet
        assert flow.loc[stage, "all"] == 7
        assert flow.loc[stage, ["control", "wellbeing"]].isna().all()
    assert row("randomized") == (3, 4, 7)
    assert row("baseline: answered") == (3, 4, 7)
    expected = {  # (control, wellbeing) per outcome
        "perma-week-1": {"answered": (2, 4), "missed": (1, 0), "withdrawn before it": (0, 0)},
        "perma-week-2": {"answered": (1, 3), "missed": (1, 1), "withdrawn before it": (1, 0)},
        "perma-week-4": {"answered": (1, 3), "missed": (1, 1), "withdrawn before it": (1, 0)},
    }
    for wave, outcomes in expected.items():
        for outcome, (control, wellbeing) in outcomes.items():
            assert row(f"{wave}: {outcome}") == (control, wellbeing, control + wellbeing), (wave, outcome)
        assert row(f"{wave}: still to come") == (0, 0, 0)
    weeks = [stage for stage in flow.index if stage.startswith("perma-week")]
    assert [w.split(":")[0] for w in weeks[::4]] == ["perma-week-1", "perma-week-2", "perma-week-4"]  # in time order
    assert row("withdrew (at any time)") == (1, 0, 1)
    assert row("of whom data deleted at their request") == (0, 0, 0)
