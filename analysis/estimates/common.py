"""What every estimate shares: the data they read (:class:`StudyData`), who is in a fit
(:class:`Sample`), the notes they state (complete-case analysis, cluster-robust errors) and the
helpers that shape the read side's frames for a model: numbers as floats, term labels, the
reference arm, the enrollment-anchored PERMA follow-up rows, wave and group indicators, and
warnings collected as a fit's notes."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from analysis.features import FEATURES, WAVE_FEATURES, conversation_features
from analysis.panel import PERMA, panel, survival
from analysis.reading import Source
from study.clock import now

# Statuses of a follow-up whose outcome can no longer arrive: completed, or missing for good.
# open, not_yet_due and overdue (planned, not opened yet) are not missing: their window has not closed.
OBSERVABLE = ("completed", "expired", "withdrawn", "cancelled")
WITHDRAWN = "withdrawn"
NO_ROLE = "none"

# The conversation features the regret model and the immediate-vs-delayed comparison use by default.
# "role" is the focal-role indicator (ended in that role, vs any other). The pushback rate is left out
# because agree share + pushback rate + escalate share = 1: with escalations rare the two are the same
# variable with opposite signs, and a model with both cannot tell them apart.
REGRET_FEATURES = ("role", "agree_share", "overrides", "affirmation_per_100_words", "sentiment_change",
                   "reassurance_seeking_turns")

LABELS = {
    "baseline": "baseline score",
    "baseline_wellbeing": "baseline PERMA overall well-being",
    "agree_share": "share of the assistant's turns that agreed",
    "pushback_rate": "share of the assistant's turns that nudged or challenged",
    "overrides": "pushbacks the participant overrode",
    "affirmation_per_100_words": "affirming words per 100 assistant words",
    "sentiment_change": "sentiment change, first to last message",
    "reassurance_seeking_turns": "reassurance-seeking messages",
    "exit_rating": "exit rating (1-7)",
    "wellbeing_mode": "well-being mode (vs default)",
}
COMPLETE_CASE = ("Complete-case analysis: rows with a missing outcome or covariate are left out. The estimates "
                 "are unbiased if the data are missing at random given the covariates in the model (for the "
                 "mixed model: given them and the participant's observed waves).")
CLUSTER_ROBUST = ("Standard errors are cluster-robust by participant (CR2, with Bell-McCaffrey degrees of freedom "
                  "for the t intervals and p-values).")


# The data


def _empty(columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=object) for name in columns})


@dataclass(frozen=True)
class StudyData:
    """The three frames every model reads: the panel, the conversation features and the survival
    table, each shaped as the read side returns it. Build it from a database with :meth:`load`, or
    from frames (a notebook, a test, a simulated panel) with the constructor."""

    panel: pd.DataFrame
    conversations: pd.DataFrame = field(default_factory=lambda: _empty(list(FEATURES)))
    survival: pd.DataFrame = field(default_factory=lambda: _empty(("participant_code", "duration_days", "event")))
    study: str | int | None = None
    read_at: dt.datetime | None = None

    @classmethod
    def load(cls, source: Source, study: int | str) -> StudyData:
        """Read the study's panel, conversation features and survival table once."""
        read_at = now()
        return cls(panel=panel(source, study), conversations=conversation_features(source, study),
                   survival=survival(source, study), study=study, read_at=read_at)

    def for_models(self, perma_outcomes: Sequence[str] = ("overall_wellbeing",)) -> StudyData:
        """The frames narrowed to what the model suite reads (:func:`model_columns`), the coded
        strings held once per value: the same figures from a fraction of the memory."""
        return replace(self, panel=narrowed(self.panel, model_columns(self.panel.columns, perma_outcomes)),
                       conversations=narrowed(self.conversations, model_columns(self.conversations.columns)))


# What the model suite reads of the panel (analysis.estimates, diagnostics, sensitivity, the report's
# numbers), besides the PERMA scores of the outcomes fitted; of the conversation features it reads
# these and every number (the feature screen screens each numeric column).
MODEL_PANEL = ("participant_code", "arm", "mode", "roles_used", "first_role", "participant_status", "enrolled_at",
               "timezone_region", "wave", "anchor_key", "decision_id", "decision_conversation_id", "instrument_id",
               "days_since_enrollment", "response_status", "regret")
