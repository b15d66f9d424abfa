"""What the synthetic draw (``analysis.simulation.synthetic``) looks up and how it shapes its
tables: every message judged once by the real monitors and the offline model, the planner's
follow-up times by time zone, the instruments' scoring, and the frames shaped like the panel's."""

from __future__ import annotations

import datetime as dt
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Literal
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt
import pandas as pd
from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

from analysis.features import FEATURES, LIST_SEPARATOR, _rolled
from analysis.lexicons import count_affirmations
from analysis.panel import PANEL_COLUMNS, PERMA
from analysis.simulation.population import (
    CHANGED_COURSE,
    DEPENDENCE,
    DISTRESS,
    PERMA_NEGATIVE,
    REASSURANCE,
    TIMEZONES,
    TOPICS,
    Effects,
)
from chat import monitors
from chat.answer_format import guidance, parse_answer
from chat.offline import answer
from chat.policy import StanceDecision
from chat.roles import CONCERNS, ROLE_SPECS, SAFETY_CONCERNS, Concern, RoleName, Stance, system_prompt
from scheduler import planner
from study.protocol import FollowUp as FollowUpSpec
from study.protocol import QuietHours
from surveys import registry
from surveys.definitions import Instrument

# The stances this generator models: distress check-ins and declines of harm to others are not
# drawn (their columns are 0); the full simulation through the services has them.
STANCES: tuple[Stance, ...] = ("agree", "nudge", "challenge", "escalate")
DAY = 86_400
ROLES: tuple[RoleName, ...] = tuple(ROLE_SPECS)  # standard, concierge, collaborator, coach
COACH = ROLES.index("coach")
NONE = CONCERNS.index("none")
AGREE, NUDGE, CHALLENGE, ESCALATE = range(4)
FloatArray = npt.NDArray[np.floating[Any]]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _logistic(x: FloatArray) -> FloatArray:
    with np.errstate(over="ignore"):
        return np.asarray(1.0 / (1.0 + np.exp(-x)), dtype=float)


# Tables of the chat pieces, computed once per process


@dataclass(frozen=True)
class _Texts:
    """Every message a synthetic participant can send, judged once by the real monitors and the
    offline model, and the offline model's reply to each in each role, stance and override."""

    texts: tuple[str, ...]
    pools: IntArray  # [pool, topic, slot] -> text id; pools: framing, reassurance, dependence, distress, plain
    pool_sizes: IntArray  # [pool, topic]
    changed_course: int
    words: IntArray
    sentiment: FloatArray
    reassurance: BoolArray
    dependence: BoolArray
    crisis: IntArray  # concern id or NONE
    acute: BoolArray
    model_concern: IntArray  # [text, role]: the concern the offline model raises by itself, or NONE
    reply_words: IntArray  # [text, role, stance, overridden]
    reply_hits: IntArray
    completion_words: IntArray
    system_words: IntArray  # [role]
    starts: IntArray  # [role, concern]: stance where pushback starts, -1 if never
    caps: IntArray  # [concern]
    safety: BoolArray  # [concern]


