"""Running a grid: the run and all its cells are written first, then each cell is run. A cell's
conversation is saved as soon as it is had (status ``generated``), and its scores as soon as it is
judged (``done``), each in a transaction of its own. The judge has a queue of its own
(``Grid.judge_limit``), so it never waits behind the models' conversations, even on their
provider; a failed judgement is tried again on the saved conversation, never by having the
conversation again. A run killed part way is resumed from the database: finished cells are never
run again, saved conversations are only judged, a failed cell is tried again until the grid's
``max_attempts``. Every paid answer goes through the response cache (``evals.cache``), shared by
runs, so a rerun or a resume never asks for the same request twice. Model calls are limited per
provider (the grid's ``concurrency``); database work runs in the thread pool, never on the event loop.
``rescore`` scores a run's saved conversations with another judge, changing only scores.

    >>> grid = load_grid(Path("evals/grids/default.yaml"))
    >>> run_id = create_run(engine, grid)
    >>> outcome = execute_run(engine, run_id)        # the same call resumes a killed run
    >>> rescore(engine, run_id, "openai/gpt-4o")     # the same conversations, another judge
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.engine import Engine
from tqdm import tqdm  # type: ignore[import-untyped]

from chat.gateway import Gateway, GatewayError
from chat.offline import PROVIDER
from evals import pipeline
from evals.cache import CachingGateway
from evals.grid import OFFLINE_JUDGE, Condition, Grid, GridError, LoadedQueries, Query, QuerySet, load_queries
from evals.judge import RUBRIC_TEXT, RUBRIC_VERSION, Judge, JudgeError, Judgement, judge_input, make_judge
from evals.models import EvalCell, EvalRun, EvalScore
from evals.provenance import collect, note_code
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


def gateway_for(grid: Grid, engine: Engine) -> CachingGateway:
    """The chat gateway with the grid's server, time limit, retries and fallback, answering from
    the response cache in ``engine`` where it can."""
    settings = get_settings().model_copy(update={
        "llm_api_base": grid.api_base, "llm_timeout_seconds": grid.timeout_seconds, "llm_retries": grid.retries,
        "llm_fallback_model": grid.fallback_model})
    return CachingGateway(settings, engine)


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
    """Write the run and every one of its cells (pending); returns the run's id. The run records
    the grid file's SHA-256 (when the grid was loaded from one) and the code it is made with
    (``evals.provenance.collect``: the commit, the package versions, the lock file's digest)."""
    grid = planned.grid
    stored = grid.model_dump(mode="json")
    stored["resolved_conditions"] = [
        {"name": c.name, "role": c.role, "system_text": c.system_text, "prompt_version": c.prompt_version}
        for c in planned.conditions]
    stored["query_set"] = planned.queries.query_set.model_dump(mode="json")
    with session_scope(engine) as session:
        run = EvalRun(name=grid.name, grid=stored, query_set=planned.queries.source,
                      query_set_sha256=planned.queries.sha256, seed=grid.seed, grid_sha256=grid.file_sha256,
                      provenance=collect(), status="running", created_at=now())
        session.add(run)
        session.flush()
        rows = [{"run_id": run.id, "condition": c.name, "model": model, "query_id": q.id, "repeat": r,
                 "seed": cell_seed(grid.seed, c.name, model, q.id, r), "status": "pending", "attempts": 0,
                 "judge_attempts": 0,
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


def query_difference(mine: Plan, theirs: Plan, their_run: int, this: str = "this run") -> str | None:
    """How the queries of ``mine`` differ from those of run ``their_run`` (planned as ``theirs``),
    with the counts a reader needs; None when they are the same (ids and wording). Paired
    comparisons (a draft's gate, a card's change) are made only on the same queries."""
    here, there = {q.id: q for q in mine.query_list}, {q.id: q for q in theirs.query_list}
    if here == there:
        return None
    only_here, only_there = len(here.keys() - there.keys()), len(there.keys() - here.keys())
    reworded = sum(here[q] != there[q] for q in here.keys() & there.keys())
    return (f"run {their_run} used {len(there)} queries of {theirs.queries.source}, {this} {len(here)} of "
            f"{mine.queries.source} ({only_there} only there, {only_here} only here, {reworded} worded differently)")


# Running its cells


@dataclass
class Outcome:
    run_id: int
    executed: int = 0  # cells done (judged) now
    failed: int = 0  # cells left not done now: the conversation or, after its tries, the judge failed
    remaining: int = 0
    seconds: float = 0.0
    cached: int = 0  # answers read back from the response cache instead of asked for
    judge_retries: int = 0  # judgements tried again on a saved conversation
    errors: list[str] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)  # the Inspect logs written now

    @property
    def finished(self) -> bool:
        return self.remaining == 0

    def error(self, todo: _Todo, exc: Exception) -> None:
        if len(self.errors) < 20:
            self.errors.append(f"{todo.condition} {todo.model} {todo.query_id}: {exc}")


@dataclass(frozen=True)
class _Todo:
    cell_id: int
    condition: str
    model: str
    query_id: str
    repeat: int
    seed: int
    judge_attempts: int = 0
    transcript: list[dict[str, Any]] | None = None  # a saved conversation, waiting for its judge


def _todo(engine: Engine, run_id: int, max_attempts: int) -> list[_Todo]:
    """The cells still to do: conversations to have (pending, or failed with tries left) and saved
    conversations to judge (generated, with judge tries left)."""
    with session_scope(engine, read_only=True) as session:
        rows = session.execute(
            select(EvalCell.id, EvalCell.condition, EvalCell.model, EvalCell.query_id, EvalCell.repeat, EvalCell.seed,
                   EvalCell.judge_attempts, EvalCell.status, EvalCell.transcript)
            .where(EvalCell.run_id == run_id, EvalCell.status != "done",
                   or_(and_(EvalCell.status == "generated", EvalCell.judge_attempts < max_attempts),
                       and_(EvalCell.status != "generated", EvalCell.attempts < max_attempts)))
            .order_by(EvalCell.id)).all()
    return [_Todo(cell_id, condition, model, query_id, repeat, seed, judge_attempts,
                  transcript if status == "generated" else None)
            for cell_id, condition, model, query_id, repeat, seed, judge_attempts, status, transcript in rows]


def _store_generated(engine: Engine, cell_id: int, conversation: pipeline.Conversation) -> None:
    """The conversation, saved before it is judged: it is never asked for again."""
    with session_scope(engine) as session:
        session.execute(
            update(EvalCell).where(EvalCell.id == cell_id, EvalCell.status.in_(("pending", "failed"))).values(
                status="generated", attempts=EvalCell.attempts + 1, error=None, transcript=conversation.turns,
                prompt_tokens=conversation.prompt_tokens, completion_tokens=conversation.completion_tokens,
                cost_usd=conversation.cost_usd, latency_ms=conversation.latency_ms)
            .execution_options(synchronize_session=False))


def _store_score(engine: Engine, cell_id: int, judgement: Judgement, *, finish: bool) -> bool:
    """A judge's scores of a cell. ``finish``: the run's judge, whose scores make the cell done;
    otherwise another judge's (``rescore``), kept beside them, the cell left as it is. False when
    the scores were already there."""
    with session_scope(engine) as session:
        if finish:
            moved = session.execute(
                update(EvalCell).where(EvalCell.id == cell_id, EvalCell.status == "generated").values(
                    status="done", judge_attempts=EvalCell.judge_attempts + 1, error=None, finished_at=now())
                .execution_options(synchronize_session=False)).rowcount  # type: ignore[attr-defined]
            if not moved:
                return False
        elif session.scalar(select(EvalScore.id).where(
                EvalScore.cell_id == cell_id, EvalScore.judge_model == judgement.judge_model,
                EvalScore.rubric_version == judgement.rubric_version)) is not None:
            return False
        session.add(EvalScore(cell_id=cell_id, judge_model=judgement.judge_model,
                              rubric_version=judgement.rubric_version, scores=judgement.scores,
                              capitulated=judgement.capitulated, raw_output=judgement.raw_output,
                              created_at=now()))
        return True


def _store_failure(engine: Engine, cell_id: int, error: str) -> None:
    with session_scope(engine) as session:
        session.execute(update(EvalCell).where(EvalCell.id == cell_id, EvalCell.status.in_(("pending", "failed")))
                        .values(status="failed", attempts=EvalCell.attempts + 1, error=error[:500])
                        .execution_options(synchronize_session=False))


def _store_judge_failure(engine: Engine, todo: _Todo, error: str) -> None:
    """A judgement that failed: the conversation stays saved (``generated``) for the next try."""
    with session_scope(engine) as session:
        session.execute(update(EvalCell).where(EvalCell.id == todo.cell_id, EvalCell.status == "generated")
                        .values(judge_attempts=EvalCell.judge_attempts + 1, error=f"judge: {error}"[:500])
                        .execution_options(synchronize_session=False))


def _finish_if_complete(engine: Engine, run_id: int, max_attempts: int) -> int:
    with session_scope(engine) as session:
        remaining = session.scalar(select(func.count()).select_from(EvalCell).where(
            EvalCell.run_id == run_id, EvalCell.status != "done")) or 0
        if remaining == 0:
            session.execute(update(EvalRun).where(EvalRun.id == run_id, EvalRun.status != "finished")
                            .values(status="finished", finished_at=now()))
    return len(_todo(engine, run_id, max_attempts))


class _Judging:
    """The judge's own queue: its calls wait only for one another (``Grid.judge_limit``), never
    behind the models' conversations, even on the same provider. A failed judgement is tried again
    on the same conversation, up to the grid's ``max_attempts`` tries of the cell's judge."""

    def __init__(self, engine: Engine, planned: Plan, judge: Judge | None, outcome: Outcome, *, finish: bool,
                 todos: list[_Todo] | None = None) -> None:
        self.engine = engine
        self.judge = judge
        self.queries = planned.queries.query_set.by_id()
        self.limit = asyncio.Semaphore(planned.grid.judge_limit)
        self.max_attempts = planned.grid.max_attempts
        self.outcome = outcome
        self.finish = finish
        self.todos = todos or []
        self._by_id = {t.cell_id: t for t in self.todos}

    def todo(self, cell_id: int, cell: dict[str, Any]) -> _Todo:
        return self._by_id.get(cell_id) or _Todo(cell_id, cell["condition"], cell["model"], cell["query_id"],
                                                 cell["repeat"], cell["seed"], cell.get("judge_attempts", 0))

    async def score(self, todo: _Todo, turns: list[dict[str, Any]]) -> Judgement | None:
        """Judge one saved conversation and store the scores as soon as they come; None when every
        try failed."""
        assert self.judge is not None
        tries = todo.judge_attempts if self.finish else 0
        while True:
            try:
                async with self.limit:
                    judgement = await self.judge.judge(self.queries[todo.query_id], turns, f"{todo.cell_id}")
            except (GatewayError, JudgeError) as exc:
                tries += 1
                self.outcome.error(todo, exc)
                if self.finish:
                    await asyncio.to_thread(retrying, partial(_store_judge_failure, self.engine, todo, str(exc)))
                if tries >= self.max_attempts:
                    return None
                self.outcome.judge_retries += 1
                continue
            await asyncio.to_thread(retrying, partial(_store_score, self.engine, todo.cell_id, judgement,
                                                      finish=self.finish))
            return judgement


def prepare(run_id: int, *, engine: Engine | None = None, judge: Judge | None = None) -> Any:
    """What the run's Inspect tasks share (``evals.inspect_run.RunContext``): its plan, the cells
    still to do, the gateway (with the response cache) and the judge."""
    from evals import inspect_run
    from study.db import get_engine

    engine = engine or get_engine()
    planned = stored_plan(engine, run_id)
    outcome = Outcome(run_id)
    todos = _todo(engine, run_id, planned.grid.max_attempts)
    ctx = inspect_run.RunContext(engine, run_id, planned, gateway_for(planned.grid, engine), None, outcome)
    ctx.judging = _Judging(engine, planned, None, outcome, finish=True, todos=todos)
    ctx.judging.judge = inspect_run.judge_for(ctx, planned.grid.judge, judge)
    return ctx


def record_generated(ctx: Any, cell_id: int, conversation: pipeline.Conversation) -> None:
    """A cell's conversation, saved before it is judged (even when SQLite's writer lock is long in
    coming): it is never asked for again."""
    retrying(partial(_store_generated, ctx.engine, cell_id, conversation))


def record_failure(ctx: Any, cell_id: int, error: str, cell: dict[str, Any]) -> None:
    ctx.outcome.failed += 1
    ctx.outcome.error(ctx.judging.todo(cell_id, cell), Exception(error))
    retrying(partial(_store_failure, ctx.engine, cell_id, error))


def execute_run(engine: Engine, run_id: int, *, judge: Judge | None = None, progress: bool = True,
                before_start: Callable[[Estimate], None] | None = None) -> Outcome:
    """Run every cell of the run not yet done (a new run, or one resumed after a kill) as Inspect
    tasks (``evals.inspect_tasks``, logs under ``evals.inspect_run.log_dir(run_id)``): saved
    conversations are only judged, answers in the response cache are read back."""
    from evals import inspect_run

    started = time.perf_counter()
    ctx = prepare(run_id, engine=engine, judge=judge)
    planned, todos, outcome = ctx.planned, ctx.judging.todos, ctx.outcome
    if before_start is not None:
        conditions = {c.name: c for c in planned.conditions}
        queries = planned.queries.query_set.by_id()
        before_start(estimate(planned.grid, [(conditions[t.condition], t.model, queries[t.query_id]) for t in todos
                                             if t.transcript is None]))
    if todos:
        retrying(partial(note_code, engine, run_id, "resume"))  # cells made by other code than the run began with
        bar = tqdm(total=len(todos), desc=f"eval run {run_id}", unit="cell", disable=not progress, dynamic_ncols=True)
        ctx.on_cell = lambda: bar.update(1)
        try:
            outcome.logs = inspect_run.run_tasks(ctx, sorted({t.model for t in todos}))
        finally:
            bar.close()
    outcome.cached = ctx.gateway.hits
    outcome.remaining = _finish_if_complete(engine, run_id, planned.grid.max_attempts)
    outcome.seconds = time.perf_counter() - started
    return outcome


def judge_params(grid: Grid) -> dict[str, Any]:
    """The judge's call settings: the grid's, without a seed (a verdict is not a sample of the cell)."""
    return {k: v for k, v in grid.params.items() if k != "seed"}


def check_models(grid: Grid) -> None:
    """Refuse a grid whose judge would be a model under test (it would grade itself)."""
    if grid.judge in grid.models:
        raise GridError(f"the judge {grid.judge} is also a model under test; choose another judge")


# Scoring a run again with another judge


@dataclass
class Rescored:
    run_id: int
    judge: str
    scored: int = 0  # cells scored now
    already: int = 0  # cells this judge had scored before
    failed: int = 0  # cells whose judgement failed every try (run rescore again for them)
    not_done: int = 0  # cells without a judged conversation (not scored)
    cached: int = 0
    judge_retries: int = 0
    errors: list[str] = field(default_factory=list)


def rescore(engine: Engine, run_id: int, judge_model: str, *, judge: Judge | None = None,
            progress: bool = True) -> Rescored:
    """Score the run's saved conversations with another judge: its scores are stored beside the
    run judge's (one ``EvalScore`` per judge), nothing else changes, no model under test is asked
    anything. Resumable: cells this judge already scored are skipped. Read the new scores with
    ``evals.results.load_frame(engine, run_id, judge_model=...)``."""
    planned = stored_plan(engine, run_id)
    grid = planned.grid
    if "/" not in judge_model:
        raise GridError(f"judge {judge_model!r} needs a provider prefix, as LiteLLM names it (e.g. openai/gpt-4o)")
    if judge_model == grid.judge:
        raise GridError(f"{judge_model} is the run's own judge: its scores are already stored")
    if judge_model in grid.models:
        raise GridError(f"the judge {judge_model} is also a model under test; choose another judge")
    with session_scope(engine, read_only=True) as session:
        rows = session.execute(
            select(EvalCell.id, EvalCell.condition, EvalCell.model, EvalCell.query_id, EvalCell.repeat, EvalCell.seed,
                   EvalCell.transcript)
            .where(EvalCell.run_id == run_id, EvalCell.status == "done").order_by(EvalCell.id)).all()
        scored = set(session.scalars(select(EvalScore.cell_id).join(EvalCell, EvalCell.id == EvalScore.cell_id).where(
            EvalCell.run_id == run_id, EvalScore.judge_model == judge_model,
            EvalScore.rubric_version == RUBRIC_VERSION)))
        total = session.scalar(select(func.count()).select_from(EvalCell).where(EvalCell.run_id == run_id)) or 0
    todos = [_Todo(cell_id, condition, model, query_id, repeat, seed, 0, transcript)
             for cell_id, condition, model, query_id, repeat, seed, transcript in rows if cell_id not in scored]
    result = Rescored(run_id, judge_model, already=len(rows) - len(todos), not_done=total - len(rows))
    gateway = gateway_for(grid, engine)
    chosen = judge or make_judge(judge_model, gateway, judge_params(grid))
    tally = Outcome(run_id)
    judging = _Judging(engine, planned, chosen, tally, finish=False)

    async def score_all() -> None:
        bar = tqdm(total=len(todos), desc=f"rescore run {run_id}", unit="cell", disable=not progress,
                   dynamic_ncols=True)

        async def one(todo: _Todo) -> None:
            assert todo.transcript is not None
            if await judging.score(todo, todo.transcript) is not None:
                result.scored += 1
            else:
                result.failed += 1
            bar.update(1)

        try:
            await asyncio.gather(*(one(todo) for todo in todos))
        finally:
            bar.close()

    if todos:
        retrying(partial(note_code, engine, run_id, f"rescore with {judge_model}"))
        asyncio.run(score_all())
    result.cached = gateway.hits
    result.errors = tally.errors
    result.judge_retries = tally.judge_retries
    return result
