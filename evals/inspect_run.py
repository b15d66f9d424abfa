"""How an evaluation run's cells run as Inspect AI tasks (``evals.inspect_tasks.afterward_run``):
the one runner of ``afterward eval run`` and ``resume``.

Each model of a run is an Inspect task whose samples are the run's cells still to do (sample id =
the cell's id; its condition, query, repeat and seed in the sample's metadata). The solver
(``afterward_pipeline``) has the cell's conversation through the Afterward pipeline
(``evals.pipeline.converse``: the chat turn pipeline for a role, the model alone for a bare
prompt); the scorer (``rubric_judge``) is the rubric judge (``evals.judge``), asked as Inspect's
``grader`` model role. Every model call goes through Inspect's model layer to the provider
``afterward`` (``AfterwardModel``), which answers through the run's gateway (LiteLLM and the
offline models, with the shared response cache, ``evals.cache``), so Inspect's log holds every
call, transcript and score and ``inspect view`` shows them. A provider has at most the grid's
``concurrency`` conversations at once; the judge has a pool of its own (``judge_limit``), so it
never waits behind the models' conversations.

The database stays the run's durable record: the solver saves a conversation as soon as it is had
and the scorer its scores as soon as they come (``evals.runner``), so a killed run resumes without
asking for anything again, and cards, gates and the rating workflow read the scores the log holds
(``frame_from_logs`` reads them back from the logs; tested equal).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from inspect_ai import eval as inspect_eval
from inspect_ai.log import read_eval_log
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
    Model,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    get_model,
    modelapi,
)
from inspect_ai.scorer import Score, Target, scorer
from inspect_ai.solver import Generate, TaskState, solver
from sqlalchemy.engine import Engine

from chat.gateway import Completion, Gateway, GatewayError
from evals import pipeline
from evals.judge import DIMENSIONS, Judge, JudgeError, make_judge

PREPARE_SECONDS = 120  # reading a run's plan and cells for ``inspect eval``
PROVIDER = "afterward"  # Inspect's name for the platform's gateway as a model provider
GRADER = "grader"  # the judge's model role


@dataclass
class RunContext:
    """What the tasks of one run share: the database, the plan, the gateway, the judge and the tally."""

    engine: Engine
    run_id: int
    planned: Any  # evals.runner.Plan
    gateway: Gateway
    judging: Any  # evals.runner._Judging
    outcome: Any  # evals.runner.Outcome
    on_cell: Callable[[], None] = lambda: None  # progress: one cell's work is over
    limits: dict[str, asyncio.Semaphore] = field(default_factory=dict)

    def conversations(self, model: str) -> asyncio.Semaphore:
        """The conversations a provider may have at once (the grid's ``concurrency``): a
        conversation keeps its place between its messages, so a scripted pushback follows its
        reply at once."""
        from evals.runner import provider

        name = provider(model)
        if name not in self.limits:
            self.limits[name] = asyncio.Semaphore(self.planned.grid.limit(name))
        return self.limits[name]


_contexts: dict[int, RunContext] = {}
# The call's gateway arguments, which Inspect's GenerateConfig has no field for: set around each
# ``Model.generate`` by ``_Routed.complete`` and read by ``AfterwardModel.generate`` in the same task.
_request: contextvars.ContextVar[tuple[bool, dict[str, Any] | None, Callable[[Completion], object] | None]] = \
    contextvars.ContextVar("afterward_request", default=(True, None, None))


def context(run_id: int) -> RunContext:
    """The run's context: the one ``evals.runner.execute_run`` made, or (a task started by
    ``inspect eval``) one made here the same way."""
    if run_id not in _contexts:
        from evals.runner import prepare

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            _contexts[run_id] = prepare(run_id)
        else:  # Inspect makes its tasks on its loop, before any sample runs: the database is read on a thread
            with ThreadPoolExecutor(max_workers=1) as pool:
                _contexts[run_id] = pool.submit(prepare, run_id).result(timeout=PREPARE_SECONDS)
    return _contexts[run_id]


def forget(run_id: int) -> None:
    _contexts.pop(run_id, None)


class AfterwardModel(ModelAPI):
    """A model answered through the run's gateway. ``model_name`` is the gateway's (LiteLLM's) name,
    e.g. ``offline/simulated`` or ``openai/gpt-4o``; ``run``: the run whose gateway answers;
    ``pool``: ``judge`` for the judge's own connection pool."""

    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig | None = None, run: int = 0, pool: str = "model",
                 **model_args: Any) -> None:
        super().__init__(model_name, base_url, api_key, [], config or GenerateConfig())
        self.run = int(run)
        self.pool = pool

    async def generate(self, input: list[ChatMessage], tools: list[Any], tool_choice: Any,
                       config: GenerateConfig) -> ModelOutput:
        structured, params, check = _request.get()
        messages = [{"role": m.role, "content": m.text} for m in input]
        completion = await context(self.run).gateway.complete(
            messages, self.model_name, structured=structured, params=params, check=check)
        output = ModelOutput.from_content(completion.model or self.model_name, completion.text)
        output.usage = ModelUsage(input_tokens=completion.prompt_tokens or 0,
                                  output_tokens=completion.completion_tokens or 0,
                                  total_tokens=(completion.prompt_tokens or 0) + (completion.completion_tokens or 0))
        output.metadata = {"completion": asdict(completion)}
        return output

    def connection_key(self) -> str:
        from evals.runner import provider

        return f"{self.pool}:{provider(self.model_name)}"

    def should_retry(self, ex: Exception) -> bool:
        return False  # the gateway has tried already (the grid's retries, honouring Retry-After)


