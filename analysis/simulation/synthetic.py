"""Synthetic studies in seconds: the analysis tables drawn straight from the generative model.

``analysis.simulation.simulate`` runs synthetic participants through the real services; that tests the
platform end to end but takes minutes for a few hundred people. Power analysis and coverage
benches need thousands of studies, so this module draws a study's analysis tables directly with
numpy, from the same :class:`analysis.simulation.population.Effects` and the protocol's arms and follow-up
schedule, shaped like ``analysis.panel.panel()``, ``analysis.features.conversation_features()``
and ``analysis.panel.survival()``::

    from analysis.simulation.synthetic import synthetic_study
    study = synthetic_study(10_000, seed=1)        # examples/wellbeing-pilot.yaml, default Effects
    panel, conversations = study.panel(), study.conversation_features()
    study.true_effects["regret_coach"]["value"]

Kept from the full simulation: enrollment days and waking hours in seven time zones, arms by the
study's own permuted-block rule, the usual role and role switches, messages drawn from the same
pools and judged by the same monitors, offline model and pushback policy (graduation within a
conversation, overrides, reconsiders, escalation), the exit check and decisions, follow-up times
from the planner (the participant's wall clock, quiet hours), surveys opened when due and looked
at each evening, answering, expiry, withdrawal and data deletion. Every outcome follows the
Effects' formulas exactly, so a statistic fitted on these tables can be checked against
``Effects.true_effects()``.

Where it departs, and why that is fine for power and coverage (which need the outcome model, the
schedule and the missing-data process, not the services):

- No database, services or stored turns. Each distinct message is judged once (a table); reply
  lengths and affirmation hits are those of the offline model's reply to that message, and
  sentiment is VADER's on it, as the feature code would compute them; tokens are word counts.
- A reassurance loop (a third similar request, across conversations) is never raised: rare with
  the default message shares, and no outcome depends on it.
- PERMA items are continuous by default (``round_items=False``), so scores are unbiased for the
  true effects. The full simulation rounds and clips items to the 0-10 slider, which pulls
  scores near the ceiling down (about 3% of a 0.8-point arm difference with the default
  Effects); ``round_items=True`` does the same here.
- Regret is drawn as the score (0-100, clipped to the scale), not as five DRS items.
- Reminders are not modelled (nobody's answering depends on them, in either simulation).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis.features import FEATURES
from analysis.panel import PANEL_COLUMNS, PERMA, PERMA_SCORES, REGRET, SURVIVAL_COLUMNS, stopping_answering
from analysis.simulation.population import (
    OFFLINE_MODEL,
    TIMEZONES,
    TOPICS,
    Effects,
)
from analysis.simulation.synthetic_tables import (
    _NO_SPEC,
    AGREE,
    CHALLENGE,
    COACH,
    DAY,
    ESCALATE,
    NUDGE,
    ROLES,
    STANCES,
    BoolArray,
    FloatArray,
    IntArray,
    _bit_labels,
    _Chat,
    _logistic,
    _normalized,
    _participant_roles,
    _perma,
    _popcount,
    _texts,
    _with_wave_features,
    _zones,
)
from chat.roles import CONCERNS, roles_for_arm, system_prompt
from chat.roles import STANCES as ALL_STANCES
from study.participants import allocate
from study.protocol import FollowUp as FollowUpSpec
from study.protocol import Protocol, parse_protocol
from study.settings import PROJECT_ROOT
from surveys import registry

EXAMPLE_PROTOCOL = PROJECT_ROOT / "examples" / "wellbeing-pilot.yaml"
DEFAULT_START = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # fixed, so a seed alone fixes the data
BLOCKS_OF = inspect.signature(allocate).parameters["blocks_of"].default  # the study's block size per weight
USUAL_ROLE_SHARE = 0.8  # analysis.simulation.simulate: a conversation starts in the usual role 8 times in 10
# Every field of Effects that true_effects() reports: zeroed by null_effects().
EFFECT_FIELDS = ("wellbeing_arm_perma_per_wave", "regret_coach", "regret_per_agree_share",
                 "exit_rating_per_agree_share", "goal_progress_coach", "answer_per_baseline_point",
                 "withdraw_per_baseline_point")

def null_effects(effects: Effects | None = None) -> Effects:
    """The same study with every effect zero (for false-positive checks): outcomes no longer
    depend on arm, role or affirmation, nor answering and withdrawal on the baseline."""
    zeros: dict[str, Any] = dict.fromkeys(EFFECT_FIELDS, 0.0)
    return dataclasses.replace(effects or Effects(), **zeros)


def load_protocol(path: Path | str | None = None) -> Protocol:
    """A protocol file (by default the example pilot); raises ProtocolError when invalid."""
    return _parsed(Path(path or EXAMPLE_PROTOCOL).read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> Protocol:  # a Protocol is frozen: one parse serves every replicate
    return parse_protocol(text)


def enrollment_days(weeks: int) -> int:
    """Days over which participants enroll, as analysis.simulation.simulate spreads them."""
    return max(1, min(14, weeks * 7 // 3))


def study_weeks(protocol: Protocol) -> int:
    """The shortest study in which the last enrollee's enrollment-anchored follow-ups all close."""
    spans = [f.offset + f.window for f in protocol.followups if f.anchor == "enrollment"] or [dt.timedelta(0)]
    need_days = max(spans).total_seconds() / DAY + 2  # + the send time and a day's margin
    weeks = 1
    while enrollment_days(weeks) + need_days > weeks * 7:
        weeks += 1
    return weeks


