"""Follow-up planning and dispatch on PostgreSQL.

    .venv/bin/python bench/scheduler.py [--participants 100000] [--dispatch 20000] [--postgres URL]

1. Planning: enrollment-anchored follow-ups for every participant (``planner.plan_many``, two
   per participant in the example protocol), in chunks of 5,000 (read by id range); rows/s with
   the participants' loading, and of ``plan_many`` and its commits alone.
2. Dispatch: ``--dispatch`` follow-ups made due at once, opened through the in-app channel by
   1 and then 2 ``afterward scheduler`` processes (each follow-up: claim, survey assignment,
   delivery record), next to a bare SQL claim-and-update loop over as many rows in the same run.
3. Lateness: follow-ups falling due steadily over 30 s while 2 dispatchers poll every second;
   p50/p99 of (sent - due).

Duplicates are counted from the survey assignments (must be 0).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from common import ACTOR, PROTOCOL, ROOT, postgres_schema  # first: sets the environment and sys.path

from scheduler import planner
from study import studies
from study.db import make_engine, migrate, session_scope
from study.models import Participant
from surveys import registry

IN_APP_ONLY = PROTOCOL.read_text().replace("channels: [email, in_app]", "channels: [in_app]")


def participants(engine: sa.Engine, n: int) -> int:
    """n enrolled participants in four time zones, inserted directly (set-up, not measured)."""
    with session_scope(engine) as session:
        study = studies.load_protocol(session, IN_APP_ONLY, ACTOR,
                                      instruments=registry.catalog(session)).study
        study_id = study.id
    zones = ["Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney"]
    start = dt.datetime.now(dt.UTC)
    rows = [dict(study_id=study_id, code=f"B{i:08d}", status="enrolled", timezone=zones[i % 4], arm="wellbeing",
                 enrolled_at=start + dt.timedelta(seconds=i), created_at=start) for i in range(n)]
    with engine.begin() as connection:
        for offset in range(0, n, 10_000):
            connection.execute(sa.insert(Participant), rows[offset:offset + 10_000])
    return study_id


def plan(engine: sa.Engine, study_id: int, chunk: int = 5000) -> None:
    with engine.connect() as connection:
        ids = connection.execute(sa.select(Participant.id).where(Participant.study_id == study_id)
                                 .order_by(Participant.id)).scalars().all()
    started = time.perf_counter()
    rows, planning = 0, 0.0
    for offset in range(0, len(ids), chunk):
        with session_scope(engine) as session:
            batch = list(session.scalars(sa.select(Participant).where(
                Participant.study_id == study_id, Participant.id.between(ids[offset], ids[offset:offset + chunk][-1]))))
            begun = time.perf_counter()
            rows += planner.plan_many(session, batch)
        planning += time.perf_counter() - begun  # plan_many and its commit
    elapsed = time.perf_counter() - started
    print(f"planning: {rows} follow-ups for {len(ids)} participants in {elapsed:.1f} s = {rows / elapsed:,.0f} rows/s "
          f"with the participants' loading; plan_many and its commits alone {planning:.1f} s = "
          f"{rows / planning:,.0f} rows/s")


def make_due(engine: sa.Engine, n: int, spread_seconds: float = 0.0) -> list[int]:
    """Move ``n`` planned follow-ups to now (or spread over the next ``spread_seconds``)."""
    with engine.begin() as connection:
        ids = connection.execute(sa.text("SELECT id FROM followups WHERE status = 'planned' ORDER BY id LIMIT :n"),
                                 {"n": n}).scalars().all()
        base = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1 if spread_seconds else -1)
        step = spread_seconds / n
        connection.execute(sa.text("UPDATE followups SET due_at = :due, closes_at = :closes, "
                                   "reminder_offsets = '[]' WHERE id = :id"),
                           [{"id": i, "due": base + dt.timedelta(seconds=k * step),
                             "closes": base + dt.timedelta(days=3)} for k, i in enumerate(ids)])
    return list(ids)


def dispatchers(url: str, count: int, poll: float) -> list[subprocess.Popen[bytes]]:
    """``count`` dispatcher processes, returned once each has said it is polling: on a loaded
    machine importing the platform alone can take longer than the 5 s the bench used to wait,
    and the start-up was then timed as dispatch."""
    env = {**os.environ, "AFTERWARD_DATABASE_URL": url, "AFTERWARD_SCHEDULER_BATCH_SIZE": "500"}
    logs = Path(tempfile.mkdtemp(prefix="bench-scheduler-"))
    processes = [subprocess.Popen([sys.executable, "-c", "from api.cli import main; main()", "scheduler",
                                   "--poll-seconds", str(poll), "--name", f"bench-{i}"], cwd=ROOT, env=env,
                                  stdout=subprocess.DEVNULL, stderr=(logs / f"{i}.log").open("wb"))
                 for i in range(count)]
    deadline = time.monotonic() + 300
    while not all("polling every" in (logs / f"{i}.log").read_text() for i in range(count)):
        if time.monotonic() > deadline or any(process.poll() is not None for process in processes):
            stop(processes)
            raise RuntimeError(f"the dispatchers did not start (logs in {logs})")
        time.sleep(0.1)
    return processes


def wait_sent(engine: sa.Engine, ids: list[int], timeout: float = 900) -> float:
    """Seconds until none of ``ids`` is planned. Polled on the (status, due_at) index up to the
    latest of their due times, which only the rows left planned cost: asking for the ids
    themselves (an array of 20,000 adapted in Python every 50 ms) took about a core of a 2-core
    machine away from the dispatchers, and the bare loop has no poller. Confirmed by the ids at the end."""
    started = time.perf_counter()
    deadline = started + timeout
    with engine.connect() as connection:
        last = connection.execute(sa.text("SELECT max(due_at) FROM followups WHERE id = ANY(:ids)"),
                                  {"ids": ids}).scalar_one()
    while time.perf_counter() < deadline:
        with engine.connect() as connection:
            left = connection.execute(sa.text("SELECT count(*) FROM followups WHERE status = 'planned' AND "
                                              "due_at <= :last"), {"last": last}).scalar_one()
        if left == 0:
            elapsed = time.perf_counter() - started
            with engine.connect() as connection:
                left = connection.execute(sa.text("SELECT count(*) FROM followups WHERE id = ANY(:ids) AND "
                                                  "status = 'planned'"), {"ids": ids}).scalar_one()
            if left == 0:
                return elapsed
        time.sleep(0.05)
    raise RuntimeError("dispatch did not finish")


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(30)


def dispatch(engine: sa.Engine, url: str, n: int, count: int) -> float:
    processes = dispatchers(url, count, poll=0.2)
    try:
        time.sleep(1)  # started: let their first ticks find nothing due; the clock starts when the rows fall due
        ids = make_due(engine, n)
        elapsed = wait_sent(engine, ids)
    finally:
        stop(processes)
    rate = n / elapsed
    print(f"dispatch, {count} dispatcher(s) polling every 0.2 s: {n} follow-ups in {elapsed:.1f} s "
          f"= {rate:,.0f} rows/s")
    return rate


def bare(engine: sa.Engine, n: int, batch: int = 500) -> float:
    """The baseline: claim due rows with SKIP LOCKED and mark them sent, nothing else."""
    make_due(engine, n)
    started = time.perf_counter()
    done = 0
    while done < n:
        with engine.begin() as connection:
            claimed = connection.execute(sa.text(
                "UPDATE followups SET status = 'sent', sent_at = now() WHERE id IN (SELECT id FROM followups "
                "WHERE status = 'planned' AND due_at <= now() ORDER BY due_at LIMIT :batch FOR UPDATE SKIP LOCKED) "
                "RETURNING id"), {"batch": batch}).scalars().all()
        if not claimed:
            break
        done += len(claimed)
    elapsed = time.perf_counter() - started
    print(f"bare SQL claim-and-update: {done} rows in {elapsed:.1f} s = {done / elapsed:,.0f} rows/s")
    return done / elapsed


def lateness(engine: sa.Engine, url: str, n: int, poll: float = 1.0) -> None:
    processes = dispatchers(url, 2, poll=poll)
    try:
        time.sleep(1)
        ids = make_due(engine, n, spread_seconds=30)
        wait_sent(engine, ids)
    finally:
        stop(processes)
    with engine.connect() as connection:
        late = connection.execute(sa.text("SELECT lateness_seconds FROM followups WHERE id = ANY(:ids)"),
                                  {"ids": ids}).scalars().all()
    q = statistics.quantiles(late, n=100)
    print(f"lateness ({n} follow-ups due over 30 s, 2 dispatchers polling every {poll:.0f} s): "
          f"p50 {q[49]:.2f} s, p99 {q[98]:.2f} s, max {max(late):.2f} s")


def duplicates(engine: sa.Engine) -> None:
    with engine.connect() as connection:
        extra = connection.execute(sa.text(
            "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM survey_assignments "
            "WHERE purpose = 'followup' GROUP BY participant_id, followup_key) AS per_followup")).scalar_one()
        opened = connection.execute(sa.text("SELECT count(*) FROM survey_assignments")).scalar_one()
    print(f"duplicates: {extra} (survey assignments created: {opened})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--participants", type=int, default=100_000)
    parser.add_argument("--dispatch", type=int, default=20_000)
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    with postgres_schema(args.postgres) as url:
        migrate(url)
        engine = make_engine(url)
        study_id = participants(engine, args.participants)
        plan(engine, study_id)
        base = bare(engine, args.dispatch)
        for count in (1, 2):
            rate = dispatch(engine, url, args.dispatch, count)
            print(f"  {count} dispatcher(s) at {rate / base:.0%} of the bare rate")
        lateness(engine, url, min(args.dispatch, 3000))
        duplicates(engine)
        engine.dispose()


if __name__ == "__main__":
    main()
