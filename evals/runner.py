"""Running a grid: the run and all its cells are written first, then each cell is run and stored
in a transaction of its own as soon as it is judged. A run killed part way is resumed from the
database: finished cells are never run again, and a failed cell is tried again until the grid's
``max_attempts``. Model and judge calls are limited per provider (the grid's ``concurrency``);
database work runs in the thread pool, never on the event loop.

    >>> grid = load_grid(Path("evals/grids/default.yaml"))
    >>> run_id = create_run(engine, grid)
    >>> outcome = execute_run(engine, run_id)        # the same call resumes a killed run
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.engine import Engine
from tqdm import tqdm  # type: ignore[import-untyped]

from chat.gateway import Gateway, GatewayError
from chat.offline import PROVIDER
from evals import pipeline
from evals.grid import OFFLINE_JUDGE, Condition, Grid, GridError, LoadedQueries, Query, QuerySet, load_queries
from evals.judge import RUBRIC_TEXT, Judge, JudgeError, judge_input, make_judge
from evals.models import EvalCell, EvalRun, EvalScore
from study.clock import now
from study.db import bulk_insert, retrying, session_scope
from study.errors import NotFound
from study.settings import get_settings

TOKENS_PER_WORD = 1.35  # a rough conversion for the estimate (English prose, BPE tokenizers)
REPLY_TOKENS = 180  # the estimate's length of one model reply
VERDICT_TOKENS = 160  # and of one verdict


def provider(model: str) -> str:
    return model.split("/", 1)[0]


def cell_seed(run_seed: int, condition: str, model: str, query_id: str, repeat: int) -> int:
    digest = hashlib.sha256(f"{run_seed}:{condition}:{model}:{query_id}:{repeat}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def gateway_for(grid: Grid) -> Gateway:
    settings = get_settings().model_copy(update={
        "llm_api_base": grid.api_base, "llm_timeout_seconds": grid.timeout_seconds, "llm_retries": grid.retries,
        "llm_fallback_model": grid.fallback_model})
    return Gateway(settings)


# The estimate printed before a run starts


@dataclass(frozen=True)
class Estimate:
    cells: int
    model_calls: int
    judge_calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None  # None: some model has no known price
    unpriced: tuple[str, ...]

    def lines(self) -> list[str]:
        cost = (f"about ${self.cost_usd:.2f}" if self.cost_usd is not None
                else f"unknown (no price known for {', '.join(self.unpriced)})")
        return [f"{self.cells:,} cells: {self.model_calls:,} model calls and {self.judge_calls:,} judge calls",
                f"about {self.prompt_tokens:,} prompt and {self.completion_tokens:,} completion tokens "
                f"(estimated from word counts); cost {cost}"]


def _tokens(text: str) -> int:
    return math.ceil(len(text.split()) * TOKENS_PER_WORD)


def _price(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    if model.startswith(f"{PROVIDER}/"):
        return 0.0
    return Gateway._cost(model, prompt_tokens, completion_tokens)


def estimate(grid: Grid, cells: list[tuple[Condition, str, Query]]) -> Estimate:
    """Tokens and cost of ``cells`` (condition, model, query), before any call is made: each
    message is sent with the system prompt and the conversation so far, each reply and verdict
    is taken to be ``REPLY_TOKENS`` / ``VERDICT_TOKENS`` long."""
    per_model: dict[str, list[int]] = {}
    model_calls = judge_calls = 0
    offline_judge = grid.judge == OFFLINE_JUDGE
    for condition, model, query in cells:
        system = _tokens(condition.system_text)
        prompt = history = 0
        for message in query.turns:
            history += _tokens(message)
            prompt += system + history
            history += REPLY_TOKENS
        entry = per_model.setdefault(model, [0, 0])
        entry[0] += prompt
        entry[1] += REPLY_TOKENS * len(query.turns)
        model_calls += len(query.turns)
        if not offline_judge:
            judge = per_model.setdefault(grid.judge, [0, 0])
            judge[0] += _tokens(RUBRIC_TEXT) + _tokens(judge_input(query, [])) + history
            judge[1] += VERDICT_TOKENS
            judge_calls += 1
    total: float | None = 0.0
    unpriced = []
    for model, (prompt, completion) in per_model.items():
        price = _price(model, prompt, completion)
        if price is None:
            unpriced.append(model)
            total = None
        elif total is not None:
            total += price
    return Estimate(cells=len(cells), model_calls=model_calls, judge_calls=judge_calls,
                    prompt_tokens=sum(v[0] for v in per_model.values()),
                    completion_tokens=sum(v[1] for v in per_model.values()), cost_usd=total,
                    unpriced=tuple(unpriced))


# Creating a run


@dataclass(frozen=True)
class Plan:
    """A grid made concrete: its conditions (prompt texts read once) and queries."""

    grid: Grid
    conditions: list[Condition]
    queries: LoadedQueries

    @property
    def query_list(self) -> list[Query]:
        found = self.queries.query_set.queries
        return found[: self.grid.limit_queries] if self.grid.limit_queries else found


def plan(grid: Grid, base: Path | None = None) -> Plan:
    return Plan(grid, grid.resolved_conditions(base), load_queries(grid.queries, base))


def create_run(engine: Engine, planned: Plan) -> int:
    """Write the run and every one of its cells (pending); returns the run's id."""
    grid = planned.grid
    stored = grid.model_dump(mode="json")
    stored["resolved_conditions"] = [
        {"name": c.name, "role": c.role, "system_text": c.system_text, "prompt_version": c.prompt_version}
        for c in planned.conditions]
    stored["query_set"] = planned.queries.query_set.model_dump(mode="json")
    with session_scope(engine) as session:
        run = EvalRun(name=grid.name, grid=stored, query_set=planned.queries.source,
                      query_set_sha256=planned.queries.sha256, seed=grid.seed, status="running", created_at=now())
        session.add(run)
        session.flush()
        rows = [{"run_id": run.id, "condition": c.name, "model": model, "query_id": q.id, "repeat": r,
                 "seed": cell_seed(grid.seed, c.name, model, q.id, r), "status": "pending", "attempts": 0,
                 "error": None, "prompt_version": c.prompt_version, "transcript": None, "prompt_tokens": None,
                 "completion_tokens": None, "cost_usd": None, "latency_ms": None, "finished_at": None}
                for c in planned.conditions for model in grid.models for q in planned.query_list
                for r in range(grid.repeats)]
        bulk_insert(session, EvalCell, rows)
        return run.id


