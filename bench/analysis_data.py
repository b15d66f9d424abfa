"""Analysis read side: conversation features against a naive ORM baseline, the panel, exports.

    .venv/bin/python bench/analysis_data.py --database sqlite      # or postgres, or both
    .venv/bin/python bench/analysis_data.py --turns 200000         # a quicker run
    .venv/bin/python bench/analysis_data.py --sections panel,export --export-participants 10000

A bulk generator writes a study directly (COPY on PostgreSQL): participants, conversations of 40
turns with stances, overrides, reconsiders, role switches, safety events and decisions. The
set-based ``analysis.features.conversation_features`` runs on the whole study; the baseline
(the same features computed row by row in Python over ORM objects, one conversation at a time)
runs on a sample of participants, so rates are compared per turn. Both are run on the sample
too, and must agree. Both use the same text functions (``count_affirmations``, the sentiment the
chat monitors stored with each message, as the generator writes it): the comparison is of how
the data are read.

The panel and export sections use smaller conversations (2 of 10 turns per participant) plus the
protocol's baseline and follow-ups as the services leave them (``Waves``). Each export runs in a
fresh process whose peak RSS (VmHWM, reset after the imports) is reported, at N and 2N
participants, against a naive baseline (at N) that reads the whole turns table with one read_sql.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pandas as pd  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from common import PROTOCOL, postgres_schema
from sqlalchemy.orm import Session  # noqa: E402

from analysis.exports import export_study  # noqa: E402
from analysis.features import conversation_features  # noqa: E402
from analysis.lexicons import count_affirmations  # noqa: E402
from analysis.panel import PERMA, REGRET, WITHDREW, panel, survival  # noqa: E402
from chat import monitors  # noqa: E402
from chat.models import Conversation, Decision, PushbackResponse, RoleSwitch, Turn  # noqa: E402
from scheduler.models import Delivery, FollowUp  # noqa: E402
from study import audit, studies  # noqa: E402
from study.db import bulk_insert, make_engine, migrate, session_scope  # noqa: E402
from study.models import Participant  # noqa: E402
from study.safety import SafetyEvent  # noqa: E402
from surveys import registry  # noqa: E402
from surveys.models import SurveyAssignment, SurveyResponse, SurveyScore  # noqa: E402

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
# What the chat monitors store with each participant message (computed once per distinct text).
SENTIMENT = {text: monitors.sentiment(text) for text in MESSAGES}
STANCES = ["agree"] * 6 + ["nudge", "nudge", "challenge", "escalate"]
T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)


BERLIN = ZoneInfo("Europe/Berlin")
# The protocol's follow-ups (examples/wellbeing-pilot.yaml): key, instrument, anchor, days after it,
# local send time, window and reminder offsets in days.
FOLLOWUPS = [("perma-week-1", PERMA, "enrollment", 7, 10, 3, [1, 2]),
             ("perma-week-4", PERMA, "enrollment", 28, 10, 5, [2]),
             ("regret-day-3", REGRET, "decision", 3, 18, 3, [1])]
VERSIONS = {PERMA: "2016", REGRET: "2003"}
PERMA_ITEMS = {"positive_emotion": 3, "engagement": 3, "relationships": 3, "meaning": 3, "accomplishment": 3,
               "negative_emotion": 3, "health": 3, "loneliness": 1, "happiness": 1, "overall_wellbeing": 16}


class Waves:
    """Rows as the survey and scheduler services leave them once the study is over: a completed
    baseline PERMA; per follow-up a row planned in local time (quiet hours respected), then sent by
    the dispatcher (an in-app invitation, reminders for the unanswered) and either completed
    (assignment, response with answers, scores), expired (some with a started, unsubmitted
    response) or, for the 5% who withdraw on day 10, cancelled with the withdrawal's reason."""

    def __init__(self, study_id: int, items: dict[str, list[str]], rng: random.Random) -> None:
        self.study_id, self.items, self.rng = study_id, items, rng
        self.ids = {"assignment": 0, "response": 0, "score": 0, "followup": 0, "delivery": 0}
        self.clear()

    def clear(self) -> None:
        self.assignments: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []
        self.scores: list[dict[str, Any]] = []
        self.followups: list[dict[str, Any]] = []
        self.deliveries: list[dict[str, Any]] = []

    def _next(self, kind: str) -> int:
        self.ids[kind] += 1
        return self.ids[kind]

    def _answered(self, pid: int, instrument: str, assignment_id: int, started: dt.datetime,
                  submitted: dt.datetime | None) -> None:
        response_id = self._next("response")
        low, high = (0, 10) if instrument == PERMA else (1, 5)
        self.responses.append({
            "id": response_id, "assignment_id": assignment_id, "participant_id": pid, "instrument_id": instrument,
            "instrument_version": VERSIONS[instrument], "submission_id": None, "started_at": started,
            "updated_at": submitted or started, "submitted_at": submitted,
            "answers": {item: self.rng.randint(low, high) for item in self.items[instrument]}})
        if submitted is None:
            return
        scores = PERMA_ITEMS.items() if instrument == PERMA else [("regret", 5)]
        for name, n in scores:
            value = self.rng.uniform(0, 10) if instrument == PERMA else self.rng.choice(range(0, 101, 5))
            self.scores.append({"id": self._next("score"), "response_id": response_id, "participant_id": pid,
                                "instrument_version": VERSIONS[instrument], "name": name, "value": value,
                                "n_items": n, "n_expected": n})

    def _assignment(self, pid: int, instrument: str, purpose: str, key: str | None, context: dict[str, Any],
                    intended: dt.datetime, closes: dt.datetime | None, status: str,
                    completed: dt.datetime | None) -> int:
        assignment_id = self._next("assignment")
        self.assignments.append({
            "id": assignment_id, "participant_id": pid, "instrument_id": instrument,
            "instrument_version": VERSIONS[instrument], "purpose": purpose, "followup_key": key, "context": context,
            "intended_at": intended, "closes_at": closes, "status": status, "completed_at": completed,
            "created_at": intended})
        return assignment_id

    def add(self, person: dict[str, Any], decision: tuple[int, dt.datetime] | None) -> None:
        pid, enrolled = person["id"], person["enrolled_at"]
        withdrawn = enrolled + dt.timedelta(days=10) if self.rng.random() < 0.05 else None
        if withdrawn is not None:
            person.update(status="withdrawn", withdrawn_at=withdrawn, withdrawal_level="stop_contact")
        baseline = self._assignment(pid, PERMA, "baseline", None, {}, enrolled, None, "completed",
                                    enrolled + dt.timedelta(minutes=12))
        self._answered(pid, PERMA, baseline, enrolled + dt.timedelta(minutes=2), enrolled + dt.timedelta(minutes=12))
        for key, instrument, anchor, days, hour, window, reminders in FOLLOWUPS:
            if anchor == "decision" and decision is None:
                continue
            origin = enrolled if anchor == "enrollment" else decision[1]  # type: ignore[index]
            anchor_key = "enrollment" if anchor == "enrollment" else f"decision:{decision[0]}"  # type: ignore[index]
            context = {} if anchor == "enrollment" else {"decision_id": anchor_key}
            local = dt.datetime.combine(origin.astimezone(BERLIN).date() + dt.timedelta(days=days),
                                        dt.time(hour), BERLIN)
            due, closes = local.astimezone(dt.UTC), local.astimezone(dt.UTC) + dt.timedelta(days=window)
            row: dict[str, Any] = {
                "id": self._next("followup"), "participant_id": pid, "study_id": self.study_id,
                "followup_key": key, "anchor_key": anchor_key, "instrument_id": instrument, "protocol_version": 1,
                "context": context, "timezone": "Europe/Berlin", "intended_local": local.strftime("%Y-%m-%dT%H:%M"),
                "due_at": due, "closes_at": closes, "reminder_offsets": [d * 86_400 for d in reminders],
                "claimed_by": None, "lease_until": None, "assignment_id": None, "sent_at": None,
                "lateness_seconds": None, "reminders_sent": 0, "ended_at": None, "end_reason": None,
                "created_at": origin, "updated_at": origin}
            self.followups.append(row)
            if withdrawn is not None and due > withdrawn:
                row.update(status="cancelled", ended_at=withdrawn, end_reason=WITHDREW, updated_at=withdrawn)
                continue
            late = self.rng.uniform(0, 90)
            sent = due + dt.timedelta(seconds=late)
            answered = self.rng.random() < 0.75
            assignment = self._assignment(pid, instrument, "followup", key, context, sent, closes,
                                          "completed" if answered else "expired", None)
            row.update(assignment_id=assignment, sent_at=sent, lateness_seconds=late)
            self._delivery(row, 0, sent)
            if answered:
                submitted = sent + dt.timedelta(hours=self.rng.uniform(1, 30))
                self.assignments[-1]["completed_at"] = submitted
                self._answered(pid, instrument, assignment, submitted - dt.timedelta(minutes=4), submitted)
                row.update(status="completed", ended_at=submitted, end_reason="survey completed", updated_at=submitted)
            else:
                if self.rng.random() < 0.3:  # started, never submitted
                    self._answered(pid, instrument, assignment, sent + dt.timedelta(hours=2), None)
                for n, offset in enumerate(reminders, start=1):
                    self._delivery(row, n, due + dt.timedelta(days=offset))
                row.update(status="expired", reminders_sent=len(reminders), ended_at=closes,
                           end_reason="window closed", updated_at=closes)

    def _delivery(self, followup: dict[str, Any], sequence: int, at: dt.datetime) -> None:
        self.deliveries.append({
            "id": self._next("delivery"), "followup_id": followup["id"], "participant_id": followup["participant_id"],
            "kind": "invitation" if sequence == 0 else "reminder", "sequence": sequence, "channel": "in_app",
            "idempotency_key": f"followup-{followup['id']}-{sequence}-in_app", "due_at": at, "status": "sent",
            "attempts": 1, "next_attempt_at": at, "claimed_by": None, "lease_until": None, "last_error": None,
            "sent_at": at, "detail": {}, "created_at": followup["due_at"]})