@functools.cache
def _texts() -> _Texts:
    pools_by_topic: list[list[tuple[str, ...]]] = [
        [t.framing for t in TOPICS], [REASSURANCE] * len(TOPICS), [DEPENDENCE] * len(TOPICS),
        [DISTRESS] * len(TOPICS), [t.plain for t in TOPICS]]
    texts: dict[str, int] = {}
    for pool in pools_by_topic:
        for choices in pool:
            for text in choices:
                texts.setdefault(text, len(texts))
    texts.setdefault(CHANGED_COURSE, len(texts))
    slots = max(len(choices) for pool in pools_by_topic for choices in pool)
    pools = np.zeros((len(pools_by_topic), len(TOPICS), slots), dtype=np.int64)
    sizes = np.zeros((len(pools_by_topic), len(TOPICS)), dtype=np.int64)
    for p, pool in enumerate(pools_by_topic):
        for t, choices in enumerate(pool):
            sizes[p, t] = len(choices)
            pools[p, t, :len(choices)] = [texts[c] for c in choices]
    ordered = tuple(texts)
    n, r = len(ordered), len(ROLES)
    analyzer = SentimentIntensityAnalyzer()
    crisis = np.full(n, NONE, dtype=np.int64)
    acute = np.zeros(n, dtype=bool)
    model_concern = np.full((n, r), NONE, dtype=np.int64)
    reply_words = np.zeros((n, r, 4, 2), dtype=np.int64)
    reply_hits = np.zeros_like(reply_words)
    completion_words = np.zeros_like(reply_words)
    for i, text in enumerate(ordered):
        finding = monitors.detect_crisis(text)
        if finding is not None:
            crisis[i], acute[i] = CONCERNS.index(finding.category), finding.acute
        for j, role in enumerate(ROLES):
            prompt = {"role": "system", "content": system_prompt(role).text}
            message = {"role": "user", "content": text}
            proposed = parse_answer(answer([prompt, message])).proposed
            if proposed is not None and proposed.stance != "agree":
                model_concern[i, j] = CONCERNS.index(proposed.concern)
            for s, stance in enumerate(STANCES):
                for overridden in (0, 1):
                    concern: Concern = "none" if stance == "agree" else "unsupported_framing"
                    required = StanceDecision(stance, concern, "A reason.")
                    note = guidance(required, overridden=bool(overridden))
                    extra = [{"role": "system", "content": note}] if note else []
                    full = answer([prompt, message, *extra])
                    reply = parse_answer(full).reply
                    reply_words[i, j, s, overridden] = len(reply.split())
                    reply_hits[i, j, s, overridden] = count_affirmations(reply)
                    completion_words[i, j, s, overridden] = len(full.split())
    starts = np.full((r, len(CONCERNS)), -1, dtype=np.int64)
    for j, role in enumerate(ROLES):
        for raised, stance in ROLE_SPECS[role].starts_at.items():
            starts[j, CONCERNS.index(raised)] = STANCES.index(stance)
    safety = np.array([c in SAFETY_CONCERNS for c in CONCERNS])
    return _Texts(
        texts=ordered, pools=pools, pool_sizes=sizes, changed_course=texts[CHANGED_COURSE],
        words=np.array([len(t.split()) for t in ordered], dtype=np.int64),
        sentiment=np.array([analyzer.polarity_scores(t)["compound"] for t in ordered], dtype=float),
        reassurance=np.array([monitors.reassurance_cue(t) is not None for t in ordered]),
        dependence=np.array([monitors.dependence_cue(t) is not None for t in ordered]),
        crisis=crisis, acute=acute, model_concern=model_concern, reply_words=reply_words, reply_hits=reply_hits,
        completion_words=completion_words,
        system_words=np.array([len(system_prompt(role).text.split()) for role in ROLES], dtype=np.int64),
        starts=starts, caps=np.where(safety, ESCALATE, CHALLENGE).astype(np.int64), safety=safety)


@functools.lru_cache(maxsize=100_000)
def _timing(offset: dt.timedelta, window: dt.timedelta, send_at_local: str, quiet: tuple[str, str], zone: str,
            wall: dt.datetime) -> tuple[float, float, str]:
    """The planner's (due, closes as POSIX seconds, intended local time) for an anchor at ``wall``."""
    spec = FollowUpSpec(id="wave", instrument="any", anchor="enrollment", offset=offset, window=window,
                        send_at_local=send_at_local)
    anchored = planner.to_utc(wall, ZoneInfo(zone))
    timing = planner.timing(spec, anchored, zone, QuietHours(start=quiet[0], end=quiet[1]))
    return timing.due_at.timestamp(), timing.closes_at.timestamp(), timing.intended_local