@modelapi(name=PROVIDER)
def afterward() -> type[AfterwardModel]:
    return AfterwardModel


def inspect_model(run: int, name: str, pool: str = "model") -> Model:
    """Inspect's model for ``name`` in run ``run``, with the grid's limit of concurrent calls (per
    provider, or the judge's own ``judge_limit``) stated, so that Inspect's adaptive concurrency
    does not choose one."""
    from evals.runner import provider

    grid = context(run).planned.grid
    limit = grid.judge_limit if pool == "judge" else grid.limit(provider(name))
    return get_model(f"{PROVIDER}/{name}", config=GenerateConfig(max_connections=limit), run=run, pool=pool)


def _inspect_messages(messages: list[dict[str, str]]) -> list[ChatMessage]:
    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser, "assistant": ChatMessageAssistant}
    return [kinds[m["role"]](content=m["content"]) for m in messages]


class _Routed:
    """The run's gateway for the pipeline and the judge, with each completion asked through
    Inspect's model (``role``: the judge's model role), so that the log records it."""

    def __init__(self, ctx: RunContext, role: str | None = None) -> None:
        self._ctx = ctx
        self._role = role

    def __getattr__(self, name: str) -> Any:  # read_message, default_model, stream: the gateway's own
        return getattr(self._ctx.gateway, name)

    async def complete(self, messages: list[dict[str, str]], model: str | None = None, *, structured: bool = True,
                       params: dict[str, Any] | None = None,
                       check: Callable[[Completion], object] | None = None) -> Completion:
        name = model or self._ctx.gateway.default_model
        model_ = get_model(role=self._role, required=True) if self._role else inspect_model(self._ctx.run_id, name)
        token = _request.set((structured, params, check))
        try:
            output = await model_.generate(_inspect_messages(messages))
        finally:
            _request.reset(token)
        return Completion(**output.metadata["completion"])  # type: ignore[index]