def generate(engine: sa.Engine, turns: int, seed: int = 7, *, conversations_each: int = CONVERSATIONS_PER_PARTICIPANT,
             turns_each: int = TURNS_PER_CONVERSATION, waves: bool = False,
             like: dict[str, dict[str, Any]] | None = None) -> tuple[str, list[str]]:
    """A study with about ``turns`` turns (``conversations_each`` conversations of ``turns_each``
    turns per participant); returns its slug and the participant codes. With ``waves`` every
    participant also gets the protocol's baseline and follow-ups (see ``Waves``), and their first
    conversation ends in a decision so the decision-anchored wave exists for everyone. ``like``:
    per speaker, columns of a turn the services stored (its ``features`` merged under the generated
    ones), so rows are as wide as real ones (``bench/table_sizes.py``)."""
    rng = random.Random(seed)
    with session_scope(engine) as session:
        study = studies.load_protocol(session, PROTOCOL.read_text(), audit.Actor.system("bench"),
                                      instruments=registry.catalog(session)).study
        slug, study_id = study.slug, study.id
        items = {i: [item.id for item in registry.get(session, i).items] for i in (PERMA, REGRET)}
    n_participants = max(1, turns // (turns_each * conversations_each))
    per_batch = max(1, 100_000 // (turns_each * conversations_each))  # a transaction per ~100,000 turns
    codes = [f"B{i:07d}" for i in range(n_participants)]
    turn_id = conversation_id = response_id = 0
    survey = Waves(study_id, items, rng)
    for start in range(0, n_participants, per_batch):
        people, conversations, turn_rows, responses, switches, events, decisions = [], [], [], [], [], [], []
        survey.clear()
        for index in range(start, min(start + per_batch, n_participants)):
            pid = index + 1
            arm = "wellbeing" if index % 2 else "control"
            people.append({"id": pid, "study_id": study_id, "code": codes[index], "status": "enrolled",
                           "timezone": "Europe/Berlin", "arm": arm, "assigned_protocol_version": 1,
                           "enrolled_at": T0, "created_at": T0, "withdrawn_at": None,
                           "withdrawal_level": None})
            first_decision: tuple[int, dt.datetime] | None = None
            for c in range(conversations_each):
                conversation_id += 1
                started = T0 + dt.timedelta(days=c, minutes=index % 600)
                role = rng.choice(["coach", "collaborator", "concierge"]) if arm == "wellbeing" else "standard"
                made = (waves and c == 0) or rng.random() < 0.3
                if made and first_decision is None:
                    first_decision = (conversation_id, started)
                conversations.append({
                    "id": conversation_id, "participant_id": pid, "arm": arm,
                    "mode": "wellbeing" if arm == "wellbeing" else "default", "role": role, "status": "ended",
                    "turn_count": turns_each, "concern_counts": {}, "overridden_concerns": [],
                    "started_at": started, "ended_at": started + dt.timedelta(minutes=45), "made_decision": made})
                if made:
                    decisions.append({"id": conversation_id, "participant_id": pid,
                                      "conversation_id": conversation_id, "text": "Stay", "decided_at": started})
                if arm == "wellbeing" and rng.random() < 0.2:
                    switches.append({"id": conversation_id, "conversation_id": conversation_id, "participant_id": pid,
                                     "from_role": role, "to_role": "coach", "after_seq": 10, "created_at": started})
                for seq in range(1, turns_each + 1):
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
                                             "crisis_category": None, "sentiment": SENTIMENT[text]})
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
                    if like is not None:
                        stored = like[row["speaker"]]
                        row.update({k: v for k, v in stored.items() if k != "features"},
                                   features={**stored.get("features", {}), **row["features"]})
                    turn_rows.append(row)
            if waves:
                survey.add(people[-1], first_decision)
        with session_scope(engine) as session:
            for model, rows in ((Participant, people), (Conversation, conversations), (Turn, turn_rows),
                                (PushbackResponse, responses), (RoleSwitch, switches), (SafetyEvent, events),
                                (Decision, decisions), (SurveyAssignment, survey.assignments),
                                (SurveyResponse, survey.responses), (SurveyScore, survey.scores),
                                (FollowUp, survey.followups), (Delivery, survey.deliveries)):
                bulk_insert(session, model, rows)
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.execute(sa.text("ANALYZE"))
    return slug, codes