def stored_plan(engine: Engine, run_id: int) -> Plan:
    """The run's plan as it was stored: the same prompts and queries, whatever changed on disk."""
    with session_scope(engine, read_only=True) as session:
        run = session.get(EvalRun, run_id)
        if run is None:
            raise NotFound(f"there is no evaluation run {run_id}")
        stored = dict(run.grid)
    conditions = [Condition(c["name"], c["role"], c["system_text"], c["prompt_version"])
                  for c in stored.pop("resolved_conditions")]
    query_set = QuerySet.model_validate(stored.pop("query_set"))
    grid = Grid.model_validate(stored)
    return Plan(grid, conditions, LoadedQueries(query_set, f"{query_set.name}@{query_set.version}", ""))


# Running its cells


@dataclass
class Outcome:
    run_id: int
    executed: int = 0
    failed: int = 0
    remaining: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.remaining == 0


@dataclass(frozen=True)
class _Todo:
    cell_id: int
    condition: str
    model: str
    query_id: str
    repeat: int
    seed: int


def _todo(engine: Engine, run_id: int, max_attempts: int) -> list[_Todo]:
    with session_scope(engine, read_only=True) as session:
        rows = session.execute(
            select(EvalCell.id, EvalCell.condition, EvalCell.model, EvalCell.query_id, EvalCell.repeat, EvalCell.seed)
            .where(EvalCell.run_id == run_id, EvalCell.status != "done", EvalCell.attempts < max_attempts)
            .order_by(EvalCell.id)).all()
    return [_Todo(*row) for row in rows]


def _store_done(engine: Engine, todo: _Todo, conversation: pipeline.Conversation, judgement: Any) -> None:
    with session_scope(engine) as session:
        stored = session.execute(
            update(EvalCell).where(EvalCell.id == todo.cell_id, EvalCell.status != "done").values(
                status="done", attempts=EvalCell.attempts + 1, error=None, transcript=conversation.turns,
                prompt_tokens=conversation.prompt_tokens, completion_tokens=conversation.completion_tokens,
                cost_usd=conversation.cost_usd, latency_ms=conversation.latency_ms, finished_at=now())
            .execution_options(synchronize_session=False)).rowcount  # type: ignore[attr-defined]
        if stored:
            session.add(EvalScore(cell_id=todo.cell_id, judge_model=judgement.judge_model,
                                  rubric_version=judgement.rubric_version, scores=judgement.scores,
                                  capitulated=judgement.capitulated, raw_output=judgement.raw_output,
                                  created_at=now()))


