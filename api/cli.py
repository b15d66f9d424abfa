"""The ``afterward`` command: database, studies, invites, staff, audit, and the processes."""

from __future__ import annotations

import datetime as dt
import getpass
import math
import secrets
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import func, select

from scheduler import planner
from scheduler.models import FollowUp
from study import audit, participants, recruitment, signin, staff, studies, wiring
from study.db import migrate, session_scope
from study.errors import DomainError
from study.models import Participant, StaffAccount, StaffRole
from study.protocol import ProtocolError
from study.settings import PROJECT_ROOT, get_settings
from surveys import registry
from surveys.definitions import InstrumentError

app = typer.Typer(no_args_is_help=True, help="Afterward: longitudinal well-being studies of LLM chat.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
study_app = typer.Typer(no_args_is_help=True, help="Study protocols.")
invites_app = typer.Typer(no_args_is_help=True, help="Invite codes.")
staff_app = typer.Typer(no_args_is_help=True, help="Staff accounts, roles and API tokens.")
audit_app = typer.Typer(no_args_is_help=True, help="The audit log.")
keys_app = typer.Typer(no_args_is_help=True, help="Encryption keys.")
instruments_app = typer.Typer(no_args_is_help=True, help="Survey instruments.")
models_app = typer.Typer(no_args_is_help=True, help="The report's models, fitted and stored for the dashboard.")
followups_app = typer.Typer(no_args_is_help=True, help="Follow-up surveys: what is due, failed or planned.")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate prompts and models before deployment (grids, judge, "
                                                  "human ratings, model cards).")
for sub, name in ((db_app, "db"), (study_app, "study"), (invites_app, "invites"), (staff_app, "staff"),
                  (audit_app, "audit"), (keys_app, "keys"), (instruments_app, "instruments"),
                  (followups_app, "followups"), (eval_app, "eval"), (models_app, "models")):
    app.add_typer(sub, name=name)

CLI_ACTOR = audit.Actor.system("cli")


def _fail(message: str) -> None:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Run the migrations up to the newest revision."""
    url = get_settings().database_url
    before = _schema_revision(url)
    migrate(url)
    after = _schema_revision(url)
    with session_scope() as session:  # addresses on file from before sign-in links: their lookup hashes
        hashed = signin.backfill_lookup_hashes(session)
    if hashed:
        typer.echo(f"{hashed} contact address(es) on file can now be found for sign-in links")
    if before is None:
        typer.echo(f"created the schema in an empty database (revision {after})")
    elif before != after:
        typer.echo(f"migrated the database from revision {before} to {after}")
    else:
        typer.echo(f"database is up to date (revision {after})")


def _schema_revision(url: str) -> str | None:
    """The Alembic revision of the database at ``url`` (None: no schema yet)."""
    from alembic.runtime.migration import MigrationContext

    from study.db import make_engine

    engine = make_engine(url, timeouts=False)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


@study_app.command("load")
def study_load(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)]) -> None:
    """Create a study from a protocol file, or add a version when the file changed."""
    try:
        with session_scope() as session:
            result = studies.load_protocol(session, file.read_text(encoding="utf-8"), CLI_ACTOR,
                                           instrument_exists=lambda name: registry.exists(session, name))
            slug = result.study.slug
            replanned = planner.replan_study(session, result.study.id) if result.changed else None
    except ProtocolError as exc:
        _fail(f"{file}: {exc}")
    except DomainError as exc:
        _fail(f"{file}: {exc.message}")
    if result.created_study:
        typer.echo(f"created study '{slug}' (protocol version 1)")
    elif result.changed:
        typer.echo(f"study '{slug}': protocol version {result.version} loaded (older versions kept)")
        if replanned is not None:
            typer.echo(f"follow-ups not yet sent: {replanned.updated} re-planned, {replanned.cancelled} cancelled, "
                       f"{replanned.added} added")
    else:
        typer.echo(f"study '{slug}': unchanged (protocol version {result.version})")


@study_app.command("list")
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
        _fail(exc.message)
        return
    cancelled = f"; {change.followups_cancelled} follow-up(s) still to come cancelled" \
        if change.transition.stop_followups else ""
    typer.echo(f"study '{slug}' is now {status}{cancelled}")


@study_app.command("pause")
def study_pause(study: str) -> None:
    """Stop new enrollments for now; enrolled participants and their follow-ups go on."""
    _change_status(study, recruitment.StudyAction.PAUSE)


@study_app.command("resume")
def study_resume(study: str) -> None:
    """Take new enrollments again (a paused study)."""
    _change_status(study, recruitment.StudyAction.RESUME)


@study_app.command("close")
def study_close(
    study: str,
    stop_followups: Annotated[bool, typer.Option(
        "--stop-followups", help="Also cancel every follow-up still to come (as withdrawal does); also works on a "
                                 "study already closed")] = False,
) -> None:
    """End recruitment for good; enrolled participants' follow-ups continue unless --stop-followups."""
    _change_status(study, recruitment.StudyAction.CLOSE, stop_followups=stop_followups)


@study_app.command("archive")
def study_archive(study: str) -> None:
    """Hide a closed study (e.g. a test study) from listings and make it read-only."""
    _change_status(study, recruitment.StudyAction.ARCHIVE)


@invites_app.command("create")
def invites_create(
    study: str,
    count: Annotated[int, typer.Option(min=1, max=10_000)] = 1,
    max_uses: Annotated[int, typer.Option(help="More than 1 makes a capped study link")] = 1,
    label: str | None = None,
) -> None:
    """Print new invite codes (only their hashes are stored: keep the printout)."""
    with session_scope() as session:
        codes = participants.create_invites(session, studies.get_study(session, study), CLI_ACTOR,
                                            count=count, max_uses=max_uses, label=label)
    for code in codes:
        typer.echo(code)


@invites_app.command("list")
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
        _fail(exc.message)
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


@invites_app.command("revoke")
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
        _fail(exc.message)
        return
    for line in lines:
        typer.echo(line)


@staff_app.command("create")
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
        _fail("give --password or --password-stdin, not both")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n") if sys.stdin is not None else ""
    elif password is None:
        if sys.stdin is None or not sys.stdin.isatty():
            _fail("no terminal to ask for the password: pipe it in with --password-stdin")
        password = getpass.getpass("password (12+ characters): ")
    assert password is not None
    try:
        with session_scope() as session:
            account = staff.create_staff(session, email=email, name=name, password=password, actor=CLI_ACTOR)
            staff.grant(session, account, studies.get_study(session, study), role, CLI_ACTOR)
    except DomainError as exc:
        _fail(exc.message)
    typer.echo(f"created {email} as {role} in {study}")


@staff_app.command("grant")
def staff_grant(email: str, study: str, role: Annotated[StaffRole, typer.Option()]) -> None:
    """Give an existing staff account a role in a study (or change it)."""
    with session_scope() as session:
        account = session.scalar(select(StaffAccount).where(StaffAccount.email == email.lower()))
        if account is None:
            _fail(f"no staff account {email}")
        assert account is not None
        staff.grant(session, account, studies.get_study(session, study), role, CLI_ACTOR)
    typer.echo(f"{email} is now {role} in {study}")


@staff_app.command("token")
def staff_token(email: str, label: str = "cli") -> None:
    """Issue an API token for a staff account (printed once, stored hashed)."""
    with session_scope() as session:
        account = session.scalar(select(StaffAccount).where(StaffAccount.email == email.lower()))
        if account is None:
            _fail(f"no staff account {email}")
        assert account is not None
        typer.echo(staff.issue_token(session, account, label, CLI_ACTOR))


@audit_app.command("verify")
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


@audit_app.command("anchor")
def audit_anchor() -> None:
    """Record the chain head outside the database (the anchor file, and the webhook when set)."""
    settings = get_settings()
    try:
        anchored = audit.anchor(settings=settings)
    except audit.AnchorError as exc:
        _fail(exc.message)
        return
    if anchored.new:
        posted = f" and posted to {settings.audit_anchor_webhook_url}" if settings.audit_anchor_webhook_url else ""
        typer.echo(f"anchored {anchored.anchor.describe()} in {settings.audit_anchor_path}{posted}")
    else:
        typer.echo(f"head unchanged since the last anchor, {anchored.anchor.describe()}; nothing written")


@instruments_app.command("load")
def instruments_load(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)]) -> None:
    """Load a custom instrument from YAML (a changed definition needs a new version)."""
    try:
        with session_scope() as session:
            instrument = registry.load_custom(session, file.read_text(encoding="utf-8"), CLI_ACTOR)
    except InstrumentError as exc:
        _fail(f"{file}: {exc}")
    except DomainError as exc:
        _fail(f"{file}: {exc.message}")
    typer.echo(f"instrument {instrument.key} loaded ({len(instrument.items)} items)")


