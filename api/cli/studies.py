"""``afterward study``: load study protocols, list studies, change their status."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy import select

from api.cli.common import CLI_ACTOR, fail
from scheduler import planner
from study import recruitment, studies
from study.db import session_scope
from study.errors import DomainError
from study.protocol import ProtocolError
from surveys import registry

app = typer.Typer(no_args_is_help=True, help="Study protocols.")


@app.command("load")
def study_load(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)]) -> None:
    """Create a study from a protocol file, or add a version when the file changed."""
    try:
        with session_scope() as session:
            result = studies.load_protocol(session, file.read_text(encoding="utf-8"), CLI_ACTOR,
                                           instruments=registry.catalog(session))
            slug = result.study.slug
            replanned = planner.replan_study(session, result.study.id) if result.changed else None
            languages = studies.current_protocol(session, result.study.id).languages
    except ProtocolError as exc:
        fail(f"{file}: {exc}")
    except DomainError as exc:
        fail(f"{file}: {exc.message}")
    if result.created_study:
        typer.echo(f"created study '{slug}' (protocol version 1)")
    elif result.changed:
        typer.echo(f"study '{slug}': protocol version {result.version} loaded (older versions kept)")
        if replanned is not None:
            typer.echo(f"follow-ups not yet sent: {replanned.updated} re-planned, {replanned.cancelled} cancelled, "
                       f"{replanned.added} added")
    else:
        typer.echo(f"study '{slug}': unchanged (protocol version {result.version})")
    if any(language != "en" for language in languages):
        typer.echo(f"note: the study is offered in {', '.join(languages)}; the reading of chat messages (crisis "
                   "triage, pushback: chat/crisis_data/READING.md) was measured on English only, so in other languages "
                   "a sign of risk may be missed: have the study team review conversations in them", err=True)


@app.command("list")
def study_list(
    all_studies: Annotated[bool, typer.Option("--all", help="Archived studies too")] = False,
) -> None:
    """Studies, their status and current protocol version (archived ones only with --all)."""
    from study.models import Study

    with session_scope() as session:
        for study in session.scalars(select(Study).where(recruitment.visible(all_studies)).order_by(Study.slug)):
            version = studies.current_version(session, study.id)
            typer.echo(f"{study.slug}\tv{version.version}\t{study.status}\t{study.title}")


def _change_status(study: str, action: recruitment.StudyAction, stop_followups: bool = False) -> None:
    from scheduler import service as scheduler_service

    try:
        with session_scope() as session:
            change = scheduler_service.change_study_status(session, studies.get_study(session, study), action,
                                                           CLI_ACTOR, stop_followups=stop_followups)
            status, slug = change.study.status, change.study.slug
    except DomainError as exc:
        fail(exc.message)
        return
    cancelled = f"; {change.followups_cancelled} follow-up(s) still to come cancelled" \
        if change.transition.stop_followups else ""
    typer.echo(f"study '{slug}' is now {status}{cancelled}")


@app.command("pause")
def study_pause(study: str) -> None:
    """Stop new enrollments for now; enrolled participants and their follow-ups go on."""
    _change_status(study, recruitment.StudyAction.PAUSE)


@app.command("resume")
def study_resume(study: str) -> None:
    """Take new enrollments again (a paused study)."""
    _change_status(study, recruitment.StudyAction.RESUME)


@app.command("close")
def study_close(
    study: str,
    stop_followups: Annotated[bool, typer.Option(
        "--stop-followups", help="Also cancel every follow-up still to come (as withdrawal does); also works on a "
                                 "study already closed")] = False,
) -> None:
    """End recruitment for good; enrolled participants' follow-ups continue unless --stop-followups."""
    _change_status(study, recruitment.StudyAction.CLOSE, stop_followups=stop_followups)


@app.command("archive")
def study_archive(study: str) -> None:
    """Hide a closed study (e.g. a test study) from listings and make it read-only."""
    _change_status(study, recruitment.StudyAction.ARCHIVE)
