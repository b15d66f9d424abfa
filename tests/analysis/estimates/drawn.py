"""Study tables drawn from a known model (seeded), for the tests of ``analysis.estimates``.

``draw_study`` draws the tables twice over: as the read side shapes them (the panel, the
conversation features, the survival table: what the models take) and as the plain analysis
tables a statistician would build by hand (``Drawn.perma``, ``Drawn.decisions``,
``Drawn.people``: what the direct fits take); ``perma_table`` is the hand-built PERMA design."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.estimates import StudyData
from analysis.panel import PERMA, REGRET

ROLES = ("concierge", "collaborator", "coach")
REGIONS = ("Europe", "America", "Asia")
PERMA_WAVES = (("perma-week-1", 1, 7.0), ("perma-week-4", 2, 28.0))
REGRET_WAVES = (("regret-day-3", 3.0), ("regret-day-14", 14.0))
REGRET_COLUMNS = ["role_coach", "agree_share", "overrides", "affirmation_per_100_words", "sentiment_change",
                  "reassurance_seeking_turns"]


# A panel drawn from a known model


@dataclass(frozen=True)
class Truth:
    """The generative model, with ``analysis.simulation.population.Effects``' structure: PERMA at the k-th
    follow-up = latent level + arm_per_wave * k in the well-being arm (by time zone region if
    ``arm_per_wave_by_region``); regret = 30 + regret_coach (ended in coach) + regret_per_agree_share
    * agree share + person + noise; a follow-up is answered with log-odds 1.4 +
    answer_per_point * (baseline - 6.5); dropout hazard multiplied by exp(dropout_per_point) per
    baseline point. The exit rating follows the agree share, is pure noise, or follows the regret."""

    arm_per_wave: float = 0.4
    regret_coach: float = -12.0
    regret_per_agree_share: float = 15.0
    exit_rating: str = "agree_share"  # or "noise", or "regret"
    dropout_per_point: float = -0.5
    answer_per_point: float = 0.5
    all_answered: bool = False
    arm_per_wave_by_region: Mapping[str, float] = field(default_factory=dict)
    slope_sd: float = 0.0  # a participant's own change per wave (a random slope)
    perma_waves: tuple[tuple[str, int, float], ...] = PERMA_WAVES


NULL = Truth(arm_per_wave=0.0, regret_coach=0.0, regret_per_agree_share=0.0, dropout_per_point=0.0,
             answer_per_point=0.0)


@dataclass(frozen=True)
class Drawn:
    data: StudyData
    perma: pd.DataFrame  # one row per PERMA follow-up: participant, wave, wellbeing, baseline, y, status
    decisions: pd.DataFrame  # one row per regret follow-up: participant, wave, regret, features, status
    people: pd.DataFrame  # one row per participant: baseline, wellbeing, duration, event


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def draw_study(seed: int, n: int = 300, truth: Truth | None = None, decisions: int = 3) -> Drawn:
    truth = truth or Truth()
    rng = np.random.default_rng(seed)
    codes = np.array([f"p{i:04d}" for i in range(n)])
    wellbeing = rng.random(n) < 0.5
    latent = rng.normal(6.5, 1.3, n)
    baseline = np.clip(latent + rng.normal(0, 0.3, n), 0, 10)
    region = rng.choice(REGIONS, n)
    usual = np.where(wellbeing, rng.choice(ROLES, n, p=[0.3, 0.35, 0.35]), "standard")
    answered = (np.ones(n) if truth.all_answered
                else _logistic(1.4 + truth.answer_per_point * (baseline - 6.5)))
    person_regret = rng.normal(0, 8, n)
    slope = rng.normal(0, truth.slope_sd, n) if truth.slope_sd else np.zeros(n)
    person = pd.DataFrame({"participant_code": codes, "arm": np.where(wellbeing, "wellbeing", "control"),
                           "mode": np.where(wellbeing, "wellbeing", "default"), "first_role": usual,
                           "participant_status": "enrolled", "timezone_region": region,
                           "baseline_perma_overall_wellbeing": baseline})

    conversations: list[dict[str, Any]] = []
    regret_rows: list[dict[str, Any]] = []
    for i in range(n):
        for _ in range(decisions):
            cid = len(conversations) + 1
            role = usual[i] if not wellbeing[i] or rng.random() < 0.8 else str(rng.choice(ROLES))
            assistant = 1 + int(rng.poisson(2))
            agree = int(rng.binomial(assistant, 0.95 if role in ("standard", "concierge") else 0.7))
            challenge = int(rng.binomial(assistant - agree, 0.5))
            share = agree / assistant
            latent_regret = (30 + truth.regret_coach * (role == "coach") + truth.regret_per_agree_share * share
                             + person_regret[i] + rng.normal(0, 8))
            if truth.exit_rating == "noise":
                exit_rating = float(rng.integers(1, 8))
            elif truth.exit_rating == "regret":
                exit_rating = float(np.clip(np.round(7 - latent_regret / 12 + rng.normal(0, 0.3)), 1, 7))
            else:
                exit_rating = float(np.clip(np.round(4 + 1.5 * share + rng.normal(0, 1)), 1, 7))
            conversations.append({
                "conversation_id": cid, "participant_code": codes[i], "arm": person["arm"][i],
                "mode": person["mode"][i], "starting_role": role, "final_role": role,
                "participant_turns": assistant, "assistant_turns": assistant, "agree_turns": agree,
                "nudge_turns": assistant - agree - challenge, "challenge_turns": challenge, "escalate_turns": 0,
                "pushback_rate": (assistant - agree) / assistant,
                "overrides": int(rng.binomial(assistant - agree, 0.25)),
                "reassurance_seeking_turns": int(rng.poisson(0.3)),
                "affirmation_per_100_words": float(rng.exponential(3.0 if role == "standard" else 0.2)),
                "sentiment_change": float(rng.normal(0, 0.3)), "exit_rating": exit_rating,
                "made_decision": True, "decision_id": cid, "day": float(rng.uniform(0, 27))})
            for wave, offset in REGRET_WAVES:
                done = rng.random() < answered[i]
                regret = float(np.clip(latent_regret + rng.normal(0, 5), 0, 100))
                regret_rows.append({"participant_code": codes[i], "wave": wave, "anchor_key": f"decision:{cid}",
                                    "instrument_id": REGRET, "decision_id": cid, "decision_conversation_id": cid,
                                    "days_since_enrollment": conversations[-1]["day"] + offset,
                                    "response_status": "completed" if done else "expired",
                                    "regret": regret if done else np.nan})
    talks = pd.DataFrame(conversations)

    perma_rows: list[dict[str, Any]] = []
    for i in range(n):
        effect = truth.arm_per_wave_by_region.get(region[i], truth.arm_per_wave)
        mine = talks[talks["participant_code"] == codes[i]]
        for wave, k, day in truth.perma_waves:
            done = rng.random() < answered[i]
            y = float(np.clip(latent[i] + (effect * wellbeing[i] + slope[i]) * k + rng.normal(0, 0.5), 0, 10))
            before = mine[mine["day"] < day]
            assistant = before["assistant_turns"].sum()
            perma_rows.append({
                "participant_code": codes[i], "wave": wave, "wave_number": k, "anchor_key": "enrollment",
                "instrument_id": PERMA, "days_since_enrollment": day,
                "response_status": "completed" if done else "expired", "perma_overall_wellbeing": y if done else np.nan,
                "conv_n_conversations": len(before), "conv_assistant_turns": assistant,
                "conv_agree_turns": before["agree_turns"].sum(),
                "conv_pushback_rate": (assistant - before["agree_turns"].sum()) / assistant if assistant else np.nan,
                "conv_overrides": before["overrides"].sum(),
                "conv_reassurance_seeking_turns": before["reassurance_seeking_turns"].sum(),
                "conv_affirmation_per_100_words": before["affirmation_per_100_words"].mean(),
                "conv_mean_sentiment_change": before["sentiment_change"].mean(),
                "conv_mean_exit_rating": before["exit_rating"].mean()})
    baseline_rows = person[["participant_code"]].assign(
        wave="baseline", anchor_key="enrollment", instrument_id=PERMA, days_since_enrollment=0.0,
        response_status="completed", perma_overall_wellbeing=baseline)
    panel = pd.concat([baseline_rows, pd.DataFrame(perma_rows).drop(columns="wave_number"),
                       pd.DataFrame(regret_rows)], ignore_index=True)
    panel = person.merge(panel, on="participant_code")
    for column in ("decision_id", "decision_conversation_id"):
        panel[column] = panel[column].astype("Int64")

    hazard = 0.02 * np.exp(truth.dropout_per_point * (baseline - 6.5))
    time = rng.exponential(1 / hazard)
    survival = person[["participant_code", "arm", "mode", "first_role"]].assign(
        duration_days=np.minimum(time, 35.0), event=(time < 35.0).astype(int),
        event_type=np.where(time < 35.0, "stopped_answering", "censored"))

    perma = pd.DataFrame(perma_rows).merge(person, on="participant_code")
    perma = perma.assign(wellbeing=(perma["arm"] == "wellbeing").astype(float),
                         baseline=perma["baseline_perma_overall_wellbeing"], y=perma["perma_overall_wellbeing"])
    table = pd.DataFrame(regret_rows).merge(talks.drop(columns=["participant_code", "decision_id"]),
                                            left_on="decision_conversation_id", right_on="conversation_id")
    table["role_coach"] = (table["final_role"] == "coach").astype(float)
    table["agree_share"] = table["agree_turns"] / table["assistant_turns"]
    people = person.assign(wellbeing=wellbeing.astype(float), baseline_wellbeing=baseline,
                           duration_days=survival["duration_days"], event=survival["event"])
    return Drawn(StudyData(panel=panel, conversations=talks.drop(columns="day"), survival=survival),
                 perma, table, people)


def covers(row: Any, value: float) -> bool:
    return bool(row["ci_low"] <= value <= row["ci_high"])


def same(actual: Any, desired: Any) -> None:
    """Equal to a direct fit's numbers up to floating-point noise."""
    np.testing.assert_allclose(np.asarray(actual, dtype=float), np.asarray(desired, dtype=float), rtol=1e-8,
                               atol=1e-10)


