"""``afterward demo`` and ``afterward mailbox``: a local demo study and the development mailbox
(``api.mailbox``)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy import select

from api.cli.common import CLI_ACTOR, fail
from study import participants, staff, studies
from study.db import migrate, session_scope
from study.models import StaffAccount, StaffRole
from study.settings import PROJECT_ROOT, get_settings
from surveys import registry


def demo(protocol: Path = PROJECT_ROOT / "examples" / "wellbeing-pilot.yaml") -> None:
    """Prepare a local demo: migrate, load the example study, a demo admin and five invites."""
    settings = get_settings()
    migrate(settings.database_url)
    with session_scope() as session:
        result = studies.load_protocol(session, protocol.read_text(encoding="utf-8"), CLI_ACTOR,
                                       instruments=registry.catalog(session))
        study = result.study
        email = "demo@afterward.local"
        account = session.scalar(select(StaffAccount).where(StaffAccount.email == email))
        password = None
        if account is None:
            password = secrets.token_urlsafe(12)
            account = staff.create_staff(session, email=email, name="Demo admin",
                                         password=password, actor=CLI_ACTOR)
            staff.grant(session, account, study, StaffRole.ADMIN, CLI_ACTOR)
        token = staff.issue_token(session, account, "demo", CLI_ACTOR)
        codes = participants.create_invites(session, study, CLI_ACTOR, count=5, label="demo")
    typer.echo(f"study '{study.slug}' ready (protocol version {result.version})")
    typer.echo(f"staff login: {email}" + (f" / password {password}" if password else " (existing account)"))
    typer.echo(f"staff API token: {token}")
    typer.echo("invite links for participants (single use; or POST the code to /api/v1/enrollment):")
    for code in codes:
        typer.echo(f"  {settings.base_url}/?code={code}")


def mailbox(
    port: Annotated[int | None, typer.Option(help="Default: AFTERWARD_SMTP_PORT, where the platform sends mail")
                    ] = None,
    folder: Path = PROJECT_ROOT / "var" / "mail",
    check: Annotated[bool, typer.Option("--check", help="Only check that the port is free (exit 1 if not)")] = False,
) -> None:
    """A local mail server for development on 127.0.0.1: keeps every message as a .eml file (needs aiosmtpd)."""
    from api import mailbox as development_mailbox

    port = get_settings().smtp_port if port is None else port
    try:
        controller = development_mailbox.start(port, folder, typer.echo)
    except development_mailbox.MailboxUnavailable as exc:
        fail(str(exc))
        return
    if check:
        controller.stop()
        typer.echo(f"127.0.0.1:{port} is free for the development mailbox")
        return
    folder.mkdir(parents=True, exist_ok=True)
    typer.echo(f"development mailbox on 127.0.0.1:{port}, messages in {folder}")
    development_mailbox.serve(controller)
