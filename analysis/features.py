"""Conversation features: one row per conversation, and roll-ups per participant and per wave.

Computed set-based: a handful of SQL aggregates grouped by conversation for the whole study, one
pass over the text for words and affirmation-lexicon hits (inside the database on SQLite, streamed
elsewhere) and one query for each conversation's first and last participant message (the VADER
sentiment stored with it). No ORM objects.

    >>> import analysis.features as f
    >>> frame = f.conversation_features(engine, "wellbeing-pilot")
    >>> f.FEATURES["pushback_rate"].definition
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
from sqlalchemy import BigInteger, and_, case, cast, func, or_, select
from sqlalchemy.engine import Connection

from analysis.lexicons import count_affirmations, count_words
from analysis.reading import Source, connect, read_frame, resolve_study_id
from chat import monitors
from chat.models import Conversation, Decision, PushbackResponse, RoleSwitch, Turn
from chat.roles import STANCES
from scheduler.models import FollowUp
from study.models import Participant
from study.safety import SafetyEvent, SafetyLevel
from surveys.models import SurveyAssignment, SurveyResponse, SurveyScore

TEXT_CHUNK_ROWS = 50_000
LIST_SEPARATOR = ";"


@dataclass(frozen=True)
class Feature:
    """One column: what it means, its type (Frictionless names), its unit, and how it rolls up
    to a participant or a wave (sum, mean, union of lists, ratio recomputed from sums, first)."""

    definition: str
    type: Literal["integer", "number", "string", "boolean", "datetime"]
    unit: str | None = None
    rollup: Literal["sum", "mean", "union", "first", "ratio", "none"] = "none"


FEATURES: dict[str, Feature] = {
    "conversation_id": Feature("Conversation id (the conversations table).", "integer"),
    "participant_code": Feature("Pseudonymous participant code.", "string", rollup="first"),
    "arm": Feature("Study arm the conversation ran in.", "string", rollup="first"),
    "mode": Feature("Assistant mode of the arm: wellbeing (roles, pushback) or default.", "string",
                    rollup="first"),
    "starting_role": Feature("Role the conversation started in (the first switch's from-role, else its role).",
                             "string"),
    "final_role": Feature("Role in force when the data were read.", "string"),
    "roles_used": Feature("Roles the conversation was in, starting role then switch targets, "
                          "distinct, ';'-separated, alphabetical.", "string", rollup="union"),
    "role_switches": Feature("Number of role switches.", "integer", "switches", "sum"),
    "status": Feature("Conversation status: active or ended.", "string"),
    "started_at": Feature("When the conversation started (UTC).", "datetime"),
    "ended_at": Feature("When it ended (UTC); empty while active.", "datetime"),
    "duration_seconds": Feature("ended_at - started_at; while active, last turn - started_at.", "number",
                                "seconds", "sum"),
    "participant_turns": Feature("Messages written by the participant.", "integer", "turns", "sum"),
    "assistant_turns": Feature("Replies stored from the assistant.", "integer", "turns", "sum"),
    "participant_words": Feature("Words in the participant's messages (runs of characters other than spaces, "
                                 "tabs and line breaks).", "integer", "words", "sum"),
    "assistant_words": Feature("Words in the assistant's replies (counted the same way).", "integer",
                               "words", "sum"),
    **{f"{stance}_turns": Feature(f"Assistant turns whose final stance was '{stance}'.", "integer", "turns", "sum")
       for stance in STANCES},
    "pushback_rate": Feature("(nudge + challenge) / assistant turns: the overridable pushback (check-ins, "
                             "declines and escalations are counted apart); empty without assistant turns.", "number",
                             "proportion", "ratio"),
    "concerns_raised": Feature("Distinct concerns of non-agree assistant turns, ';'-separated, alphabetical.",
                               "string", rollup="union"),
    "n_concerns_raised": Feature("Number of distinct concerns raised.", "integer", "concerns"),
    "overrides": Feature("Pushbacks the participant overrode ('go ahead anyway').", "integer", "responses", "sum"),
    "reconsiders": Feature("Pushbacks the participant answered with 'let me reconsider'.", "integer", "responses",
                           "sum"),
    "challenges_reconsidered": Feature("Challenges after which the participant changed course (reconsider).",
                                       "integer", "challenges", "sum"),
    "challenges_overridden": Feature("Challenges the participant overrode.", "integer", "challenges", "sum"),
    "challenges_left": Feature("Challenges with no response and no later participant message (the "
                               "participant left).", "integer", "challenges", "sum"),
    "challenges_continued": Feature("Challenges with no response but a later participant message.", "integer",
                                    "challenges", "sum"),
    "reassurance_seeking_turns": Feature("Participant messages the monitor flagged as reassurance-seeking.",
                                         "integer", "turns", "sum"),
    "dependence_cues": Feature("Participant messages with a dependence cue (monitor feature dependence_signal).",
                               "integer", "turns", "sum"),
    "crisis_cues": Feature("Participant messages with a crisis finding (monitor feature crisis_category).",
                           "integer", "turns", "sum"),
    "safety_events": Feature("Safety events raised in the conversation, at any level (check-ins, escalations "
                             "and check-ins left unanswered: every risk finding staff review).", "integer", "events",
                             "sum"),
    "safety_escalations": Feature("Safety events of the conversation at level escalation (they page the on-call "
                                  "contacts): escalated by the reply or by the check-in's answers.", "integer",
                                  "events", "sum"),
    "safety_categories": Feature("Distinct safety-event categories, ';'-separated, alphabetical.", "string",
                                 rollup="union"),
    "models": Feature("Distinct models that produced the replies, ';'-separated, alphabetical.", "string",
                      rollup="union"),
    "prompt_versions": Feature("Distinct system-prompt versions of the replies, ';'-separated, alphabetical.",
                               "string", rollup="union"),
    "prompt_tokens": Feature("Prompt tokens summed over the replies (missing counts as 0).", "integer", "tokens",
                             "sum"),
    "completion_tokens": Feature("Completion tokens summed over the replies (missing counts as 0).", "integer",
                                 "tokens", "sum"),
    "cost_usd": Feature("LLM cost summed over the replies (missing counts as 0).", "number", "USD", "sum"),
    "exit_rating": Feature("Exit check: 'How helpful was this conversation?' (immediate-rating, 1-7); empty "
                           "if not rated.", "number", "points (1-7)", "mean"),
    "made_decision": Feature("Exit check: the participant said they made a decision; empty without an exit "
                             "check.", "boolean", rollup="sum"),
    "decision_id": Feature("Id of the decision recorded at the exit check, if any.", "integer"),
    "affirmation_hits": Feature("Affirmation-lexicon hits in the assistant's replies (analysis.lexicons).",
                                "integer", "hits", "sum"),
    "affirmation_per_100_words": Feature("100 x affirmation_hits / assistant_words; empty without assistant "
                                         "words.", "number", "hits per 100 words", "ratio"),
    "first_message_sentiment": Feature("VADER compound sentiment of the participant's first message (as the "
                                       "chat monitors stored it with the message).", "number",
                                       "compound (-1..1)", "mean"),
    "last_message_sentiment": Feature("VADER compound sentiment of the participant's last message (as "
                                      "stored with it).", "number", "compound (-1..1)", "mean"),
    "sentiment_change": Feature("last_message_sentiment - first_message_sentiment.", "number",
                                "compound (-2..2)", "mean"),
}

_ROLLUP_EXTRA: dict[str, Feature] = {
    "n_conversations": Feature("Conversations rolled up into this row.", "integer", "conversations"),
    "first_conversation_at": Feature("Start of the earliest conversation (UTC).", "datetime"),
    "last_conversation_at": Feature("Start of the latest conversation (UTC).", "datetime"),
}
_WAVE_EXTRA: dict[str, Feature] = {
    "followup_key": Feature("The protocol's follow-up id (the wave).", "string"),
    "anchor_key": Feature("What the follow-up is counted from: 'enrollment' or 'decision:<id>'.", "string"),
    "occurrence": Feature("Which occurrence of a repeating follow-up, from 0 (a single follow-up: 0).", "integer"),
    "intended_at": Feature("The follow-up's intended send time (due_at, UTC); conversations started before it "
                           "belong to the wave.", "datetime"),
    "window_start": Feature("Start of the wave's window: empty (cumulative) or the previous follow-up's "
                            "intended time.", "datetime"),
}


def _rolled(name: str, feature: Feature) -> tuple[str, Feature]:
    if feature.rollup == "mean":
        return f"mean_{name}", Feature(f"Mean over the conversations of: {feature.definition}", "number",
                                       feature.unit)
    if feature.rollup == "sum" and name == "made_decision":
        return "decisions_made", Feature("Conversations that ended with a decision.", "integer", "conversations")
    if feature.rollup in ("sum", "ratio"):
        kind: Literal["integer", "number"] = "integer" if feature.type == "integer" else "number"
        how = "Summed" if feature.rollup == "sum" else "Recomputed from the summed parts"
        return name, Feature(f"{how} over the conversations: {feature.definition}", kind, feature.unit)
    return name, feature


_PER_PARTICIPANT = dict(_rolled(n, f) for n, f in FEATURES.items() if f.rollup != "none")
PARTICIPANT_FEATURES: dict[str, Feature] = {"participant_code": FEATURES["participant_code"], **_ROLLUP_EXTRA,
                                            **_PER_PARTICIPANT}
WAVE_FEATURES: dict[str, Feature] = {"participant_code": FEATURES["participant_code"], **_WAVE_EXTRA,
                                     **_ROLLUP_EXTRA, **_PER_PARTICIPANT}


# Reading


@dataclass(frozen=True)
class Scope:
    """Which participants a read covers: a study, optionally some participant codes, optionally a
    range of participant ids (``first_id`` to ``last_id`` inclusive: one chunk of a streamed read,
    filtered on each table's own participant column so its index is used)."""

    study_id: int
    codes: Sequence[str] | None = None
    id_range: tuple[int, int] | None = None

    def conditions(self, participant_column: Any) -> list[Any]:
        """The filter, for a query that already joins (or reads) participants."""
        found = [Participant.study_id == self.study_id]
        if self.codes is not None:
            found.append(Participant.code.in_(list(self.codes)))
        if self.id_range is not None:
            found.append(participant_column.between(*self.id_range))
        return found

    def apply(self, query: Any, participant_column: Any) -> Any:
        """Join participants on ``participant_column`` and filter."""
        return query.join(Participant, Participant.id == participant_column).where(
            *self.conditions(participant_column))


def participant_chunks(connection: Connection, study_id: int, size: int) -> list[tuple[int, int]]:
    """The study's participant ids cut into ranges of at most ``size`` participants."""
    ids = connection.scalars(select(Participant.id).where(Participant.study_id == study_id)
                             .order_by(Participant.id)).all()
    return [(ids[i], ids[min(i + size, len(ids)) - 1]) for i in range(0, len(ids), size)]


def _count(condition: Any) -> Any:
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


def _lists(frame: pd.DataFrame, column: str, name: str, key: str = "conversation_id") -> pd.Series:
    """Distinct values of ``column`` per ``key``, sorted and ';'-joined (one pass in plain Python:
    a pandas aggregation with a Python function costs ~100 µs a group)."""
    values = frame[[key, column]].dropna(subset=[column])
    values = values.assign(**{column: values[column].astype(str)})
    values = values[values[column] != ""].drop_duplicates().sort_values([key, column])
    joined: dict[Any, list[str]] = {}
    for group, value in zip(values[key].tolist(), values[column].tolist(), strict=True):
        joined.setdefault(group, []).append(value)
    return pd.Series([LIST_SEPARATOR.join(parts) for parts in joined.values()],
                     index=pd.Index(list(joined), name=key), dtype=object, name=name)


def _text_counts(connection: Connection, scope: Scope) -> pd.DataFrame:
    """Words per side and affirmation-lexicon hits per conversation, with the counters of
    ``analysis.lexicons``. On SQLite they are registered as SQL functions, so the text is counted
    inside one aggregate query; elsewhere the text is streamed past them in chunks (PostgreSQL's
    own regular expressions are ten times slower than Python's on this lexicon)."""
    participant = Turn.speaker == "participant"
    if connection.dialect.name == "sqlite":
        raw = connection.connection.driver_connection
        raw.create_function("afterward_words", 1, count_words, deterministic=True)  # type: ignore[union-attr]
        raw.create_function("afterward_affirmations", 1, count_affirmations,  # type: ignore[union-attr]
                            deterministic=True)
        words = func.afterward_words(Turn.content)
        return read_frame(connection, scope.apply(select(
            Turn.conversation_id,
            func.sum(case((participant, words), else_=0)).label("participant_words"),
            func.sum(case((participant, 0), else_=words)).label("assistant_words"),
            func.sum(case((participant, 0), else_=func.afterward_affirmations(Turn.content)))
            .label("affirmation_hits"),
        ), Turn.participant_id).group_by(Turn.conversation_id)).set_index("conversation_id")
    totals: dict[int, list[int]] = {}
    query = scope.apply(select(Turn.conversation_id, Turn.speaker, Turn.content), Turn.participant_id)
    result = connection.execution_options(stream_results=True, yield_per=TEXT_CHUNK_ROWS).execute(query)
    for conversation_id, speaker, content in result:
        counts = totals.setdefault(conversation_id, [0, 0, 0])
        if speaker == "participant":
            counts[0] += count_words(content)
        else:
            counts[1] += count_words(content)
            counts[2] += count_affirmations(content)
    return pd.DataFrame.from_dict(totals, orient="index", dtype="int64",
                                  columns=["participant_words", "assistant_words", "affirmation_hits"])


def _sentiment(connection: Connection, scope: Scope) -> pd.DataFrame:
    """Sentiment of each conversation's first and last participant message: the VADER compound
    the chat monitors stored with the message, computed here only for messages stored without it
    (only those two messages are read)."""
    ends = scope.apply(select(Turn.conversation_id, func.min(Turn.seq).label("first_seq"),
                              func.max(Turn.seq).label("last_seq")), Turn.participant_id) \
        .where(Turn.speaker == "participant").group_by(Turn.conversation_id).subquery()
    stored = Turn.features["sentiment"].as_float()
    query = select(Turn.conversation_id, Turn.seq, stored, ends.c.first_seq, ends.c.last_seq,
                   case((stored.is_(None), Turn.content), else_=None)).join(
        ends, and_(Turn.conversation_id == ends.c.conversation_id,
                   or_(Turn.seq == ends.c.first_seq, Turn.seq == ends.c.last_seq)))
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    result = connection.execution_options(stream_results=True, yield_per=TEXT_CHUNK_ROWS).execute(query)
    for conversation_id, seq, compound, first_seq, last_seq, content in result:
        if compound is None:
            compound = monitors.sentiment(content)
        if seq == first_seq:
            first[conversation_id] = compound
        if seq == last_seq:
            last[conversation_id] = compound
    frame = pd.DataFrame({"first_message_sentiment": pd.Series(first, dtype=float),
                          "last_message_sentiment": pd.Series(last, dtype=float)})
    frame["sentiment_change"] = frame["last_message_sentiment"] - frame["first_message_sentiment"]
    return frame


def _switches(connection: Connection, scope: Scope) -> pd.DataFrame:
    return read_frame(connection, scope.apply(select(
        RoleSwitch.conversation_id, RoleSwitch.from_role, RoleSwitch.to_role, RoleSwitch.after_seq, RoleSwitch.id,
    ), RoleSwitch.participant_id).order_by(RoleSwitch.conversation_id, RoleSwitch.after_seq, RoleSwitch.id))


def _add_roles(frame: pd.DataFrame, switches: pd.DataFrame) -> None:
    """starting_role, roles_used and role_switches of conversations (``frame`` indexed by
    conversation id, with ``final_role``) from their role switches."""
    if switches.empty:
        frame["starting_role"] = frame["final_role"]
        frame["roles_used"] = frame["final_role"]
        frame["role_switches"] = 0
        return
    by_conversation = switches.groupby("conversation_id")
    frame["starting_role"] = by_conversation["from_role"].first().reindex(frame.index).fillna(frame["final_role"])
    starts = frame["starting_role"].rename("role").reset_index()
    targets = switches[["conversation_id", "to_role"]].rename(columns={"to_role": "role"})
    frame["roles_used"] = _lists(pd.concat([starts, targets]), "role", "roles_used")
    frame["role_switches"] = by_conversation.size().reindex(frame.index).fillna(0)


def conversation_roles(source: Source, study: int | str) -> pd.DataFrame:
    """Per conversation only the role columns (participant_code, started_at, final_role,
    starting_role, roles_used, role_switches): what the survival table needs, without the rest."""
    with connect(source) as connection:
        return _conversation_roles(connection, Scope(resolve_study_id(connection, study)))


def _conversation_roles(connection: Connection, scope: Scope) -> pd.DataFrame:
    frame = read_frame(connection, scope.apply(select(
        Conversation.id.label("conversation_id"), Participant.code.label("participant_code"),
        Conversation.started_at, Conversation.role.label("final_role"),
    ), Conversation.participant_id)).set_index("conversation_id")
    _add_roles(frame, _switches(connection, scope))
    return frame.reset_index().sort_values("conversation_id", kind="stable").reset_index(drop=True)


def participant_roles(conversations: pd.DataFrame) -> pd.DataFrame:
    """Per participant (index participant_code): ``roles_used`` (every role of any conversation)
    and ``first_role`` (the starting role of the first conversation), from conversation rows."""
    if conversations.empty:
        return pd.DataFrame({"roles_used": pd.Series(dtype=object), "first_role": pd.Series(dtype=object)},
                            index=pd.Index([], name="participant_code"))
    used = conversations[["participant_code", "roles_used"]].assign(
        roles_used=conversations["roles_used"].str.split(LIST_SEPARATOR)).explode("roles_used")
    roles = _lists(used, "roles_used", "roles_used", "participant_code").to_frame()
    first = conversations.sort_values(["started_at", "conversation_id"]).groupby("participant_code").first()
    roles["first_role"] = first["starting_role"]
    return roles


def starting_role() -> Any:
    """A conversation's starting role as SQL (the query selects from conversations): the from-role
    of its first role switch, else its role, as ``_add_roles`` finds it from the switches."""
    first = (select(RoleSwitch.from_role).where(RoleSwitch.conversation_id == Conversation.id)
             .order_by(RoleSwitch.after_seq, RoleSwitch.id).limit(1).correlate(Conversation).scalar_subquery())
    return func.coalesce(first, Conversation.role)


def conversation_cells(source: Source, study: int | str) -> pd.DataFrame:
    """Conversations summed per participant, arm and starting role, in SQL (no row per turn or
    conversation leaves the database): participant_id, arm, starting_role, conversations,
    assistant_turns, pushback_turns (nudge or challenge), overrides, reconsiders. The counts
    mean what the same columns of ``conversation_features`` mean; the aggregate tables and the
    dashboard rest on it."""
    with connect(source) as connection:
        scope = Scope(resolve_study_id(connection, study))
        # Turns filtered by conversation: the (conversation, speaker, stance) index then serves the
        # whole count without reading a turn's row.
        in_study = scope.apply(select(Conversation.id), Conversation.participant_id)
        assistant = Turn.speaker == "assistant"
        turns = select(
            Turn.conversation_id, _count(assistant).label("assistant_turns"),
            _count(and_(assistant, Turn.stance.in_(("nudge", "challenge")))).label("pushback_turns"),
        ).where(Turn.conversation_id.in_(in_study)).group_by(Turn.conversation_id).subquery()
        responses = select(
            PushbackResponse.conversation_id, _count(PushbackResponse.action == "override").label("overrides"),
            _count(PushbackResponse.action == "reconsider").label("reconsiders"),
        ).where(PushbackResponse.conversation_id.in_(in_study)).group_by(PushbackResponse.conversation_id).subquery()
        role = starting_role().label("starting_role")
        return read_frame(connection, scope.apply(select(
            Conversation.participant_id, Conversation.arm, role, func.count().label("conversations"),
            *(cast(func.coalesce(func.sum(column), 0), BigInteger).label(column.name)  # PostgreSQL: not numeric
              for column in (turns.c.assistant_turns, turns.c.pushback_turns, responses.c.overrides,
                             responses.c.reconsiders)),
        ).outerjoin(turns, turns.c.conversation_id == Conversation.id)
            .outerjoin(responses, responses.c.conversation_id == Conversation.id), Conversation.participant_id)
            .group_by(Conversation.participant_id, Conversation.arm, role))


def conversation_features(source: Source, study: int | str, *,
                          participant_codes: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per conversation of ``study`` (id or slug), columns as documented in ``FEATURES``.
    ``participant_codes`` restricts it to some participants."""
    with connect(source) as connection:
        return _conversation_features(connection, Scope(resolve_study_id(connection, study), participant_codes))


def iter_conversation_features(source: Source, study: int | str, *,
                               chunk_participants: int = 5_000) -> Iterator[pd.DataFrame]:
    """``conversation_features`` in chunks of at most ``chunk_participants`` participants (their
    conversations in id order within a chunk), so memory stays flat however large the study."""
    with connect(source) as connection:
        study_id = resolve_study_id(connection, study)
        for id_range in participant_chunks(connection, study_id, chunk_participants):
            yield _conversation_features(connection, Scope(study_id, id_range=id_range))


def _conversation_features(connection: Connection, scope: Scope) -> pd.DataFrame:
    base = read_frame(connection, scope.apply(select(
        Conversation.id.label("conversation_id"), Participant.code.label("participant_code"),
        Conversation.arm, Conversation.mode, Conversation.role.label("final_role"), Conversation.status,
        Conversation.started_at, Conversation.ended_at, Conversation.made_decision,
        Decision.id.label("decision_id"),
    ).outerjoin(Decision, Decision.conversation_id == Conversation.id), Conversation.participant_id))
    if base.empty:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in FEATURES})
    assistant, participant = Turn.speaker == "assistant", Turn.speaker == "participant"
    turns = read_frame(connection, scope.apply(select(
        Turn.conversation_id,
        _count(participant).label("participant_turns"), _count(assistant).label("assistant_turns"),
        *[_count(and_(assistant, Turn.stance == stance)).label(f"{stance}_turns") for stance in STANCES],
        _count(and_(participant, Turn.reassurance_seeking.is_(True))).label("reassurance_seeking_turns"),
        _count(and_(participant, Turn.features["dependence_signal"].as_boolean().is_(True)))
        .label("dependence_cues"),
        _count(and_(participant, Turn.features["crisis_category"].as_string().is_not(None)))
        .label("crisis_cues"),
        func.coalesce(func.sum(Turn.prompt_tokens), 0).label("prompt_tokens"),
        func.coalesce(func.sum(Turn.completion_tokens), 0).label("completion_tokens"),
        func.coalesce(func.sum(Turn.cost_usd), 0.0).label("cost_usd"),
        func.max(Turn.created_at).label("last_turn_at"),
    ), Turn.participant_id).group_by(Turn.conversation_id)).set_index("conversation_id")

    # What happened after each challenge: its response, else whether the participant wrote again.
    last_message = scope.apply(select(Turn.conversation_id, func.max(Turn.seq).label("last_seq")),
                               Turn.participant_id).where(participant).group_by(Turn.conversation_id).subquery()
    wrote_again = and_(last_message.c.last_seq.is_not(None), last_message.c.last_seq > Turn.seq)
    unanswered = PushbackResponse.id.is_(None)
    challenges = read_frame(connection, scope.apply(select(
        Turn.conversation_id,
        _count(PushbackResponse.action == "reconsider").label("challenges_reconsidered"),
        _count(PushbackResponse.action == "override").label("challenges_overridden"),
        _count(and_(unanswered, ~wrote_again)).label("challenges_left"),
        _count(and_(unanswered, wrote_again)).label("challenges_continued"),
    ).outerjoin(PushbackResponse, PushbackResponse.turn_id == Turn.id)
        .outerjoin(last_message, last_message.c.conversation_id == Turn.conversation_id), Turn.participant_id)
        .where(assistant, Turn.stance == "challenge").group_by(Turn.conversation_id)).set_index("conversation_id")

    responses = read_frame(connection, scope.apply(select(
        PushbackResponse.conversation_id, _count(PushbackResponse.action == "override").label("overrides"),
        _count(PushbackResponse.action == "reconsider").label("reconsiders"),
    ), PushbackResponse.participant_id).group_by(PushbackResponse.conversation_id)) \
        .set_index("conversation_id")

    switches = _switches(connection, scope)
    concerns = read_frame(connection, scope.apply(
        select(Turn.conversation_id, Turn.concern).distinct(), Turn.participant_id,
    ).where(assistant, Turn.stance != "agree", Turn.concern.is_not(None), Turn.concern != "none"))
    versions = read_frame(connection, scope.apply(
        select(Turn.conversation_id, Turn.model, Turn.prompt_version).distinct(), Turn.participant_id,
    ).where(assistant))
    safety = read_frame(connection, scope.apply(
        select(SafetyEvent.conversation_id, SafetyEvent.category, func.count().label("n"),
               func.count(case((SafetyEvent.level == SafetyLevel.ESCALATION, 1))).label("escalations")),
        SafetyEvent.participant_id,
    ).group_by(SafetyEvent.conversation_id, SafetyEvent.category))
    ratings = read_frame(connection, scope.apply(select(
        SurveyAssignment.context["conversation_id"].as_string().label("conversation_id"),
        SurveyScore.value.label("exit_rating"),
    ).join(SurveyResponse, SurveyResponse.assignment_id == SurveyAssignment.id)
        .join(SurveyScore, SurveyScore.response_id == SurveyResponse.id), SurveyAssignment.participant_id,
    ).where(SurveyAssignment.purpose == "exit", SurveyAssignment.instrument_id == "immediate-rating",
            SurveyScore.name == "helpful", SurveyResponse.submitted_at.is_not(None)))
    sentiment = _sentiment(connection, scope)

    frame = base.set_index("conversation_id")
    frame = frame.join(turns).join(_text_counts(connection, scope)).join(challenges).join(responses)
    _add_roles(frame, switches)
    frame["concerns_raised"] = _lists(concerns, "concern", "concerns_raised").reindex(frame.index).fillna("")
    frame["n_concerns_raised"] = (concerns.groupby("conversation_id").size().reindex(frame.index).fillna(0)
                                  if not concerns.empty else 0)
    frame["models"] = _lists(versions, "model", "models").reindex(frame.index).fillna("")
    frame["prompt_versions"] = _lists(versions, "prompt_version", "prompt_versions").reindex(frame.index).fillna("")
    for name, counted in (("safety_events", "n"), ("safety_escalations", "escalations")):
        frame[name] = (safety.groupby("conversation_id")[counted].sum().reindex(frame.index).fillna(0)
                       if not safety.empty else 0)
    frame["safety_categories"] = _lists(safety, "category", "safety_categories").reindex(frame.index).fillna("")
    if not ratings.empty:
        ratings["conversation_id"] = ratings["conversation_id"].astype(int)
        frame["exit_rating"] = ratings.groupby("conversation_id")["exit_rating"].last().reindex(frame.index)
    else:
        frame["exit_rating"] = float("nan")
    frame = frame.join(sentiment)

    counts = [name for name, feature in FEATURES.items() if feature.type == "integer"
              and name not in ("conversation_id", "decision_id")]
    frame[counts] = frame[counts].apply(pd.to_numeric).fillna(0).astype("int64")
    frame["cost_usd"] = frame["cost_usd"].fillna(0.0).astype(float)
    frame["pushback_rate"] = ((frame["nudge_turns"] + frame["challenge_turns"])
                              / frame["assistant_turns"].where(frame["assistant_turns"] > 0))
    frame["affirmation_per_100_words"] = (100 * frame["affirmation_hits"]
                                          / frame["assistant_words"].where(frame["assistant_words"] > 0))
    end = frame["ended_at"].where(frame["ended_at"].notna(), frame["last_turn_at"])
    frame["duration_seconds"] = (pd.to_datetime(end, utc=True)
                                 - pd.to_datetime(frame["started_at"], utc=True)).dt.total_seconds()
    frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True)
    frame["ended_at"] = pd.to_datetime(frame["ended_at"], utc=True)
    frame["made_decision"] = frame["made_decision"].astype("boolean")
    frame["decision_id"] = frame["decision_id"].astype("Int64")
    for column in ("exit_rating", "first_message_sentiment", "last_message_sentiment", "sentiment_change"):
        frame[column] = frame[column].astype(float)
    frame = frame.reset_index().sort_values("conversation_id", kind="stable").reset_index(drop=True)
    return frame[list(FEATURES)]


# Roll-ups


def _roll_up(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Aggregate conversation features over ``keys`` as each feature's ``rollup`` says."""
    grouped = frame.groupby(keys, sort=True, dropna=False)
    out = grouped.size().rename("n_conversations").to_frame()
    group_numbers = grouped.ngroup()  # 0, 1, ... in the order of the rows of ``out``
    out["first_conversation_at"] = grouped["started_at"].min()
    out["last_conversation_at"] = grouped["started_at"].max()
    for name, feature in FEATURES.items():
        if name in keys or feature.rollup in ("none", "ratio"):
            continue
        column, _ = _rolled(name, feature)
        if feature.rollup == "sum":
            out[column] = grouped[name].sum().astype(float if feature.type == "number" else "int64")
        elif feature.rollup == "mean":
            out[column] = grouped[name].mean().astype(float)
        elif feature.rollup == "union":  # by group number: the keys may hold NaT, which never matches
            parts = pd.DataFrame({"group": group_numbers, name: frame[name].fillna("").str.split(LIST_SEPARATOR)})
            lists = _lists(parts.explode(name), name, column, "group")
            out[column] = lists.reindex(range(len(out))).fillna("").to_numpy()
        elif feature.rollup == "first":
            out[column] = grouped[name].first()
    out["pushback_rate"] = ((out["nudge_turns"] + out["challenge_turns"])
                            / out["assistant_turns"].where(out["assistant_turns"] > 0))
    out["affirmation_per_100_words"] = (100 * out["affirmation_hits"]
                                        / out["assistant_words"].where(out["assistant_words"] > 0))
    return out.reset_index()


def participant_features(source: Source, study: int | str, *, participant_codes: Sequence[str] | None = None,
                         conversations: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per participant with at least one conversation; columns in ``PARTICIPANT_FEATURES``.
    Pass ``conversations`` (from ``conversation_features``) to reuse it instead of reading again."""
    frame = conversations if conversations is not None else conversation_features(
        source, study, participant_codes=participant_codes)
    return _roll_up(frame, ["participant_code"])[list(PARTICIPANT_FEATURES)]


def wave_features(source: Source, study: int | str, *, participant_codes: Sequence[str] | None = None,
                  followup_keys: Sequence[str] | None = None,
                  window: Literal["cumulative", "since_previous"] = "cumulative",
                  conversations: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per follow-up (participant x wave), rolling up the conversations started before
    its intended time: all of them (``cumulative``), or only those since the participant's
    previous follow-up of the selection (``since_previous``). A wave without conversations has
    ``n_conversations`` 0 and zero counts. Columns in ``WAVE_FEATURES``."""
    with connect(source) as connection:
        scope = Scope(resolve_study_id(connection, study), participant_codes)
        frame = conversations if conversations is not None else _conversation_features(connection, scope)
        return _wave_features(connection, scope, frame, followup_keys=followup_keys, window=window)


def _wave_features(connection: Connection, scope: Scope, frame: pd.DataFrame, *,
                   followup_keys: Sequence[str] | None = None,
                   window: Literal["cumulative", "since_previous"] = "cumulative") -> pd.DataFrame:
    query = scope.apply(select(Participant.code.label("participant_code"), FollowUp.followup_key,
                               FollowUp.anchor_key, FollowUp.occurrence, FollowUp.due_at.label("intended_at")),
                        FollowUp.participant_id)
    if followup_keys is not None:
        query = query.where(FollowUp.followup_key.in_(list(followup_keys)))
    waves = read_frame(connection, query)
    if waves.empty:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in WAVE_FEATURES})
    waves["intended_at"] = pd.to_datetime(waves["intended_at"], utc=True)
    waves = waves.sort_values(["participant_code", "intended_at", "followup_key", "anchor_key"])
    previous = waves.groupby("participant_code")["intended_at"].shift()
    waves["window_start"] = previous if window == "since_previous" else pd.NaT
    waves["window_start"] = pd.to_datetime(waves["window_start"], utc=True)
    keys = ["participant_code", "followup_key", "anchor_key", "occurrence", "intended_at", "window_start"]
    paired = waves.merge(frame, on="participant_code", how="inner")
    inside = paired["started_at"] < paired["intended_at"]
    inside &= paired["window_start"].isna() | (paired["started_at"] >= paired["window_start"])
    rolled = (_roll_up(paired[inside], keys) if inside.any()
              else pd.DataFrame(columns=[*keys, "n_conversations"]))  # no conversation before any wave
    out = waves[keys].merge(rolled, on=keys, how="left")
    out["n_conversations"] = pd.to_numeric(out["n_conversations"]).fillna(0).astype("int64")
    for name, feature in WAVE_FEATURES.items():
        if name in out.columns and feature.type == "integer" and name != "n_conversations":
            out[name] = out[name].fillna(0).astype("int64")
        elif name not in out.columns:
            out[name] = pd.NA
    for name in ("roles_used", "concerns_raised", "safety_categories", "models", "prompt_versions"):
        out[name] = out[name].fillna("")
    return out[list(WAVE_FEATURES)].reset_index(drop=True)
