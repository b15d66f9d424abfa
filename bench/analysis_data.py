"""Analysis read side: conversation features, set-based against a naive ORM baseline.

    .venv/bin/python bench/analysis_data.py --database sqlite      # or postgres, or both
    .venv/bin/python bench/analysis_data.py --turns 200000         # a quicker run

A bulk generator writes a study directly (COPY on PostgreSQL): participants, conversations of 40
turns with stances, overrides, reconsiders, role switches, safety events and decisions. The
set-based ``analysis.features.conversation_features`` runs on the whole study; the baseline
(the same features computed row by row in Python over ORM objects, one conversation at a time)
runs on a sample of participants, so rates are compared per turn. Both are run on the sample
too, and must agree. Sections for the panel and exports are added as ``bench_*`` functions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import time
from collections.abc import Callable
from typing import Any

import pandas as pd  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from common import PROTOCOL, postgres_schema
from sqlalchemy.orm import Session  # noqa: E402
from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer  # noqa: E402

from analysis.features import conversation_features  # noqa: E402
from analysis.lexicons import affirmation_pattern  # noqa: E402
from chat.models import Conversation, Decision, PushbackResponse, RoleSwitch, SafetyEvent, Turn  # noqa: E402
from study import audit, studies  # noqa: E402
from study.db import bulk_insert, make_engine, migrate, session_scope  # noqa: E402
from study.models import Participant  # noqa: E402
from surveys import registry  # noqa: E402

TURNS_PER_CONVERSATION = 40
CONVERSATIONS_PER_PARTICIPANT = 10
MESSAGES = [
    "Nobody at work ever listens to me, so I'm quitting tomorrow without another job lined up",
    "Help me plan my week around the move", "Do you think she still loves me after the argument?",
    "Just tell me what to do, I can't decide", "I feel a bit better about the interview today",
    "My sister says I should stay but I am not sure what I want",
]
REPLIES = [
    "You're right that it hurts. Is quitting tomorrow wise? What would you tell a friend?",
    "That makes sense. Let's list the three things that matter most this week.",
    "I can't know how she feels; what did she say when you talked afterwards?",
    "Great idea to think it through. What are the two options you are weighing?",
    "Sounds good. Absolutely worth preparing one story about a hard problem you solved.",
]
STANCES = ["agree"] * 6 + ["nudge", "nudge", "challenge", "escalate"]
T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)


def generate(engine: sa.Engine, turns: int, seed: int = 7) -> tuple[str, list[str]]:
    """A study with about ``turns`` turns; returns its slug and the participant codes."""
    rng = random.Random(seed)
    with session_scope(engine) as session:
        study = studies.load_protocol(session, PROTOCOL.read_text(), audit.Actor.system("bench"),
                                      instrument_exists=lambda i: registry.exists(session, i)).study
        slug, study_id = study.slug, study.id
    n_participants = max(1, turns // (TURNS_PER_CONVERSATION * CONVERSATIONS_PER_PARTICIPANT))
    codes = [f"B{i:07d}" for i in range(n_participants)]
    turn_id = conversation_id = response_id = 0
    for start in range(0, n_participants, 250):  # a transaction per 250 participants (100,000 turns)
        people, conversations, turn_rows, responses, switches, events, decisions = [], [], [], [], [], [], []
        for index in range(start, min(start + 250, n_participants)):
            pid = index + 1
            arm = "wellbeing" if index % 2 else "control"
            people.append({"id": pid, "study_id": study_id, "code": codes[index], "status": "enrolled",
                           "timezone": "Europe/Berlin", "arm": arm, "assigned_protocol_version": 1,
                           "enrolled_at": T0, "created_at": T0})
            for c in range(CONVERSATIONS_PER_PARTICIPANT):
                conversation_id += 1
                started = T0 + dt.timedelta(days=c, minutes=index % 600)
                role = rng.choice(["coach", "collaborator", "concierge"]) if arm == "wellbeing" else "standard"
                made = rng.random() < 0.3
                conversations.append({
                    "id": conversation_id, "participant_id": pid, "arm": arm,
                    "mode": "wellbeing" if arm == "wellbeing" else "default", "role": role, "status": "ended",
                    "turn_count": TURNS_PER_CONVERSATION, "concern_counts": {}, "overridden_concerns": [],
                    "started_at": started, "ended_at": started + dt.timedelta(minutes=45), "made_decision": made})
                if made:
                    decisions.append({"id": conversation_id, "participant_id": pid,
                                      "conversation_id": conversation_id, "text": "Stay", "decided_at": started})
                if arm == "wellbeing" and rng.random() < 0.2:
                    switches.append({"id": conversation_id, "conversation_id": conversation_id, "participant_id": pid,
                                     "from_role": role, "to_role": "coach", "after_seq": 10, "created_at": started})
                for seq in range(1, TURNS_PER_CONVERSATION + 1):
                    turn_id += 1
                    at = started + dt.timedelta(minutes=seq)
                    row: dict[str, Any] = {
                        "id": turn_id, "conversation_id": conversation_id, "participant_id": pid, "seq": seq,
                        "role": role, "created_at": at, "after_override": False, "streamed": False,
                        "reassurance_seeking": False, "features": {}, "stance": None, "concern": None,
                        "model": None, "prompt_version": None, "prompt_tokens": None, "completion_tokens": None,
                        "cost_usd": None, "reply_to_id": None}
                    if seq % 2:
                        text = rng.choice(MESSAGES)
                        row.update(speaker="participant", content=text,
                                   reassurance_seeking=text.startswith("Do you think"),
                                   features={"dependence_signal": text.startswith("Just tell"),
                                             "crisis_category": None})
                    else:
                        stance = rng.choice(STANCES) if arm == "wellbeing" else "agree"
                        row.update(speaker="assistant", content=rng.choice(REPLIES), stance=stance,
                                   concern="none" if stance == "agree" else "unsupported_framing",
                                   reply_to_id=turn_id - 1, model="offline/afterward", prompt_version="v1",
                                   prompt_tokens=rng.randint(200, 900), completion_tokens=rng.randint(20, 200),
                                   cost_usd=0.0001)
                        if stance in ("nudge", "challenge") and rng.random() < 0.4:
                            response_id += 1
                            responses.append({"id": response_id, "turn_id": turn_id,
                                              "conversation_id": conversation_id, "participant_id": pid,
                                              "action": rng.choice(["override", "reconsider"]), "stance": stance,
                                              "concern": "unsupported_framing", "created_at": at})
                        if stance == "escalate":
                            row["concern"] = "risk_to_self"
                            events.append({"id": turn_id, "study_id": study_id, "participant_id": pid,
                                           "conversation_id": conversation_id, "turn_id": turn_id,
                                           "category": "risk_to_self", "source": "lexicon", "cue": None,
                                           "created_at": at})
                    turn_rows.append(row)
        with session_scope(engine) as session:
            for model, rows in ((Participant, people), (Conversation, conversations), (Turn, turn_rows),
                                (PushbackResponse, responses), (RoleSwitch, switches), (SafetyEvent, events),
                                (Decision, decisions)):
                bulk_insert(session, model, rows)
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.execute(sa.text("ANALYZE"))
    return slug, codes


def naive_features(engine: sa.Engine, slug: str, codes: list[str]) -> pd.DataFrame:
    """The baseline: the same features, row by row in Python over ORM objects."""
    pattern, analyzer = affirmation_pattern(), SentimentIntensityAnalyzer()
    out = []
    with Session(engine) as session:
        people = session.scalars(sa.select(Participant).where(Participant.code.in_(codes))).all()
        for person in people:
            for conversation in session.scalars(sa.select(Conversation).where(
                    Conversation.participant_id == person.id)):
                turns = session.scalars(sa.select(Turn).where(Turn.conversation_id == conversation.id)
                                        .order_by(Turn.seq)).all()
                answers = {r.turn_id: r.action for r in session.scalars(sa.select(PushbackResponse).where(
                    PushbackResponse.conversation_id == conversation.id))}
                switches = session.scalars(sa.select(RoleSwitch).where(
                    RoleSwitch.conversation_id == conversation.id).order_by(RoleSwitch.after_seq)).all()
                events = session.scalars(sa.select(SafetyEvent).where(
                    SafetyEvent.conversation_id == conversation.id)).all()
                said = [t for t in turns if t.speaker == "participant"]
                replies = [t for t in turns if t.speaker == "assistant"]
                last_said = max((t.seq for t in said), default=None)
                row: dict[str, Any] = {"conversation_id": conversation.id, "participant_code": person.code,
                                       "starting_role": switches[0].from_role if switches else conversation.role,
                                       "role_switches": len(switches), "participant_turns": len(said),
                                       "assistant_turns": len(replies),
                                       "participant_words": sum(len(t.content.split()) for t in said),
                                       "assistant_words": sum(len(t.content.split()) for t in replies)}
                for stance in ("agree", "nudge", "challenge", "escalate"):
                    row[f"{stance}_turns"] = sum(t.stance == stance for t in replies)
                row["overrides"] = sum(a == "override" for a in answers.values())
                row["reconsiders"] = sum(a == "reconsider" for a in answers.values())
                challenges = [t for t in replies if t.stance == "challenge"]
                row["challenges_left"] = sum(t.id not in answers and (last_said is None or last_said < t.seq)
                                             for t in challenges)
                row["reassurance_seeking_turns"] = sum(t.reassurance_seeking for t in said)
                row["dependence_cues"] = sum(bool(t.features.get("dependence_signal")) for t in said)
                row["prompt_tokens"] = sum(t.prompt_tokens or 0 for t in replies)
                row["safety_events"] = len(events)
                row["affirmation_hits"] = sum(len(pattern.findall(t.content)) for t in replies)
                row["first_message_sentiment"] = analyzer.polarity_scores(said[0].content)["compound"] if said \
                    else None
                row["last_message_sentiment"] = analyzer.polarity_scores(said[-1].content)["compound"] if said \
                    else None
                row["made_decision"] = session.scalar(sa.select(Decision.id).where(
                    Decision.conversation_id == conversation.id)) is not None
                out.append(row)
    return pd.DataFrame(out).sort_values("conversation_id").reset_index(drop=True)


def timed(work: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def bench_features(engine: sa.Engine, slug: str, codes: list[str], turns: int, sample: int) -> None:
    sample_codes = codes[:sample]
    sample_turns = sample * CONVERSATIONS_PER_PARTICIPANT * TURNS_PER_CONVERSATION
    full_s, frame = timed(lambda: conversation_features(engine, slug))
    assert len(frame) * TURNS_PER_CONVERSATION == turns, (len(frame), turns)
    fast_s, fast = timed(lambda: conversation_features(engine, slug, participant_codes=sample_codes))
    naive_s, naive = timed(lambda: naive_features(engine, slug, sample_codes))
    for column in naive.columns:  # the two must agree before their speed means anything
        expected = naive[column].to_numpy()
        actual = fast[column].astype(object if column.endswith(("code", "role")) else float).to_numpy()
        if column.endswith(("code", "role")):
            assert list(actual) == list(expected), column
        else:
            assert ((actual - expected.astype(float)) ** 2 < 1e-12).all(), column
    full_rate, fast_rate, naive_rate = turns / full_s, sample_turns / fast_s, sample_turns / naive_s
    print(f"features, {turns:,} turns: set-based {full_s:.1f} s ({full_rate:,.0f} turns/s)")
    print(f"  sample of {sample} participants ({sample_turns:,} turns): set-based {fast_s:.2f} s "
          f"({fast_rate:,.0f} turns/s), naive ORM baseline {naive_s:.1f} s ({naive_rate:,.0f} turns/s)")
    print(f"  ratio per turn: full study vs baseline {full_rate / naive_rate:.1f}x, same sample "
          f"{fast_rate / naive_rate:.1f}x; baseline extrapolated to {turns:,} turns: {turns / naive_rate:.0f} s")


def run(url: str, turns: int, sample: int) -> None:
    engine = make_engine(url, timeouts=False)
    started = time.perf_counter()
    slug, codes = generate(engine, turns)
    print(f"generated {turns:,} turns in {time.perf_counter() - started:.0f} s")
    bench_features(engine, slug, codes, turns, sample)
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=100, help="participants in the baseline's sample")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "AFTERWARD_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    if args.database in ("sqlite", "both"):
        path = f"/tmp/afterward-bench-analysis-{os.getpid()}.db"
        try:
            migrate(f"sqlite:///{path}")
            print("== SQLite")
            run(f"sqlite:///{path}", args.turns, args.sample)
        finally:
            if os.path.exists(path):
                os.remove(path)
    if args.database in ("postgres", "both"):
        with postgres_schema(args.postgres_url) as url:
            migrate(url)
            print("== PostgreSQL")
            run(url, args.turns, args.sample)


if __name__ == "__main__":
    main()