@instruments_app.command("list")
def instruments_list() -> None:
    """Built-in and custom instruments."""
    from surveys.models import CustomInstrument

    for instrument in registry.builtin().values():
        typer.echo(f"{instrument.key}\tbuilt in\t{instrument.title}")
    with session_scope() as session:
        for row in session.scalars(select(CustomInstrument).order_by(CustomInstrument.instrument_id)):
            typer.echo(f"{row.instrument_id}@{row.version}\tcustom\t{row.definition['title']}")


@keys_app.command("generate")
def keys_generate() -> None:
    """Print a new Fernet key for AFTERWARD_CONTACT_ENCRYPTION_KEYS."""
    from cryptography.fernet import Fernet

    typer.echo(Fernet.generate_key().decode())


@app.command("demo")
def demo(protocol: Path = PROJECT_ROOT / "examples" / "wellbeing-pilot.yaml") -> None:
    """Prepare a local demo: migrate, load the example study, a demo admin and five invites."""
    settings = get_settings()
    migrate(settings.database_url)
    with session_scope() as session:
        result = studies.load_protocol(session, protocol.read_text(encoding="utf-8"), CLI_ACTOR,
                                       instrument_exists=lambda name: registry.exists(session, name))
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


@app.command("simulate")
def simulate(
    study: str,
    participants: Annotated[int, typer.Option(min=1, max=10_000, help="Synthetic participants to enroll")] = 50,
    weeks: Annotated[int, typer.Option(min=1, max=52, help="Simulated weeks")] = 6,
    seed: Annotated[int, typer.Option(min=0, help="The same seed on the same database gives the same data")] = 1,
    start: Annotated[dt.datetime | None, typer.Option(
        formats=["%Y-%m-%d"], help="First simulated day (UTC); default: WEEKS weeks ago")] = None,
) -> None:
    """Run synthetic participants through the real services (offline model, in-app follow-ups only)
    with effects known in advance; the run's seed, parameters and true effects are stored."""
    from analysis.simulate import simulate as run_simulation
    from study.db import get_engine

    try:
        result = run_simulation(get_engine(), study, participants=participants, weeks=weeks, seed=seed,
                                start=start.replace(tzinfo=dt.UTC) if start else None, progress=typer.echo)
    except DomainError as exc:
        _fail(exc.message)
        return
    s = result.summary
    typer.echo(f"simulation {result.run_id} of '{study}' (seed {seed}) finished in {result.seconds:.1f} s")
    typer.echo(f"  enrolled {s['enrolled']} ({', '.join(f'{arm} {n}' for arm, n in s['arms'].items())}), "
               f"withdrawn {s['withdrawn']} (data deleted {s['data_deleted']})")
    typer.echo(f"  conversations {s['conversations']}, turns {s['turns']}, stances "
               f"{', '.join(f'{k} {v}' for k, v in s['stances'].items())}; overrides {s['overrides']}, "
               f"reconsiders {s['reconsiders']}, role switches {s['role_switches']}, decisions {s['decisions']}, "
               f"safety events {s['safety_events']}")
    typer.echo(f"  follow-ups sent {s['followups_sent']}, completed {s['followups_completed']}, expired "
               f"{s['followups_expired']}, still open {s['followups_open']}, planned {s['followups_planned']}, "
               f"cancelled {s['followups_cancelled']}")
    typer.echo("  true effects stored in simulation_runs: " + ", ".join(
        f"{name} {effect['value']:+g}" for name, effect in result.true_effects.items()))


