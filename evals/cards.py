"""Model cards: one per model x condition (a role or a bare prompt) x prompt version, from a run.
A card summarizes endorsement and disagreement calibration (affirming unsupported framings,
justified challenges, capitulation under pushback, safety), as data (JSON) and Markdown. Cards
are kept across versions; each one records the change since the previous card of the same model
and condition (the newest from an earlier run).

The change is paired by query (``evals.results.paired_difference``: the mean of the per-query
differences, its 95% interval and the exact sign test's p), and only when it can be: both runs
planned the same queries (the same ids with the same wording) and were scored by the same judge.
Otherwise the card says why in ``comparison["note"]`` and carries no change at all, rather than
setting rates over different queries against each other.

    >>> write_cards(engine, run_id)                  # after a run
    >>> for listing in latest_cards(engine): print(listing.line())
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.engine import Engine

from evals.agreement import agreement
from evals.models import EvalModelCard, EvalRun
from evals.results import METRICS, interval, load_frame, paired_by_query, per_query
from evals.runner import Plan, query_difference, stored_plan
from study.clock import now
from study.db import session_scope

CARD_METRICS = ("affirmed", "challenged", "capitulation_rate", "unsafe", "accurate")


def _clean(value: float) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), 4)


def _previous(engine: Engine, model: str, condition: str, before_run: int) -> EvalModelCard | None:
    with session_scope(engine, read_only=True) as session:
        return session.scalars(select(EvalModelCard).where(
            EvalModelCard.model == model, EvalModelCard.condition == condition, EvalModelCard.run_id < before_run)
            .order_by(EvalModelCard.run_id.desc()).limit(1)).first()


def unpaired_because(mine: Plan, theirs: Plan, previous_run: int) -> str | None:
    """Why a card of the run planned as ``mine`` cannot be compared, query by query, with one of
    ``previous_run`` (planned as ``theirs``); None when it can: the same queries and the same judge."""
    if theirs.grid.judge != mine.grid.judge:
        return (f"run {previous_run} was scored by the judge {theirs.grid.judge} and this run by {mine.grid.judge}; "
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


def card_markdown(card: dict[str, Any]) -> str:
    lines = [f"# Model card: {card['model']} as {card['condition']}", "",
             f"- Prompt version: `{card['prompt_version']}`", f"- Run: {card['run_id']} ({card['run_name']}), "
             f"{card['queries']} queries, written {card['written_at']}",
             f"- Judge: {card['judge']} (rubric {card['rubric_version']})"]
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


def write_cards(engine: Engine, run_id: int) -> list[dict[str, Any]]:
    """Compute and store the run's cards (replacing its own earlier ones); returns them."""
    planned = stored_plan(engine, run_id)
    frame = load_frame(engine, run_id)
    checked = agreement(engine, run_id, n_boot=200)
    with session_scope(engine, read_only=True) as session:
        run = session.get(EvalRun, run_id)
        assert run is not None
        run_name = run.name
    before_plans: dict[int, tuple[Plan, str | None]] = {}
    before_frames: dict[int, pd.DataFrame] = {}
    cards = []
    for (model, condition), group in frame.groupby(["model", "condition"], sort=False):
        metrics: dict[str, dict[str, float | None]] = {}
        for name in CARD_METRICS:
            means = per_query(group, name, [])[name].to_numpy(float)
            value, low, high = interval(means, rate=True)
            metrics[name] = {"value": _clean(value), "low": _clean(low), "high": _clean(high), "queries": len(means)}
        previous = _previous(engine, str(model), str(condition), run_id)
        intervals: dict[str, dict[str, Any] | None] = dict.fromkeys(CARD_METRICS)
        comparison: dict[str, Any] | None = None
        if previous is not None:
            if previous.run_id not in before_plans:
                theirs = stored_plan(engine, previous.run_id)
                before_plans[previous.run_id] = (theirs, unpaired_because(planned, theirs, previous.run_id))
            note = before_plans[previous.run_id][1]
            comparison = {"paired": note is None, "note": note}
            if note is None:
                if previous.run_id not in before_frames:
                    before_frames[previous.run_id] = load_frame(engine, previous.run_id)
                before = before_frames[previous.run_id]
                before = before[(before["model"] == model) & (before["condition"] == condition)]
                intervals = {name: paired_change(group, before, name) for name in CARD_METRICS}
        card: dict[str, Any] = {
            "model": model, "condition": condition, "prompt_version": str(group["prompt_version"].iloc[0]),
            "run_id": run_id, "run_name": run_name, "queries": int(group["query_id"].nunique()),
            "judge": planned.grid.judge, "rubric_version": _rubric(engine, run_id),
            "judge_agreement": None if not checked.rated else checked.table[["dimension", "kappa"]].to_dict("records"),
            "judge_flagged": checked.flagged, "agreement_threshold": planned.grid.agreement_threshold,
            "metrics": metrics, "comparison": comparison, "change_interval": intervals,
            "change": {name: None if found is None else found["difference"] for name, found in intervals.items()},
            "written_at": now().isoformat(timespec="seconds"),
            "previous": None if previous is None else {"run_id": previous.run_id,
                                                       "prompt_version": previous.prompt_version},
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


def _rubric(engine: Engine, run_id: int) -> str | None:
    from evals.models import EvalCell, EvalScore

    with session_scope(engine, read_only=True) as session:
        return session.scalar(select(EvalScore.rubric_version).join(EvalCell, EvalCell.id == EvalScore.cell_id)
                              .where(EvalCell.run_id == run_id).limit(1))


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
        since = (f"since run {c['previous']['run_id']} v{c['previous']['prompt_version']}" if c["previous"]
                 else "first version")
        note = comparison_note(c)
        if note:
            since += f": {note}"
        flag = " [judge flagged]" if c["judge_flagged"] else ""
        return (f"{c['model']}\t{c['condition']}\tv{c['prompt_version']}\trun {c['run_id']}\t"
                f"{'; '.join(parts)}\t{since}{flag}")


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
