"""API and dispatcher replicas against one PostgreSQL: 2 API processes and 2 dispatchers, alone and together.

    nice -n 10 .venv/bin/python bench/replicas.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/DB
        [--participants 50] [--turns 20] [--followups 20000]

One schema, one study (the example protocol, in-app follow-ups only, as ``bench/scheduler.py``):
``--followups / 2`` participants with their follow-ups planned, and ``--participants`` chatting
participants each in a coach conversation. Two replicas of the API are two ``afterward api``
processes on two ports (``bench/chat_turns.serve``), the chatting participants split between them
as a load balancer would; two dispatchers are two ``afterward scheduler`` processes
(``bench/scheduler.dispatchers``). Three phases, in the same run:

1. chat alone: every participant sends ``--turns`` messages over HTTP keep-alive
   (``bench/chat_turns.run_served``), the dispatchers running idle;
2. dispatch alone: ``--followups / 2`` follow-ups fall due at once; the time until none is left;
3. together: as many other follow-ups fall due at once as the chat phase starts again.

Printed: turns/s with p50/p99 latency, follow-ups opened/s, and the most connections to PostgreSQL
seen at once (``pg_stat_activity``, every process of the run). Every turn stored and no duplicate
follow-up are checked.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import sqlalchemy as sa
from chat_turns import quantiles, run_served, serve, stored_turns
from common import enrolled, postgres_schema  # first: sets the environment and sys.path
from sqlalchemy.orm import Session

from chat import service as chat_service
from study.db import make_engine, migrate
from study.models import Participant

# bench/scheduler.py, under another name: ``scheduler`` is the package it measures.
_spec = importlib.util.spec_from_file_location("scheduler_bench", Path(__file__).with_name("scheduler.py"))
if _spec is None or _spec.loader is None:
    raise ImportError("bench/scheduler.py not found")
dispatch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dispatch)


class Connections(threading.Thread):
    """The most connections to the database seen at once, sampled every 0.2 s."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.engine = make_engine(url)
        self.database = sa.engine.make_url(url).database
        self.most = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            with self.engine.connect() as connection:
                now = connection.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db"),
                                         {"db": self.database}).scalar_one()
            self.most = max(self.most, int(now))

    def stop(self) -> int:
        self.done.set()
        self.join()
        self.engine.dispose()
        return self.most


async def chat(ports: list[int], work: list[tuple[str, int]], turns: int) -> tuple[list[float], float]:
    """Participants split between the API replicas; elapsed = until the last turn."""
    started = time.perf_counter()
    runs = await asyncio.gather(*(run_served(port, work[n::len(ports)], turns) for n, port in enumerate(ports)))
    return [latency for latencies, _ in runs for latency in latencies], time.perf_counter() - started


def show_chat(label: str, latencies: list[float], elapsed: float) -> None:
    p50, p99 = quantiles(latencies)
    print(f"  {label}: {len(latencies)} turns in {elapsed:.1f} s = {len(latencies) / elapsed:.1f} turns/s, "
          f"p50 {p50:.0f} ms, p99 {p99:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", required=True)
    parser.add_argument("--participants", type=int, default=50, help="chatting participants")
    parser.add_argument("--turns", type=int, default=20, help="messages each, per chat phase")
    parser.add_argument("--followups", type=int, default=20_000, help="follow-ups opened, half in each phase")
    args = parser.parse_args()
    if args.followups < 400:
        parser.error("--followups: at least 400")
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"load at start: {Path('/proc/loadavg').read_text().strip()}; {os.cpu_count()} cores")
    burst = args.followups // 2
    with postgres_schema(args.postgres) as url:
        migrate(url)
        engine = make_engine(url)
        study_id = dispatch.participants(engine, burst + 100)  # two follow-ups each, both planned below
        dispatch.plan(engine, study_id)

        def conversation(session: Session, who: Participant) -> int:
            return chat_service.start_conversation(session, who, "coach").id
        work = enrolled(engine, args.participants + 2, arm="wellbeing", then=conversation,
                        protocol=dispatch.IN_APP_ONLY)
        warm, work = work[:2], work[2:]
        expected = stored_turns(engine)
        workers = dispatch.dispatchers(url, 2, poll=0.2)
        apis: list[tuple[subprocess.Popen[bytes], int]] = []
        watch = Connections(url)
        try:
            apis += [serve(url, 1, wait_seconds=300) for _ in range(2)]  # start-up loads the encoder: slow when busy
            ports = [port for _, port in apis]
            for (token, conversation_id), port in zip(warm, ports, strict=True):  # each replica's imports, pools
                asyncio.run(run_served(port, [(token, conversation_id)], 2))
            for _ in range(2):  # the dispatchers polling (started before the participants enrolled), then idle
                dispatch.wait_sent(engine, dispatch.make_due(engine, 100))
            time.sleep(2)
            watch.start()
            print(f"2 API processes, 2 dispatchers, one PostgreSQL; {args.participants} participants chatting, "
                  f"{args.turns} messages each a phase; {burst} follow-ups due at once a phase")
            show_chat("1. chat alone", *asyncio.run(chat(ports, work, args.turns)))
            ids = dispatch.make_due(engine, burst)
            elapsed = dispatch.wait_sent(engine, ids)
            print(f"  2. dispatch alone: {burst} follow-ups in {elapsed:.1f} s = {burst / elapsed:,.0f} rows/s")
            ids = dispatch.make_due(engine, burst)
            sent: list[float] = []
            waiter = threading.Thread(target=lambda: sent.append(dispatch.wait_sent(engine, ids)))
            waiter.start()
            latencies, chat_elapsed = asyncio.run(chat(ports, work, args.turns))
            waiter.join()
            print("  3. together:")
            show_chat("   chat", latencies, chat_elapsed)
            print(f"     dispatch: {burst} follow-ups in {sent[0]:.1f} s = {burst / sent[0]:,.0f} rows/s")
            with engine.connect() as connection:
                limit = connection.execute(sa.text("SHOW max_connections")).scalar_one()
            print(f"  most connections to PostgreSQL at once: {watch.stop()} (this run's 5 processes and the "
                  f"bench's watcher; max_connections {limit})")
        finally:
            dispatch.stop(workers)
            for process, _ in apis:
                process.terminate()
                process.wait(30)
        expected += 2 * 2 + 2 * args.participants * args.turns
        stored = stored_turns(engine)
        assert stored == expected, (stored, expected)  # every reply stored
        dispatch.duplicates(engine)
        engine.dispose()
    print(f"load at end: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