@app.command("power")
def power(
    kind: Annotated[str, typer.Option(help="regret-role | perma-arm | two-means")] = "regret-role",
    effect: Annotated[float, typer.Option(help="Target effect: regret points (coach minus other roles), PERMA "
                                          "points (well-being arm minus control at --wave), or two-means' "
                                          "difference")] = -5.0,
    sd: Annotated[float, typer.Option(help="two-means: the outcome's SD")] = 1.0,
    attrition: Annotated[float | None, typer.Option(help="Share of follow-ups (two-means: values) missing at "
                                                    "random; default the generative model's own (two-means 0)")
                         ] = None,
    alpha: float = 0.05,
    target: Annotated[float, typer.Option("--power", help="Target power")] = 0.8,
    min_n: Annotated[int, typer.Option("--min-n", help="Smallest n (participants, all arms)")] = 50,
    max_n: Annotated[int, typer.Option("--max-n", help="Largest n")] = 500,
    steps: Annotated[int, typer.Option(help="Sample sizes from --min-n to --max-n")] = 6,
    replicates: Annotated[int, typer.Option(help="Simulated studies per sample size")] = 200,
    seed: int = 1,
    protocol: Annotated[Path, typer.Option(help="Protocol file (schedule and arms)")] = (
        PROJECT_ROOT / "examples" / "wellbeing-pilot.yaml"),
    wave: Annotated[str | None, typer.Option(help="perma-arm: the PERMA follow-up (default the last)")] = None,
) -> None:
    """Sample size by simulation for a target effect, from the generative model of `simulate` with the
    protocol's schedule and attrition: a power curve with 95% intervals, and the n that reaches the target."""
    from analysis import power as sim

    if kind not in sim.KINDS:
        _fail(f"unknown --kind '{kind}'; one of {', '.join(sim.KINDS)}")
    problems = [message for bad, message in (
        (not 0 < alpha < 1, "--alpha must be between 0 and 1"),
        (not 0 < target < 1, "--power must be between 0 and 1"),
        (attrition is not None and not 0 <= attrition < 1, "--attrition must be at least 0 and below 1"),
        (not sd > 0, "--sd must be positive"),
        (not 4 <= min_n <= max_n <= 100_000, "need 4 <= --min-n <= --max-n <= 100000"),
        (not 1 <= steps <= 50, "--steps must be 1 to 50"),
        (not 1 <= replicates <= 100_000, "--replicates must be 1 to 100000"), (seed < 0, "--seed must not be negative"),
        (effect == 0 or not math.isfinite(effect), "--effect must be a non-zero number")) if bad]
    if problems:
        _fail("; ".join(problems))
    if not protocol.is_file():
        _fail(f"no protocol file {protocol}")
    try:
        plan = sim.load_protocol(protocol)
        if kind == "perma-arm":
            sim.perma_wave(plan, wave)
    except ProtocolError as exc:
        _fail(f"{protocol}: {'; '.join(exc.problems)}")
        return
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(f"power of {kind} for an effect of {effect:+g} at alpha {alpha:g} (target {target:g}), {replicates} "
               f"simulated studies per n, seed {seed}; {sim.MODELS[kind]}")  # type: ignore[index]
    if kind != "two-means":
        typer.echo(f"protocol {protocol.name}; attrition: " + (f"{attrition:g} of follow-ups at random"
                   if attrition is not None else "the generative model's (depends on baseline well-being)"))
    typer.echo(f"{'n':>7}  {'power':>6}  {'95% CI':>13}  {'mean estimate':>13}  {'rows analysed':>13}")

    def row(point: sim.PowerPoint) -> None:
        typer.echo(f"{point.n:>7}  {point.power:>6.3f}  {point.ci_low:>5.3f}-{point.ci_high:<5.3f}  "
                   f"{point.mean_estimate:>13.3f}  {point.mean_rows:>13.1f}")

    try:
        curve = sim.simulate_power(kind, effect, sizes=sim.sample_sizes(min_n, max_n, steps),  # type: ignore[arg-type]
                                   replicates=replicates, alpha=alpha, target=target, sd=sd, attrition=attrition,
                                   protocol=plan, wave=wave, seed=seed, progress=row)
    except ValueError as exc:
        _fail(str(exc))
        return
    typer.echo(f"\n{'':>7}  power from 0 to 1, '|' at the target {target:g}")
    for line in sim.text_plot(curve):
        typer.echo(line)
    reached = curve.n_reaching
    typer.echo(f"n reaching power {target:g} (the smallest of the grid): {reached}" if reached is not None
               else f"no n up to {max_n} reaches power {target:g}: try a larger --max-n")
    if curve.closed_form_n is not None:
        typer.echo(f"closed form (two arms, normal approximation): n = {math.ceil(curve.closed_form_n)}")
    typer.echo(f"finished in {curve.seconds:.1f} s")