MODEL_CONVERSATIONS = ("conversation_id", "participant_code", "arm", "mode", "starting_role", "final_role",
                       "roles_used", "status")
# Strings with a few distinct values: held once each (a row points to its value's one string).
CODED = ("arm", "mode", "roles_used", "first_role", "starting_role", "final_role", "participant_status",
         "timezone_region", "wave", "anchor_key", "instrument_id", "response_status", "status")


NUMBERS = ("integer", "number", "boolean")


def model_columns(columns: Sequence[str] | pd.Index, perma_outcomes: Sequence[str] = ()) -> list[str]:
    """Of a panel's or conversation table's ``columns``, those the model suite reads (in their
    order): the panel's ``MODEL_PANEL`` and the PERMA scores (and baselines) of overall well-being
    and ``perma_outcomes`` and the numeric ``conv_*`` features (screened against PERMA change); the
    conversations' ``MODEL_CONVERSATIONS`` and their numeric features,
    told apart by the panel's ``wave`` column. For Parquet: pass the file's schema names and read
    only these."""
    names = [str(c) for c in columns]
    if "wave" not in names:
        return [c for c in names if c in MODEL_CONVERSATIONS
                or (c in FEATURES and FEATURES[c].type in NUMBERS)]
    scores = {name for outcome in ("overall_wellbeing", *perma_outcomes)
              for name in (f"perma_{outcome}", f"baseline_perma_{outcome}")}
    return [c for c in names if c in MODEL_PANEL or c in scores
            or (c.startswith("conv_") and c[5:] in WAVE_FEATURES and WAVE_FEATURES[c[5:]].type in NUMBERS)]