class _Zones:
    """Each time zone's UTC offset hour by hour over the study (these zones change offset on the
    hour), and the wall-clock arithmetic analysis.simulation.simulate does with them."""

    def __init__(self, start: dt.datetime, days: int) -> None:
        self.origin = start.timestamp()
        hours = (days + 2) * 24
        self.offsets = np.zeros((len(TIMEZONES), hours), dtype=np.int64)
        for code, zone in enumerate(TIMEZONES):
            info = ZoneInfo(zone)
            for hour in range(hours):
                offset = (start + dt.timedelta(hours=hour)).astimezone(info).utcoffset()
                self.offsets[code, hour] = int(offset.total_seconds()) if offset else 0

    def offset(self, zones: IntArray, seconds: FloatArray) -> IntArray:
        hour = np.clip(np.floor(seconds / 3600).astype(np.int64), 0, self.offsets.shape[1] - 1)
        return np.asarray(self.offsets[zones, hour], dtype=np.int64)

    def local_times(self, days: IntArray, zones: IntArray, wall_seconds: FloatArray) -> FloatArray:
        """Seconds since the start at which ``wall_seconds`` after local midnight falls, kept inside
        the UTC day ``days`` (analysis.simulation.simulate's ``_local``)."""
        offset = self.offset(zones, days * float(DAY))
        return np.asarray(days * DAY + np.mod(wall_seconds - offset, DAY), dtype=float)

    def schedule(self, spec: FollowUpSpec, quiet: QuietHours, anchors: FloatArray, zones: IntArray
                 ) -> tuple[FloatArray, FloatArray, npt.NDArray[np.object_]]:
        """Due and closes (seconds since the start) and intended local time of ``spec`` for anchors
        in each participant's zone, by the planner itself: called once per distinct wall-clock case
        (with whole-day offsets only the anchor's local day and whether it is past the send time
        matter; a late anchor stands in as 23:59), then looked up."""
        wall = np.floor(anchors + self.origin + self.offset(zones, anchors)).astype(np.int64)  # naive local
        if spec.offset % dt.timedelta(days=1) == dt.timedelta(0):
            hours, minutes = (int(part) for part in spec.send_at_local.split(":"))
            day = wall // DAY * DAY
            wall = day + np.where(wall - day >= hours * 3600 + minutes * 60, DAY - 60, 0)
        keys = (zones.astype(np.int64) << 40) + wall // 60
        distinct, inverse = np.unique(keys, return_inverse=True)
        found = [_timing(spec.offset, spec.window, spec.send_at_local, (quiet.start, quiet.end),
                         TIMEZONES[int(key) >> 40], _EPOCH + dt.timedelta(minutes=int(key) & ((1 << 40) - 1)))
                 for key in distinct]
        due = np.array([f[0] for f in found]) - self.origin
        closes = np.array([f[1] for f in found]) - self.origin
        local = np.array([f[2] for f in found], dtype=object)
        return due[inverse], closes[inverse], local[inverse]


_EPOCH = dt.datetime.fromtimestamp(0, dt.UTC).replace(tzinfo=None)  # naive: wall times count from it


_NO_SPEC = FollowUpSpec(id="none", instrument="none", anchor="enrollment", offset=dt.timedelta(0))


@functools.lru_cache(maxsize=16)
def _zones(start: dt.datetime, days: int) -> _Zones:
    return _Zones(start, days)