def stored_sentiment(turn: Turn) -> float:
    """As the features read it: stored by the chat monitors, else computed."""
    stored = turn.features.get("sentiment")
    return float(stored) if stored is not None else monitors.sentiment(turn.content)


def naive_features(engine: sa.Engine, slug: str, codes: list[str]) -> pd.DataFrame:
    """The baseline: the same features, row by row in Python over ORM objects."""
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
                row["affirmation_hits"] = sum(count_affirmations(t.content) for t in replies)
                row["first_message_sentiment"] = stored_sentiment(said[0]) if said else None
                row["last_message_sentiment"] = stored_sentiment(said[-1]) if said else None
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


def bench_panel(engine: sa.Engine, slug: str, n: int) -> None:
    panel_s, frame = timed(lambda: panel(engine, slug))
    survival_s, table = timed(lambda: survival(engine, slug))
    assert frame.participant_code.nunique() == n
    assert len(table) == n
    statuses = frame.response_status.value_counts().to_dict()
    print(f"panel, {n:,} participants: {len(frame):,} rows ({len(frame) / n:.1f} waves each) in {panel_s:.1f} s; "
          f"survival {survival_s:.1f} s; statuses {statuses}")


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024


def _export_child(url: str, slug: str, fmt: str, out: str, naive: bool) -> dict[str, float]:
    """In a fresh process, so its peak RSS is this export's alone."""
    import tempfile

    from analysis.exports import scrub

    engine = make_engine(url, timeouts=False)
    with open("/proc/self/clear_refs", "w") as refs:  # reset the peak (VmHWM) left by the imports
        refs.write("5")
    base = _status_mb("VmRSS:")
    started = time.perf_counter()
    if naive:  # the whole turns table in one read_sql, written at once
        with engine.connect() as connection:
            frame = pd.read_sql(sa.select(Turn.__table__, Participant.code.label("participant_code"))
                                .join(Participant, Participant.id == Turn.participant_id).order_by(Turn.id),
                                connection)
        frame["content"] = [scrub(t) for t in frame["content"]]
        frame = frame.drop(columns=["features"])
        path = os.path.join(out, f"turns.{fmt}")
        frame.to_parquet(path, index=False) if fmt == "parquet" else frame.to_csv(path, index=False)
        rows = len(frame)
    else:
        with tempfile.TemporaryDirectory(dir=out) as where:
            result = export_study(engine, slug, Path(where), format=fmt,  # type: ignore[arg-type]
                                  turns=True, actor=audit.Actor.system("bench"))
        rows = sum(result.row_counts.values())
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "rows": rows, "base_mb": base,
            "peak_mb": _status_mb("VmHWM:")}


