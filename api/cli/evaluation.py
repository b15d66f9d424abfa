"""``afterward eval``: evaluate prompts and models before deployment (grids, judge, human ratings, model cards)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import func, select

from api.cli.common import fail
from study.db import session_scope
from study.errors import DomainError

app = typer.Typer(no_args_is_help=True, help="Evaluate prompts and models before deployment (grids, judge, "
                                              "human ratings, model cards).")


@contextmanager
def _failing_in_one_line() -> Iterator[None]:
    """A bad grid, a refused step or a file that cannot be read or written fails the command with
    its message."""
    from evals.grid import GridError

    try:
        yield
    except (GridError, DomainError, OSError) as exc:
        fail(exc.message if isinstance(exc, DomainError) else str(exc))


def _eval_execute(run_id: int, progress: bool) -> None:
    from evals.runner import execute_run
    from study.db import get_engine

    def announce(estimate: Any) -> None:
        for line in estimate.lines():
            typer.echo(line)

    outcome = execute_run(get_engine(), run_id, progress=progress, before_start=announce)
    typer.echo(f"run {run_id}: {outcome.executed} cells done now, {outcome.failed} failed, in {outcome.seconds:.1f} s; "
               f"{outcome.cached} answers from the response cache, {outcome.judge_retries} judgements tried again")
    for error in outcome.errors[:5]:
        typer.echo(f"  {error}", err=True)
    if outcome.finished:
        typer.echo(f"run {run_id} is complete: afterward eval report {run_id} --out report.html; "
                   f"afterward eval cards --run {run_id}")


def _gate(run_id: int) -> None:
    """Print the run's gates (and whether it is complete); exit 1 unless everything passed."""
    from evals.gates import judge_run
    from study.db import get_engine

    report = judge_run(get_engine(), run_id)
    for line in report.lines():
        typer.echo(line)
    if not report.passed:
        raise typer.Exit(1)


@app.command("run")
def eval_run(
    grid_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="The grid (YAML)")],
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Start a grid run: prints the token and cost estimate, runs every cell (resumable), then judges
    the grid's gates. Exits 1 when a gate fails or cells are not done."""
    from evals.gates import check_baseline
    from evals.grid import load_grid
    from evals.runner import check_models, create_run, plan
    from study.db import get_engine

    with _failing_in_one_line():
        grid = load_grid(grid_file)
        check_models(grid)
        planned = plan(grid, grid_file.parent)
        check_baseline(get_engine(), planned)  # refused before anything is paid for
        run_id = create_run(get_engine(), planned)
        typer.echo(f"created evaluation run {run_id} ({grid.name})")
        _eval_execute(run_id, progress)
        _gate(run_id)


@app.command("resume")
def eval_resume(run_id: int, progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True) -> None:
    """Continue a run that was stopped (finished cells are not run again), then judge its gates.
    Exits 1 when a gate fails or cells are not done."""
    with _failing_in_one_line():
        _eval_execute(run_id, progress)
        _gate(run_id)


@app.command("gate")
def eval_gate(run_id: int) -> None:
    """Judge a run's gates: each rule with its figure and 95% interval. Exits 1 when a gate fails,
    cells are not done or the baseline comparison is refused; 0 when everything passed."""
    with _failing_in_one_line():
        _gate(run_id)


