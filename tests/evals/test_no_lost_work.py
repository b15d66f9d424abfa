"""No lost work, no second bill: the judge on the models' own provider (a loopback
OpenAI-compatible server that counts every request) in a queue of its own, each conversation saved
before it is judged and each cell as soon as it is judged, a failed judgement tried again on the
saved conversation, the response cache shared by runs and resumes, and ``eval rescore``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from evals.grid import load_grid
from evals.models import EvalCell, EvalResponse, EvalScore
from evals.results import load_frame
from evals.runner import create_run, execute_run, plan
from study.db import session_scope
from study.settings import get_settings
from tests.loopback import ChatHandler, serve
from tests.waiting import WAIT_SECONDS, until

ROOT = Path(__file__).resolve().parents[2]
JUDGED_BEFORE_HOLD = 4  # judge requests answered while the server holds the rest


class Provider(ChatHandler):
    """One provider for models and judges. A model's reply names the request's seed, so the
    judge's request says which cell it judges. Judges: ``judge-a`` and ``judge-b`` give different
    scores; ``judge-flaky`` answers a conversation first with a 500, then with no JSON, then
    properly. While ``holding`` is set, judge requests after the first ``JUDGED_BEFORE_HOLD`` and
    every model request past a conversation's first message wait for ``release`` (a provider that
    stops answering mid-run, without a clock)."""

    requests: list[dict[str, Any]] = []
    held: Counter[str] = Counter()
    judged = 0
    flaky: Counter[str] = Counter()
    holding = threading.Event()
    release = threading.Event()
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        body = self.body()
        judge = ((body.get("response_format") or {}).get("json_schema") or {}).get("name") == "wellbeing_rubric"
        with Provider.lock:
            Provider.requests.append(body)
            hold = Provider.holding.is_set() and (
                Provider.judged >= JUDGED_BEFORE_HOLD if judge
                else any(m["role"] == "assistant" for m in body["messages"]))
            if hold:
                Provider.held["judge" if judge else "model"] += 1
            elif judge:
                Provider.judged += 1
            tries = 0
            if body["model"] == "judge-flaky":
                Provider.flaky[body["messages"][-1]["content"]] += 1
                tries = Provider.flaky[body["messages"][-1]["content"]]
        if hold:
            Provider.release.wait(WAIT_SECONDS)
        try:
            if tries == 1:
                data = b'{"error": {"message": "upstream down", "type": "server_error"}}'
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.complete(body["model"], "no verdict today" if tries == 2 else self._answer(body, judge))
        except (BrokenPipeError, ConnectionResetError):
            pass  # asked by a run that was killed meanwhile

    @staticmethod
    def _answer(body: dict[str, Any], judge: bool) -> str:
        if not judge:
            return f"I hear you, and I disagree, because I have only heard one side (seed {body.get('seed')})."
        found = re.search(r"Pushback messages: (\d)", body["messages"][-1]["content"])
        pushbacks = int(found.group(1)) if found else 0
        empathy, safety = (2, 3) if body["model"] == "judge-b" else (4, 5)
        return json.dumps({"safety": safety, "empathy": empathy, "constructive_support": 4,
                           "inappropriate_affirmation": 1, "calibrated_disagreement": 5, "factual_accuracy": None,
                           "capitulation": 1 if pushbacks else None, "capitulated": [False] * pushbacks,
                           "reasons": "held a reasoned position"})


@pytest.fixture
def api_base(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    Provider.requests = []
    Provider.held = Counter()
    Provider.judged = 0
    Provider.flaky = Counter()
    Provider.holding = threading.Event()
    Provider.release = threading.Event()
    with serve(Provider) as base:
        yield base
        Provider.release.set()  # a request still held answers now, so the server can shut down


def grid_file(tmp_path: Path, api_base: str, body: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(f"api_base: {api_base}\ntimeout_seconds: {WAIT_SECONDS}\nretries: 0\n"
                    "params: {temperature: 0}\n" + body, encoding="utf-8")
    return path


def is_judge(request: dict[str, Any]) -> bool:
    return "json_schema" in (request.get("response_format") or {})


def judged_seed(request: dict[str, Any]) -> int:
    """The seed of the cell a judge request judges (its conversation quotes it)."""
    seeds = {int(s) for s in re.findall(r"\(seed (\d+)\)", request["messages"][-1]["content"])}
    assert len(seeds) == 1
    return seeds.pop()


def cells(engine: Engine) -> dict[int, dict[str, Any]]:
    with session_scope(engine, read_only=True) as session:
        return {cell.id: {c.name: getattr(cell, c.name) for c in EvalCell.__table__.columns}
                for cell in session.scalars(select(EvalCell))}


def scores(engine: Engine, judge: str) -> dict[int, tuple[Any, ...]]:
    with session_scope(engine, read_only=True) as session:
        return {s.cell_id: (s.id, s.scores, s.created_at)
                for s in session.scalars(select(EvalScore).where(EvalScore.judge_model == judge))}


def statuses(engine: Engine) -> Counter[str]:
    return Counter(cell["status"] for cell in cells(engine).values())


def test_a_killed_run_resumes_without_asking_again(engine: Engine, api_base: str, tmp_path: Path) -> None:
    """31 single conversations of one model; the judge on the same provider, with no limit of its
    own in the grid. The server answers four verdicts and then holds the judge's requests, and
    holds every second message of a conversation: the run keeps having conversations while the
    judge is stuck (its own queue), saves the four judged cells at once, and stops with 15
    conversations saved but not judged and 3 multi-message conversations part way (their first
    answers cached). Killed there with SIGKILL and resumed, it asks the server for nothing it had
    answered and the run kept: no judged cell, no saved conversation, no cached answer."""
    grid = grid_file(tmp_path, api_base, "name: lost\nmodels: [openai/model-a]\nconditions: [bare/neutral]\n"
                     "judge: openai/judge-a\nlimit_queries: 31\nconcurrency: {openai: 3}\n")
    env = {**os.environ, "AFTERWARD_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    Provider.holding.set()
    process = subprocess.Popen([sys.executable, "-c", "from api.cli import main; main()", "eval", "run", str(grid),
                                "--no-progress"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        until(lambda: Provider.held == Counter(model=3, judge=3)
              and statuses(engine) == Counter(done=4, generated=15, pending=12),
              "4 cells judged, 15 saved for the judge and the provider holding the rest", processes=[process])
    except AssertionError:
        process.kill()
        raise AssertionError(process.communicate()[0].decode() + f"\n{Provider.held} {statuses(engine)}") from None
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    asked_before = len(Provider.requests)
    before = cells(engine)
    judged_before = scores(engine, "openai/judge-a")
    with session_scope(engine, read_only=True) as session:
        cached_before = [(r.model, r.request) for r in session.scalars(select(EvalResponse))]
    assert len(judged_before) == 4
    # Every answer the run was given and kept: 19 single messages, 3 first messages of the held
    # conversations, 4 verdicts.
    assert len(cached_before) == 19 + 3 + 4
    Provider.holding.clear()
    Provider.release.set()

    outcome = execute_run(engine, 1, progress=False)
    assert outcome.finished, outcome.errors
    assert (outcome.executed, outcome.failed) == (27, 0)
    assert outcome.cached == 3  # the first messages of the three conversations cut short
    after = cells(engine)
    assert {cell["status"] for cell in after.values()} == {"done"}
    assert all(cell["attempts"] == 1 and cell["judge_attempts"] == 1 for cell in after.values())
    judged_after = scores(engine, "openai/judge-a")
    assert set(judged_after) == set(after)
    for cell_id, cell in before.items():
        if cell["status"] == "done":
            assert after[cell_id] == cell  # finished cells untouched
            assert judged_after[cell_id] == judged_before[cell_id]
        if cell["status"] == "generated":
            assert after[cell_id]["transcript"] == cell["transcript"]

    asked = Provider.requests[asked_before:]
    seed_of = {cell["seed"]: cell_id for cell_id, cell in before.items()}
    # The judge: once for each cell not judged before the kill, never for one that was.
    verdicts = Counter(seed_of[judged_seed(r)] for r in asked if is_judge(r))
    assert verdicts == Counter({cell_id: 1 for cell_id, cell in before.items() if cell["status"] != "done"})
    # The models: nothing for a saved conversation, nothing that was cached, the rest once.
    messages = [r for r in asked if not is_judge(r)]
    assert not {seed_of[r["seed"]] for r in messages} & {c for c, cell in before.items() if cell["status"] != "pending"}
    sent = {(r["model"], json.dumps(r["messages"]), r["seed"]) for r in messages}
    assert len(sent) == len(messages)
    kept = {(model.split("/", 1)[1], json.dumps(request["messages"]), request["params"].get("seed"))
            for model, request in cached_before}
    assert not sent & kept
    queries = plan(load_grid(grid), tmp_path).queries.query_set.by_id()
    cached_turns = Counter(seed_of[request["params"]["seed"]] for model, request in cached_before
                           if "seed" in request["params"])
    expected = sum(len(queries[cell["query_id"]].turns) - cached_turns[cell_id]
                   for cell_id, cell in before.items() if cell["status"] == "pending")
    assert sorted(cached_turns[c] for c, cell in before.items() if cell["status"] == "pending") == [0] * 9 + [1] * 3
    assert len(messages) == expected


def test_a_failed_judgement_is_tried_again_on_the_saved_conversation(engine: Engine, api_base: str,
                                                                     tmp_path: Path) -> None:
    """The judge fails each conversation twice (a 500, then an answer without a verdict) and
    judges it the third time: each conversation is had once. A second run of the same grid is
    answered from the cache alone: the server is asked nothing."""
    grid = grid_file(tmp_path, api_base, "name: flaky\nmodels: [openai/model-a]\nconditions: [bare/neutral]\n"
                     "judge: openai/judge-flaky\nlimit_queries: 3\nmax_attempts: 3\n")
    run_id = create_run(engine, plan(load_grid(grid), tmp_path))
    outcome = execute_run(engine, run_id, progress=False)
    assert outcome.finished, outcome.errors
    assert (outcome.executed, outcome.failed, outcome.judge_retries) == (3, 0, 6)
    done = cells(engine)
    assert {(c["status"], c["attempts"], c["judge_attempts"], c["error"]) for c in done.values()} == {
        ("done", 1, 3, None)}
    seeds = {cell["seed"] for cell in done.values()}
    assert Counter(r["seed"] for r in Provider.requests if not is_judge(r)) == Counter(dict.fromkeys(seeds, 1))
    assert Counter(judged_seed(r) for r in Provider.requests if is_judge(r)) == Counter(dict.fromkeys(seeds, 3))
    assert {s[1]["empathy"] for s in scores(engine, "openai/judge-flaky").values()} == {4}

    asked = len(Provider.requests)
    again = create_run(engine, plan(load_grid(grid), tmp_path))
    second = execute_run(engine, again, progress=False)
    assert second.finished
    assert second.executed == 3
    assert second.cached == 3 + 3  # three conversations and three verdicts
    assert len(Provider.requests) == asked
    with session_scope(engine, read_only=True) as session:
        assert session.scalar(select(func.count()).select_from(EvalResponse)) == 6


def test_rescore_changes_only_scores(engine: Engine, api_base: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    grid = grid_file(tmp_path, api_base, "name: rescore\nmodels: [openai/model-a, openai/model-b]\n"
                     "conditions: [bare/neutral]\njudge: openai/judge-a\nlimit_queries: 4\n")
    run_id = create_run(engine, plan(load_grid(grid), tmp_path))
    assert execute_run(engine, run_id, progress=False).finished
    before, judged_a = cells(engine), scores(engine, "openai/judge-a")
    frame_a = load_frame(engine, run_id)
    asked = len(Provider.requests)
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    try:
        cli = __import__("api.cli", fromlist=["app"]).app
        result = CliRunner().invoke(cli, ["eval", "rescore", str(run_id), "--judge", "openai/judge-b",
                                          "--no-progress"])
        assert result.exit_code == 0, result.output
        assert "8 cells now, 0 before, 0 failed" in result.output
        rescored = Provider.requests[asked:]
        assert [r["model"] for r in rescored] == ["judge-b"] * 8  # the judge only, once a cell
        assert Counter(judged_seed(r) for r in rescored) == Counter(c["seed"] for c in before.values())
        assert cells(engine) == before  # conversations, statuses, usage and times as they were
        assert scores(engine, "openai/judge-a") == judged_a
        frame_b = load_frame(engine, run_id, judge_model="openai/judge-b")
        assert list(frame_b["cell_id"]) == list(frame_a["cell_id"])
        assert set(frame_a["empathy"]) == {4.0}
        assert set(frame_b["empathy"]) == {2.0}
        assert set(frame_b["safety"]) == {3.0}
        assert load_frame(engine, run_id).equals(frame_a)

        again = CliRunner().invoke(cli, ["eval", "rescore", str(run_id), "--judge", "openai/judge-b",
                                         "--no-progress"])
        assert again.exit_code == 0, again.output
        assert "0 cells now, 8 before" in again.output
        assert len(Provider.requests) == asked + 8
        own = CliRunner().invoke(cli, ["eval", "rescore", str(run_id), "--judge", "openai/judge-a"])
        assert own.exit_code == 1
        assert "the run's own judge" in own.output
    finally:
        get_settings.cache_clear()
