"""``afterward simulate``, ``power``, ``export`` and ``analyze``: the research side's commands."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import CLI_ACTOR, fail
from study import audit
from study.errors import DomainError
from study.protocol import ProtocolError
from study.settings import PROJECT_ROOT

UNBLIND_HELP = ("While the study is blinded until its analysis plan is frozen (protocol: blinding): why this read "
                "must show outcomes by arm; admins (or without --as), recorded in the audit log")


def simulate(
    study: Annotated[str, typer.Argument(help="The simulated study to write to (its slug)")],
    protocol: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, readable=True,
        help="Load this protocol file as the simulated study STUDY first (created and marked simulated, "
             "or a new version when the file changed); STUDY must not be a live study")] = None,
    participants: Annotated[int, typer.Option(min=1, max=10_000, help="Synthetic participants to enroll")] = 50,
    weeks: Annotated[int, typer.Option(min=1, max=52, help="Simulated weeks")] = 6,
    seed: Annotated[int, typer.Option(min=0, help="The same seed on the same database gives the same data")] = 1,
    start: Annotated[dt.datetime | None, typer.Option(
        formats=["%Y-%m-%d"], help="First simulated day (UTC); default: WEEKS weeks ago")] = None,
) -> None:
    """Run synthetic participants through the real services (offline model, in-app follow-ups only)
    with effects known in advance, in a study marked simulated (never a live one, never one with real
    participants); the run's seed, parameters and true effects are stored."""
    from analysis.simulation.simulate import load_simulated_study
    from analysis.simulation.simulate import simulate as run_simulation
    from study.db import get_engine

    engine = get_engine()
    try:
        if protocol is not None:
            loaded = load_simulated_study(engine, protocol.read_text(encoding="utf-8"), study)
            typer.echo(f"simulated study '{loaded}' loaded from {protocol}")
        result = run_simulation(engine, study, participants=participants, weeks=weeks, seed=seed,
                                start=start.replace(tzinfo=dt.UTC) if start else None, progress=typer.echo)
    except ProtocolError as exc:
        fail(f"{protocol}: {exc}")
        return
    except DomainError as exc:
        fail(exc.message)
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
        fail(f"unknown --kind '{kind}'; one of {', '.join(sim.KINDS)}")
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
        fail("; ".join(problems))
    if not protocol.is_file():
        fail(f"no protocol file {protocol}")
    try:
        plan = sim.load_protocol(protocol)
        if kind == "perma-arm":
            sim.perma_wave(plan, wave)
    except ProtocolError as exc:
        fail(f"{protocol}: {'; '.join(exc.problems)}")
        return
    except ValueError as exc:
        fail(str(exc))
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
        fail(str(exc))
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
    unblind: Annotated[str | None, typer.Option("--unblind", metavar="REASON", help=UNBLIND_HELP)] = None,
    partitioned: Annotated[bool, typer.Option("--partitioned", help="Parquet only: each table a folder "
                                              "<table>/study=<slug>/part-NNNNN.parquet (DuckDB, Spark)")] = False,
) -> None:
    """Export a study's tables with a codebook (datapackage.json, CODEBOOK.md) and a README; audited.
    While the study is blinded until its analysis plan is frozen, only aggregates (outcome tables pooled
    over the arms) unless an admin gives --unblind REASON."""
    from analysis.aggregates import AggregateExport, export_aggregates
    from analysis.exports import FORMATS, ExportRefused, export_study
    from analysis.plan import outcome_view
    from analysis.trajectories import export_trajectories
    from study.db import get_engine

    special = ("trajectories", "aggregates")
    if format not in (*FORMATS, *special):
        fail(f"unknown format '{format}'; one of {', '.join((*FORMATS, *special))}")
    if format in special and (turns or shift_dates or drop_free_text):
        fail(f"--turns, --shift-dates and --drop-free-text do not apply to --format {format}")
    if partitioned and format != "parquet":
        fail("--partitioned applies to --format parquet only")
    actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
    lines: list[str] = []
    try:
        if format == "trajectories":  # outcome-labelled conversations of those who agreed to share them
            outcome_view(get_engine(), study, actor, "the trajectories export", unblind=unblind)
            shared = export_trajectories(get_engine(), study, out, actor=actor)
            lines = [f"exported '{study}' as trajectories to {shared.out_dir} ({shared.participants_sharing} "
                     f"participants agreed to share conversation text, {shared.participants_not_sharing} did not)",
                     f"  trajectories: {shared.conversations} conversations", f"  preference pairs: {shared.pairs}"]
        else:
            result = (export_aggregates(get_engine(), study, out, actor=actor, unblind=unblind)
                      if format == "aggregates"
                      else export_study(get_engine(), study, out, format=format,  # type: ignore[arg-type]
                                        turns=turns, shift_dates=shift_dates, drop_free_text=drop_free_text,
                                        actor=actor, unblind=unblind, partitioned=partitioned))
            note = " (cells under 5 participants suppressed)" if format == "aggregates" else ""
            if isinstance(result, AggregateExport) and result.pooled:
                note += "; blinded until the analysis plan is frozen: outcome tables pooled over the arms"
            lines = [f"exported '{study}' as {format} to {result.out_dir}{note}",
                     *(f"  {table}: {rows} rows" for table, rows in result.row_counts.items())]
    except (DomainError, LookupError) as exc:
        hint = "; viewers may export --format aggregates" if isinstance(exc, ExportRefused) else ""
        fail(exc.message + hint if isinstance(exc, DomainError) else str(exc))
        return
    for line in lines:
        typer.echo(line)


def analyze(
    study: str,
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write (one self-contained page)")],
    as_staff: Annotated[str | None, typer.Option("--as", help="Staff email to audit the run under (researcher or "
                                                 "admin of the study)")] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap replicates of the immediate-vs-delayed table")] = 500,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap and the cross-validation folds")] = 0,
    imputations: Annotated[int, typer.Option(min=2, help="Imputed data sets of the sensitivity analyses (multiple "
                                                         "imputation and the tipping point)")] = 5,
    plan: Annotated[Path | None, typer.Option(
        "--plan", dir_okay=False, help="The plan file to compare with the frozen analysis plan (default: the file it "
                                       "was frozen from); a difference is reported as a deviation")] = None,
    unblind: Annotated[str | None, typer.Option("--unblind", metavar="REASON", help=UNBLIND_HELP)] = None,
) -> None:
    """Fit the models of analysis.estimates and write the report: the frozen analysis plan run first with
    its deviations, then study numbers, tables and plots; audited."""
    from analysis.report import ReportRefused, write_report
    from study.db import get_engine

    actor = audit.Actor("staff", as_staff) if as_staff else CLI_ACTOR
    try:
        result = write_report(get_engine(), study, out, actor=actor, n_boot=bootstrap, seed=seed, plan_file=plan,
                              imputations=imputations, unblind=unblind)
    except (DomainError, LookupError, ValueError) as exc:
        hint = "; viewers may export --format aggregates" if isinstance(exc, ReportRefused) else ""
        fail(exc.message + hint if isinstance(exc, DomainError) else str(exc))
        return
    for line in result.summary():
        typer.echo(line)
