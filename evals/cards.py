"""Model cards: one per model x condition (a role or a bare prompt) x prompt version, from a run.
A card summarizes endorsement and disagreement calibration (affirming unsupported framings,
justified challenges, capitulation under pushback, safety), as data (JSON) and Markdown. Cards
are kept across versions; each one records the change since the previous card of the same model
and condition (the newest from an earlier run), or, for a draft, since its named baseline: the
condition of an earlier run named by the grid (``baseline: {run, condition, draft}``) or by
``afterward eval cards --run RUN --baseline RUN[:CONDITION] | VERSION``, which a draft under a new
condition name is compared with instead of being a "first version".

The change is paired by query (``evals.results.paired_difference``: the mean of the per-query
differences, its 95% interval and the exact sign test's p), and only when it can be: both runs
planned the same queries (the same ids with the same wording) and were scored by the same judge.
Otherwise the card says why in ``comparison["note"]`` and carries no change at all, rather than
setting rates over different queries against each other; a baseline named on the command line is
refused outright (``GridError``, nothing written). ``judge_model`` writes the cards from the scores
of another judge the run was re-scored with (``eval rescore``); the comparison then needs that
judge's scores of the earlier run too. Each card carries the run's provenance (``evals.provenance``:
the commit, the package versions, the grid file's SHA-256).

    >>> write_cards(engine, run_id)                  # after a run
    >>> write_cards(engine, run_id, baseline="3:role/coach", draft="role/coach-draft")
    >>> for listing in latest_cards(engine): print(listing.line())
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.engine import Engine

from evals.agreement import agreement
from evals.grid import GridError
from evals.models import EvalModelCard, EvalRun
from evals.provenance import describe, describe_later, describe_packages
from evals.results import METRICS, chosen_judge, interval, load_frame, paired_by_query, per_query, scored_by
from evals.runner import Plan, query_difference, stored_plan
from evals.simulated import is_simulated
from study.clock import now
from study.db import session_scope
from study.errors import NotFound

CARD_METRICS = ("affirmed", "challenged", "capitulation_rate", "unsafe", "accurate")


def _clean(value: float) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), 4)


def _previous(engine: Engine, model: str, condition: str, before_run: int) -> EvalModelCard | None:
    with session_scope(engine, read_only=True) as session:
        return session.scalars(select(EvalModelCard).where(
            EvalModelCard.model == model, EvalModelCard.condition == condition, EvalModelCard.run_id < before_run)
            .order_by(EvalModelCard.run_id.desc()).limit(1)).first()


@dataclass(frozen=True)
class NamedBaseline:
    """The version a draft is compared with: ``condition`` of ``run`` (at ``prompt_version``), for
    this run's condition ``draft``; ``named_by`` says where it was named (the grid, the command)."""

    run: int
    condition: str
    prompt_version: str
    draft: str
    named_by: str


_RUN = re.compile(r"^(\d{1,11})(?::(.+))?$")
_VERSION = re.compile(r"^v?([0-9a-f]{12})$")


def _plan_of(engine: Engine, run_id: int, what: str) -> Plan:
    try:
        return stored_plan(engine, run_id)
    except NotFound:
        raise GridError(f"{what}: there is no evaluation run {run_id}") from None


def _draft_of(planned: Plan, draft: str | None) -> str:
    names = [c.name for c in planned.conditions]
    grid_baseline = planned.grid.baseline
    chosen = draft or (grid_baseline.draft_condition if grid_baseline else None) or (
        names[0] if len(names) == 1 else None)
    if chosen is None:
        raise GridError(f"--baseline: say which condition is the draft with --draft (the run ran {', '.join(names)})")
    if chosen not in names:
        raise GridError(f"--draft: the run has no condition {chosen} (it ran {', '.join(names)})")
    return chosen