@app.command("export")
def export(
    study: str,
    format: Annotated[str, typer.Option("--format", help="csv | parquet | spss | stata | trajectories | aggregates")],
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Directory to write into")],
    turns: Annotated[bool, typer.Option("--turns", help="Include every message (scrubbed of emails, phones)")] = False,
    shift_dates: Annotated[bool, typer.Option("--shift-dates", help="De-identify: move each participant's dates "
                                              "by a random number of days, stored nowhere; rename participants "
                                              "and ids for this export; rows in a random order")] = False,
    drop_free_text: Annotated[bool, typer.Option("--drop-free-text", help="Leave out free-text columns")] = False,
    as_staff: Annotated[str | None, typer.Option("--as", help="Staff email to audit the export under "
                                                 "(researcher or admin of the study; any role for "
                                                 "aggregates)")] = None,
) -> None:
    """Export a study's tables with a codebook (datapackage.json, CODEBOOK.md) and a README; audited."""
    from analysis.aggregates import export_aggregates
    from analysis.exports import FORMATS, ExportRefused, export_study
    from analysis.trajectories import export_trajectories
    from study.db import get_engine

    special = ("trajectories", "aggregates")
    if format not in (*FORMATS, *special):
        _fail(f"unknown format '{format}'; one of {', '.join((*FORMATS, *special))}")
    if format in special and (turns or shift_dates or drop_free_text):
        _fail(f"--turns, --shift-dates and --drop-free-text do not apply to --format {format}")
    actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
    lines: list[str] = []
    try:
        if format == "trajectories":  # outcome-labelled conversations of those who agreed to share them
            shared = export_trajectories(get_engine(), study, out, actor=actor)
            lines = [f"exported '{study}' as trajectories to {shared.out_dir} ({shared.participants_sharing} "
                     f"participants agreed to share conversation text, {shared.participants_not_sharing} did not)",
                     f"  trajectories: {shared.conversations} conversations", f"  preference pairs: {shared.pairs}"]
        else:
            result = (export_aggregates(get_engine(), study, out, actor=actor) if format == "aggregates"
                      else export_study(get_engine(), study, out, format=format,  # type: ignore[arg-type]
                                        turns=turns, shift_dates=shift_dates, drop_free_text=drop_free_text,
                                        actor=actor))
            note = " (cells under 5 participants suppressed)" if format == "aggregates" else ""
            lines = [f"exported '{study}' as {format} to {result.out_dir}{note}",
                     *(f"  {table}: {rows} rows" for table, rows in result.row_counts.items())]
    except (DomainError, LookupError) as exc:
        hint = "; viewers may export --format aggregates" if isinstance(exc, ExportRefused) else ""
        _fail(exc.message + hint if isinstance(exc, DomainError) else str(exc))
        return
    for line in lines:
        typer.echo(line)


