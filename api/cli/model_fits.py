"""``afterward models``: the report's models, fitted and stored for the dashboard."""

from __future__ import annotations

from typing import Annotated

import typer

from api.cli.common import CLI_ACTOR, fail
from api.cli.research import UNBLIND_HELP
from study import audit

app = typer.Typer(no_args_is_help=True, help="The report's models, fitted and stored for the dashboard.")


@app.command("fit")
def models_fit(
    study: Annotated[str | None, typer.Argument(help="The study's slug (not with --claimed)")] = None,
    as_staff: Annotated[str | None, typer.Option("--as", help="Staff email to audit the fit under (researcher or "
                                                 "admin of the study)")] = None,
    bootstrap: Annotated[int, typer.Option(min=1, help="Bootstrap replicates of the immediate-vs-delayed "
                                                       "table")] = 200,
    claimed: Annotated[int | None, typer.Option(help="Run this already claimed fit (as the dashboard's "
                                                     "analysis.fit_worker does)")] = None,
    unblind: Annotated[str | None, typer.Option("--unblind", metavar="REASON", help=UNBLIND_HELP)] = None,
) -> None:
    """Fit the report's models and store them for the dashboard (one fit of a study at a time); audited.
    Refused while the study is blinded until its analysis plan is frozen, unless an admin gives
    --unblind REASON."""
    from analysis.exports import ExportRefused, open_study
    from analysis.fit_worker import run_claimed
    from analysis.fits import request_fit
    from analysis.plan import outcome_view
    from study.db import get_engine
    from study.errors import DomainError

    engine = get_engine()
    if claimed is None:
        if study is None:
            fail("give the study's slug (or --claimed ID)")
            return
        actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
        try:
            with engine.connect() as connection:
                open_study(connection, study, actor)
        except ExportRefused as exc:
            fail(f"{exc.message}: fitting the models reads participant-level data (researchers and admins)")
            return
        except LookupError as exc:
            fail(str(exc))
            return
        try:
            outcome_view(engine, study, actor, "the model fits", unblind=unblind)
        except DomainError as exc:
            fail(exc.message)
            return
        claimed = request_fit(engine, study, requested_by=actor, n_boot=bootstrap)
        if claimed is None:
            fail(f"a fit of '{study}' is running already; its tables appear in the dashboard when it ends")
            return
    try:
        run_claimed(engine, claimed, typer.echo)
    except LookupError as exc:
        fail(str(exc))
