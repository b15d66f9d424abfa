"""``afterward staff``: staff accounts, their roles and API tokens."""

from __future__ import annotations

import getpass
import sys
from typing import Annotated

import typer
from sqlalchemy import select

from api.cli.common import CLI_ACTOR, fail
from study import staff, studies
from study.db import session_scope
from study.errors import DomainError
from study.models import StaffAccount, StaffRole

app = typer.Typer(no_args_is_help=True, help="Staff accounts, roles and API tokens.")


@app.command("create")
def staff_create(
    email: str,
    name: Annotated[str, typer.Option(help="Display name")],
    study: Annotated[str, typer.Option(help="Study slug the role applies to")],
    role: Annotated[StaffRole, typer.Option()] = StaffRole.RESEARCHER,
    password: Annotated[str | None, typer.Option(help="Prompted for when omitted (it shows in the shell's "
                                                 "history: prefer the prompt or --password-stdin)")] = None,
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="Read the password from the first line "
                                                 "of standard input (scripts, no terminal)")] = False,
) -> None:
    """Create a staff account with a role in one study."""
    if password is not None and password_stdin:
        fail("give --password or --password-stdin, not both")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n") if sys.stdin is not None else ""
    elif password is None:
        if sys.stdin is None or not sys.stdin.isatty():
            fail("no terminal to ask for the password: pipe it in with --password-stdin")
        password = getpass.getpass("password (12+ characters): ")
    assert password is not None
    try:
        with session_scope() as session:
            account = staff.create_staff(session, email=email, name=name, password=password, actor=CLI_ACTOR)
            staff.grant(session, account, studies.get_study(session, study), role, CLI_ACTOR)
    except DomainError as exc:
        fail(exc.message)
    typer.echo(f"created {email} as {role} in {study}")


@app.command("grant")
def staff_grant(email: str, study: str, role: Annotated[StaffRole, typer.Option()]) -> None:
    """Give an existing staff account a role in a study (or change it)."""
    with session_scope() as session:
        account = session.scalar(select(StaffAccount).where(StaffAccount.email == email.lower()))
        if account is None:
            fail(f"no staff account {email}")
        assert account is not None
        staff.grant(session, account, studies.get_study(session, study), role, CLI_ACTOR)
    typer.echo(f"{email} is now {role} in {study}")


@app.command("token")
def staff_token(email: str, label: str = "cli") -> None:
    """Issue an API token for a staff account (printed once, stored hashed)."""
    with session_scope() as session:
        account = session.scalar(select(StaffAccount).where(StaffAccount.email == email.lower()))
        if account is None:
            fail(f"no staff account {email}")
        assert account is not None
        typer.echo(staff.issue_token(session, account, label, CLI_ACTOR))
