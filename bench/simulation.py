"""``afterward simulate`` at the size issue 27 names: 400 participants over 6 weeks, in under 3 minutes.

    .venv/bin/python bench/simulation.py [--participants 400] [--weeks 6] [--seed 1] [--turns 600]
                                         [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]

A migrated scratch database (a SQLite file; with ``--postgres`` a schema of its own, dropped after),
the example protocol loaded as a simulated study, then ``analysis.simulation.simulate`` as
``afterward simulate`` runs it. Printed: the command, the 1-minute load average at the start and
the end and the cores; the run's wall-clock and CPU seconds (the process's, every thread); the CPU
of each part of the run (the dispatcher's hourly polls, enrollments, withdrawals, conversations,
and the participants who open the app with the surveys they answer); and what it did.

Baseline, measured in the same run and the same process: the turns alone. ``--turns`` messages
through the same driver (``analysis.simulation.driver``: ``chat.turn``, one unit of work per
request), in conversations of three messages of fresh participants, with no dispatcher, no
surveys, no planning. Its CPU per message, times the run's messages, is what the run's turns
would cost on their own; the rest of the run is what the simulation adds around them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shlex
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import ACTOR, PROTOCOL, postgres_schema  # first: sets the environment and sys.path
from sqlalchemy.engine import Engine

import analysis.simulation.simulate as simulation
from analysis.simulation.driver import Driver, OfflineGateway
from analysis.simulation.population import OFFLINE_MODEL, TOPICS
from chat import semantic
from scheduler.dispatcher import Dispatcher
from scheduler.service import save_profile
from study import participants, studies, wiring
from study.clock import FrozenClock, set_clock
from study.db import make_engine, migrate, session_scope
from study.models import Participant
from study.settings import get_settings

PARTS = {"_converse": "conversations", "_check_surveys": "opening the app, answering",
         "_enroll": "enrollments", "_withdraw": "withdrawals"}


@contextmanager
def database(postgres: str | None) -> Iterator[str]:
    if postgres:
        with postgres_schema(postgres) as url:
            yield url
        return
    with tempfile.TemporaryDirectory() as folder:
        yield f"sqlite:///{Path(folder) / 'simulation.db'}"


def cpu_of(parts: defaultdict[str, float]) -> Callable[[str, Callable[..., Any]], Callable[..., Any]]:
    def timed(name: str, work: Callable[..., Any]) -> Callable[..., Any]:
        def measured(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return work(*args, **kwargs)
            finally:
                parts[name] += time.process_time() - started
        return measured
    return timed


def run(engine: Engine, args: argparse.Namespace) -> simulation.SimulationResult:
    parts: defaultdict[str, float] = defaultdict(float)
    timed = cpu_of(parts)
    originals = {name: getattr(simulation._Simulation, name) for name in PARTS}
    tick = Dispatcher.tick
    for name in PARTS:
        setattr(simulation._Simulation, name, timed(name, originals[name]))
    Dispatcher.tick = timed("tick", tick)  # type: ignore[method-assign]
    try:
        slug = simulation.load_simulated_study(engine, PROTOCOL.read_text(encoding="utf-8"), "pilot-bench")
        started, cpu = time.perf_counter(), time.process_time()
        result = simulation.simulate(engine, slug, participants=args.participants, weeks=args.weeks, seed=args.seed)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        for name, original in originals.items():
            setattr(simulation._Simulation, name, original)
        Dispatcher.tick = tick  # type: ignore[method-assign]
    c = result.counts
    print(f"simulation: {args.participants} participants over {args.weeks} weeks: {wall:.1f} s wall, {cpu:.1f} s CPU "
          f"({'under' if wall < 180 else 'over'} 3 minutes of wall-clock time)")
    print(f"  did: enrolled {c['enrolled']}, conversations {c['conversations']}, messages {c['messages']}, "
          f"follow-ups opened {c['followups_opened']}, answered {c['followups_answered']}, missed "
          f"{c['followups_missed']}, expired {c['followups_expired']}, withdrawn {c['withdrawn']}")
    print(f"  dispatcher polls (hourly): {parts['tick']:.1f} s CPU")
    for name, label in PARTS.items():
        print(f"  {label}: {parts[name]:.1f} s CPU")
    return result


def turns_alone(engine: Engine, count: int) -> float:
    """CPU seconds per message of ``count`` messages through the driver alone (the baseline)."""
    wiring.wire()
    conversations = max(1, count // 3)
    with session_scope(engine) as session:
        study = studies.load_simulated(session, PROTOCOL.read_text(encoding="utf-8"), ACTOR, "pilot-baseline").study
        codes = participants.create_invites(session, study, ACTOR, count=conversations, simulation=0)
    clock = FrozenClock(dt.datetime(2026, 3, 2, 9, tzinfo=dt.UTC))
    previous = set_clock(clock)
    settings = get_settings().model_copy(update={"llm_model": OFFLINE_MODEL})
    texts = [text for topic in TOPICS for text in (*topic.plain, *topic.framing)]
    try:
        people = []
        for code in codes:
            with session_scope(engine) as session:
                who = participants.enroll(session, code).participant
                current = participants.consent_status(session, who).current
                participants.sign_consent(session, who, version=current.version,
                                          confirmations=[c["id"] for c in current.confirmations],
                                          typed_signature="bench")
                people.append(who.id)
            with session_scope(engine) as session:
                who_now = session.get(Participant, people[-1])
                assert who_now is not None
                save_profile(session, who_now, timezone="Europe/Berlin", contact_email=None)
                who_now.arm = "wellbeing"
        with asyncio.Runner() as runner:
            driver = Driver(engine, OfflineGateway(settings), clock, runner, model=OFFLINE_MODEL)
            started = time.process_time()
            sent = 0
            for index, participant in enumerate(people):
                conversation = driver.start(participant, ("concierge", "collaborator", "coach")[index % 3])
                for _ in range(3):
                    clock.advance(dt.timedelta(minutes=2))
                    driver.send(participant, conversation, texts[sent % len(texts)], f"bench-{sent}")
                    sent += 1
                driver.end(participant, conversation, rating=5, decision=None)
            return (time.process_time() - started) / sent
    finally:
        set_clock(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--participants", type=int, default=400)
    parser.add_argument("--weeks", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--turns", type=int, default=600, help="messages of the baseline (the turns alone)")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL (default: a SQLite file)")
    args = parser.parse_args()
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"load at start: {os.getloadavg()[0]:.2f} (1-minute average), {os.cpu_count()} cores; "
          f"database: {'PostgreSQL' if args.postgres else 'SQLite'}")
    with database(args.postgres) as url:
        migrate(url)
        engine = make_engine(url)
        semantic.classify("The encoder loaded before the clock starts.")
        result = run(engine, args)
        per_message = turns_alone(engine, args.turns)
        engine.dispose()
    messages = result.counts["messages"]
    floor = per_message * messages
    print(f"baseline, the turns alone: {per_message * 1000:.1f} ms CPU a message ({args.turns} messages through the "
          f"driver); the run's {messages} messages alone: {floor:.1f} s CPU")
    print(f"load at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
