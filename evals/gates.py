"""Release gates: the grid's pass/fail rules (``evals.grid``: ``gates`` and ``baseline``) judged on a
run, so a team can decide from the exit status of ``afterward eval run``, ``resume`` or ``gate``
whether a prompt or model change may go in front of participants.

A run passes only when every cell is done and every rule holds on its whole 95% interval:

- ``rate``: each condition x model's rate over queries (Wilson interval); ``at_most`` is judged on
  the upper end, ``at_least`` on the lower end;
- ``change``: the draft's rate minus the baseline version's, paired by query, per model in both runs
  (``evals.results.paired_difference``);
- ``agreement``: the judge's kappa with human raters pooled by rater (``evals.agreement``), lower end.

A rule with nothing to judge (no queries of its kind, no ratings) fails and says why. A draft is
compared with its baseline only on the same queries with the same judge; otherwise the comparison
is refused with the reason (``check_baseline``), before a new run spends anything and again when it
is judged.

    >>> check_baseline(engine, plan(grid, base))   # raises GridError when refused
    >>> report = judge_run(engine, run_id)
    >>> print("\\n".join(report.lines())); report.passed
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from evals.agreement import agreement
from evals.grid import AgreementGate, Baseline, ChangeGate, GridError, RateGate
from evals.models import EvalCell
from evals.results import chosen_judge, interval, load_frame, paired_by_query, per_query, scored_by
from evals.runner import Plan, query_difference, stored_plan
from study.db import session_scope
from study.errors import NotFound


@dataclass(frozen=True)
class Check:
    """One rule on one subject (a condition x model, a draft on a model, a dimension)."""

    rule: str
    subject: str
    figure: float
    low: float
    high: float
    n: int
    unit: str
    passed: bool
    note: str = ""  # why it could not be judged

    def line(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        if math.isnan(self.figure):
            return f"{status} {self.rule}: {self.subject}: not judged ({self.note})"
        return (f"{status} {self.rule}: {self.subject}: {self.figure:+.3f} (95% interval {self.low:+.3f} to "
                f"{self.high:+.3f}, {self.n} {self.unit})")


@dataclass
class GateReport:
    run_id: int
    problems: list[str] = field(default_factory=list)  # the run as a whole: undone cells, a refused baseline
    checks: list[Check] = field(default_factory=list)
    other_judge: str | None = None  # the scores read, when not the run's own judge's (``eval rescore``)

    @property
    def passed(self) -> bool:
        return not self.problems and all(check.passed for check in self.checks)

    def lines(self) -> list[str]:
        failed = sum(not check.passed for check in self.checks)
        verdict = ("gates PASSED" if self.passed else
                   f"gates FAILED: {failed} of {len(self.checks)} check(s) failed"
                   + (f", {len(self.problems)} problem(s) with the run" if self.problems else ""))
        scores = f" on the scores of {self.other_judge}, not the run's judge" if self.other_judge else ""
        return ([f"FAIL {problem}" for problem in self.problems] + [check.line() for check in self.checks]
                + [f"run {self.run_id}: {verdict}{scores}"])


def _not_judged(rule: str, subject: str, note: str) -> Check:
    return Check(rule, subject, math.nan, math.nan, math.nan, 0, "", False, note)


# The baseline


def check_baseline(engine: Engine, planned: Plan, judge_model: str | None = None) -> Plan | None:
    """The baseline run's plan, when the grid names one and the comparison can be made: refused
    (``GridError``, with the reason) when that run or its condition is missing, its prompt version is
    not the one named, it holds no scores of the judge compared (``judge_model``, by default the
    grid's: its own judge's or a re-scoring's), no model is in both, or its queries are not the same."""
    baseline = planned.grid.baseline
    if baseline is None:
        return None
    try:
        theirs = stored_plan(engine, baseline.run)
    except NotFound:
        raise GridError(f"baseline: there is no evaluation run {baseline.run}") from None
    refused = f"refused: {baseline.draft_condition} cannot be compared with {baseline.condition} of run {baseline.run}"
    found = {c.name: c for c in theirs.conditions}
    if baseline.condition not in found:
        raise GridError(f"{refused}: that run has no such condition (it ran {', '.join(found)})")
    if baseline.prompt_version and found[baseline.condition].prompt_version != baseline.prompt_version:
        raise GridError(f"{refused}: there it is prompt version {found[baseline.condition].prompt_version}, not "
                        f"the named version {baseline.prompt_version}")
    judge = judge_model or planned.grid.judge
    if theirs.grid.judge != judge and judge not in scored_by(engine, baseline.run):
        raise GridError(f"{refused}: it was judged by {theirs.grid.judge} and this grid by {judge}; "
                        f"scores of different judges are not compared (afterward eval rescore {baseline.run} "
                        f"--judge {judge} scores it with this one)")
    if not set(theirs.grid.models) & set(planned.grid.models):
        raise GridError(f"{refused}: no model is in both (there: {', '.join(theirs.grid.models)})")
    differ = query_difference(planned, theirs, baseline.run, this="this grid")
    if differ is not None:
        raise GridError(f"{refused} on different queries: {differ}. A draft is compared with its baseline on the "
                        "same queries: use that run's query set and limit_queries")
    return theirs


# Judging a run


def _cell_problems(engine: Engine, run_id: int) -> tuple[list[str], int]:
    with session_scope(engine, read_only=True) as session:
        counts = dict(session.execute(select(EvalCell.status, func.count()).where(EvalCell.run_id == run_id)
                                      .group_by(EvalCell.status)).all())
        error = session.scalar(select(EvalCell.error).where(EvalCell.run_id == run_id, EvalCell.status == "failed",
                                                            EvalCell.error.is_not(None)).limit(1))
    total, done, failed = sum(counts.values()), counts.get("done", 0), counts.get("failed", 0)
    generated = counts.get("generated", 0)
    if total and failed == total:
        return [f"every cell failed ({failed} of {total}); the first error: {error}"], 0
    if done < total:
        return [f"{total - done} of {total} cells not done ({failed} failed, {generated} not yet judged, "
                f"{total - done - failed - generated} not yet run): afterward eval resume {run_id}"], done
    return [], done


def _rate_checks(frame: pd.DataFrame, gate: RateGate) -> list[Check]:
    rule = gate.describe()
    part = frame
    if gate.conditions:
        part = part[part["condition"].isin(gate.conditions)]
    if gate.models:
        part = part[part["model"].isin(gate.models)]
    checks = []
    for (condition, model), group in part.groupby(["condition", "model"], sort=False):
        subject = f"{condition} x {model}"
        values = per_query(group, gate.metric, [])[gate.metric].to_numpy(float)
        if not len(values):
            checks.append(_not_judged(rule, subject, f"no judged query measures {gate.metric}"))
            continue
        rate, low, high = interval(values, rate=True)
        checks.append(Check(rule, subject, rate, low, high, len(values), "queries", gate.holds(low, high)))
    return checks or [_not_judged(rule, "the run", "no judged cell of the conditions and models named")]


def _change_checks(frame: pd.DataFrame, before: pd.DataFrame, baseline: Baseline, gate: ChangeGate) -> list[Check]:
    rule = gate.describe()
    models = [m for m in dict.fromkeys(frame["model"]) if m in set(before["model"])
              and (not gate.models or m in gate.models)]
    checks = []
    for model in models:
        subject = f"{baseline.draft_condition} vs {baseline.condition} of run {baseline.run} on {model}"
        found = paired_by_query(frame[(frame["condition"] == baseline.draft_condition) & (frame["model"] == model)],
                                before[(before["condition"] == baseline.condition) & (before["model"] == model)],
                                gate.metric)
        if found is None:
            checks.append(_not_judged(rule, subject, f"no query measures {gate.metric} in both runs"))
            continue
        checks.append(Check(rule, subject, found["difference"], found["low"], found["high"], int(found["n"]),
                            f"paired queries, sign test p {found['p']:.3g}", gate.holds(found["low"], found["high"])))
    return checks or [_not_judged(rule, baseline.draft_condition, "no judged model in both runs")]


def _agreement_checks(engine: Engine, run_id: int, gate: AgreementGate, judge: str) -> list[Check]:
    rule = gate.describe()
    pooled = {str(row["dimension"]): row
              for row in agreement(engine, run_id, judge_model=judge).table.to_dict("records")}
    checks = []
    for dimension in gate.dimensions:
        row = pooled.get(dimension)
        if row is None:
            checks.append(_not_judged(rule, dimension, f"no human ratings of {dimension}: afterward eval "
                                                       f"export-ratings {run_id}, then import-ratings"))
            continue
        low, high = float(row["kappa_low"]), float(row["kappa_high"])
        checks.append(Check(rule, f"{dimension} ({row['raters']} rater(s))", float(row["kappa"]), low, high,
                            int(row["cells"]), "cells", not row["degenerate"] and gate.holds(low, high)))
    return checks


def judge_run(engine: Engine, run_id: int, judge_model: str | None = None) -> GateReport:
    """Every gate of the run's grid (as stored with the run) on its judged cells, and whether the
    run is complete; ``passed`` only when both hold. ``judge_model``: read the scores of another
    judge the run was re-scored with (and the baseline's by the same judge); the exit status of
    ``eval run``, ``resume`` and ``gate`` is always the run's own judge's."""
    planned = stored_plan(engine, run_id)
    judge = chosen_judge(engine, run_id, judge_model)
    problems, done = _cell_problems(engine, run_id)
    report = GateReport(run_id, problems, other_judge=None if judge == planned.grid.judge else judge)
    if not done or not planned.grid.gates:
        return report
    frame = load_frame(engine, run_id, judge)
    baseline, before = planned.grid.baseline, None
    if baseline is not None and any(isinstance(gate, ChangeGate) for gate in planned.grid.gates):
        try:
            check_baseline(engine, planned, judge)
            before = load_frame(engine, baseline.run, judge)
        except GridError as exc:
            report.problems.append(str(exc))
    for gate in planned.grid.gates:
        if isinstance(gate, RateGate):
            report.checks += _rate_checks(frame, gate)
        elif isinstance(gate, ChangeGate):
            report.checks += (_change_checks(frame, before, baseline, gate) if before is not None and baseline
                              else [_not_judged(gate.describe(), "the draft", "the baseline comparison was refused")])
        else:
            report.checks += _agreement_checks(engine, run_id, gate, judge)
    return report
