"""``afterward plan``: freeze a study's pre-registered analysis plan, and show the frozen plan."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import CLI_ACTOR, fail
from study import audit
from study.db import session_scope
from study.errors import DomainError

app = typer.Typer(no_args_is_help=True, help="The pre-registered analysis plan (examples/wellbeing-pilot.plan.yaml).")


@app.command("freeze")
def plan_freeze(
    study: str,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="The plan file (YAML)")],
    as_staff: Annotated[str | None, typer.Option("--as", help="Staff email to audit the freeze under (researcher or "
                                                 "admin of the study)")] = None,
) -> None:
    """Record the plan's text and SHA-256 as the study's frozen analysis plan (audited), before any
    outcome is read. The same file again changes nothing; a changed file is refused."""
    from analysis.plan import PlanError, freeze_plan

    actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
    try:
        with session_scope() as session:
            result = freeze_plan(session, study, file.read_text(encoding="utf-8"), str(file.resolve()), actor)
            frozen = result.frozen
    except PlanError as exc:
        fail(f"{file}: {exc}")
        return
    except DomainError as exc:
        fail(exc.message)
        return
    if not result.new:
        typer.echo(f"the analysis plan of '{study}' is already frozen with this file (SHA-256 {frozen.sha256}, "
                   f"at {frozen.frozen_at.isoformat(timespec='seconds')}); nothing changed")
        return
    typer.echo(f"froze the analysis plan of '{study}': SHA-256 {frozen.sha256}")
    typer.echo(f"  primary: {frozen.plan.primary.label}; secondary: {len(frozen.plan.secondary)}; alpha "
               f"{frozen.plan.alpha:g}, multiplicity {frozen.plan.multiplicity}")
    if frozen.outcome_reads_before:
        typer.secho(f"  note: {frozen.outcome_reads_before} read(s) of the study's outcomes were audited before this "
                    "freeze; the report will say the plan was not fixed before any outcome was read",
                    fg=typer.colors.YELLOW)


@app.command("show")
def plan_show(
    study: str,
    file: Annotated[Path | None, typer.Option("--file", dir_okay=False,
                                              help="Compare this file with the frozen plan (default: the file it "
                                                   "was frozen from)")] = None,
) -> None:
    """Print the study's frozen plan and whether the plan file still matches it."""
    from analysis.plan import check_file, frozen_plan
    from study.studies import get_study

    try:
        with session_scope(read_only=True) as session:
            frozen = frozen_plan(session, get_study(session, study).id)
    except DomainError as exc:
        fail(exc.message)
        return
    if frozen is None:
        fail(f"no analysis plan is frozen for '{study}'; freeze one with `afterward plan freeze {study} FILE`")
        return
    path = file or Path(frozen.source_path)
    check = check_file(frozen, str(path), lambda: path.read_text(encoding="utf-8"))
    typer.echo(f"analysis plan of '{study}': SHA-256 {frozen.sha256}, frozen at "
               f"{frozen.frozen_at.isoformat(timespec='seconds')} by {frozen.frozen_by} from {frozen.source_path}; "
               f"outcome reads audited before: {frozen.outcome_reads_before}")
    typer.echo(f"current file: {'matches' if check.status == 'matches' else 'DOES NOT MATCH'}: {check.describe()}")
    typer.echo("--- the frozen plan ---")
    typer.echo(frozen.source_text.rstrip("\n"))