@app.command("analyze")
def analyze(
    study: str,
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write (one self-contained page)")],
    as_staff: Annotated[str | None, typer.Option("--as", help="Staff email to audit the run under (researcher or "
                                                 "admin of the study)")] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap replicates of the immediate-vs-delayed table")] = 500,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap and the cross-validation folds")] = 0,
) -> None:
    """Fit the models of analysis.models and write the report: study numbers, tables and plots; audited."""
    from analysis.report import ReportRefused, write_report
    from study.db import get_engine

    actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
    try:
        result = write_report(get_engine(), study, out, actor=actor, n_boot=bootstrap, seed=seed)
    except (DomainError, LookupError, ValueError) as exc:
        hint = "; viewers may export --format aggregates" if isinstance(exc, ReportRefused) else ""
        _fail(exc.message + hint if isinstance(exc, DomainError) else str(exc))
        return
    for line in result.summary():
        typer.echo(line)


@models_app.command("fit")
def models_fit(
    study: Annotated[str | None, typer.Argument(help="The study's slug (not with --claimed)")] = None,
    as_staff: Annotated[str | None, typer.Option("--as", help="Staff email to audit the fit under (researcher or "
                                                 "admin of the study)")] = None,
    bootstrap: Annotated[int, typer.Option(min=1, help="Bootstrap replicates of the immediate-vs-delayed "
                                                       "table")] = 200,
    claimed: Annotated[int | None, typer.Option(help="Run this already claimed fit (what the dashboard "
                                                     "starts)")] = None,
) -> None:
    """Fit the report's models and store them for the dashboard (one fit of a study at a time); audited."""
    from analysis.exports import ExportRefused, open_study
    from analysis.fits import request_fit, run_fit
    from study.db import get_engine

    engine = get_engine()
    if claimed is None:
        if study is None:
            _fail("give the study's slug (or --claimed ID)")
            return
        actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
        try:
            with engine.connect() as connection:
                open_study(connection, study, actor)
        except ExportRefused as exc:
            _fail(f"{exc.message}: fitting the models reads participant-level data (researchers and admins)")
            return
        except LookupError as exc:
            _fail(str(exc))
            return
        claimed = request_fit(engine, study, requested_by=actor, n_boot=bootstrap)
        if claimed is None:
            _fail(f"a fit of '{study}' is running already; its tables appear in the dashboard when it ends")
            return
    typer.echo(f"fitting the models (fit {claimed})")
    try:
        stored = run_fit(engine, claimed)
    except LookupError as exc:
        _fail(str(exc))
        return
    typer.echo(f"fit {stored.id}: {len(stored.tables)} tables from {stored.participants} participants "
               f"in {stored.seconds:.1f} s")
    for note in stored.notes:
        typer.echo(f"  {note}")


