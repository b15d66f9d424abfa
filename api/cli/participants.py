"""``afterward participants``: list a study's participants, with the staff API's filters."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer

from api.cli.common import CLI_ACTOR, fail
from study import audit, reads, studies
from study.db import session_scope
from study.errors import DomainError
from study.models import ParticipantStatus

app = typer.Typer(no_args_is_help=True, help="Participants (pseudonymous: codes, never contact details).")


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    """A date or time given without a zone is UTC, as every time this command prints."""
    return value if value is None or value.tzinfo else value.replace(tzinfo=dt.UTC)


@app.command("list")
def participants_list(
    study: str,
    status: Annotated[ParticipantStatus | None, typer.Option(help="Only participants in this state")] = None,
    arm: Annotated[str | None, typer.Option(help="Only participants randomized to this arm")] = None,
    consent_version: Annotated[str | None, typer.Option(
        help="Only participants whose latest signature is of this consent version")] = None,
    enrolled_since: Annotated[dt.datetime | None, typer.Option(
        help="Only participants enrolled at or after this date or time (UTC)")] = None,
    enrolled_before: Annotated[dt.datetime | None, typer.Option(
        help="Only participants enrolled before this date or time (UTC)")] = None,
    as_staff: Annotated[str | None, typer.Option(
        "--as", help="Staff email to audit the read under (researcher or admin of the study); without it, the "
                     "command line")] = None,
) -> None:
    """The study's participants with status, arm, consent version and enrollment (one per line, the
    same filters as the staff API's GET /studies/{slug}/participants; audited)."""
    actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
    where = reads.ParticipantFilter(status=status, arm=arm, consent_version=consent_version,
                                    enrolled_since=_aware(enrolled_since), enrolled_before=_aware(enrolled_before))
    try:
        with session_scope() as session:
            rows = reads.participants(session, actor, studies.get_study(session, study).id, where)
    except DomainError as exc:
        fail(exc.message)
        return
    narrowed = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in where.given().items())
    typer.echo(f"{len(rows)} participant(s) in '{study}'{f' ({narrowed})' if narrowed else ''}")
    for row in rows:
        typer.echo(f"{row.participant_code:<14} {row.status:<10} arm {row.arm or '-':<14} consent "
                   f"{row.consent_version or '-':<8} enrolled {_when(row.enrolled_at)}"
                   + (f"  withdrawn {_when(row.withdrawn_at)} ({row.withdrawal_level})" if row.withdrawn_at else ""))


def _when(value: dt.datetime | None) -> str:
    return f"{value:%Y-%m-%d %H:%M} UTC" if value else "-"
