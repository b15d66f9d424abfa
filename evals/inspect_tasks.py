"""The Inspect AI task of an evaluation run (``evals.inspect_run`` has the model provider, the
solver and the scorer it is made of). ``afterward eval run`` and ``resume`` run it for each model of
a run; Inspect can run it too, for a run created by ``afterward eval run`` or
``evals.runner.create_run``::

    inspect eval evals/inspect_tasks.py@afterward_run -T run=3 -T model=offline/simulated
    inspect view --log-dir var/evals/inspect/run-3    # the setting eval_log_dir
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample

from evals.inspect_run import GRADER, afterward_pipeline, context, inspect_model, rubric_judge


@task
def afterward_run(run: int, model: str) -> Task:
    """The cells of run ``run`` answered by ``model`` that are not done yet."""
    ctx = context(run)
    grid = ctx.planned.grid
    samples = [Sample(id=todo.cell_id, input=ctx.planned.queries.query_set.by_id()[todo.query_id].turns[0],
                      metadata={"condition": todo.condition, "model": todo.model, "query_id": todo.query_id,
                                "repeat": todo.repeat, "seed": todo.seed, "judge_attempts": todo.judge_attempts,
                                "transcript": todo.transcript})
               for todo in ctx.judging.todos if todo.model == model]
    return Task(dataset=MemoryDataset(samples, name=f"{ctx.planned.queries.source}"),
                solver=afterward_pipeline(run), scorer=rubric_judge(run),
                model=inspect_model(run, model), model_roles={GRADER: inspect_model(run, grid.judge, "judge")},
                name=f"afterward-run-{run}", metadata={"afterward_run": run, "grid": grid.name,
                                                       "query_set": ctx.planned.queries.source})