@app.command("scheduler")
def scheduler_process(name: str | None = None, poll_seconds: float | None = None) -> None:
    """Run the follow-up dispatcher (its own process; several may run against PostgreSQL)."""
    import logging

    from scheduler.process import run
    from study.db import get_engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # not a line per tick
    settings = get_settings()
    if poll_seconds is not None:
        settings = settings.model_copy(update={"scheduler_poll_seconds": poll_seconds})
    typer.echo(f"links in follow-up messages point at {settings.base_url}")
    run(get_engine(), settings, name)


def _followup_line(f: FollowUp, code: str) -> str:
    sent = f"sent {f.sent_at:%Y-%m-%d %H:%M} (late {f.lateness_seconds or 0:.0f}s)" if f.sent_at else ""
    ended = f"{f.end_reason}" if f.end_reason else ""
    return (f"{f.id:>6}  {code:<10} {f.followup_key:<18} {f.status:<9} due {f.due_at:%Y-%m-%d %H:%M} UTC "
            f"(local {f.intended_local} {f.timezone})  {sent} {ended}").rstrip()


@followups_app.command("due")
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


@followups_app.command("send")
def followups_send(followup_id: int) -> None:
    """Send one follow-up now (open it if planned; send its invitation on every channel)."""
    from scheduler.dispatcher import Dispatcher
    from study.db import get_engine

    try:
        report = Dispatcher(get_engine(), get_settings(), name="cli").send_now(followup_id)
    except LookupError as exc:
        _fail(str(exc))
    with session_scope() as session:
        followup = session.get(FollowUp, followup_id)
        assert followup is not None
        code = session.scalar(select(Participant.code).where(Participant.id == followup.participant_id))
        audit.record(session, CLI_ACTOR, "followup.sent_now", study_id=followup.study_id, participant_code=code,
                     followup_id=followup_id, opened=report.opened, sent=report.sent)
    typer.echo(f"opened {report.opened}, sent {report.sent}, failed {report.failed}, expired {report.expired}")
    for error in report.errors:
        typer.echo(f"  {error}")


@followups_app.command("schedule")
def followups_schedule(participant_code: str) -> None:
    """A participant's follow-ups and every delivery attempt."""
    from scheduler import service as scheduler_service

    with session_scope() as session:
        participant = session.scalar(select(Participant).where(
            Participant.code == participant_code.strip().upper()))
        if participant is None:
            _fail(f"no participant '{participant_code}'")
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


@followups_app.command("preview")
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
        _fail("; ".join(f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-') or 'options'}: "
                        f"{str(e['msg']).removeprefix('Value error, ')}" for e in exc.errors()))
        return
    try:
        with session_scope(read_only=True) as session:
            preview = scheduler_service.schedule_preview(session, studies.get_study(session, study), query)
    except DomainError as exc:
        _fail(exc.message)
        return
    zone = preview.timezone
    typer.echo(f"{preview.study}, protocol version {preview.protocol_version}, a participant in {zone} "
               f"(quiet hours {preview.quiet_hours['start']}-{preview.quiet_hours['end']} local)")
    typer.echo(f"enrolled   {_local_and_utc(preview.enrolled_at_utc, zone)}")
    if preview.decision_at_utc is not None:
        typer.echo(f"decision   {_local_and_utc(preview.decision_at_utc, zone)}")
    for followup in preview.followups:
        typer.echo(f"\n{followup.followup} ({followup.instrument}, after {followup.anchor})")
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


@app.command("mailbox")
def mailbox(
    port: Annotated[int | None, typer.Option(help="Default: AFTERWARD_SMTP_PORT, where the platform sends mail")
                    ] = None,
    folder: Path = PROJECT_ROOT / "var" / "mail",
    check: Annotated[bool, typer.Option("--check", help="Only check that the port is free (exit 1 if not)")] = False,
) -> None:
    """A local mail server for development on 127.0.0.1: keeps every message as a .eml file (needs aiosmtpd)."""
    import errno
    import time

    from aiosmtpd.controller import Controller

    port = get_settings().smtp_port if port is None else port

    class Keep:
        async def handle_DATA(self, server: object, session: object, envelope: Any) -> str:  # noqa: N802
            path = folder / f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S.%f}.eml"
            path.write_bytes(envelope.content)
            typer.echo(f"mail to {', '.join(envelope.rcpt_tos)} kept in {path}")
            return "250 kept"

    controller = Controller(Keep(), hostname="127.0.0.1", port=port)
    try:
        controller.start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            _fail(f"the development mailbox cannot listen on 127.0.0.1:{port}: the port is taken (another mailbox "
                  "or mail server?); stop it, or set AFTERWARD_SMTP_PORT to a free port")
        _fail(f"the development mailbox cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}")
    if check:
        controller.stop()
        typer.echo(f"127.0.0.1:{port} is free for the development mailbox")
        return
    folder.mkdir(parents=True, exist_ok=True)
    typer.echo(f"development mailbox on 127.0.0.1:{port}, messages in {folder}")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        controller.stop()