def resolve_baseline(engine: Engine, run_id: int, baseline: str | None = None,
                     draft: str | None = None) -> NamedBaseline | None:
    """The baseline a draft of run ``run_id`` is compared with: named by ``baseline`` (``RUN``,
    ``RUN:CONDITION`` or a prompt ``VERSION``, 12 hex digits, ``v`` before them allowed) for the
    condition ``draft`` (default: the grid's draft, or the run's only condition); else the grid's
    ``baseline``; else None (each card is compared with the previous card of its condition). A
    run's condition defaults to the grid's baseline condition when the grid names that run, then to
    the draft's own name, then to that run's only condition. A version is found in the newest other
    run that ran a condition at it (the draft's name first). Refused (``GridError``) when what is
    named cannot be found."""
    planned = stored_plan(engine, run_id)
    grid_baseline = planned.grid.baseline
    if baseline is None:
        if grid_baseline is None:
            return None
        theirs = _plan_of(engine, grid_baseline.run, "the grid's baseline")
        found = {c.name: c.prompt_version for c in theirs.conditions}
        if grid_baseline.condition not in found:
            raise GridError(f"the grid's baseline: run {grid_baseline.run} has no condition {grid_baseline.condition} "
                            f"(it ran {', '.join(found)})")
        return NamedBaseline(grid_baseline.run, grid_baseline.condition, found[grid_baseline.condition],
                             grid_baseline.draft_condition, "the grid")
    spec = baseline.strip()
    chosen = _draft_of(planned, draft)
    by_run, by_version = _RUN.match(spec), _VERSION.match(spec.lower())
    if by_run:  # a run's id has at most 11 digits; a prompt version has 12
        other = int(by_run.group(1))
        if other == run_id:
            raise GridError(f"--baseline: run {run_id} is the run whose cards are written; name an earlier version")
        theirs = _plan_of(engine, other, "--baseline")
        found = {c.name: c.prompt_version for c in theirs.conditions}
        condition = by_run.group(2) or (
            grid_baseline.condition if grid_baseline and grid_baseline.run == other else
            chosen if chosen in found else next(iter(found)) if len(found) == 1 else None)
        if condition is None:
            raise GridError(f"--baseline: say which condition of run {other} with {other}:CONDITION (it ran "
                            f"{', '.join(found)})")
        if condition not in found:
            raise GridError(f"--baseline: run {other} has no condition {condition} (it ran {', '.join(found)})")
        return NamedBaseline(other, condition, found[condition], chosen, "the command")
    if by_version is None:
        raise GridError(f"--baseline {baseline!r}: give a run (3, or 3:role/coach) or a prompt version (12 hex digits)")
    version = by_version.group(1)
    with session_scope(engine, read_only=True) as session:
        others = list(session.scalars(select(EvalRun.id).where(EvalRun.id != run_id).order_by(EvalRun.id.desc())))
    for other in others:
        at_version = [c.name for c in stored_plan(engine, other).conditions if c.prompt_version == version]
        if at_version:
            condition = chosen if chosen in at_version else at_version[0]
            return NamedBaseline(other, condition, version, chosen, "the command")
    raise GridError(f"--baseline: no other evaluation run has a condition at prompt version {version}")


def unpaired_because(mine: Plan, theirs: Plan, previous_run: int, judge: str | None = None,
                     their_judges: tuple[str, ...] | list[str] = ()) -> str | None:
    """Why a card of the run planned as ``mine`` cannot be compared, query by query, with one of
    ``previous_run`` (planned as ``theirs``); None when it can: the same queries and scores of the
    same judge (``judge``, by default this run's own; the earlier run holds that judge's scores
    when it was its judge or is among ``their_judges``, those it was re-scored with)."""
    judge = judge or mine.grid.judge
    if theirs.grid.judge != judge and judge not in their_judges:
        return (f"run {previous_run} was scored by the judge {theirs.grid.judge} and this card by {judge}; "
                "scores of different judges are not compared")
    differ = query_difference(mine, theirs, previous_run)
    return None if differ is None else f"different queries: {differ}, so no change is shown"


