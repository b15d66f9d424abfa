"""``afterward followups``: follow-up surveys that are due, failed or planned; send one now; preview a schedule."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Annotated

import typer
from sqlalchemy import select

from api.cli.common import CLI_ACTOR, fail
from scheduler.models import FollowUp
from study import audit, studies
from study.db import session_scope
from study.errors import DomainError
from study.models import Participant
from study.settings import get_settings

app = typer.Typer(no_args_is_help=True, help="Follow-up surveys: what is due, failed or planned.")


def _followup_line(f: FollowUp, code: str) -> str:
    sent = f"sent {f.sent_at:%Y-%m-%d %H:%M} (late {f.lateness_seconds or 0:.0f}s)" if f.sent_at else ""
    ended = f"{f.end_reason}" if f.end_reason else ""
    return (f"{f.id:>6}  {code:<10} {f.followup_key:<18} {f.status:<9} due {f.due_at:%Y-%m-%d %H:%M} UTC "
            f"(local {f.intended_local} {f.timezone})  {sent} {ended}").rstrip()


@app.command("due")
def followups_due(within_hours: float = 24.0) -> None:
    """Follow-ups due now or within the next hours, and deliveries that failed."""
    from scheduler.models import Delivery
    from study.clock import now

    with session_scope() as session:
        horizon = now() + dt.timedelta(hours=within_hours)
        rows = session.execute(select(FollowUp, Participant.code).join(Participant)
                               .where(FollowUp.status == "planned", FollowUp.due_at <= horizon)
                               .order_by(FollowUp.due_at)).all()
        typer.echo(f"{len(rows)} follow-up(s) due by {horizon:%Y-%m-%d %H:%M} UTC")
        for followup, code in rows:
            typer.echo(_followup_line(followup, code))
        failed = session.execute(select(Delivery, Participant.code).join(Participant)
                                 .where(Delivery.status == "failed").order_by(Delivery.id)).all()
        typer.echo(f"{len(failed)} failed deliver{'y' if len(failed) == 1 else 'ies'}")
        for delivery, code in failed:
            typer.echo(f"{delivery.id:>6}  {code:<10} follow-up {delivery.followup_id} {delivery.kind} "
                       f"{delivery.channel} after {delivery.attempts} attempt(s): {delivery.last_error}")


@app.command("send")
def followups_send(followup_id: int) -> None:
    """Send one follow-up now (open it if planned; send its invitation on every channel)."""
    from scheduler.dispatcher import Dispatcher
    from study.db import get_engine

    try:
        report = Dispatcher(get_engine(), get_settings(), name="cli").send_now(followup_id)
    except LookupError as exc:
        fail(str(exc))
    with session_scope() as session:
        followup = session.get(FollowUp, followup_id)
        assert followup is not None
        code = session.scalar(select(Participant.code).where(Participant.id == followup.participant_id))
        audit.record(session, CLI_ACTOR, "followup.sent_now", study_id=followup.study_id, participant_code=code,
                     followup_id=followup_id, opened=report.opened, sent=report.sent)
    typer.echo(f"opened {report.opened}, sent {report.sent}, failed {report.failed}, expired {report.expired}")
    for error in report.errors:
        typer.echo(f"  {error}")


@app.command("schedule")
def followups_schedule(participant_code: str) -> None:
    """A participant's follow-ups and every delivery attempt."""
    from scheduler import service as scheduler_service

    with session_scope() as session:
        participant = session.scalar(select(Participant).where(
            Participant.code == participant_code.strip().upper()))
        if participant is None:
            fail(f"no participant '{participant_code}'")
        assert participant is not None
        audit.record(session, CLI_ACTOR, "followups.schedule_read", study_id=participant.study_id,
                     participant_code=participant.code)
        for followup in scheduler_service.schedule(session, participant):
            typer.echo(_followup_line(followup, participant.code))
            for d in scheduler_service.deliveries(session, followup):
                when = f"sent {d.sent_at:%Y-%m-%d %H:%M}" if d.sent_at else f"next {d.next_attempt_at:%Y-%m-%d %H:%M}"
                typer.echo(f"        {d.kind} {d.sequence} {d.channel:<8} {d.status:<9} attempts {d.attempts} "
                           f"{when} {d.last_error or ''}".rstrip())


def _local_and_utc(at: dt.datetime, zone: str) -> str:
    from zoneinfo import ZoneInfo

    local = at.astimezone(ZoneInfo(zone))
    return f"{local:%a %Y-%m-%d %H:%M} {local.tzname()} (UTC{local:%z})  = {at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"


@app.command("preview")
def followups_preview(
    study: str,
    enrolled_at: Annotated[str, typer.Option(help="Enrollment time, local to --timezone unless it has an offset, "
                                             "e.g. 2026-03-28T09:00")],
    timezone: Annotated[str, typer.Option(help="The participant's IANA time zone, e.g. Europe/London")],
    decision_at: Annotated[str | None, typer.Option(help="A decision time, to preview the decision "
                                                    "follow-ups too")] = None,
) -> None:
    """Every invitation and reminder the protocol in force would send one participant, in local time
    and UTC with quiet hours applied (the planner's own timing; nothing is stored)."""
    from pydantic import ValidationError

    from scheduler import service as scheduler_service
    from scheduler.schemas import SchedulePreviewQuery

    try:
        query = SchedulePreviewQuery.model_validate(
            {"enrolled_at": enrolled_at, "timezone": timezone, "decision_at": decision_at})
    except ValidationError as exc:
        fail("; ".join(f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-') or 'options'}: "
                       f"{str(e['msg']).removeprefix('Value error, ')}" for e in exc.errors()))
        return
    try:
        with session_scope(read_only=True) as session:
            preview = scheduler_service.schedule_preview(session, studies.get_study(session, study), query)
    except DomainError as exc:
        fail(exc.message)
        return
    zone = preview.timezone
    typer.echo(f"{preview.study}, protocol version {preview.protocol_version}, a participant in {zone} "
               f"(quiet hours {preview.quiet_hours['start']}-{preview.quiet_hours['end']} local)")
    typer.echo(f"enrolled   {_local_and_utc(preview.enrolled_at_utc, zone)}")
    if preview.decision_at_utc is not None:
        typer.echo(f"decision   {_local_and_utc(preview.decision_at_utc, zone)}")
    repeating = Counter(followup.followup for followup in preview.followups)
    for followup in preview.followups:
        repeats = repeating.get(followup.followup, 1)
        occurrence = f" #{followup.occurrence + 1} of {repeats}" if repeats > 1 else ""
        typer.echo(f"\n{followup.followup}{occurrence} ({followup.instrument}, after {followup.anchor})")
        for message in followup.messages:
            label = "invitation" if message.kind == "invitation" else f"reminder {message.sequence}"
            typer.echo(f"  {label:<11}{_local_and_utc(message.at_utc, zone)}")
        typer.echo(f"  {'closes':<11}{_local_and_utc(followup.closes_at_utc, zone)}")
        if followup.moved_by_quiet_hours:
            typer.echo(f"  (asked for {followup.intended_local.replace('T', ' ')} local, inside quiet hours: moved)")
    if not preview.followups:
        typer.echo("\nthe protocol has no follow-ups to preview")
    if preview.decision_followups_not_shown:
        typer.echo(f"\ndecision follow-ups ({', '.join(preview.decision_followups_not_shown)}) are planned from "
                   "each decision a participant reports: give --decision-at to preview them")