def narrowed(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``frame``'s ``columns``, the ``CODED`` strings held once per distinct value, 64-bit integers
    that fit in 32 bits as int32."""
    return pd.DataFrame({c: narrowed_column(c, frame[c]) for c in columns}, index=frame.index)


def narrowed_column(name: str, column: pd.Series) -> pd.Series:
    """One column as :func:`narrowed` holds it (to narrow a table read column by column)."""
    if name in CODED and column.dtype == object:
        # One string object per distinct value, still of dtype object: a categorical would change
        # what the models' groupbys and indicators see (every category, observed or not).
        shared = column.astype("category").astype(object)
        return shared.where(column.notna(), column)
    if column.dtype == np.int64 and len(column) and _INT32.min <= column.min() and column.max() <= _INT32.max:
        return column.astype(np.int32)  # counts and ids: exact, half the memory
    if column.dtype == "Int64" and column.notna().any() and _INT32.min <= column.min() and column.max() <= _INT32.max:
        return column.astype("Int32")
    return column


_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class Sample:
    """Who is in a fit. ``eligible`` rows are those whose outcome can no longer arrive (status in
    ``OBSERVABLE``); ``used`` rows are in the fit. ``missingness`` has one row per wave (and a
    total): the count of each response status, then eligible, missing_outcome, missing_covariates
    (outcome there, a covariate missing), imputed and used. ``withdrawn`` counts the eligible
    participants who withdrew (attrition)."""

    participants: int
    observations: int
    eligible_participants: int
    eligible_observations: int
    withdrawn: int
    missingness: pd.DataFrame

    def table(self) -> pd.DataFrame:
        """The counts as a two-column table (quantity, value), for a report."""
        return pd.DataFrame({"quantity": ["participants", "observations", "eligible_participants",
                                          "eligible_observations", "withdrawn_participants"],
                             "value": [self.participants, self.observations, self.eligible_participants,
                                       self.eligible_observations, self.withdrawn]})


def sample_of(rows: pd.DataFrame, used: pd.Series, outcome: pd.Series, *, imputed: bool = False,
            by: str = "wave") -> Sample:
    """``rows``: every row the analysis asked for (with participant_code, response_status and
    ``by``); ``used``: in the fit; ``outcome``: the outcome is present."""
    status = rows["response_status"].astype(str) if "response_status" in rows else pd.Series("completed",
                                                                                              index=rows.index)
    eligible = status.isin(OBSERVABLE)
    wave = rows[by].astype(str) if by in rows else pd.Series("all", index=rows.index)
    parts = pd.DataFrame({
        "wave": wave, "status": status, "eligible": eligible,
        "missing_outcome": eligible & ~outcome,
        "missing_covariates": eligible & outcome & ~used if not imputed else pd.Series(False, index=rows.index),
        "imputed": used & ~outcome if imputed else pd.Series(False, index=rows.index),
        "used": used,
    })
    counts = pd.crosstab(parts["wave"], parts["status"]) if len(parts) else pd.DataFrame()
    sums = parts.groupby("wave")[["eligible", "missing_outcome", "missing_covariates", "imputed", "used"]].sum()
    table = counts.join(sums, how="outer").fillna(0).astype("int64")
    table.loc["all"] = table.sum()
    table = table.reset_index().rename(columns={"index": "wave"})
    table.columns.name = None
    codes = rows["participant_code"]
    eligible_codes = set(codes[eligible])
    withdrawn = 0
    if "participant_status" in rows:
        people = rows[eligible].drop_duplicates("participant_code")
        withdrawn = int((people["participant_status"].astype(str) == WITHDRAWN).sum())
    return Sample(participants=int(codes[used].nunique()), observations=int(used.sum()),
                  eligible_participants=len(eligible_codes), eligible_observations=int(eligible.sum()),
                  withdrawn=withdrawn, missingness=table)


def floats(series: pd.Series) -> pd.Series:
    """Numbers as float64 with NaN for missing (nullable Int64/boolean columns included)."""
    if series.dtype == object or pd.api.types.is_string_dtype(series):
        return pd.to_numeric(series, errors="coerce").astype(float)
    return series.astype("Float64").astype(float)


def label_of(name: str, focal_role: str) -> str:
    if name == f"role_{focal_role}":
        return f"ended in the {focal_role} role (vs any other)"
    if name in LABELS:
        return LABELS[name]
    base = name.removeprefix("conv_").removeprefix("mean_")
    return FEATURES[base].definition if base in FEATURES else name


def coefficients_table(result: Any, focal_role: str = "", *, skip: Sequence[str] = ()) -> pd.DataFrame:
    """A statsmodels OLS/Logit result as a tidy table, numbers exactly as statsmodels gives them."""
    interval = result.conf_int()
    table = pd.DataFrame({
        "term": result.params.index, "estimate": result.params.to_numpy(), "se": result.bse.to_numpy(),
        "ci_low": interval.iloc[:, 0].to_numpy(), "ci_high": interval.iloc[:, 1].to_numpy(),
        "statistic": result.tvalues.to_numpy(), "p": result.pvalues.to_numpy()})
    table.insert(1, "label", [label_of(term, focal_role) for term in table["term"]])
    return table[~table["term"].isin(skip)].reset_index(drop=True)


# Shaping the panel for a model


def perma_rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str], dict[int, float]]:
    """Enrollment-anchored PERMA follow-up rows with ``wave_number`` 1..K in the order of their
    median day since enrollment; the wave names and typical days by number."""
    rows = frame[(frame["instrument_id"] == PERMA) & (frame["wave"] != "baseline")
                 & (frame["anchor_key"] == "enrollment")].copy()
    if rows.empty:
        raise ValueError("the panel has no PERMA follow-up waves to model")
    days = floats(rows["days_since_enrollment"]).groupby(rows["wave"]).median().sort_values(kind="stable")
    numbers = {wave: k for k, wave in enumerate(days.index, start=1)}
    rows["wave_number"] = rows["wave"].map(numbers).astype(int)
    return rows, {k: str(w) for w, k in numbers.items()}, {numbers[w]: float(d) for w, d in days.items()}


def pick_reference_arm(frame: pd.DataFrame, reference: str | None) -> str:
    arms = sorted(frame["arm"].dropna().astype(str).unique())
    if reference is not None:
        if reference not in arms:
            raise ValueError(f"reference arm {reference!r} is not in the data (arms: {', '.join(arms)})")
        return reference
    if not arms:
        raise ValueError("the panel has no arms")
    modes = dict(zip(frame["arm"].astype(str), frame["mode"].astype(str), strict=True)) if "mode" in frame else {}
    defaults = [arm for arm in arms if arm in modes and modes[arm] == "default"]
    return defaults[0] if defaults else arms[0]


def roles_of(frame: pd.DataFrame) -> pd.Series:
    role = frame["first_role"].astype(object) if "first_role" in frame else pd.Series(None, index=frame.index)
    return role.where(role.notna() & (role.astype(str) != ""), NO_ROLE).astype(str)



@contextmanager
def warnings_as_notes(category: type[Warning]) -> Iterator[list[str]]:
    """Collect the warnings of ``category`` as messages for the result's notes (a fit states its
    own problems); every other warning goes on to the caller as usual."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield messages
    for warning in caught:
        if issubclass(warning.category, category):
            messages.append(str(warning.message).strip())
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno,
                                   source=warning.source)