@app.command("rescore")
def eval_rescore(
    run_id: int,
    judge: Annotated[str, typer.Option("--judge", help="The other judge (a LiteLLM model name, or offline/rules)")],
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Score a run's saved conversations with another judge: only scores are added (beside the run
    judge's), no model under test is asked anything; answers already paid for are read back.
    Resumable. Exits 1 when some cell could not be scored."""
    from evals.runner import rescore
    from study.db import get_engine

    with _failing_in_one_line():
        result = rescore(get_engine(), run_id, judge, progress=progress)
    typer.echo(f"run {run_id} scored by {judge}: {result.scored} cells now, {result.already} before, "
               f"{result.failed} failed, {result.not_done} not done (not scored); "
               f"{result.cached} answers from the response cache")
    for error in result.errors[:5]:
        typer.echo(f"  {error}", err=True)
    if result.failed:
        typer.echo(f"afterward eval rescore {run_id} --judge {judge} tries the failed cells again", err=True)
        raise typer.Exit(1)


@app.command("runs")
def eval_runs() -> None:
    """Evaluation runs: id, name, status, cells done of all."""
    from evals.models import EvalCell, EvalRun

    with session_scope(read_only=True) as session:
        for run in session.scalars(select(EvalRun).order_by(EvalRun.id)):
            done = session.scalar(select(func.count()).select_from(EvalCell).where(
                EvalCell.run_id == run.id, EvalCell.status == "done"))
            total = session.scalar(select(func.count()).select_from(EvalCell).where(EvalCell.run_id == run.id))
            typer.echo(f"{run.id}\t{run.name}\t{run.status}\t{done}/{total} cells\t{run.created_at:%Y-%m-%d %H:%M}")


_JUDGE_HELP = ("Read the scores of this judge, one the run was re-scored with (afterward eval rescore RUN --judge "
               "MODEL); default: the run's own judge")


@app.command("report")
def eval_report(
    run_id: int, out: Annotated[Path, typer.Option("--out", help="The HTML file to write")],
    judge: Annotated[str | None, typer.Option("--judge", help=_JUDGE_HELP)] = None,
) -> None:
    """Write the run's report: results with intervals, paired comparisons, judge agreement, and the
    code, packages and grid file the run was made with."""
    from evals.report import write_report
    from study.db import get_engine

    with _failing_in_one_line():
        write_report(get_engine(), run_id, out, judge)
    typer.echo(f"wrote the evaluation report of run {run_id} to {out}" + (f" (scores of {judge})" if judge else ""))


@app.command("cards")
def eval_cards(
    run: Annotated[int | None, typer.Option("--run", help="Write this run's cards first")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model's cards")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write each card as JSON and Markdown here")] = None,
    judge: Annotated[str | None, typer.Option("--judge", help=_JUDGE_HELP + " (with --run; the run's cards are "
                                                              "written from its scores, replacing the run's cards)")]
    = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", metavar="RUN_OR_VERSION",
        help="With --run: compare the draft with this version instead of its previous card: a run (3, or "
             "3:role/coach for that run's condition) or a prompt version (12 hex digits). Default: the grid's "
             "baseline. Refused, with the reason, over other queries or another judge's scores")] = None,
    draft: Annotated[str | None, typer.Option(
        "--draft", help="With --baseline: the run's condition compared with it (default: the grid's draft, or the "
                        "run's only condition)")] = None,
) -> None:
    """The latest model card of each model and condition, with the change since the previous one
    (or, for a draft, since its named baseline)."""
    import json

    from evals.cards import latest_cards, write_cards
    from study.db import get_engine

    if run is None and (judge or baseline or draft):
        fail("--judge, --baseline and --draft write a run's cards: give the run with --run RUN")
    if draft and not baseline:
        fail("--draft names the condition compared with --baseline: give --baseline RUN_OR_VERSION too")
    with _failing_in_one_line():
        if run is not None:
            written = write_cards(get_engine(), run, judge_model=judge, baseline=baseline, draft=draft)
            scores = f" from the scores of {judge}" if judge else ""
            typer.echo(f"wrote {len(written)} card(s) for run {run}{scores}")
        listings = latest_cards(get_engine(), model=model)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for listing in listings:
                stem = f"{listing.card['model']}--{listing.card['condition']}".replace("/", "_")
                (out / f"{stem}.json").write_text(json.dumps(listing.card, indent=2), encoding="utf-8")
                (out / f"{stem}.md").write_text(listing.markdown, encoding="utf-8")
    if not listings:
        typer.echo("no model cards yet: afterward eval cards --run RUN_ID")
    for listing in listings:
        typer.echo(listing.line())


@app.command("export-ratings")
def eval_export_ratings(
    run_id: int, out: Annotated[Path, typer.Option("--out", help="The CSV for raters")],
    per_stratum: Annotated[int, typer.Option(min=1, help="Cells per domain x probe x condition")] = 2,
    seed: int = 0,
) -> None:
    """A stratified sample of the run's cells for human raters (condition and model blinded)."""
    from evals.agreement import export_sample
    from study.db import get_engine

    with _failing_in_one_line():
        count = export_sample(get_engine(), run_id, out, per_stratum=per_stratum, seed=seed)
    typer.echo(f"wrote {count} cells to rate to {out}")


@app.command("import-ratings")
def eval_import_ratings(
    run_id: int, file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    rater: Annotated[str, typer.Option(help="Who rated (a code, not a name)")],
) -> None:
    """Import a rater's CSV and print the judge's agreement with the ratings so far."""
    from evals.agreement import agreement, import_ratings
    from study.db import get_engine

    with _failing_in_one_line():
        count = import_ratings(get_engine(), run_id, file, rater=rater)
        checked = agreement(get_engine(), run_id)
    typer.echo(f"imported {count} ratings by {rater}")
    typer.echo("the judge with the raters, pooled by rater (mean of the raters' kappas; 95% bootstrap over cells):")
    for row in checked.table.to_dict(orient="records"):
        flag = f"  FLAGGED (interval reaches below {checked.threshold})" if row["flagged"] else ""
        typer.echo(f"  {row['dimension']}: kappa {row['kappa']:.3f} ({row['kappa_low']:.3f} to "
                   f"{row['kappa_high']:.3f}), {row['cells']} cells, {row['raters']} rater(s){flag}")
    typer.echo("the judge with each rater:")
    for row in checked.by_rater.to_dict(orient="records"):
        typer.echo(f"  {row['rater']} {row['dimension']}: kappa {row['kappa']:.3f} ({row['kappa_low']:.3f} to "
                   f"{row['kappa_high']:.3f}), Spearman {row['spearman']:.3f}, {row['cells']} cells")
    if not checked.between_raters.empty:
        typer.echo("rater with rater:")
    for row in checked.between_raters.to_dict(orient="records"):
        typer.echo(f"  {row['rater_a']} and {row['rater_b']} {row['dimension']}: kappa {row['kappa']:.3f} "
                   f"({row['kappa_low']:.3f} to {row['kappa_high']:.3f}), {row['cells']} cells")


@app.command("import-baseline")
def eval_import_baseline(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True,
                                         help="One row per person's answer: query_id,affirmed (yes/no)")],
    name: Annotated[str, typer.Option(help="The baseline's name (e.g. the panel and month it was collected)")],
    queries: Annotated[str, typer.Option(help="The query set the answers are to (default: the shipped set, or a "
                                              "YAML file)")] = "default",
) -> None:
    """Import people's own answers to the queries: the human column the reports set beside every
    model's affirmation, paired by query (runs on the same query set and version)."""
    from evals.grid import load_queries
    from evals.human_baseline import import_baseline
    from study.db import get_engine

    with _failing_in_one_line():
        loaded = load_queries(queries)
        counts = import_baseline(get_engine(), file, loaded, name=name)
    typer.echo(f"imported {counts['answers']} answers to {counts['queries']} queries of {loaded.source} as {name}: "
               "afterward eval report RUN shows them beside the models")