def _store_failure(engine: Engine, todo: _Todo, error: str) -> None:
    with session_scope(engine) as session:
        session.execute(update(EvalCell).where(EvalCell.id == todo.cell_id, EvalCell.status != "done")
                        .values(status="failed", attempts=EvalCell.attempts + 1, error=error[:500])
                        .execution_options(synchronize_session=False))


def _finish_if_complete(engine: Engine, run_id: int, max_attempts: int) -> int:
    with session_scope(engine) as session:
        remaining = session.scalar(select(func.count()).select_from(EvalCell).where(
            EvalCell.run_id == run_id, EvalCell.status != "done")) or 0
        retryable = session.scalar(select(func.count()).select_from(EvalCell).where(
            EvalCell.run_id == run_id, EvalCell.status != "done", EvalCell.attempts < max_attempts)) or 0
        if remaining == 0:
            session.execute(update(EvalRun).where(EvalRun.id == run_id, EvalRun.status != "finished")
                            .values(status="finished", finished_at=now()))
        return int(retryable)


async def _run_cells(engine: Engine, planned: Plan, todos: list[_Todo], gateway: Gateway, judge: Judge,
                     outcome: Outcome, progress: bool) -> None:
    grid = planned.grid
    conditions = {c.name: c for c in planned.conditions}
    queries = planned.queries.query_set.by_id()
    limits: dict[str, asyncio.Semaphore] = {}

    def limit(model: str) -> asyncio.Semaphore:
        name = provider(model)
        if name not in limits:
            limits[name] = asyncio.Semaphore(grid.limit(name))
        return limits[name]

    bar = tqdm(total=len(todos), desc=f"eval run {outcome.run_id}", unit="cell", disable=not progress,
               dynamic_ncols=True)

    async def one(todo: _Todo) -> None:
        query = queries[todo.query_id]
        params = {**grid.params, "seed": todo.seed}
        try:
            async with limit(todo.model):
                conversation = await pipeline.converse(gateway, conditions[todo.condition], todo.model, query, params)
            async with limit(judge.model):
                judgement = await judge.judge(query, conversation.turns, f"{todo.cell_id}")
            # Paid for: stored even when SQLite's writer lock is long in coming.
            await asyncio.to_thread(retrying, lambda: _store_done(engine, todo, conversation, judgement))
            outcome.executed += 1
        except (GatewayError, JudgeError) as exc:
            outcome.failed += 1
            if len(outcome.errors) < 20:
                outcome.errors.append(f"{todo.condition} {todo.model} {todo.query_id}: {exc}")
            message = str(exc)
            await asyncio.to_thread(retrying, lambda: _store_failure(engine, todo, message))
        finally:
            bar.update(1)

    try:
        await asyncio.gather(*(one(todo) for todo in todos))
    finally:
        bar.close()


def execute_run(engine: Engine, run_id: int, *, judge: Judge | None = None, progress: bool = True,
                before_start: Callable[[Estimate], None] | None = None) -> Outcome:
    """Run every cell of the run not yet done (a new run, or one resumed after a kill)."""
    started = time.perf_counter()
    planned = stored_plan(engine, run_id)
    grid = planned.grid
    todos = _todo(engine, run_id, grid.max_attempts)
    if before_start is not None:
        conditions = {c.name: c for c in planned.conditions}
        queries = planned.queries.query_set.by_id()
        before_start(estimate(grid, [(conditions[t.condition], t.model, queries[t.query_id]) for t in todos]))
    outcome = Outcome(run_id)
    gateway = gateway_for(grid)
    chosen = judge or make_judge(grid.judge, gateway, {k: v for k, v in grid.params.items() if k != "seed"})
    if todos:
        asyncio.run(_run_cells(engine, planned, todos, gateway, chosen, outcome, progress))
    outcome.remaining = _finish_if_complete(engine, run_id, grid.max_attempts)
    outcome.seconds = time.perf_counter() - started
    return outcome


def check_models(grid: Grid) -> None:
    """Refuse a grid whose judge would be a model under test (it would grade itself)."""
    if grid.judge in grid.models:
        raise GridError(f"the judge {grid.judge} is also a model under test; choose another judge")