def paired_change(now_frame: pd.DataFrame, before_frame: pd.DataFrame, metric: str) -> dict[str, Any] | None:
    """This card's ``metric`` minus the previous card's, paired by query over the queries measured
    in both (each query's repeats averaged first); None when no query measures it in both."""
    found = paired_by_query(now_frame, before_frame, metric)
    if found is None:
        return None
    return {"difference": round(found["difference"], 4), "low": round(found["low"], 4),
            "high": round(found["high"], 4), "p": round(found["p"], 4), "queries": int(found["n"]),
            "positive": int(found["positive"]), "negative": int(found["negative"])}


def _format_change(change: dict[str, Any] | None) -> str:
    if change is None:
        return "–"
    return (f"{change['difference']:+.3f} ({change['low']:+.3f} to {change['high']:+.3f}), {change['queries']} "
            f"paired queries, sign test p {change['p']:.3g}")


def since(card: dict[str, Any]) -> str:
    """What the card's change is since: the previous card, a named baseline, or nothing."""
    previous = card.get("previous")
    if not previous:
        return "first version"
    where = f"run {previous['run_id']}"
    if previous.get("condition") and previous["condition"] != card["condition"]:
        where += f" {previous['condition']}"
    named = f" (baseline named by {previous['named_by']})" if previous.get("named_by") else ""
    return f"{where} v{previous['prompt_version']}{named}"


def card_markdown(card: dict[str, Any]) -> str:
    judge = card["judge"] + (f" (re-scored; the run's own judge is {card['run_judge']})"
                             if card.get("run_judge") and card["run_judge"] != card["judge"] else "")
    lines = [f"# Model card: {card['model']} as {card['condition']}", "",
             f"- Prompt version: `{card['prompt_version']}`", f"- Run: {card['run_id']} ({card['run_name']}), "
             f"{card['queries']} queries, written {card['written_at']}",
             f"- Judge: {judge} (rubric {card['rubric_version']})"]
    if "provenance" in card:
        provenance = card["provenance"]
        grid_sha = card.get("grid_sha256")
        lines += [f"- Code: {'; '.join([describe(provenance), *describe_later(provenance)])}",
                  f"- Packages: {describe_packages(provenance)}",
                  f"- Grid file: {f'SHA-256 `{grid_sha}`' if grid_sha else 'not recorded'}"]
    if card.get("simulated"):
        lines.append("- **Simulated model**: a scripted stand-in (evals/simulated.py), not a language model, written "
                     "to behave like published findings; these numbers show what the harness finds.")
    if card["judge_flagged"]:
        lines.append("- **Judge flagged**: the interval of its agreement with human raters reaches below the "
                     f"threshold ({card['agreement_threshold']}); read these numbers with care.")
    elif card["judge_agreement"] is None:
        lines.append("- Judge not yet checked against human ratings for this run.")
    lines += ["", "| measure | value (95% interval) | change since previous (95% interval) |", "|---|---|---|"]
    previous = card.get("previous")
    for name in CARD_METRICS:
        entry = card["metrics"][name]
        value = "–" if entry["value"] is None else f"{entry['value']:.3f} ({entry['low']:.3f} to {entry['high']:.3f})"
        lines.append(f"| {METRICS[name][0]} | {value} | {_format_change(change_of(card, name))} |")
    lines.append("")
    if previous:
        if previous.get("named_by"):
            lines.append(f"Baseline (named by {previous['named_by']}): run {previous['run_id']}, "
                         f"{previous['condition']}, prompt version `{previous['prompt_version']}`.")
        else:
            lines.append(f"Previous card: run {previous['run_id']}, prompt version `{previous['prompt_version']}`.")
        note = comparison_note(card)
        if note:
            lines.append(f"**No change is shown**: {note}.")
    else:
        lines.append("This is the first card of this model and condition.")
    return "\n".join(lines) + "\n"