def agrees(actual: Any, desired: Any) -> None:
    """Equal to statsmodels' ``MixedLM`` fit of a random-intercept model: the exact REML optimum of
    ``analysis.estimates.mixed`` against statsmodels' gradient optimizer, which stops within about
    1e-5 (relative) of it; 1e-4 is well inside the three decimals a report shows."""
    np.testing.assert_allclose(np.asarray(actual, dtype=float), np.asarray(desired, dtype=float), rtol=1e-4,
                               atol=1e-7)


def pick(frame: pd.DataFrame, **where: Any) -> Any:
    """The one row of ``frame`` whose columns hold the values in ``where``."""
    mask = np.ones(len(frame), dtype=bool)
    for column, value in where.items():
        mask &= (frame[column] == value).to_numpy()
    assert mask.sum() == 1, where
    return frame[mask].iloc[0]


# Direct fits of tables built by hand


def perma_table(drawn: Drawn) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The completed PERMA follow-ups and their design: intercept, baseline, day (each wave's day
    since enrollment: 7, 28), arm, arm x day."""
    table = drawn.perma[drawn.perma["response_status"] == "completed"].sort_values(["participant_code", "wave_number"])
    day = table["days_since_enrollment"].astype(float)
    return table, pd.DataFrame({"Intercept": 1.0, "baseline": table["baseline"], "day": day,
                                "wellbeing": table["wellbeing"], "wellbeing_day": table["wellbeing"] * day})


def per_day(truth: Truth, per_wave: float | None = None) -> tuple[float, float]:
    """A per-wave arm effect (the k-th follow-up: effect x k) as the model of time in days sees it:
    (the arm x day effect, the arm difference at day 0), by hand from the first two waves' days."""
    effect = truth.arm_per_wave if per_wave is None else per_wave
    (_, k1, d1), (_, k2, d2) = truth.perma_waves[:2]
    slope = effect * (k2 - k1) / (d2 - d1)
    return slope, effect * k1 - slope * d1
