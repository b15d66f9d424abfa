"""``afterward invites``: create, list and revoke invite codes."""

from __future__ import annotations

from typing import Annotated

import typer

from api.cli.common import CLI_ACTOR, fail
from study import participants, recruitment, studies
from study.db import session_scope
from study.errors import DomainError
from study.settings import get_settings

app = typer.Typer(no_args_is_help=True, help="Invite codes.")


@app.command("create")
def invites_create(
    study: str,
    count: Annotated[int, typer.Option(min=1, max=10_000)] = 1,
    max_uses: Annotated[int, typer.Option(help="More than 1 makes a capped study link")] = 1,
    label: str | None = None,
) -> None:
    """Print new invite codes (only their hashes are stored: keep the printout)."""
    with session_scope() as session:
        found = studies.get_study(session, study)
        codes = participants.create_invites(session, found, CLI_ACTOR, count=count, max_uses=max_uses, label=label)
        panel = studies.current_protocol(session, found.id).recruitment
    for code in codes:
        typer.echo(code)
    if panel is not None:  # the study link to give the panel, which puts its id for each person in place
        for code in codes:
            typer.echo(f"entry link for {panel.name}: {get_settings().base_url}/?code={code}&panel_id="
                       f"{panel.id_placeholder}")


@app.command("list")
def invites_list(
    study: str,
    status: Annotated[recruitment.InviteStatus | None, typer.Option(help="Only invites in this state")] = None,
) -> None:
    """Invites with their creation time and who used them when (participant codes only; audited)."""
    try:
        with session_scope() as session:
            listings = recruitment.list_invites(session, studies.get_study(session, study), CLI_ACTOR, status)
            lines = [_invite_lines(listing) for listing in listings]
    except DomainError as exc:
        fail(exc.message)
        return
    typer.echo(f"{len(lines)} invite(s){f' {status}' if status else ''} in '{study}' (codes are stored hashed, "
               "so they cannot be shown again)")
    for invite_lines in lines:
        for line in invite_lines:
            typer.echo(line)


def _invite_lines(listing: recruitment.InviteListing) -> list[str]:
    invite = listing.invite
    when = [f"created {invite.created_at:%Y-%m-%d %H:%M} UTC"]
    if invite.expires_at is not None:
        when.append(f"{'expired' if listing.expired else 'expires'} {invite.expires_at:%Y-%m-%d %H:%M} UTC")
    if invite.revoked_at is not None:
        when.append(f"revoked {invite.revoked_at:%Y-%m-%d %H:%M} UTC")
    label = f"  [{invite.label}]" if invite.label else ""
    return [f"{invite.id:>6}  {listing.status:<7} used {invite.use_count}/{invite.max_uses}  {', '.join(when)}{label}",
            *(f"        by {use.participant_code} at {use.at:%Y-%m-%d %H:%M} UTC" for use in listing.uses)]


@app.command("revoke")
def invites_revoke(
    study: str,
    code: Annotated[str | None, typer.Argument(help="The invite code (or give --id)")] = None,
    invite_id: Annotated[int | None, typer.Option("--id", min=1, help="The invite's id from `invites list`")] = None,
) -> None:
    """Revoke an invite: nobody can enroll with it afterwards; who already did goes on (audited)."""
    try:
        with session_scope() as session:
            listing = recruitment.revoke_invite(session, studies.get_study(session, study), CLI_ACTOR, code=code,
                                                invite_id=invite_id)
            lines = _invite_lines(listing)
    except DomainError as exc:
        fail(exc.message)
        return
    for line in lines:
        typer.echo(line)