def comparison_note(card: dict[str, Any]) -> str | None:
    """Why a card with a previous version shows no change (None when it shows one, or has no
    previous version). Cards written before changes were paired say so too."""
    if not card.get("previous"):
        return None
    comparison = card.get("comparison")
    if comparison is None:
        return (f"this card was written before changes were paired by query; write it again (afterward eval cards "
                f"--run {card['run_id']}) for its change with an interval")
    return None if comparison["paired"] else str(comparison["note"])


@dataclass(frozen=True)
class _Before:
    """A card's earlier version: the run and its condition there, and where it was named (None:
    the previous card of the same condition)."""

    run_id: int
    condition: str
    prompt_version: str
    named_by: str | None = None


def write_cards(engine: Engine, run_id: int, *, judge_model: str | None = None, baseline: str | None = None,
                draft: str | None = None) -> list[dict[str, Any]]:
    """Compute and store the run's cards (replacing its own earlier ones); returns them.
    ``judge_model``: from the scores of another judge the run was re-scored with (refused when it
    holds none). ``baseline``/``draft``: the version a draft is compared with (``resolve_baseline``;
    by default the grid's ``baseline``); one named here is refused (``GridError``, nothing
    written) when it cannot be compared: other queries, or no scores of the same judge."""
    planned = stored_plan(engine, run_id)
    judge = chosen_judge(engine, run_id, judge_model)
    named = resolve_baseline(engine, run_id, baseline, draft)
    frame = load_frame(engine, run_id, judge)
    checked = agreement(engine, run_id, judge_model=judge, n_boot=200)
    with session_scope(engine, read_only=True) as session:
        run = session.get(EvalRun, run_id)
        assert run is not None
        run_name, grid_sha, provenance = run.name, run.grid_sha256, run.provenance
    before_plans: dict[int, tuple[Plan, str | None]] = {}
    before_frames: dict[int, pd.DataFrame] = {}

    def refusal(other: int) -> str | None:
        if other not in before_plans:
            theirs = stored_plan(engine, other)
            before_plans[other] = (theirs, unpaired_because(planned, theirs, other, judge, scored_by(engine, other)))
        return before_plans[other][1]

    if named is not None and baseline is not None and (note := refusal(named.run)) is not None:
        raise GridError(f"refused: {named.draft} cannot be compared with {named.condition} of run {named.run}: {note}")
    cards = []
    for (model, condition), group in frame.groupby(["model", "condition"], sort=False):
        metrics: dict[str, dict[str, float | None]] = {}
        for name in CARD_METRICS:
            means = per_query(group, name, [])[name].to_numpy(float)
            value, low, high = interval(means, rate=True)
            metrics[name] = {"value": _clean(value), "low": _clean(low), "high": _clean(high), "queries": len(means)}
        before_of: _Before | None = None
        if named is not None and condition == named.draft:
            before_of = _Before(named.run, named.condition, named.prompt_version, named.named_by)
        elif (previous_card := _previous(engine, str(model), str(condition), run_id)) is not None:
            before_of = _Before(previous_card.run_id, str(condition), previous_card.prompt_version)
        intervals: dict[str, dict[str, Any] | None] = dict.fromkeys(CARD_METRICS)
        comparison: dict[str, Any] | None = None
        if before_of is not None:
            note = refusal(before_of.run_id)
            if note is None:
                if before_of.run_id not in before_frames:
                    before_frames[before_of.run_id] = load_frame(engine, before_of.run_id, judge)
                before = before_frames[before_of.run_id]
                before = before[(before["model"] == model) & (before["condition"] == before_of.condition)]
                if before.empty:
                    note = (f"run {before_of.run_id} has no judged cell of {model} as {before_of.condition}"
                            + (f" scored by {judge}" if judge != planned.grid.judge else ""))
                else:
                    intervals = {name: paired_change(group, before, name) for name in CARD_METRICS}
            comparison = {"paired": note is None, "note": note}
        card: dict[str, Any] = {
            "model": model, "simulated": is_simulated(str(model)),
            "condition": condition, "prompt_version": str(group["prompt_version"].iloc[0]),
            "run_id": run_id, "run_name": run_name, "queries": int(group["query_id"].nunique()),
            "judge": judge, "run_judge": planned.grid.judge, "rubric_version": _rubric(engine, run_id, judge),
            "judge_agreement": None if not checked.rated else checked.table[["dimension", "kappa"]].to_dict("records"),
            "judge_flagged": checked.flagged, "agreement_threshold": planned.grid.agreement_threshold,
            "metrics": metrics, "comparison": comparison, "change_interval": intervals,
            "change": {name: None if found is None else found["difference"] for name, found in intervals.items()},
            "written_at": now().isoformat(timespec="seconds"),
            "previous": None if before_of is None else {
                "run_id": before_of.run_id, "prompt_version": before_of.prompt_version,
                "condition": before_of.condition, "named_by": before_of.named_by},
            "grid_sha256": grid_sha, "provenance": provenance,
        }
        cards.append(card)
    with session_scope(engine) as session:
        for old_card in session.scalars(select(EvalModelCard).where(EvalModelCard.run_id == run_id)):
            session.delete(old_card)
        session.flush()
        for card in cards:
            session.add(EvalModelCard(run_id=run_id, model=card["model"], condition=card["condition"],
                                      prompt_version=card["prompt_version"], card=card,
                                      markdown=card_markdown(card), created_at=now()))
    return cards