@app.command("api")
def api(
    host: Annotated[str | None, typer.Option(help="Default: AFTERWARD_API_HOST (127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Default: AFTERWARD_API_PORT (8000)")] = None,
    workers: int = 1,
    access_log: bool = True,
) -> None:
    """Serve the HTTP API (and the participant pages) with uvicorn; links for participants point at this
    address unless AFTERWARD_BASE_URL says otherwise."""
    import os

    import uvicorn

    from study.client_address import trusted_networks

    settings = get_settings()
    host = settings.api_host if host is None else host
    port = settings.api_port if port is None else port
    # The app (in every worker process) takes the address it is served on as the default base URL.
    os.environ["AFTERWARD_API_HOST"], os.environ["AFTERWARD_API_PORT"] = host, str(port)
    get_settings.cache_clear()
    try:
        settings = get_settings()
        trusted_networks(tuple(settings.trusted_proxies))
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(f"links for participants point at {settings.base_url}")
    # X-Forwarded-For is read in one place only, api.client_address (study.client_address's rule, from
    # AFTERWARD_TRUSTED_PROXIES); uvicorn's own handling would otherwise believe it from any local client.
    # SIGTERM stops the server within seconds even under load: open requests get a short grace
    # period, then are cancelled (a participant's message is committed before any slow step).
    uvicorn.run("api.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level="info", access_log=access_log, proxy_headers=False, timeout_graceful_shutdown=3)


def _eval_errors() -> tuple[type[Exception], ...]:
    from evals.grid import GridError

    return (GridError, DomainError, OSError)


def _eval_fail(exc: Exception) -> None:
    _fail(exc.message if isinstance(exc, DomainError) else str(exc))


def _eval_execute(run_id: int, progress: bool) -> None:
    from evals.runner import execute_run
    from study.db import get_engine

    def announce(estimate: Any) -> None:
        for line in estimate.lines():
            typer.echo(line)

    outcome = execute_run(get_engine(), run_id, progress=progress, before_start=announce)
    typer.echo(f"run {run_id}: {outcome.executed} cells done now, {outcome.failed} failed, in {outcome.seconds:.1f} s")
    for error in outcome.errors[:5]:
        typer.echo(f"  {error}", err=True)
    if outcome.finished:
        typer.echo(f"run {run_id} is complete: afterward eval report {run_id} --out report.html; "
                   f"afterward eval cards --run {run_id}")
    else:
        typer.echo(f"{outcome.remaining} cell(s) still to do: afterward eval resume {run_id}")


@eval_app.command("run")
def eval_run(
    grid_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="The grid (YAML)")],
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Start a grid run: prints the token and cost estimate, then runs every cell (resumable)."""
    from evals.grid import load_grid
    from evals.runner import check_models, create_run, plan
    from study.db import get_engine

    try:
        grid = load_grid(grid_file)
        check_models(grid)
        run_id = create_run(get_engine(), plan(grid, grid_file.parent))
        typer.echo(f"created evaluation run {run_id} ({grid.name})")
        _eval_execute(run_id, progress)
    except _eval_errors() as exc:
        _eval_fail(exc)


@eval_app.command("resume")
def eval_resume(run_id: int, progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True) -> None:
    """Continue a run that was stopped: finished cells are not run again."""
    try:
        _eval_execute(run_id, progress)
    except _eval_errors() as exc:
        _eval_fail(exc)


@eval_app.command("runs")
def eval_runs() -> None:
    """Evaluation runs: id, name, status, cells done of all."""
    from evals.models import EvalCell, EvalRun

    with session_scope(read_only=True) as session:
        for run in session.scalars(select(EvalRun).order_by(EvalRun.id)):
            done = session.scalar(select(func.count()).select_from(EvalCell).where(
                EvalCell.run_id == run.id, EvalCell.status == "done"))
            total = session.scalar(select(func.count()).select_from(EvalCell).where(EvalCell.run_id == run.id))
            typer.echo(f"{run.id}\t{run.name}\t{run.status}\t{done}/{total} cells\t{run.created_at:%Y-%m-%d %H:%M}")


@eval_app.command("report")
def eval_report(run_id: int, out: Annotated[Path, typer.Option("--out", help="The HTML file to write")]) -> None:
    """Write the run's report: results with intervals, paired comparisons, judge agreement."""
    from evals.report import write_report
    from study.db import get_engine

    try:
        write_report(get_engine(), run_id, out)
    except _eval_errors() as exc:
        _eval_fail(exc)
        return
    typer.echo(f"wrote the evaluation report of run {run_id} to {out}")