def _score(instrument: Instrument, items: FloatArray) -> dict[str, FloatArray]:
    """The instrument's scores of a matrix of item answers (NaN = skipped), by its own rules:
    reversed items, rescaling, mean or sum of the answered items."""
    ids = [item.id for item in instrument.items]
    out: dict[str, FloatArray] = {}
    for score in instrument.scores:
        columns = []
        for item_id in score.items:
            item = instrument.item(item_id)
            values = items[:, ids.index(item_id)]
            if item.reverse and item.min is not None and item.max is not None:
                values = item.min + item.max - values
            if score.rescale_to and item.min is not None and item.max is not None:
                low, high = score.rescale_to
                values = low + (values - item.min) * (high - low) / (item.max - item.min)
            columns.append(values)
        stacked = np.column_stack(columns)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a score with no answered item is NaN
            total = np.nanmean(stacked, axis=1) if score.method == "mean" else np.nansum(stacked, axis=1)
        if score.method != "mean":
            total[np.isnan(stacked).all(axis=1)] = np.nan
        out[score.name] = np.asarray(total, dtype=float)
    return out


def _perma(levels: FloatArray, effects: Effects, rng: np.random.Generator, round_items: bool) -> dict[str, FloatArray]:
    """PERMA-Profiler scores at the given well-being levels: each item is the level (10 - level for
    the items that run against well-being) plus N(0, item_noise_sd), skipped with item_skip_prob."""
    instrument = registry.builtin()[PERMA]
    negative = np.array([item.id in PERMA_NEGATIVE for item in instrument.items])
    base = np.where(negative, 10.0 - levels[:, None], levels[:, None])
    items = base + rng.normal(0.0, effects.item_noise_sd, base.shape)
    if round_items:
        items = np.clip(np.round(items), 0.0, 10.0)
    items[rng.random(base.shape) < effects.item_skip_prob] = np.nan
    return _score(instrument, items)


def _bit_labels(names: tuple[str, ...]) -> npt.NDArray[np.object_]:
    """For every bit mask over ``names``: the names it holds, distinct, alphabetical, ';'-separated."""
    return np.array([LIST_SEPARATOR.join(sorted({n for i, n in enumerate(names) if mask >> i & 1 and n != "none"}))
                     for mask in range(1 << len(names))], dtype=object)


def _popcount(masks: IntArray) -> IntArray:
    return np.array([bin(int(x)).count("1") for x in range(int(masks.max()) + 1 if len(masks) else 1)],
                    dtype=np.int64)[masks]