def observed_waves(observed: pd.DataFrame, waves: dict[int, str]) -> tuple[dict[int, str], list[str]]:
    """The waves with an observed outcome in every group (early in a study, later waves have none
    yet, or only the earliest enrollees of one arm: a wave seen in one group only would make that
    group's difference at the wave inestimable and the model singular)."""
    groups = set(observed["group"])
    seen = observed.groupby("wave_number")["group"].agg(lambda g: set(g) == groups)
    present = set(seen.index[seen.astype(bool)].astype(int).tolist())
    fitted = {k: w for k, w in waves.items() if k in present}
    notes = []
    missing = [w for k, w in waves.items() if k not in set(observed["wave_number"])]
    partial = [f"{w} ({int((observed['wave_number'] == k).sum())} values)" for k, w in waves.items()
               if k not in present and w not in missing]
    if missing:
        notes.append("no observed values yet at " + ", ".join(missing) + ": left out of the model.")
    if partial:
        notes.append("observed in only some groups so far at " + ", ".join(partial) + ": left out of the model.")
    if len(fitted) == 1:
        notes.append(f"one follow-up wave only ({next(iter(fitted.values()))}): no wave terms or random slopes; "
                     "the group terms are the differences at that wave.")
    return fitted, notes


def wave_dummies(frame: pd.DataFrame) -> pd.DataFrame:
    """One indicator per wave but the earliest (by median day since enrollment)."""
    order = floats(frame["days_since_enrollment"]).groupby(frame["wave"]).median().sort_values(kind="stable")
    return pd.DataFrame({f"wave {w}": (frame["wave"] == w).astype(float) for w in order.index[1:]},
                        index=frame.index)


def indicators(values: pd.Series, reference: str, prefix: str) -> pd.DataFrame:
    levels = sorted(v for v in values.unique() if v != reference)
    return pd.DataFrame({f"{prefix}{level} vs {reference}": (values == level).astype(float) for level in levels},
                        index=values.index)


def arm_adjustment(frame: pd.DataFrame, reference: str, *, by_wave: bool, baseline: str | None = None) -> pd.DataFrame:
    """The terms an analysis of conversation features holds fixed so that a feature is compared
    within arm: an intercept, ``baseline`` (a column of ``frame``) where there is one, one indicator
    per wave but the earliest, one per arm but ``reference`` and, with ``by_wave``, their products (the
    arm difference free to change from wave to wave, as the arm x time effect makes it). Columns
    constant over ``frame`` (a wave or an arm absent) are left out, so the design has full rank."""
    design = pd.DataFrame({"Intercept": 1.0}, index=frame.index)
    if baseline is not None:
        design["baseline"] = floats(frame[baseline])
    waves = wave_dummies(frame) if "wave" in frame and frame["wave"].nunique() > 1 else pd.DataFrame(index=frame.index)
    arms = indicators(frame["arm"].astype(str), reference, "arm ")
    design = pd.concat([design, waves, arms], axis=1)
    if by_wave:
        for arm in arms.columns:
            for wave in waves.columns:
                design[f"{arm} x {wave}"] = arms[arm] * waves[wave]
    keep = (design.std(ddof=0) > 0) | (design.columns == "Intercept")
    return design.loc[:, keep]


def within(column: pd.Series, adjustment: pd.DataFrame) -> pd.Series:
    """``column`` less its least-squares projection on ``adjustment``: what is left of a feature
    within arm (and wave); all but zero when the feature is the arm itself."""
    x = adjustment.to_numpy(float)
    y = column.to_numpy(float)
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    return pd.Series(y - x @ beta, index=column.index)