@eval_app.command("cards")
def eval_cards(
    run: Annotated[int | None, typer.Option("--run", help="Write this run's cards first")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model's cards")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write each card as JSON and Markdown here")] = None,
) -> None:
    """The latest model card of each model and condition, with the change since the previous one."""
    import json

    from evals.cards import latest_cards, write_cards
    from study.db import get_engine

    try:
        if run is not None:
            typer.echo(f"wrote {len(write_cards(get_engine(), run))} card(s) for run {run}")
        listings = latest_cards(get_engine(), model=model)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for listing in listings:
                stem = f"{listing.card['model']}--{listing.card['condition']}".replace("/", "_")
                (out / f"{stem}.json").write_text(json.dumps(listing.card, indent=2), encoding="utf-8")
                (out / f"{stem}.md").write_text(listing.markdown, encoding="utf-8")
    except _eval_errors() as exc:
        _eval_fail(exc)
        return
    if not listings:
        typer.echo("no model cards yet: afterward eval cards --run RUN_ID")
    for listing in listings:
        typer.echo(listing.line())


@eval_app.command("export-ratings")
def eval_export_ratings(
    run_id: int, out: Annotated[Path, typer.Option("--out", help="The CSV for raters")],
    per_stratum: Annotated[int, typer.Option(min=1, help="Cells per domain x probe x condition")] = 2,
    seed: int = 0,
) -> None:
    """A stratified sample of the run's cells for human raters (condition and model blinded)."""
    from evals.agreement import export_sample
    from study.db import get_engine

    try:
        count = export_sample(get_engine(), run_id, out, per_stratum=per_stratum, seed=seed)
    except _eval_errors() as exc:
        _eval_fail(exc)
        return
    typer.echo(f"wrote {count} cells to rate to {out}")


@eval_app.command("import-ratings")
def eval_import_ratings(
    run_id: int, file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    rater: Annotated[str, typer.Option(help="Who rated (a code, not a name)")],
) -> None:
    """Import a rater's CSV and print the judge's agreement with the ratings so far."""
    from evals.agreement import agreement, import_ratings
    from study.db import get_engine

    try:
        count = import_ratings(get_engine(), run_id, file, rater=rater)
        checked = agreement(get_engine(), run_id)
    except _eval_errors() as exc:
        _eval_fail(exc)
        return
    typer.echo(f"imported {count} ratings by {rater}")
    for row in checked.table.to_dict(orient="records"):
        flag = "  BELOW THRESHOLD" if row["below_threshold"] else ""
        typer.echo(f"  {row['dimension']}: kappa {row['kappa']:.3f} ({row['kappa_low']:.3f} to "
                   f"{row['kappa_high']:.3f}), Spearman {row['spearman']:.3f}, n {row['n']}{flag}")


@app.command("dashboard")
def dashboard(
    host: Annotated[str, typer.Option(help="Address to serve the staff dashboard on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the staff dashboard")] = 8501,
) -> None:
    """Serve the staff dashboard (Streamlit): sign in with a staff account; pages by role."""
    import os

    from study.client_address import configured_networks

    app_path = PROJECT_ROOT / "dashboard" / "app.py"
    if not app_path.exists():
        _fail(f"the dashboard is missing: {app_path}")
    try:
        configured_networks()  # sign-in resolves the client with them: a bad entry fails here, not there
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(f"staff dashboard at http://{host}:{port}")
    sys.stdout.flush()
    # Streamlit serves with uvicorn, whose proxy handling would rewrite the peer from X-Forwarded-For
    # for any local client; the dashboard resolves it itself by AFTERWARD_TRUSTED_PROXIES, as the API
    # does (dashboard.auth.client_address), so uvicorn trusts no one.
    os.environ["FORWARDED_ALLOW_IPS"] = ""
    # Streamlit takes over this process (make run stops it by its process id).
    os.execv(sys.executable, [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.address", host,
                              "--server.port", str(port), "--server.headless", "true",
                              "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer"])


def main() -> None:
    wiring.wire()  # every command (the dispatcher too) has withdrawal and completion wired first
    try:
        app()
    except DomainError as exc:
        typer.secho(exc.message, fg=typer.colors.RED, err=True)
        sys.exit(1)
