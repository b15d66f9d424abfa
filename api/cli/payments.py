"""``afterward payments``: per-wave payment records of a study that recruits on a panel."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import CLI_ACTOR, fail
from study import audit, studies
from study.db import session_scope
from study.errors import DomainError

app = typer.Typer(no_args_is_help=True, help="Panel payments (protocol recruitment).")


@app.command("export")
def payments_export(
    study: str,
    out: Annotated[Path, typer.Option(help="The CSV file to write")] = Path("payments.csv"),
    bulk: Annotated[bool, typer.Option(help="The panel's bulk-payment form: 'panel_id,amount' per participant, "
                                            "no header (Prolific's bulk bonus upload)")] = False,
    as_staff: Annotated[str | None, typer.Option(
        "--as", help="Staff email to audit the export under (researcher or admin of the study)")] = None,
) -> None:
    """Every paid wave a panel participant completed: panel id, wave, occurrence, completed at, amount
    (audited; the panel id only, never contact details or study data)."""
    from analysis.payments import payments, write_csv

    actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
    try:
        with session_scope() as session:
            found = payments(session, actor, studies.get_study(session, study))
    except DomainError as exc:
        fail(exc.message)
        return
    written = write_csv(found, out, bulk=bulk)
    typer.echo(f"{written} {'participant' if bulk else 'payment'} row(s) of {len(found)} paid wave(s) to {out}")
