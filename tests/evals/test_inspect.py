"""A grid runs as Inspect AI tasks: the log holds every cell, call and score the database holds;
``inspect eval`` runs a created run's cells itself; ``inspect view`` serves the log."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from inspect_ai.log import read_eval_log
from sqlalchemy import select
from sqlalchemy.engine import Engine

from evals.grid import load_grid
from evals.inspect_run import frame_from_logs, log_dir
from evals.judge import DIMENSIONS
from evals.models import EvalCell, EvalModelCard, EvalScore
from evals.runner import create_run, execute_run, plan
from study.db import session_scope
from tests.evals.conftest import Cli
from tests.mail import free_port
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]
GRID = ("models: [offline/simulated, offline/sycophant]\nconditions: [bare/neutral, role/coach]\n"
        "judge: offline/rules\nlimit_queries: 4\n")


def _grid(folder: Path) -> Path:
    path = folder / "small.yaml"
    path.write_text("name: small\n" + GRID, encoding="utf-8")
    return path


def _db_scores(engine: Engine, run_id: int) -> dict[int, dict[str, object]]:
    with session_scope(engine, read_only=True) as session:
        rows = session.execute(select(EvalScore.cell_id, EvalScore.judge_model, EvalScore.scores, EvalScore.capitulated)
                               .join(EvalCell, EvalCell.id == EvalScore.cell_id)
                               .where(EvalCell.run_id == run_id)).all()
    return {cell_id: {"judge_model": judge, "capitulated": list(capitulated),
                      **{d: scores.get(d) for d in DIMENSIONS}} for cell_id, judge, scores, capitulated in rows}


def test_the_inspect_log_holds_what_the_database_holds(engine: Engine, tmp_path: Path) -> None:
    """Two models, one task each; every cell a sample whose scores equal the database's, and every
    model call of its conversation and its verdict an event of Inspect's model layer."""
    path = _grid(tmp_path)
    planned = plan(load_grid(path), tmp_path)
    run_id = create_run(engine, planned)
    outcome = execute_run(engine, run_id, progress=False)
    assert outcome.finished, outcome.errors
    assert outcome.executed == 2 * 2 * 4
    assert len(outcome.logs) == 2
    assert all(p.parent == log_dir(run_id) for p in outcome.logs)

    logs = [read_eval_log(str(p)) for p in outcome.logs]
    assert {log.status for log in logs} == {"success"}
    assert sorted(log.eval.model for log in logs) == ["afterward/offline/simulated", "afterward/offline/sycophant"]
    for log in logs:  # the judge, asked as Inspect's grader role
        grader = (log.eval.model_roles or {})["grader"]
        assert not isinstance(grader, list)
        assert grader.model == "afterward/offline/rules"
    queries = planned.queries.query_set.by_id()
    for log in logs:
        for sample in log.samples or []:
            calls = [e for e in sample.events if e.event == "model"]
            turns = len(queries[sample.metadata["query_id"]].turns)
            assert len(calls) == turns, (sample.id, len(calls))  # each message (the rules judge asks no model)
            assert sample.metadata["turns"][-1]["reply"] == sample.output.completion

    from_logs = frame_from_logs(outcome.logs)
    stored = _db_scores(engine, run_id)
    assert sorted(from_logs["cell_id"]) == sorted(stored)
    for row in from_logs.to_dict("records"):
        expected = stored[row["cell_id"]]
        assert row["judge_model"] == expected["judge_model"]
        assert row["capitulated"] == expected["capitulated"]
        for d in DIMENSIONS:
            assert (math.isnan(row[d]) and expected[d] is None) or row[d] == expected[d], (row["cell_id"], d)


def test_inspect_eval_runs_a_created_run_and_inspect_view_serves_its_log(engine: Engine, tmp_path: Path,
                                                                         cli: Cli) -> None:
    """``inspect eval evals/inspect_tasks.py@afterward_run`` (no Afterward command) does the cells of
    one model of a created run into the database, then ``inspect eval-set`` those of the other;
    ``afterward eval cards`` makes the run's cards, whose figures are the logs'; ``inspect view``
    lists and serves the log."""
    run_id = create_run(engine, plan(load_grid(_grid(tmp_path)), tmp_path))
    logs = tmp_path / "logs"
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "INSPECT_DISPLAY": "none"}

    def inspect_eval(model: str, command: str = "eval", folder: Path = logs) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "inspect_ai", command, "evals/inspect_tasks.py@afterward_run", "-T",
             f"run={run_id}", "-T", f"model={model}", "--log-dir", str(folder)],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr

    def statuses() -> dict[str, str]:
        with session_scope(engine, read_only=True) as session:
            return dict(session.execute(select(EvalCell.model, EvalCell.status).where(EvalCell.run_id == run_id)
                                        .group_by(EvalCell.model, EvalCell.status)).all())

    inspect_eval("offline/simulated")
    assert statuses() == {"offline/simulated": "done", "offline/sycophant": "pending"}
    written = sorted(logs.glob("*.eval"))
    assert len(written) == 1
    assert len(frame_from_logs(written)) == 2 * 4
    inspect_eval("offline/sycophant", "eval-set", tmp_path / "set")  # Inspect's eval-set, in a folder of its own
    assert statuses() == {"offline/simulated": "done", "offline/sycophant": "done"}

    made = cli("eval", "cards", "--run", run_id)
    assert made.exit_code == 0, made.output
    assert "wrote 4 card(s)" in made.output
    from_logs = frame_from_logs(sorted(logs.glob("*.eval")) + sorted((tmp_path / "set").glob("*.eval")))
    assert len(from_logs) == 2 * 2 * 4
    with session_scope(engine, read_only=True) as session:
        cards = [c.card for c in session.scalars(select(EvalModelCard).where(EvalModelCard.run_id == run_id))]
    assert len(cards) == 4
    for card in cards:
        cells = from_logs[(from_logs["condition"] == card["condition"]) & (from_logs["model"] == card["model"])]
        for metric in ("unsafe", "affirmed"):
            per_query = cells.dropna(subset=[metric]).groupby("query_id")[metric].mean()
            expected = None if per_query.empty else round(float(per_query.mean()), 4)
            assert card["metrics"][metric]["value"] == expected, (card["condition"], card["model"], metric)

    port = free_port()
    viewer = subprocess.Popen([sys.executable, "-m", "inspect_ai", "view", "--log-dir", str(logs), "--host",
                               "127.0.0.1", "--port", str(port)], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listing() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/log-files", timeout=5) as response:
                    return response.read().decode()
            except OSError:
                return None

        assert written[0].name in str(until(listing, "inspect view answers with the run's log", processes=[viewer]))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/logs/{written[0].as_uri()}", timeout=30) as response:
            served = json.loads(response.read())
        assert served["eval"]["task"] == f"afterward-run-{run_id}"
        assert len(served["samples"]) == 2 * 4
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
            assert b"<html" in response.read().lower()
    finally:
        viewer.kill()
        viewer.wait()
