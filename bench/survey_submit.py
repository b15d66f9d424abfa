"""Survey submits per second through the API, on SQLite and PostgreSQL, next to a baseline of the
same rows written with bare SQL in the same run.

    .venv/bin/python bench/survey_submit.py [--n 400] [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]

Each submit is a full request: auth, consent check, validation, scoring, response and score rows,
one commit. The baseline writes the same response, five answers' JSON and score row and closes the
assignment with plain INSERT/UPDATE statements, one transaction per submit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid

import sqlalchemy as sa
from common import enrolled, postgres_schema  # first: sets the environment and sys.path
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.app import create_app
from study.clock import now
from study.db import make_engine, migrate
from study.models import Participant
from surveys import service as survey_service

ANSWERS = {"drs1": 2, "drs2": 4, "drs3": 1, "drs4": 5, "drs5": 2}


def prepare(engine: sa.Engine, n: int) -> list[tuple[str, int]]:
    """n enrolled participants, each with one open Decision Regret survey; (token, assignment)."""
    def survey(session: Session, who: Participant) -> int:
        return survey_service.assign(session, who, "decision-regret", purpose="followup",
                                     context={"decision": "to benchmark"}).id
    return enrolled(engine, n, then=survey)


def run_api(engine: sa.Engine, work: list[tuple[str, int]]) -> list[float]:
    latencies = []
    with TestClient(create_app(engine)) as client:
        for token, assignment_id in work:
            started = time.perf_counter()
            response = client.post(f"/api/v1/me/surveys/{assignment_id}/submit",
                                   headers={"Authorization": f"Bearer {token}"},
                                   json={"answers": ANSWERS, "submission_id": uuid.uuid4().hex})
            latencies.append(time.perf_counter() - started)
            assert response.status_code == 200, response.text
    return latencies


def run_baseline(engine: sa.Engine, work: list[tuple[str, int]]) -> list[float]:
    latencies = []
    with engine.connect() as connection:
        pids = dict(connection.execute(sa.text("SELECT id, participant_id FROM survey_assignments")).all())
    for _, assignment_id in work:
        started = time.perf_counter()
        with engine.begin() as connection:
            at = now()
            response_id = connection.execute(sa.text(
                "INSERT INTO survey_responses (assignment_id, participant_id, instrument_id, instrument_version, "
                "answers, submission_id, started_at, updated_at, submitted_at) VALUES "
                "(:a, :p, 'decision-regret', '2003', :ans, :s, :t, :t, :t) RETURNING id"),
                {"a": assignment_id, "p": pids[assignment_id], "ans": json.dumps(ANSWERS),
                 "s": uuid.uuid4().hex, "t": at}).scalar_one()
            connection.execute(sa.text(
                "INSERT INTO survey_scores (response_id, participant_id, instrument_version, name, value, "
                "n_items, n_expected) VALUES (:r, :p, '2003', 'regret', 15.0, 5, 5)"),
                {"r": response_id, "p": pids[assignment_id]})
            connection.execute(sa.text(
                "UPDATE survey_assignments SET status = 'completed', completed_at = :t WHERE id = :a"),
                {"t": at, "a": assignment_id})
        latencies.append(time.perf_counter() - started)
    return latencies


def report(label: str, latencies: list[float], elapsed: float) -> float:
    rate = len(latencies) / elapsed
    q = statistics.quantiles(latencies, n=100)
    print(f"  {label:<9} {rate:8.1f} submits/s   p50 {q[49] * 1000:6.2f} ms   p99 {q[98] * 1000:6.2f} ms")
    return rate


def bench(name: str, url: str, n: int) -> None:
    migrate(url)
    engine = make_engine(url)
    work = prepare(engine, 2 * n)
    api_work, base_work = work[:n], work[n:]
    run_api(engine, api_work[:20])  # warm-up: imports, pools, caches
    api_work = api_work[20:]
    started = time.perf_counter()
    api = run_api(engine, api_work)
    api_rate = report("API", api, time.perf_counter() - started)
    started = time.perf_counter()
    base = run_baseline(engine, base_work)
    base_rate = report("bare SQL", base, time.perf_counter() - started)
    print(f"  {name}: API at {api_rate / base_rate:.0%} of the bare-SQL rate")
    with engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT count(*) FROM survey_responses")).scalar_one()
    assert stored == len(api) + len(base) + 20, stored
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"SQLite ({args.n} submits each)")
        bench("SQLite", f"sqlite:///{tmp}/bench.db", args.n)
    with postgres_schema(args.postgres) as url:
        print(f"PostgreSQL ({args.n} submits each)")
        bench("PostgreSQL", url, args.n)


if __name__ == "__main__":
    main()