class _Chat:
    """All conversations at once, message by message: the monitors' findings and the offline
    model's own concern for each message, the pushback policy (the stronger of the two, graduated
    by how often the concern was raised in the conversation, none for an overridden non-safety
    concern), and the participant's answer to a nudge or challenge, as in analysis.simulation.simulate."""

    def __init__(self, texts: _Texts, role: IntArray, m: int) -> None:
        self.texts, self.m = texts, m
        self.role, self.start_role = role.copy(), role.copy()
        def z() -> IntArray:
            return np.zeros(m, dtype=np.int64)

        self.stances = np.zeros((m, 4), dtype=np.int64)
        self.participant_turns, self.assistant_turns, self.participant_words, self.assistant_words = z(), z(), z(), z()
        self.overrides, self.reconsiders, self.challenges_reconsidered, self.challenges_overridden = z(), z(), z(), z()
        self.challenges_left, self.challenges_continued = z(), z()
        self.reassurance, self.dependence, self.crisis, self.hits = z(), z(), z(), z()
        self.prompt_words, self.completion_words, self.history_words = z(), z(), z()
        self.concern_bits, self.safety_bits, self.switched = z(), z(), np.zeros(m, dtype=bool)
        self.role_bits = (1 << role).astype(np.int64)
        self.reply_role_bits = z()
        self.duration = np.zeros(m)
        self.first_text, self.last_text = z(), z()
        self.raised = np.zeros((m, len(CONCERNS)), dtype=np.int64)
        self.overridden = np.zeros((m, len(CONCERNS)), dtype=bool)

    def _graduated(self, rows: IntArray, concern: IntArray) -> IntArray:
        t = self.texts
        start = t.starts[self.role[rows], concern]
        blocked = ~t.safety[concern] & self.overridden[rows, concern]
        stance = np.minimum(start + self.raised[rows, concern], t.caps[concern])
        return np.where((start < 0) | blocked | (concern == NONE), AGREE, stance)

    def _platform(self, rows: IntArray, text: IntArray) -> tuple[IntArray, IntArray]:
        """The platform's directive: acute crisis escalates; else a crisis or dependence concern."""
        t = self.texts
        concern = np.where(t.crisis[text] != NONE, t.crisis[text], np.where(t.dependence[text],
                                                                            CONCERNS.index("dependence"), NONE))
        stance = np.where(t.acute[text], ESCALATE, self._graduated(rows, concern))
        return stance, concern

    def _reply(self, rows: IntArray, text: IntArray, stance: IntArray, concern: IntArray, overridden: int) -> None:
        t = self.texts
        role = self.role[rows]
        raised = stance != AGREE
        np.add.at(self.raised, (rows[raised], concern[raised]), 1)
        np.add.at(self.stances, (rows, stance), 1)
        self.concern_bits[rows] |= np.where(raised, 1 << concern, 0)
        escalated = stance == ESCALATE
        self.safety_bits[rows] |= np.where(escalated, 1 << concern, 0)
        words = t.reply_words[text, role, stance, overridden]
        self.assistant_turns[rows] += 1
        self.assistant_words[rows] += words
        self.hits[rows] += t.reply_hits[text, role, stance, overridden]
        self.completion_words[rows] += t.completion_words[text, role, stance, overridden]
        self.prompt_words[rows] += t.system_words[role] + self.history_words[rows]
        self.history_words[rows] += words
        self.reply_role_bits[rows] |= 1 << role

    def run(self, messages: IntArray, switches: BoolArray, switch_at: IntArray, switch_pick: IntArray,
            arm_roles: IntArray, n_roles: IntArray, drawn: IntArray, response: FloatArray, delay: FloatArray,
            override_prob: float, reconsider_prob: float) -> None:
        t, m = self.texts, self.m
        alive = np.ones(m, dtype=bool)
        changed_course = np.zeros(m, dtype=bool)
        unanswered = np.zeros((m, drawn.shape[1]), dtype=np.int64)  # challenges nobody responded to, per message
        for j in range(drawn.shape[1]):
            rows = np.flatnonzero(alive & (j < messages))
            if not len(rows):
                break
            switching = rows[switches[rows] & (switch_at[rows] == j)]
            if len(switching):  # a different role of the arm, the current one left out
                current = np.argmax(arm_roles[switching] == self.role[switching, None], axis=1)
                pick = switch_pick[switching] + (switch_pick[switching] >= current)
                self.role[switching] = arm_roles[switching, np.minimum(pick, n_roles[switching] - 1)]
                self.role_bits[switching] |= 1 << self.role[switching]
                self.switched[switching] = True
            text = np.where(changed_course[rows], t.changed_course, drawn[rows, j])
            changed_course[rows] = False
            if j == 0:
                self.first_text[rows] = text
            self.last_text[rows] = text
            self.participant_turns[rows] += 1
            self.participant_words[rows] += t.words[text]
            self.history_words[rows] += t.words[text]
            self.reassurance[rows] += t.reassurance[text]
            self.dependence[rows] += t.dependence[text]
            self.crisis[rows] += t.crisis[text] != NONE
            self.duration[rows] += delay[rows, j] + 5
            platform, platform_concern = self._platform(rows, text)
            model_concern = t.model_concern[text, self.role[rows]]
            model = np.where(platform == ESCALATE, AGREE, self._graduated(rows, model_concern))
            stance = np.maximum(platform, model)
            concern = np.where(model > platform, model_concern, platform_concern)
            self._reply(rows, text, stance, concern, 0)
            alive[rows[stance == ESCALATE]] = False
            pushed = (stance == NUDGE) | (stance == CHALLENGE)
            answer = response[rows, j]
            override = pushed & (answer < override_prob)
            reconsider = pushed & ~override & (answer < override_prob + reconsider_prob)
            challenge = stance == CHALLENGE
            self.challenges_overridden[rows] += override & challenge
            self.challenges_reconsidered[rows] += reconsider & challenge
            unanswered[rows, j] += challenge & ~override & ~reconsider
            self.reconsiders[rows] += reconsider
            changed_course[rows] = reconsider
            if override.any():  # "go ahead anyway": the same message answered again, the concern set aside
                again, again_text, again_concern = rows[override], text[override], concern[override]
                self.overridden[again, again_concern] = True
                self.overrides[again] += 1
                self.duration[again] += 25
                stance_again, concern_again = self._platform(again, again_text)
                self._reply(again, again_text, stance_again, concern_again, 1)
                unanswered[again, j] += stance_again == CHALLENGE
        later = np.arange(drawn.shape[1])[None, :] + 1 < self.participant_turns[:, None]
        self.challenges_continued = (unanswered * later).sum(axis=1)
        self.challenges_left = (unanswered * ~later).sum(axis=1)