# The study


@dataclass
class SyntheticStudy:
    """One synthetic study: its generative truths and the analysis tables.

    ``people``, ``conversations`` and ``waves`` are the raw draws (one row per participant,
    conversation and follow-up, with hidden truths such as ``latent`` and ``regret_latent``, data-
    deleted participants included); ``panel()``, ``conversation_features()`` and ``survival()``
    shape them as the analysis functions do for a real study read at ``read_at``.
    """

    effects: Effects
    protocol: Protocol
    seed: int
    start: dt.datetime
    weeks: int
    read_at: dt.datetime
    people: pd.DataFrame
    conversations: pd.DataFrame
    waves: pd.DataFrame

    @property
    def true_effects(self) -> dict[str, Any]:
        return self.effects.true_effects()

    def _kept(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Rows of participants whose data were not deleted (they are absent from real tables)."""
        deleted = self.people["data_deleted"].to_numpy(dtype=bool)
        return frame[~deleted[frame["person"].to_numpy(dtype=np.int64)]]

    def conversation_features(self) -> pd.DataFrame:
        """Like ``analysis.features.conversation_features()``: columns of ``FEATURES``."""
        return _normalized(self._kept(self.conversations), FEATURES)

    def panel(self) -> pd.DataFrame:
        """Like ``analysis.panel.panel()``: one row per participant x wave, columns of ``PANEL_COLUMNS``."""
        people = self._kept(self.people).join(_participant_roles(self._kept(self.conversations)), on="person")
        people["roles_used"] = people["roles_used"].fillna("")
        missing_time = pd.Series(pd.NaT, index=people.index, dtype="datetime64[us, UTC]")
        baseline = pd.DataFrame({
            "person": people["person"], "wave": "baseline", "anchor_key": "enrollment", "occurrence": 0,
            "decision_id": pd.array([pd.NA] * len(people), dtype="Int64"),
            "decision_conversation_id": pd.array([pd.NA] * len(people), dtype="Int64"),
            "instrument_id": PERMA, "instrument_version": registry.builtin()[PERMA].version,
            "intended_at": people["enrolled_at"],
            "intended_local": pd.Series(np.nan, index=people.index, dtype=object),
            "closes_at": missing_time, "opened_at": people["enrolled_at"], "invitation_sent_at": missing_time,
            "response_started_at": people["baseline_started_at"], "submitted_at": people["baseline_submitted_at"],
            "response_status": "completed",
            **{f"perma_{name}": people[f"baseline_perma_{name}"] for name in PERMA_SCORES}, "regret": np.nan,
        })
        waves = self._kept(self.waves)
        rows = pd.concat([baseline, waves[[c for c in baseline.columns]]], ignore_index=True)
        rows["wave_order"] = rows["wave"] != "baseline"
        keep = ["person", "participant_code", "arm", "mode", "roles_used", "first_role", "participant_status",
                "enrolled_at", "withdrawn_at", "timezone", "timezone_region",
                *[f"baseline_perma_{n}" for n in PERMA_SCORES]]
        out = rows.merge(people[keep], on="person", how="inner", validate="many_to_one")
        out["days_since_enrollment"] = (out["intended_at"] - out["enrolled_at"]).dt.total_seconds() / DAY
        out = out.sort_values(["person", "wave_order", "intended_at", "wave", "anchor_key"], kind="stable")
        out = _with_wave_features(out.reset_index(drop=True), self._kept(self.conversations))
        return _normalized(out, PANEL_COLUMNS, integers="Int64")

    def survival(self) -> pd.DataFrame:
        """Like ``analysis.panel.survival()``, by its rule (``analysis.panel.stopping_answering``):
        columns of ``SURVIVAL_COLUMNS``."""
        people = self._kept(self.people).join(_participant_roles(self._kept(self.conversations)), on="person")
        people["roles_used"] = people["roles_used"].fillna("")
        waves = self._kept(self.waves)
        waves = waves[waves["anchor_key"] == "enrollment"]
        out = stopping_answering(people, waves[["person", "wave", "closes_at", "response_status"]], self.read_at,
                                 key="person")
        return _normalized(out, SURVIVAL_COLUMNS)


def synthetic_study(participants: int, *, weeks: int | None = None, seed: int = 0, effects: Effects | None = None,
                    protocol: Protocol | None = None, start: dt.datetime = DEFAULT_START, round_items: bool = False,
                    chat: bool = True) -> SyntheticStudy:
    """Draw a study of ``participants`` people over ``weeks`` weeks (default: long enough for the
    last enrollee's enrollment-anchored follow-ups to close) under ``protocol`` (default the
    example pilot), read when it ends. The same arguments give the same data. ``chat=False``
    skips conversations and decision-anchored follow-ups (for PERMA-only power): the people, their
    PERMA waves and attrition are the same as with it, since each part has its own random stream.
    """
    if participants < 1:
        raise ValueError("participants must be at least 1")
    protocol = protocol or load_protocol()
    weeks = study_weeks(protocol) if weeks is None else weeks
    if weeks < 1:
        raise ValueError("weeks must be at least 1")
    if start.tzinfo is None:
        raise ValueError("start needs a time zone")
    if PERMA not in protocol.baseline:
        raise ValueError("the generative model needs the perma-profiler at baseline (its overall score "
                         "drives attrition)")
    effects = effects or Effects()
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]
    draw = _Draw(protocol, effects, weeks, start, round_items)
    people = draw.people(participants, streams[0])
    conversations = draw.conversations(people, streams[2]) if chat else None
    waves = draw.waves(people, conversations, streams[1], streams[3])
    if conversations is None:
        conversations = pd.DataFrame({name: pd.Series(dtype=object) for name in ("person", *FEATURES)})
    return SyntheticStudy(effects=effects, protocol=protocol, seed=seed, start=start, weeks=weeks,
                          read_at=start + dt.timedelta(weeks=weeks), people=people.frame(),
                          conversations=conversations, waves=waves)


@dataclass
class _People:
    """Per-participant arrays (index = position in enrollment order)."""

    code: npt.NDArray[np.object_]
    arm: IntArray
    zone: IntArray
    enroll_day: IntArray
    enrolled: FloatArray  # seconds since the start of the study
    latent: FloatArray
    topic: IntArray
    usual_role: IntArray  # role id; for a default-mode arm the standard assistant
    regret_person: FloatArray
    baseline: dict[str, FloatArray]
    baseline_started: FloatArray
    baseline_submitted: FloatArray
    answer_p: FloatArray
    withdraw_day: IntArray  # the UTC day of withdrawal; a day after the study if none
    withdrawn: FloatArray  # seconds, NaN if not withdrawn
    deleted: BoolArray
    arms: tuple[str, ...]
    modes: tuple[str, ...]
    start: dt.datetime

    def times(self, seconds: FloatArray) -> pd.Series:
        return _datetimes(seconds, self.start)

    def frame(self) -> pd.DataFrame:
        zones = np.array(TIMEZONES, dtype=object)[self.zone]
        return pd.DataFrame({
            "person": np.arange(len(self.code)), "participant_code": self.code,
            "arm": np.array(self.arms, dtype=object)[self.arm],
            "mode": np.array(self.modes, dtype=object)[self.arm],
            "participant_status": np.where(np.isnan(self.withdrawn), "enrolled", "withdrawn"),
            "enrolled_at": self.times(self.enrolled), "withdrawn_at": self.times(self.withdrawn),
            "timezone": zones,
            "timezone_region": pd.Series([z.split("/")[0] for z in zones], dtype=object),
            **{f"baseline_perma_{name}": self.baseline[name] for name in PERMA_SCORES},
            "baseline_started_at": self.times(self.baseline_started),
            "baseline_submitted_at": self.times(self.baseline_submitted),
            "latent": self.latent, "regret_person": self.regret_person,
            "usual_role": np.array(ROLES, dtype=object)[self.usual_role],
            "answer_probability": self.answer_p, "data_deleted": self.deleted,
        })


def _permuted_blocks(n: int, weights: list[int], rng: np.random.Generator) -> IntArray:
    """Arm indices by permuted blocks, the study's rule (study.participants.allocate): each block
    holds every arm weight x BLOCKS_OF times in a random order."""
    block = np.repeat(np.arange(len(weights)), np.array(weights) * BLOCKS_OF)
    blocks = -(-n // len(block))
    order = np.argsort(rng.random((blocks, len(block))), axis=1)
    return np.asarray(block[order].reshape(-1)[:n], dtype=np.int64)


def _datetimes(seconds: FloatArray, start: dt.datetime) -> pd.Series:
    """Seconds since ``start`` (NaN = missing) as aware UTC datetimes at microsecond resolution."""
    values = np.asarray(seconds, dtype=float)
    micro = np.round(np.nan_to_num(values) * 1e6).astype(np.int64) + round(start.timestamp() * 1e6)
    stamps = np.where(np.isnan(values), np.iinfo(np.int64).min, micro).view("datetime64[us]")  # min = NaT
    return pd.Series(pd.DatetimeIndex(stamps).tz_localize("UTC"))


class _Draw:
    """The generative model, one vectorized step per part of the study."""

    def __init__(self, protocol: Protocol, effects: Effects, weeks: int, start: dt.datetime,
                 round_items: bool) -> None:
        repeating = [f.id for f in protocol.followups if f.repeat is not None]
        if repeating:
            raise ValueError(f"the synthetic generator plans single follow-ups; {', '.join(repeating)} repeat: "
                             "simulate such a study through the services (afterward simulate)")
        self.protocol, self.e, self.weeks, self.start, self.round_items = protocol, effects, weeks, start, round_items
        self.days = weeks * 7
        self.zones = _zones(start, self.days)
        self.arm_roles = [[ROLES.index(r) for r in roles_for_arm(arm.mode, list(arm.roles))] for arm in protocol.arms]
        width = max(len(r) for r in self.arm_roles)
        self.role_table = np.array([r + [r[0]] * (width - len(r)) for r in self.arm_roles], dtype=np.int64)
        self.role_count = np.array([len(r) for r in self.arm_roles], dtype=np.int64)
        self.wellbeing = np.array([arm.mode == "wellbeing" for arm in protocol.arms])
        perma_waves = sorted((f for f in protocol.followups if f.instrument == PERMA and f.anchor == "enrollment"),
                             key=lambda f: f.offset)
        self.perma_wave = {f.id: k for k, f in enumerate(perma_waves, start=1)}

    # Participants

    def people(self, n: int, rng: np.random.Generator) -> _People:
        e = self.e
        zone = rng.integers(len(TIMEZONES), size=n)
        enroll_day = rng.integers(enrollment_days(self.weeks), size=n)
        minute = rng.integers(8 * 60, 22 * 60, size=n).astype(float)
        latent = rng.normal(e.baseline_mean, e.baseline_sd, n)
        topic = rng.integers(len(TOPICS), size=n)
        regret_person = rng.normal(0.0, e.regret_person_sd, n)
        names = [arm.name for arm in self.protocol.arms]
        arm = _permuted_blocks(n, [a.weight for a in self.protocol.arms], rng)
        enrolled = self.zones.local_times(enroll_day, zone, minute * 60) + 120  # consent and profile: 2 min
        usual = self.role_table[arm, 0].copy()
        pick = rng.random(n)
        for a, roles in enumerate(self.arm_roles):
            rows = (arm == a) & self.wellbeing[a]
            weights = np.array([e.role_weights.get(ROLES[r], 1.0) for r in roles])
            cumulative = np.cumsum(weights / weights.sum())
            usual[rows] = np.array(roles)[np.minimum(np.searchsorted(cumulative, pick[rows], side="right"),
                                                     len(roles) - 1)]
        baseline = _perma(latent, e, rng, self.round_items)
        partial = rng.random(n) < e.partial_save_prob
        started = enrolled + 180  # the baseline is answered three minutes after the profile
        submitted = started + np.where(partial, 300, 0)  # saved half, then submitted five minutes later
        centred = baseline["overall_wellbeing"] - e.baseline_center
        answer_p = _logistic(e.answer_logit + e.answer_per_baseline_point * centred)
        weekly = _logistic(e.withdraw_weekly_logit + e.withdraw_per_baseline_point * centred)
        daily = 1 - (1 - weekly) ** (1 / 7)
        with np.errstate(divide="ignore"):  # daily 0: never withdraws
            after = np.ceil(np.log(1 - rng.random(n)) / np.log1p(-daily))  # days after enrollment, >= 1
        after = np.where(np.isfinite(after), np.maximum(after, 1), self.days + 1)
        withdraw_day = np.minimum(enroll_day + after, self.days + 1).astype(np.int64)
        withdraws = withdraw_day < self.days
        when = self.zones.local_times(withdraw_day, zone, rng.integers(8 * 60, 22 * 60, size=n) * 60.0)
        withdrawn = np.where(withdraws, when, np.nan)
        deleted = withdraws & (rng.random(n) < e.delete_data_share) & self.protocol.withdrawal.allow_data_deletion
        return _People(
            code=np.array([f"P{i:07d}" for i in range(n)], dtype=object), arm=arm, zone=zone, enroll_day=enroll_day,
            enrolled=enrolled, latent=latent, topic=topic, usual_role=usual, regret_person=regret_person,
            baseline=baseline, baseline_started=started, baseline_submitted=submitted, answer_p=answer_p,
            withdraw_day=withdraw_day, withdrawn=withdrawn, deleted=deleted,
            arms=tuple(names), modes=tuple(arm.mode for arm in self.protocol.arms), start=self.start)

    # Follow-ups

    def _followups(self, spec: FollowUpSpec, who: IntArray, anchors: FloatArray, people: _People,
                   rng: np.random.Generator) -> dict[str, Any]:
        """Times and status of one follow-up per anchor: opened when due unless withdrawn first,
        seen at the first evening check after that (each active day, 17:00-22:00 local), answered
        then with the participant's answer probability, otherwise left to expire."""
        due, closes, local = self.zones.schedule(spec, self.protocol.quiet_hours, anchors, people.zone[who])
        n = len(who)
        zone, withdraw_day, withdrawn = people.zone[who], people.withdraw_day[who], people.withdrawn[who]
        first_day = np.floor(due / DAY).astype(np.int64)
        evening = rng.uniform(17 * 3600, 22 * 3600, size=(n, 2))
        check = self.zones.local_times(first_day, zone, evening[:, 0])
        late = check <= due
        check = np.where(late, self.zones.local_times(first_day + 1, zone, evening[:, 1]), check)
        check_day = first_day + late
        seen = (check_day < withdraw_day) & (check_day < self.days) & (check < closes)
        answers = rng.random(n) < people.answer_p[who]
        minutes = rng.integers(1, 20, size=n) * 60.0
        read_at = self.days * DAY
        gone = ~np.isnan(withdrawn)
        opened = (due <= read_at) & ~(gone & (withdrawn <= due))
        completed = opened & seen & answers
        withdrew = ~completed & gone & (withdrawn < closes)
        status = np.select(
            [completed, withdrew, opened & (closes <= read_at), opened, due > read_at],
            ["completed", "withdrawn", "expired", "open", "not_yet_due"], default="withdrawn")
        submitted = np.where(completed, check + minutes, np.nan)
        return {"who": who, "due": due, "closes": closes, "local": local, "opened": np.where(opened, due, np.nan),
                "submitted": submitted, "response_status": status, "completed": completed}

    def _outcomes(self, spec: FollowUpSpec, who: IntArray, regret_latent: FloatArray, people: _People,
                  rng: np.random.Generator) -> dict[str, FloatArray]:
        """The scores a follow-up would get if answered (drawn for every row, so the random stream
        does not depend on who answers)."""
        e, n = self.e, len(who)
        if spec.instrument == PERMA:
            k = self.perma_wave.get(spec.id, 0) if spec.anchor == "enrollment" else 0
            level = people.latent[who].copy()
            if k:
                level += rng.normal(0.0, e.wave_noise_sd, n)
                level += np.where(self.wellbeing[people.arm[who]], e.wellbeing_arm_perma_per_wave * k, 0.0)
            return _perma(level, e, rng, self.round_items)
        if spec.instrument == REGRET:
            low, high = registry.builtin()[REGRET].scores[0].rescale_to or (0.0, 100.0)
            return {"regret": np.clip(regret_latent + rng.normal(0.0, e.regret_wave_sd, n), low, high)}
        return {}

    def waves(self, people: _People, conversations: pd.DataFrame | None, enrollment_rng: np.random.Generator,
              decision_rng: np.random.Generator) -> pd.DataFrame:
        """One row per follow-up: every enrollment-anchored one per participant, and every
        decision-anchored one per decision (when conversations were drawn)."""
        everyone = np.arange(len(people.code))
        if conversations is not None:
            decisions = conversations[conversations["made_decision"].to_numpy(dtype=bool, na_value=False)]
            decided_by = decisions["person"].to_numpy(dtype=np.int64)
            decided_at = decisions["ended_seconds"].to_numpy(dtype=float)
            regret = decisions["regret_latent"].to_numpy(dtype=float)
            decision = decisions["decision_id"].to_numpy(dtype=np.int64)
            conversation = decisions["conversation_id"].to_numpy(dtype=np.int64)
        parts: list[dict[str, Any]] = []
        specs = [f for f in self.protocol.followups if f.anchor == "enrollment"] + (
            [f for f in self.protocol.followups if f.anchor == "decision"] if conversations is not None else [])
        for spec in specs:
            if spec.anchor == "enrollment":
                who, rng, anchors = everyone, enrollment_rng, people.enrolled
                latent = np.full(len(everyone), self.e.regret_base)
                ids: IntArray = np.full(len(everyone), -1, dtype=np.int64)
                from_conversation, anchor_keys = ids, np.full(len(everyone), "enrollment", dtype=object)
            else:
                who, rng, anchors, latent = decided_by, decision_rng, decided_at, regret
                ids, from_conversation = decision, conversation
                anchor_keys = np.array([f"decision:{i}" for i in decision], dtype=object)
            part = self._followups(spec, who, anchors, people, rng)
            scores = self._outcomes(spec, who, latent, people, rng)
            completed = part.pop("completed")
            instrument = registry.builtin().get(spec.instrument)
            part.update({
                "wave": np.full(len(who), spec.id, dtype=object), "anchor_key": anchor_keys,
                "decision_id": ids, "decision_conversation_id": from_conversation,
                "instrument_id": np.full(len(who), spec.instrument, dtype=object),
                "instrument_version": np.where(np.isnan(part["opened"]), np.array(None, dtype=object),
                                               np.array(instrument.version if instrument else None, dtype=object)),
                "k": np.full(len(who), self.perma_wave.get(spec.id, 0) if spec.anchor == "enrollment" else 0),
                **{f"perma_{name}": np.where(completed, scores.get(name, np.nan), np.nan) for name in PERMA_SCORES},
                "regret": np.where(completed, scores.get("regret", np.nan), np.nan),
            })
            parts.append(part)
        if not parts:  # a protocol without follow-ups
            parts.append(self._followups(self.protocol.followups[0] if self.protocol.followups else _NO_SPEC,
                                         np.zeros(0, dtype=np.int64), np.zeros(0), people, enrollment_rng))
        names = set.intersection(*(set(part) for part in parts))
        columns = {name: np.concatenate([part[name] for part in parts]) for name in names}
        who = columns.pop("who").astype(np.int64)
        frame = pd.DataFrame({"person": who, "participant_code": people.code[who]})
        for name in ("wave", "anchor_key", "instrument_id", "instrument_version", "response_status", "k",
                     *[f"perma_{score}" for score in PERMA_SCORES], "regret"):
            frame[name] = columns.get(name, np.full(len(who), np.nan))
        frame["occurrence"] = 0  # single follow-ups only (__init__)
        for name in ("decision_id", "decision_conversation_id"):
            values = columns.get(name, np.full(len(who), -1)).astype(np.int64)
            nullable = pd.array(np.maximum(values, 0), dtype="Int64")
            nullable[values < 0] = pd.NA
            frame[name] = nullable
        frame["intended_local"] = columns["local"]
        for name, source in (("intended_at", "due"), ("closes_at", "closes"), ("opened_at", "opened"),
                             ("invitation_sent_at", "opened"), ("response_started_at", "submitted"),
                             ("submitted_at", "submitted")):
            frame[name] = people.times(columns[source]).set_axis(frame.index)
        return frame

    # Conversations

    def conversations(self, people: _People, rng: np.random.Generator) -> pd.DataFrame:
        e, t = self.e, _texts()
        active_days = np.maximum(np.minimum(people.withdraw_day, self.days) - people.enroll_day - 1, 0)
        counts = rng.poisson(e.conversations_per_week / 7 * active_days)
        person = np.repeat(np.arange(len(counts)), counts)
        m = len(person)
        day = people.enroll_day[person] + 1 + np.floor(rng.random(m) * active_days[person]).astype(np.int64)
        started = self.zones.local_times(day, people.zone[person], rng.integers(8 * 60, 22 * 60, size=m) * 60.0)
        arm = people.arm[person]
        wellbeing = self.wellbeing[arm]
        n_roles = self.role_count[arm]
        other = self.role_table[arm, np.floor(rng.random(m) * n_roles).astype(np.int64)]
        role = np.where(wellbeing & (rng.random(m) >= USUAL_ROLE_SHARE), other, people.usual_role[person])
        role = np.where(wellbeing, role, self.role_table[arm, 0])
        messages = 1 + rng.poisson(e.extra_messages_mean, m)
        switches = wellbeing & (n_roles > 1) & (rng.random(m) < e.role_switch_prob)
        switch_at = 1 + np.floor(rng.random(m) * messages).astype(np.int64)
        switch_pick = np.floor(rng.random(m) * np.maximum(n_roles - 1, 1)).astype(np.int64)
        width = int(messages.max()) if m else 1
        kind = np.searchsorted(np.cumsum([e.framing_share, e.reassurance_share, e.dependence_share,
                                          e.distress_share]), rng.random((m, width)), side="right")
        topic = people.topic[person][:, None]
        slot = np.floor(rng.random((m, width)) * t.pool_sizes[kind, topic]).astype(np.int64)
        drawn = t.pools[kind, topic, slot]
        response = rng.random((m, width))
        delay = rng.integers(30, 240, size=(m, width)).astype(float)
        chat = _Chat(t, role, m)
        chat.run(messages, switches, switch_at, switch_pick, self.role_table[arm], n_roles, drawn, response, delay,
                 e.override_prob, e.reconsider_prob)
        turns = chat.assistant_turns
        share = chat.stances[:, AGREE] / np.maximum(turns, 1)
        decided = rng.random(m) < e.decision_prob
        rated = rng.random(m) < e.exit_rating_prob
        rating = np.clip(np.round(e.exit_rating_base + e.exit_rating_per_agree_share * share + rng.normal(0, 1, m)),
                         1, 7)
        regret = (e.regret_base + np.where(chat.role == COACH, e.regret_coach, 0.0) + e.regret_per_agree_share * share
                  + people.regret_person[person] + rng.normal(0.0, e.regret_noise_sd, m))
        ended = started + chat.duration + 60  # the exit check a minute after the last reply
        order = np.lexsort((person, started))
        frame = self._features(chat, people, person, started, ended, decided, rated, rating, share)
        frame["regret_latent"], frame["ended_seconds"] = regret, ended
        frame = frame.iloc[order].reset_index(drop=True)
        frame["conversation_id"] = np.arange(1, m + 1, dtype=np.int64)
        made = frame["made_decision"].to_numpy(dtype=bool)
        decision_order = np.lexsort((frame["conversation_id"].to_numpy(), frame["ended_seconds"].to_numpy()))
        decision_ids = np.zeros(m, dtype=np.int64)
        decision_order = decision_order[made[decision_order]]
        decision_ids[decision_order] = np.arange(1, len(decision_order) + 1)
        ids = pd.array(decision_ids, dtype="Int64")
        ids[~made] = pd.NA
        frame["decision_id"] = ids
        return frame

    def _features(self, chat: _Chat, people: _People, person: IntArray, started: FloatArray, ended: FloatArray,
                  decided: BoolArray, rated: BoolArray, rating: FloatArray, share: FloatArray) -> pd.DataFrame:
        t = chat.texts
        names = np.array(ROLES, dtype=object)
        roles_used = _bit_labels(ROLES)
        concern_labels = _bit_labels(CONCERNS)
        versions = _bit_labels(tuple(system_prompt(r).version for r in ROLES))
        turns = chat.assistant_turns
        first = t.sentiment[chat.first_text]
        last = t.sentiment[chat.last_text]
        s = chat.stances
        return pd.DataFrame({
            "person": person, "participant_code": people.code[person],
            "arm": np.array(people.arms, dtype=object)[people.arm[person]],
            "mode": np.array(people.modes, dtype=object)[people.arm[person]],
            "starting_role": names[chat.start_role],
            "final_role": names[chat.role],
            "roles_used": roles_used[chat.role_bits],
            "role_switches": chat.switched.astype(np.int64), "status": ["ended"] * len(person),
            "started_at": people.times(started), "ended_at": people.times(ended),
            "duration_seconds": ended - started,
            "participant_turns": chat.participant_turns, "assistant_turns": turns,
            "participant_words": chat.participant_words, "assistant_words": chat.assistant_words,
            **{f"{stance}_turns": s[:, i] for i, stance in enumerate(STANCES)},
            **{f"{stance}_turns": np.zeros(len(person), dtype=np.int64) for stance in ALL_STANCES
               if stance not in STANCES},
            "pushback_rate": (s[:, NUDGE] + s[:, CHALLENGE]) / np.where(turns > 0, turns, np.nan),
            "concerns_raised": concern_labels[chat.concern_bits],
            "n_concerns_raised": _popcount(chat.concern_bits),
            "overrides": chat.overrides, "reconsiders": chat.reconsiders,
            "challenges_reconsidered": chat.challenges_reconsidered,
            "challenges_overridden": chat.challenges_overridden,
            "challenges_left": chat.challenges_left, "challenges_continued": chat.challenges_continued,
            "reassurance_seeking_turns": chat.reassurance, "dependence_cues": chat.dependence,
            # The synthetic model has no check-ins: each of its safety events is an escalation.
            "crisis_cues": chat.crisis, "safety_events": s[:, ESCALATE].copy(),
            "safety_escalations": s[:, ESCALATE].copy(),
            "safety_categories": pd.Series(concern_labels[chat.safety_bits], dtype=object),
            "models": [OFFLINE_MODEL] * len(person),
            "prompt_versions": versions[chat.reply_role_bits],
            "prompt_tokens": chat.prompt_words, "completion_tokens": chat.completion_words,
            "cost_usd": np.zeros(len(person)),
            "exit_rating": np.where(rated, rating, np.nan),
            "made_decision": pd.array(decided, dtype="boolean"),
            "decision_id": pd.array([pd.NA] * len(person), dtype="Int64"),
            "affirmation_hits": chat.hits,
            "affirmation_per_100_words": 100 * chat.hits / np.where(chat.assistant_words > 0, chat.assistant_words,
                                                                     np.nan),
            "first_message_sentiment": first, "last_message_sentiment": last, "sentiment_change": last - first,
            "agree_share": share,
        })


