"""What every ``afterward`` command module shares: the actor commands are audited under, and how a
command fails (one red line on stderr, exit status 1)."""

from __future__ import annotations

import typer

from study import audit

CLI_ACTOR = audit.Actor.system("cli")


def fail(message: str) -> None:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(1)
