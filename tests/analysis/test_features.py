"""Conversation features on a hand-built study: every value below was worked out by hand from the
messages and replies the builder sent (word counts counted, sums added, lexicon hits marked)."""

from __future__ import annotations

import datetime as dt
import math
import random
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

from analysis import operations
from analysis.features import (
    FEATURES,
    PARTICIPANT_FEATURES,
    WAVE_FEATURES,
    conversation_features,
    iter_conversation_features,
    participant_features,
    wave_features,
)
from analysis.lexicons import affirmation_pattern, affirmation_phrases, count_affirmations
from chat.models import Conversation, Turn
from chat.roles import system_prompt
from study import clock, studies
from study.db import session_scope
from study.models import Participant
from tests.analysis.builders import StudyBuilder
from tests.builders import FRAMING  # 16 words

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # a Monday; Berlin is UTC+1 until 29 March
MINUTE = dt.timedelta(minutes=1)
VADER = SentimentIntensityAnalyzer()


def compound(text: str) -> float:
    return float(VADER.polarity_scores(text)["compound"])


@dataclass
class Study:
    slug: str
    alice: str  # wellbeing arm: three conversations
    bob: str  # control arm: one conversation
    carol: str  # wellbeing arm: no conversation
    conversations: list[int]


@pytest.fixture
def study(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> Study:
    build = StudyBuilder(engine, example_protocol)
    alice, bob, carol = build.participant("wellbeing"), build.participant("control"), build.participant("wellbeing")

    # c1, 09:00-09:05: a challenge the participant reconsiders, a role switch, a decision and a rating.
    c1 = build.start(alice, "coach")
    frozen_clock.advance(MINUTE)
    r1 = build.say(alice, c1, FRAMING, "You're right that it hurts. Is quitting tomorrow wise?",
                   proposes="challenge/unsupported_framing", prompt_tokens=100, completion_tokens=20, cost_usd=0.001)
    assert (r1.stance, r1.concern) == ("challenge", "unsupported_framing")
    build.reconsider(alice, c1, r1.id)
    frozen_clock.advance(MINUTE)
    build.switch(alice, c1, "collaborator")
    frozen_clock.advance(MINUTE)
    r2 = build.say(alice, c1, "Help me plan my week", "Sounds good. Start with Monday.",
                   prompt_tokens=120, completion_tokens=10, cost_usd=0.002, model="test/model-b")
    assert r2.stance == "agree"
    frozen_clock.advance(2 * MINUTE)
    build.end(alice, c1, rating=6, decision="Stay at my job")

    # c2, ten days later: a challenge overridden, reassurance-seeking, an escalation; left active.
    frozen_clock.set(T0 + dt.timedelta(days=10))
    c2 = build.start(alice, "coach")
    frozen_clock.advance(MINUTE)
    r3 = build.say(alice, c2, FRAMING, "Think it over first.", proposes="challenge/unsupported_framing",
                   prompt_tokens=50, completion_tokens=5)
    assert r3.stance == "challenge"
    frozen_clock.advance(MINUTE)
    r3b = build.override(alice, c2, r3.id, "Absolutely, here is a resignation letter.", prompt_tokens=60,
                         completion_tokens=8)
    assert r3b.stance == "agree"
    frozen_clock.advance(MINUTE)
    r4 = build.say(alice, c2, "Will my biopsy come back okay?", "That is understandable.")
    assert r4.stance == "agree"
    frozen_clock.advance(MINUTE)
    r5 = build.say(alice, c2, "I want to kill myself", "Please call 988 now.")
    assert (r5.stance, r5.concern) == ("escalate", "risk_to_self")

    # c3, an hour after c2 started: a challenge the participant leaves without answering.
    frozen_clock.set(T0 + dt.timedelta(days=10, hours=1))
    c3 = build.start(alice, "coach")
    frozen_clock.advance(MINUTE)
    r6 = build.say(alice, c3, "He obviously hates me, so I'll avoid him", "Perhaps he is busy.",
                   proposes="challenge/unsupported_framing")
    assert r6.stance == "challenge"

    # c4, control arm, on day 1: a dependence cue, a rating, no decision.
    frozen_clock.set(T0 + dt.timedelta(days=1))
    c4 = build.start(bob, None)
    frozen_clock.advance(MINUTE)
    build.say(bob, c4, "Just tell me what to do", "Great idea to ask. Take the job.", cost_usd=0.01)
    frozen_clock.advance(MINUTE)
    build.say(bob, c4, "Thanks, that helps a lot", "You are welcome.", cost_usd=0.02)
    frozen_clock.advance(MINUTE)
    build.end(bob, c4, rating=3)
    return Study(build.slug, alice, bob, carol, [c1, c2, c3, c4])


def check(row: Any, expected: dict[str, Any]) -> None:
    for name, value in expected.items():
        actual = row[name]
        if value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
            assert pd.isna(actual), name
        elif isinstance(value, float):
            assert actual == pytest.approx(value, abs=1e-9), name
        else:
            assert actual == value, name


def test_every_conversation_feature_equals_a_hand_count(engine: Engine, study: Study) -> None:
    frame = conversation_features(engine, study.slug)
    assert list(frame.columns) == list(FEATURES)
    assert list(frame["conversation_id"]) == study.conversations
    c1, c2, c3, c4 = (frame.iloc[i] for i in range(4))
    coach, collaborator = system_prompt("coach").version, system_prompt("collaborator").version
    standard = system_prompt("standard").version
    check(c1, {
        "participant_code": study.alice, "arm": "wellbeing", "mode": "wellbeing",
        "starting_role": "coach", "final_role": "collaborator", "roles_used": "coach;collaborator",
        "role_switches": 1, "status": "ended", "started_at": pd.Timestamp(T0),
        "ended_at": pd.Timestamp(T0 + 5 * MINUTE), "duration_seconds": 300.0,
        "participant_turns": 2, "assistant_turns": 2,
        "participant_words": 16 + 5, "assistant_words": 9 + 5,  # "You're right ... wise?" 9; "Sounds good ..." 5
        "agree_turns": 1, "nudge_turns": 0, "challenge_turns": 1, "escalate_turns": 0, "pushback_rate": 0.5,
        "concerns_raised": "unsupported_framing", "n_concerns_raised": 1, "overrides": 0, "reconsiders": 1,
        "challenges_reconsidered": 1, "challenges_overridden": 0, "challenges_left": 0,
        "challenges_continued": 0, "reassurance_seeking_turns": 0, "dependence_cues": 0, "crisis_cues": 0,
        "safety_events": 0, "safety_categories": "", "models": "test/model-a;test/model-b",
        "prompt_versions": ";".join(sorted({coach, collaborator})),
        "prompt_tokens": 220, "completion_tokens": 30, "cost_usd": 0.003, "exit_rating": 6.0,
        "made_decision": True,
        "affirmation_hits": 3,  # "You're right", "wise", "Sounds good"
        "affirmation_per_100_words": 300 / 14,
        "first_message_sentiment": compound(FRAMING), "last_message_sentiment": compound("Help me plan my week"),
        "sentiment_change": compound("Help me plan my week") - compound(FRAMING),
    })
    assert c1["decision_id"] > 0
    check(c2, {
        "participant_code": study.alice, "starting_role": "coach", "final_role": "coach", "roles_used": "coach",
        "role_switches": 0, "status": "active", "ended_at": pd.NaT,
        "duration_seconds": 240.0,  # started at day 10 09:00, last reply at 09:04
        "participant_turns": 3, "assistant_turns": 4,  # the override adds a reply, not a message
        "participant_words": 16 + 6 + 5, "assistant_words": 4 + 6 + 3 + 4,
        "agree_turns": 2, "nudge_turns": 0, "challenge_turns": 1, "escalate_turns": 1, "pushback_rate": 0.25,
        "concerns_raised": "risk_to_self;unsupported_framing", "n_concerns_raised": 2,
        "overrides": 1, "reconsiders": 0, "challenges_reconsidered": 0, "challenges_overridden": 1,
        "challenges_left": 0, "challenges_continued": 0, "reassurance_seeking_turns": 1, "dependence_cues": 0,
        "crisis_cues": 1, "safety_events": 1, "safety_escalations": 1, "safety_categories": "risk_to_self",
        "models": "test/model-a",
        "prompt_versions": coach, "prompt_tokens": 110, "completion_tokens": 13, "cost_usd": 0.0,
        "exit_rating": math.nan, "affirmation_hits": 2,  # "Absolutely", "understandable"
        "affirmation_per_100_words": 200 / 17,
        "first_message_sentiment": compound(FRAMING),
        "last_message_sentiment": compound("I want to kill myself"),
    })
    assert pd.isna(c2["made_decision"])
    assert pd.isna(c2["decision_id"])
    check(c3, {
        "participant_turns": 1, "assistant_turns": 1, "participant_words": 8, "assistant_words": 4,
        "challenge_turns": 1, "pushback_rate": 1.0, "challenges_left": 1, "challenges_continued": 0,
        "affirmation_hits": 0, "affirmation_per_100_words": 0.0, "duration_seconds": 60.0,
        "sentiment_change": 0.0,
    })
    check(c4, {
        "participant_code": study.bob, "arm": "control", "mode": "default", "starting_role": "standard",
        "roles_used": "standard", "role_switches": 0, "status": "ended", "duration_seconds": 180.0,
        "participant_words": 6 + 5, "assistant_words": 7 + 3, "agree_turns": 2, "pushback_rate": 0.0,
        "concerns_raised": "", "n_concerns_raised": 0, "dependence_cues": 1, "reassurance_seeking_turns": 0,
        "models": "test/model-a", "prompt_versions": standard, "prompt_tokens": 0, "cost_usd": 0.03,
        "exit_rating": 3.0, "made_decision": False, "affirmation_hits": 1,  # "Great idea"
        "affirmation_per_100_words": 10.0,
    })


def test_roll_ups_per_participant_and_per_wave(engine: Engine, study: Study) -> None:
    people = participant_features(engine, study.slug).set_index("participant_code")
    assert list(people.reset_index().columns) == list(PARTICIPANT_FEATURES)
    assert sorted(people.index) == sorted([study.alice, study.bob])  # carol never chatted
    alice = people.loc[study.alice]
    check(alice, {
        "n_conversations": 3, "participant_turns": 6, "assistant_turns": 7, "challenge_turns": 3,
        "pushback_rate": 3 / 7, "assistant_words": 14 + 17 + 4, "affirmation_hits": 5,
        "affirmation_per_100_words": 500 / 35, "mean_exit_rating": 6.0, "decisions_made": 1,
        "roles_used": "coach;collaborator", "concerns_raised": "risk_to_self;unsupported_framing",
        "safety_events": 1, "overrides": 1, "reconsiders": 1, "challenges_left": 1,
        "duration_seconds": 600.0, "cost_usd": 0.003,
    })
    assert people.loc[study.bob, "mean_exit_rating"] == 3.0

    waves = wave_features(engine, study.slug)
    assert list(waves.columns) == list(WAVE_FEATURES)
    got = {(row.participant_code, row.followup_key): (row.intended_at, row.n_conversations, row.participant_turns)
           for row in waves.itertuples()}
    berlin_10 = dt.time(9)  # 10:00 CET
    assert got == {
        (study.alice, "perma-week-1"): (pd.Timestamp(dt.datetime.combine(dt.date(2026, 3, 9), berlin_10, dt.UTC)),
                                        1, 2),
        # 28 days after enrollment is 30 March, after the change to summer time: 10:00 CEST = 08:00 UTC.
        (study.alice, "perma-week-4"): (pd.Timestamp("2026-03-30 08:00", tz="UTC"), 3, 6),
        (study.alice, "regret-day-3"): (pd.Timestamp("2026-03-05 17:00", tz="UTC"), 1, 2),
        (study.alice, "regret-day-14"): (pd.Timestamp("2026-03-16 17:00", tz="UTC"), 3, 6),
        (study.bob, "perma-week-1"): (pd.Timestamp("2026-03-09 09:00", tz="UTC"), 1, 2),
        (study.bob, "perma-week-4"): (pd.Timestamp("2026-03-30 08:00", tz="UTC"), 1, 2),
        (study.carol, "perma-week-1"): (pd.Timestamp("2026-03-09 09:00", tz="UTC"), 0, 0),
        (study.carol, "perma-week-4"): (pd.Timestamp("2026-03-30 08:00", tz="UTC"), 0, 0),
    }
    intervals = wave_features(engine, study.slug, window="since_previous", followup_keys=["perma-week-1",
                                                                                          "perma-week-4"])
    alice_week_4 = intervals[(intervals.participant_code == study.alice) & (intervals.followup_key == "perma-week-4")]
    check(alice_week_4.iloc[0], {"n_conversations": 2, "participant_turns": 4, "safety_events": 1,
                                 "window_start": pd.Timestamp("2026-03-09 09:00", tz="UTC")})


def test_affirmation_lexicon_matches_whole_words_case_insensitively() -> None:
    pattern = affirmation_pattern()
    assert pattern.findall("YOU\u2019RE ABSOLUTELY RIGHT, that is valid.") == ["YOU\u2019RE ABSOLUTELY RIGHT", "valid"]
    assert pattern.findall("That seems invalid and unwise; wisely done.") == []


def edge_texts(n: int, seed: int) -> list[str]:
    """Texts built to hit the lexicon's edges: phrases glued to words, apostrophes of both kinds,
    capitals, accented letters, punctuation and odd spaces (no-break, tabs, line breaks)."""
    rng = random.Random(seed)
    pieces = [*affirmation_phrases(), "you", "are", "right", "invalid", "wise", "ly", "'", "\u2019", ",", ".",
              "  ", "\n", "-", "YOU'RE", "Absolutely", "x", "re", "'s", "don't", "_", "9", "\u00e9t\u00e9",
              "valid\u00e9", "\u00a0", "\t", "\r\n", "of", "course", "!"]
    texts = []
    for _ in range(n):
        text = "".join(rng.choice(pieces) + rng.choice(["", " ", " ", ", ", "'", "\u2019", "\u00a0"])
                       for _ in range(rng.randint(0, 12)))
        texts.append(text.upper() if rng.random() < 0.3 else text)
    return texts


def test_the_fast_counter_finds_what_the_documented_pattern_finds() -> None:
    pattern = affirmation_pattern()
    for text in edge_texts(20_000, seed=11):
        assert count_affirmations(text) == len(pattern.findall(text)), text


def test_words_and_hits_are_counted_by_the_stated_rules_on_every_database(engine: Engine, study: Study) -> None:
    """The features count inside SQLite (the counters registered as SQL functions) and in a
    streamed pass elsewhere: both give the numbers of the stated rules, edge texts included."""
    pattern, texts = affirmation_pattern(), edge_texts(300, seed=12)
    with session_scope(engine) as session:
        alice = session.scalars(select(Participant).where(Participant.code == study.alice)).one()
        ids = []
        for text in texts:  # one conversation each, one reply with the edge text
            conversation = Conversation(participant_id=alice.id, arm="wellbeing", mode="wellbeing", role="coach",
                                        started_at=T0)
            session.add(conversation)
            session.flush()
            session.add(Turn(conversation_id=conversation.id, participant_id=alice.id, seq=1, speaker="assistant",
                             role="coach", content=text, created_at=T0, stance="agree", concern="none"))
            ids.append(conversation.id)
    frame = conversation_features(engine, study.slug).set_index("conversation_id")
    for conversation_id, text in zip(ids, texts, strict=True):
        expected_words = len(re.findall(r"[^ \t\n\r\f\v]+", text))  # runs between ASCII white space
        row = frame.loc[conversation_id]
        assert (row.assistant_words, row.affirmation_hits) == (expected_words, len(pattern.findall(text))), text


def test_reading_in_chunks_of_participants_gives_the_same_rows(engine: Engine, study: Study) -> None:
    whole = conversation_features(engine, study.slug)
    chunks = list(iter_conversation_features(engine, study.slug, chunk_participants=1))
    assert [len(chunk) for chunk in chunks] == [3, 1, 0]  # alice, bob, carol (no conversation)
    pd.testing.assert_frame_equal(pd.concat(chunks[:2], ignore_index=True).sort_values("conversation_id")
                                  .reset_index(drop=True), whole, check_dtype=False)


def test_sentiment_is_the_stored_score_and_is_computed_for_messages_stored_without_it(
        engine: Engine, study: Study) -> None:
    with session_scope(engine) as session:
        said = session.scalars(select(Turn).where(Turn.speaker == "participant").order_by(Turn.id)).all()
        assert all(turn.features["sentiment"] == compound(turn.content) for turn in said)  # the monitors stored it
        first = said[0]
        first.features = {k: v for k, v in first.features.items() if k != "sentiment"}  # as rows stored before
        conversation_id, expected = first.conversation_id, compound(first.content)
        last = said[-1]  # the stored score is what is read: mark it
        last.features = {**last.features, "sentiment": 0.123}
        marked = last.conversation_id
    frame = conversation_features(engine, study.slug).set_index("conversation_id")
    assert frame.loc[conversation_id, "first_message_sentiment"] == pytest.approx(expected)
    assert frame.loc[marked, "last_message_sentiment"] == 0.123


def test_every_feature_is_documented() -> None:
    for table in (FEATURES, PARTICIPANT_FEATURES, WAVE_FEATURES):
        for name, feature in table.items():
            assert feature.definition.endswith("."), name
            assert feature.type in ("integer", "number", "string", "boolean", "datetime"), name


def test_safety_events_count_every_level_and_escalations_only_escalations(
        engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> None:
    build = StudyBuilder(engine, example_protocol)
    alice = build.participant("wellbeing")
    checked, escalated = build.start(alice, "concierge"), build.start(alice, "concierge")
    assert build.say(alice, checked, "I feel hopeless, like I'm falling apart", "I'm here.").stance == "check_in"
    build.say(alice, escalated, "I feel hopeless, like I'm falling apart", "I'm here.")
    build.say(alice, escalated, "yeah i have a plan", "Thank you for telling me.")  # its check-in's answer
    features = conversation_features(engine, build.slug).set_index("conversation_id")
    assert features.loc[[checked, escalated], ["safety_events", "safety_escalations"]].to_dict("list") == {
        "safety_events": [1, 1], "safety_escalations": [0, 1]}
    with session_scope(engine) as session:
        study_id = studies.get_study(session, build.slug).id
    with engine.connect() as connection:
        weekly = operations.escalations_and_overrides(connection, study_id)
    assert weekly["escalations"].sum() == 1  # the dashboard's escalations: level escalation only

