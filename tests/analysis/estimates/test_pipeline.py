"""``analysis.estimates`` through the database: a hand-built study against direct fits, and a
simulated study run through the real services with its stored true effects."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
import statsmodels.api as sm
from lifelines import CoxPHFitter, KaplanMeierFitter
from sqlalchemy.engine import Engine
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from analysis.estimates import StudyData, dropout_survival, perma_trajectories, regret_model
from analysis.simulation.population import Effects
from analysis.simulation.simulate import load_simulated_study, simulate
from analysis.tables import SimulationRun
from study import clock
from study.db import session_scope
from study.models import Study, WithdrawalLevel
from tests.analysis.estimates.drawn import agrees, pick, same
from tests.analysis.panel_builders import PanelBuilder, perma_answers

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # enrollment: a Monday, 10:00 in Berlin


def overall(domains: int, happiness: int) -> float:
    """Overall well-being when every PERMA item is ``domains`` and 'hap' is ``happiness``."""
    return (15 * domains + happiness) / 16


# arm, baseline (domains, happiness), week 1, week 4 (None: left to expire; "withdrew": withdrew before it)
PEOPLE: list[tuple[str, tuple[int, int], Any, Any]] = [
    ("wellbeing", (6, 7), (7, 8), (7, 7)),
    ("control", (4, 5), (4, 4), (5, 5)),
    ("wellbeing", (7, 6), (8, 8), (9, 8)),
    ("control", (5, 6), (5, 5), (4, 5)),
    ("wellbeing", (5, 4), (6, 6), None),
    ("control", (8, 7), (7, 7), "withdrew"),
    ("wellbeing", (4, 3), None, (6, 5)),
    ("control", (7, 8), None, None),
]


def test_the_pipeline_on_a_hand_built_study_equals_direct_fits(engine: Engine, example_protocol: str,
                                                                frozen_clock: clock.FrozenClock) -> None:
    build = PanelBuilder(engine, example_protocol)
    codes = [build.participant(arm) for arm, *_ in PEOPLE]
    frozen_clock.set(T0 + dt.timedelta(minutes=10))
    for code, (_, (d, h), _, _) in zip(codes, PEOPLE, strict=True):
        build.answer(code, purpose="baseline", instrument="perma-profiler",
                     answers=perma_answers(dict.fromkeys("PERMANH", d), loneliness=3, happiness=h))
    # Week 1 is due 9 March 10:00 Berlin (09:00 UTC), its window closes 12 March; week 4 is due 30 March
    # 10:00 CEST (08:00 UTC) and closes 4 April.
    for due, index, closes in ((dt.datetime(2026, 3, 9, 9, tzinfo=dt.UTC), 2, dt.datetime(2026, 3, 13, tzinfo=dt.UTC)),
                               (dt.datetime(2026, 3, 30, 8, tzinfo=dt.UTC), 3,
                                dt.datetime(2026, 4, 5, 12, tzinfo=dt.UTC))):
        frozen_clock.set(due)
        build.tick()
        frozen_clock.set(due + dt.timedelta(hours=2))
        for code, person in zip(codes, PEOPLE, strict=True):
            answer: Any = person[index]
            if isinstance(answer, tuple):
                d, h = answer
                build.answer(code, purpose="followup", instrument="perma-profiler",
                             answers=perma_answers(dict.fromkeys("PERMANH", int(d)), loneliness=3, happiness=int(h)))
        frozen_clock.set(closes)
        build.tick()  # the unanswered ones expire
        if index == 2:
            frozen_clock.set(dt.datetime(2026, 3, 20, 12, tzinfo=dt.UTC))
            build.withdraw(codes[5], WithdrawalLevel.STOP_CONTACT)

    data = StudyData.load(engine, build.slug)
    assert data.read_at == dt.datetime(2026, 4, 5, 12, tzinfo=dt.UTC)

    # The mixed model: the completed follow-ups, by hand.
    rows: list[dict[str, Any]] = []
    for code, (arm, (bd, bh), *waves) in zip(codes, PEOPLE, strict=True):
        for k, answer in enumerate(waves, start=1):
            if isinstance(answer, tuple):
                rows.append({"participant": code, "wave": float(k), "baseline": overall(bd, bh),
                             "wellbeing": float(arm == "wellbeing"), "y": overall(*answer)})
    table = pd.DataFrame(rows).sort_values(["participant", "wave"]).reset_index(drop=True)
    assert len(table) == 11
    # Time: each wave's day since enrollment (week 1 due 7 days after enrollment, week 4 at 27 days
    # 23 hours, Berlin's clocks having moved), as the panel reads it, the same for every participant.
    follow_ups = data.panel[(data.panel["instrument_id"] == "perma-profiler") & (data.panel["wave"] != "baseline")]
    by_wave = follow_ups.groupby("wave")["days_since_enrollment"]
    assert (by_wave.max() - by_wave.min()).max() < 1e-9
    median_days = by_wave.median().sort_values().to_numpy(float)
    assert median_days[1] - median_days[0] == pytest.approx(20 + 23 / 24)
    day = table["wave"].map({1.0: median_days[0], 2.0: median_days[1]})
    design = pd.DataFrame({"Intercept": 1.0, "baseline": table["baseline"], "day": day,
                           "wellbeing": table["wellbeing"], "wellbeing_day": table["wellbeing"] * day})
    # Seven people, eleven rows: the participant variance is estimated at its boundary (0). The
    # direct fit warns; the pipeline says so in its notes instead.
    with pytest.warns(ConvergenceWarning, match="boundary"):
        direct = sm.MixedLM(table["y"], design, groups=table["participant"]).fit(reml=True)
    fit = perma_trajectories(data, random_slopes=False)
    agrees(fit.fixed_effects["estimate"], direct.fe_params)
    agrees(fit.fixed_effects["se"], direct.bse_fe)
    assert any("boundary of the parameter space" in note for note in fit.notes)
    sample = fit.samples["overall_wellbeing"]
    assert (sample.participants, sample.observations) == (7, 11)
    assert (sample.eligible_participants, sample.eligible_observations, sample.withdrawn) == (8, 16, 1)
    week1, week4 = pick(sample.missingness, wave="perma-week-1"), pick(sample.missingness, wave="perma-week-4")
    assert week1[["completed", "expired", "used"]].tolist() == [6, 2, 6]
    assert week4[["completed", "expired", "withdrawn", "used"]].tolist() == [5, 2, 1, 5]

    # Survival, by hand: answered the last wave -> censored at the end of follow-up, week 4's close
    # (4 April 08:00 UTC: 32 days 23 hours), also for the one who missed week 1 and answered week 4;
    # missed week 4 -> stopped at its close; withdrew on 20 March 12:00 -> censored (a competing
    # event) at 18.125 days; missed both -> stopped at week 1's close, 12 March 09:00 (10 days).
    duration = [32 + 23 / 24] * 5 + [18.125, 32 + 23 / 24, 10.0]
    event = [0, 0, 0, 0, 1, 0, 0, 1]
    people = pd.DataFrame({"participant": codes, "duration_days": duration, "event": event,
                           "baseline_wellbeing": [overall(*p[1]) for p in PEOPLE],
                           "wellbeing": [float(p[0] == "wellbeing") for p in PEOPLE]}).sort_values("participant")
    survival = dropout_survival(data)
    for arm in ("wellbeing", "control"):
        part = people[people["wellbeing"] == float(arm == "wellbeing")]
        km = KaplanMeierFitter().fit(part["duration_days"], part["event"], label="km")
        curve = survival.curves[(survival.curves["by"] == "arm") & (survival.curves["group"] == arm)]
        same(curve["survival"], km.survival_function_["km"])
        same(curve["ci_low"], km.confidence_interval_["km_lower_0.95"])
    cox = CoxPHFitter().fit(people[["baseline_wellbeing", "wellbeing", "duration_days", "event"]],
                            duration_col="duration_days", event_col="event")
    same(survival.cox["coef"], cox.params_)
    same(survival.cox["se"], cox.standard_errors_)
    assert survival.sample.withdrawn == 1


def test_a_simulated_study_recovers_the_coach_effect_on_regret(engine: Engine, example_protocol: str) -> None:
    """Through the real services (about 40 s): the stored true coach effect lies in the interval.
    Regret noise is lowered from the defaults so 50 participants over 3 weeks are enough."""
    slug = load_simulated_study(engine, example_protocol)
    with session_scope(engine) as session:  # the arms come from the study's randomization: fix it
        session.execute(sa.update(Study).where(Study.slug == slug).values(allocation_seed="models-e2e"))
    effects = Effects(regret_coach=-15.0, regret_person_sd=3.0, regret_noise_sd=3.0, regret_wave_sd=2.0,
                      decision_prob=1.0, conversations_per_week=3.0, extra_messages_mean=1.0,
                      role_weights={"concierge": 1.0, "collaborator": 1.0, "coach": 2.0})
    result = simulate(engine, slug, participants=50, weeks=3, seed=5, effects=effects, start=T0.replace(hour=0),
                      tick_minutes=120)
    with session_scope(engine, read_only=True) as session:
        run = session.get(SimulationRun, result.run_id)
        assert run is not None
        truth = run.true_effects["regret_coach"]["value"]
    assert truth == -15.0
    fit = regret_model(StudyData.load(engine, slug))
    coach = fit.effect("role_coach")
    assert coach["ci_low"] <= truth <= coach["ci_high"]
    assert coach["ci_high"] < 0
    assert fit.sample.participants > 30