def _label_masks(values: pd.Series) -> tuple[IntArray, tuple[str, ...]]:
    """A ';'-separated list column as bit masks over its labels (alphabetical): few distinct
    values, so each is split once."""
    codes, uniques = pd.factorize(values.to_numpy(dtype=object))
    parts = [set(str(u).split(LIST_SEPARATOR)) - {""} if isinstance(u, str) else set() for u in uniques]
    labels = tuple(sorted(set().union(*parts)))
    table = np.array([sum(1 << labels.index(x) for x in p) for p in parts] or [0], dtype=np.int64)
    return np.where(codes >= 0, table[np.maximum(codes, 0)], 0), labels


def _participant_roles(conversations: pd.DataFrame) -> pd.DataFrame:
    """roles_used (union over the participant's conversations) and first_role (starting role of
    the first), indexed by person."""
    if conversations.empty:
        return pd.DataFrame({"roles_used": pd.Series(dtype=object), "first_role": pd.Series(dtype=object)},
                            index=pd.Index([], name="person"))
    ordered = conversations.sort_values(["started_at", "conversation_id"])
    masks, labels = _label_masks(ordered["roles_used"])
    person = ordered["person"].to_numpy(dtype=np.int64)
    union = np.zeros(int(person.max()) + 1, dtype=np.int64)
    np.bitwise_or.at(union, person, masks)
    people = np.unique(person)
    first = ordered.groupby("person")["starting_role"].first()
    return pd.DataFrame({"roles_used": _bit_labels(labels)[union[people]],
                         "first_role": first.reindex(people).to_numpy()}, index=pd.Index(people, name="person"))


_SHIFT = 43  # bits of microseconds since the study's first time in a (participant, time) sort key