def _rubric(engine: Engine, run_id: int, judge: str) -> str | None:
    from evals.models import EvalCell, EvalScore

    with session_scope(engine, read_only=True) as session:
        return session.scalar(select(EvalScore.rubric_version).join(EvalCell, EvalCell.id == EvalScore.cell_id)
                              .where(EvalCell.run_id == run_id, EvalScore.judge_model == judge).limit(1))


def change_of(card: dict[str, Any], metric: str) -> dict[str, Any] | None:
    """The card's paired change of ``metric`` (difference, low, high, p, queries), or None: no
    previous version, not comparable, nothing measured in both, or a card written before changes
    were paired (whose ``change`` was the difference of two rates, over whatever queries each had)."""
    if card.get("comparison") is None:
        return None
    found: dict[str, Any] | None = card.get("change_interval", {}).get(metric)
    return found


@dataclass(frozen=True)
class CardListing:
    card: dict[str, Any]
    markdown: str

    def line(self) -> str:
        c = self.card
        parts = []
        for name in CARD_METRICS:
            value = c["metrics"][name]["value"]
            change = change_of(c, name)
            if value is None:
                continue
            parts.append(f"{name} {value:.2f}" + ("" if change is None else
                                                   f" ({change['difference']:+.2f}, 95% {change['low']:+.2f} to "
                                                   f"{change['high']:+.2f})"))
        changed = f"since {since(c)}" if c["previous"] else since(c)
        note = comparison_note(c)
        if note:
            changed += f": {note}"
        flag = " [judge flagged]" if c["judge_flagged"] else ""
        other = f" [judge {c['judge']}]" if c.get("run_judge") and c["run_judge"] != c["judge"] else ""
        return (f"{c['model']}\t{c['condition']}\tv{c['prompt_version']}\trun {c['run_id']}\t"
                f"{'; '.join(parts)}\t{changed}{flag}{other}")


def latest_cards(engine: Engine, *, model: str | None = None) -> list[CardListing]:
    """The newest card of each model and condition, with its change since the previous one."""
    with session_scope(engine, read_only=True) as session:
        query = select(EvalModelCard).order_by(EvalModelCard.model, EvalModelCard.condition,
                                               EvalModelCard.run_id.desc())
        if model:
            query = query.where(EvalModelCard.model == model)
        seen: set[tuple[str, str]] = set()
        found = []
        for card in session.scalars(query):
            key = (card.model, card.condition)
            if key not in seen:
                seen.add(key)
                found.append(CardListing(dict(card.card), card.markdown))
    return found