@solver
def afterward_pipeline(run: int) -> Any:
    """The cell's conversation through the Afterward pipeline, saved as soon as it is had; a saved
    conversation (a resumed run whose judge had not finished) is read back, never had again."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        from evals.runner import record_failure, record_generated

        ctx = context(run)
        cell = state.metadata
        turns = cell.get("transcript")
        if turns is None:
            condition = {c.name: c for c in ctx.planned.conditions}[cell["condition"]]
            query = ctx.planned.queries.query_set.by_id()[cell["query_id"]]
            try:
                async with ctx.conversations(cell["model"]):
                    conversation = await pipeline.converse(_Routed(ctx), condition, cell["model"], query,  # type: ignore[arg-type]
                                                           {**ctx.planned.grid.params, "seed": cell["seed"]})
            except GatewayError as exc:
                await asyncio.to_thread(record_failure, ctx, int(state.sample_id), str(exc), cell)
                ctx.on_cell()
                raise
            await asyncio.to_thread(record_generated, ctx, int(state.sample_id), conversation)
            turns = conversation.turns
        state.metadata["turns"] = turns
        for turn in turns:
            state.messages.append(ChatMessageUser(content=turn["participant"]))
            state.messages.append(ChatMessageAssistant(content=turn["reply"] or ""))
        state.output = ModelOutput.from_content(cell["model"], turns[-1]["reply"] or "")
        return state

    return solve


@scorer(metrics=[])
def rubric_judge(run: int) -> Any:
    """The rubric judge's scores of the conversation (every dimension that applies), saved as soon as
    they come; a failed judgement is tried again on the same conversation (the grid's
    ``max_attempts``), then the sample fails with the judge's error."""

    async def score(state: TaskState, target: Target) -> Score:
        ctx = context(run)
        cell = state.metadata
        todo = ctx.judging.todo(int(state.sample_id), cell)
        try:
            judgement = await ctx.judging.score(todo, state.metadata["turns"])
        finally:
            ctx.on_cell()
        if judgement is None:
            ctx.outcome.failed += 1
            raise JudgeError(f"the judge failed on cell {state.sample_id} after {ctx.planned.grid.max_attempts} tries")
        ctx.outcome.executed += 1
        return Score(value={k: float(v) for k, v in judgement.scores.items() if v is not None},
                     metadata={"cell_id": int(state.sample_id), "judge_model": judgement.judge_model,
                               "rubric_version": judgement.rubric_version,
                               "capitulated": list(judgement.capitulated)})

    return score


def log_dir(run_id: int) -> Path:
    from study.settings import get_settings

    return get_settings().eval_log_dir / f"run-{run_id}"


def run_tasks(ctx: RunContext, models: list[str]) -> list[Path]:
    """Run the context's cells as one Inspect task per model; the logs' paths."""
    from evals.inspect_tasks import afterward_run

    _contexts[ctx.run_id] = ctx
    try:
        tasks = [afterward_run(ctx.run_id, m) for m in models]
        logs = inspect_eval(tasks, log_dir=str(log_dir(ctx.run_id)), display="none", log_level="warning",
                            max_samples=max(1, len(ctx.judging.todos)), max_tasks=max(1, len(models)),
                            fail_on_error=False, score_display=False)
    finally:
        forget(ctx.run_id)
    return [Path(log.location) for log in logs]


def frame_from_logs(paths: list[Path]) -> pd.DataFrame:
    """The scored cells the logs hold, one row each: ``cell_id``, its condition, model, query and
    repeat, the judge, ``capitulated``, every rubric dimension (NaN where it does not apply) and the
    derived metrics (``evals.results.add_metrics``): what ``evals.results.load_frame`` reads from the
    database for the same cells, so a log can be checked against the cards made from it."""
    from evals.results import add_metrics

    columns = ["cell_id", "condition", "model", "query_id", "repeat", "judge_model", "capitulated", *DIMENSIONS]
    records = []
    for path in paths:
        for sample in read_eval_log(str(path)).samples or []:
            for found in (sample.scores or {}).values():
                if found.metadata is None:
                    continue
                value = found.value if isinstance(found.value, dict) else {}
                records.append({"cell_id": found.metadata["cell_id"],
                                **{k: sample.metadata[k] for k in ("condition", "model", "query_id", "repeat")},
                                "judge_model": found.metadata["judge_model"],
                                "capitulated": found.metadata["capitulated"],
                                **{d: float(value[d]) if d in value else math.nan for d in DIMENSIONS}})
    return add_metrics(pd.DataFrame.from_records(records, columns=columns))


def judge_for(ctx: RunContext, model: str, given: Judge | None) -> Judge:
    """The run's judge asked as Inspect's grader role (or ``given``, a test's own judge)."""
    from evals.runner import judge_params

    return given or make_judge(model, _Routed(ctx, GRADER), judge_params(ctx.planned.grid))  # type: ignore[arg-type]

