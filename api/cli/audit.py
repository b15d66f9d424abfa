"""``afterward audit``: verify and anchor the audit log."""

from __future__ import annotations

import typer

from api.cli.common import fail
from study import audit
from study.db import session_scope
from study.settings import get_settings

app = typer.Typer(no_args_is_help=True, help="The audit log.")


@app.command("verify")
def audit_verify() -> None:
    """Check the audit log's keyed chain and every anchor; exit 1 if anything was edited, deleted or forged."""
    settings = get_settings()
    with session_scope(read_only=True) as session:  # a long walk must not hold SQLite's write lock
        result = audit.verify(session, settings)
    for problem in result.problems:
        typer.secho(problem, fg=typer.colors.RED, err=True)
    if not result.ok:
        raise typer.Exit(1)
    last = result.last_anchor
    if last is None:
        anchored = f"never anchored (no anchors in {settings.audit_anchor_path}; run: afterward audit anchor)"
    else:
        anchored = f"last anchored at {last.describe()}"
        if last.seq < result.head_seq:
            anchored += f"; entries after {last.seq} are not anchored yet"
    typer.echo(f"audit log intact: {result.entries} entries, {anchored}")


@app.command("anchor")
def audit_anchor() -> None:
    """Record the chain head outside the database (the anchor file, and the webhook when set)."""
    settings = get_settings()
    try:
        anchored = audit.anchor(settings=settings)
    except audit.AnchorError as exc:
        fail(exc.message)
        return
    if anchored.new:
        posted = f" and posted to {settings.audit_anchor_webhook_url}" if settings.audit_anchor_webhook_url else ""
        typer.echo(f"anchored {anchored.anchor.describe()} in {settings.audit_anchor_path}{posted}")
    else:
        typer.echo(f"head unchanged since the last anchor, {anchored.anchor.describe()}; nothing written")
