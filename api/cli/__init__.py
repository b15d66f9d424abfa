"""The ``afterward`` command: database, studies, invites, staff, audit, and the processes.

One module per sub-command group (``afterward db`` is ``db``, ``study`` is ``studies``, ``models``
is ``model_fits``, ``eval`` is ``evaluation``, ``plan`` is ``plans``, the others by their names); the
top-level commands are grouped in ``development`` (demo, mailbox), ``research`` (simulate, power,
export, analyze) and ``processes`` (api, scheduler, dashboard). ``main`` is the console script (pyproject.toml) and
``python -m api``.
"""

from __future__ import annotations

import re
import sys

import typer
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError, ProgrammingError

from api.cli import (
    audit,
    db,
    development,
    evaluation,
    followups,
    instruments,
    invites,
    keys,
    model_fits,
    participants,
    payments,
    plans,
    processes,
    research,
    staff,
    studies,
)
from study import wiring
from study.errors import DomainError

app = typer.Typer(no_args_is_help=True, help="Afterward: longitudinal well-being studies of LLM chat.")
MISSING_TABLE = re.compile(r"no such table|relation \S+ does not exist")  # SQLite's words, PostgreSQL's
for command, name in ((development.demo, "demo"), (research.simulate, "simulate"), (research.power, "power"),
                      (research.export, "export"), (research.analyze, "analyze"),
                      (processes.scheduler_process, "scheduler"), (development.mailbox, "mailbox"),
                      (processes.api, "api"), (processes.dashboard, "dashboard")):
    app.command(name)(command)
for sub, name in ((db.app, "db"), (studies.app, "study"), (invites.app, "invites"), (staff.app, "staff"),
                  (audit.app, "audit"), (keys.app, "keys"), (instruments.app, "instruments"),
                  (followups.app, "followups"),
                  (participants.app, "participants"), (payments.app, "payments"), (evaluation.app, "eval"),
                  (model_fits.app, "models"),
                  (plans.app, "plan")):
    app.add_typer(sub, name=name)


def main() -> None:
    wiring.wire()  # every command (the dispatcher too) has withdrawal and completion wired first
    try:
        app()
    except DomainError as exc:
        typer.secho(exc.message, fg=typer.colors.RED, err=True)
        sys.exit(1)
    except (OperationalError, ProgrammingError) as exc:
        if not MISSING_TABLE.search(str(exc.orig)):
            raise
        # A database never migrated (or behind the code): say what to run, not a traceback.
        typer.secho(f"the database has no table the command needs ({str(exc.orig).splitlines()[0]}): run "
                    "`afterward db upgrade` first", fg=typer.colors.RED, err=True)
        sys.exit(1)
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        # A refused configuration (e.g. production without its secrets) in one line, not a traceback.
        typer.secho("refusing to start: " + "; ".join(str(e["msg"]).removeprefix("Value error, ")
                                                      for e in exc.errors()), fg=typer.colors.RED, err=True)
        sys.exit(1)