def bench_export(url: str, slug: str, n: int, naive: bool) -> None:
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as out:
        for fmt in ("parquet", "csv"):
            for label, is_naive in (("streamed export_study", False), ("naive read_sql, turns only", True)):
                if is_naive and (not naive or fmt == "csv"):  # its memory is the point: once is enough
                    continue
                with context.Pool(1) as pool:
                    got = pool.apply(_export_child, (url, slug, fmt, out, is_naive))
                print(f"export {fmt}, {n:,} participants, {label}: {got['rows']:,.0f} rows in {got['seconds']:.1f} s "
                      f"({got['rows'] / got['seconds']:,.0f} rows/s), peak RSS {got['peak_mb']:,.0f} MB "
                      f"({got['peak_mb'] - got['base_mb']:+,.0f} MB over {got['base_mb']:,.0f} MB after imports)")


SMALL = {"conversations_each": 2, "turns_each": 10, "waves": True}  # panel and export studies


def run(url: str, section: str, args: argparse.Namespace, participants: int = 0) -> None:
    engine = make_engine(url, timeouts=False)
    started = time.perf_counter()
    if section == "features":
        slug, codes = generate(engine, args.turns)
        print(f"generated {args.turns:,} turns in {time.perf_counter() - started:.0f} s")
        bench_features(engine, slug, codes, args.turns, args.sample)
    else:
        slug, codes = generate(engine, participants * 20, **SMALL)  # type: ignore[arg-type]
        print(f"generated {len(codes):,} participants (2 conversations of 10 turns, baseline and 3 follow-ups "
              f"each) in {time.perf_counter() - started:.0f} s")
        if section == "panel":
            bench_panel(engine, slug, len(codes))
        else:
            # The naive baseline holds the whole turns table: run it at N only (at 2N it needs GBs).
            bench_export(url, slug, len(codes), naive=not args.no_naive and participants == args.export_participants)
    engine.dispose()


def studies_to_run(args: argparse.Namespace) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for section in args.sections.split(","):
        if section == "export":
            out += [("export", args.export_participants), ("export", 2 * args.export_participants)]
        else:
            out.append((section, args.panel_participants))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=100, help="participants in the baseline's sample")
    parser.add_argument("--sections", default="features,panel,export", help="comma-separated")
    parser.add_argument("--panel-participants", type=int, default=10_000)
    parser.add_argument("--export-participants", type=int, default=20_000, help="N; the export runs at N and 2N")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive export baseline")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "AFTERWARD_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    for section, participants in studies_to_run(args):  # a fresh database per study
        if args.database in ("sqlite", "both"):
            path = f"/tmp/afterward-bench-analysis-{os.getpid()}.db"
            try:
                migrate(f"sqlite:///{path}")
                print(f"== SQLite, {section}")
                run(f"sqlite:///{path}", section, args, participants)
            finally:
                if os.path.exists(path):
                    os.remove(path)
        if args.database in ("postgres", "both"):
            with postgres_schema(args.postgres_url) as url:
                migrate(url)
                print(f"== PostgreSQL, {section}")
                run(url, section, args, participants)


if __name__ == "__main__":
    main()