def _with_wave_features(panel: pd.DataFrame, conversations: pd.DataFrame) -> pd.DataFrame:
    """The conv_* columns: each follow-up row rolls up the participant's conversations started
    before its intended time, as analysis.features.wave_features does (cumulative window), from
    running totals per participant instead of pairing every wave with every conversation."""
    ordered = conversations.sort_values(["person", "started_at", "conversation_id"]).reset_index(drop=True)
    started = ordered["started_at"].to_numpy(dtype="datetime64[us]").astype(np.int64)
    intended = panel["intended_at"].to_numpy(dtype="datetime64[us]").astype(np.int64)
    every = np.concatenate([started, intended])
    base = int(every.min()) if len(every) else 0
    if len(every) and int(every.max()) - base >= 1 << _SHIFT:
        raise ValueError("a study longer than 101 days does not fit the roll-up's sort key")
    key = (ordered["person"].to_numpy(dtype=np.int64) << _SHIFT) + (started - base)
    owner = panel["person"].to_numpy(dtype=np.int64) << _SHIFT
    first = np.searchsorted(key, owner, side="left")
    upto = np.searchsorted(key, owner + (intended - base), side="left")  # started strictly before
    count = upto - first
    has = count > 0
    followup = (panel["wave"] != "baseline").to_numpy()

    def running(values: npt.ArrayLike) -> FloatArray:
        totals = np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])
        return np.asarray(totals[upto] - totals[first], dtype=float)

    times = ordered["started_at"].to_numpy(dtype="datetime64[us]")
    never = np.datetime64("NaT", "us")

    def at(index: IntArray) -> npt.NDArray[Any]:
        return np.where(has, times[np.clip(index, 0, len(times) - 1)] if len(times) else never, never)

    values: dict[str, Any] = {"n_conversations": count.astype(float), "first_conversation_at": at(first),
                              "last_conversation_at": at(upto - 1)}
    for name, feature in FEATURES.items():
        column, _ = _rolled(name, feature)
        if feature.rollup == "sum":
            values[column] = running(ordered[name].astype("Float64").fillna(0).to_numpy(dtype=float))
        elif feature.rollup == "mean":
            numbers = ordered[name].to_numpy(dtype=float)
            with np.errstate(invalid="ignore", divide="ignore"):
                values[column] = running(np.nan_to_num(numbers)) / running(~np.isnan(numbers))
        elif feature.rollup == "union":
            masks, labels = _label_masks(ordered[name])
            union = np.zeros(len(panel), dtype=np.int64)
            for bit in range(len(labels)):
                union |= (running(masks >> bit & 1) > 0).astype(np.int64) << bit
            values[column] = _bit_labels(labels)[union]
        elif feature.rollup == "first" and name != "participant_code":
            values[column] = np.where(has, panel[name].to_numpy(dtype=object), np.nan)
    values["pushback_rate"] = (values["nudge_turns"] + values["challenge_turns"]) / np.where(
        values["assistant_turns"] > 0, values["assistant_turns"], np.nan)
    values["affirmation_per_100_words"] = 100 * values["affirmation_hits"] / np.where(
        values["assistant_words"] > 0, values["assistant_words"], np.nan)
    out = panel.copy()
    for name, documented in PANEL_COLUMNS.items():
        if not name.startswith("conv_"):
            continue
        value = values[name.removeprefix("conv_")]
        if documented.type == "integer":
            out[name] = pd.array(np.round(value).astype(np.int64), dtype="Int64")
            out.loc[~followup, name] = pd.NA
        elif documented.type == "number":
            out[name] = np.where(followup, value, np.nan)
        elif documented.type == "datetime":
            stamps = pd.DatetimeIndex(value).tz_localize("UTC")
            out[name] = pd.Series(stamps, index=out.index).astype("datetime64[us, UTC]").where(followup & has)
        else:
            out[name] = np.where(followup, value, np.nan)
    return out


def _normalized(frame: pd.DataFrame, columns: dict[str, Any], integers: Literal["Int64"] | None = None
                ) -> pd.DataFrame:
    """The columns in order with the dtypes the real tables have: float64, aware UTC at us, boolean,
    integers as they are or as ``integers`` (the panel's Int64), and strings left as pandas holds
    them, missing values kept missing (``astype(str)`` would make them the text "nan" in pandas 2)."""
    out = frame[list(columns)].reset_index(drop=True)
    wanted = {"number": "float64", "datetime": "datetime64[us, UTC]", "boolean": "boolean"}
    for name, column in columns.items():
        dtype = str(out[name].dtype)
        if column.type in wanted and dtype != wanted[column.type]:
            out[name] = out[name].astype(wanted[column.type])  # type: ignore[call-overload]
        elif column.type == "integer" and (dtype not in ("int64", "Int64") or integers and dtype != integers):
            out[name] = out[name].astype("Int64")
        elif column.type == "string" and not pd.api.types.is_string_dtype(out[name].dtype):
            out[name] = out[name].astype(object).where(out[name].notna(), np.nan)
    return out
