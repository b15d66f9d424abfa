"""Model cards: one per model x condition (a role or a bare prompt) x prompt version, from a run.
A card summarizes endorsement and disagreement calibration (affirming unsupported framings,
justified challenges, capitulation under pushback, safety), as data (JSON) and Markdown. Cards
are kept across versions; each one records the change since the previous card of the same model
and condition that had another prompt version or came from an earlier run.

    >>> write_cards(engine, run_id)                  # after a run
    >>> for listing in latest_cards(engine): print(listing.line())
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from evals.agreement import agreement
from evals.models import EvalModelCard, EvalRun
from evals.results import METRICS, interval, load_frame, per_query
from evals.runner import stored_plan
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
    lines += ["", "| measure | value (95% interval) | change since previous |", "|---|---|---|"]
    previous = card.get("previous")
    for name in CARD_METRICS:
        entry = card["metrics"][name]
        value = "–" if entry["value"] is None else f"{entry['value']:.3f} ({entry['low']:.3f} to {entry['high']:.3f})"
        change = card["change"].get(name)
        lines.append(f"| {METRICS[name][0]} | {value} | {'–' if change is None else f'{change:+.3f}'} |")
    lines.append("")
    if previous:
        lines.append(f"Previous card: run {previous['run_id']}, prompt version `{previous['prompt_version']}`.")
    else:
        lines.append("This is the first card of this model and condition.")
    return "\n".join(lines) + "\n"


def write_cards(engine: Engine, run_id: int) -> list[dict[str, Any]]:
    """Compute and store the run's cards (replacing its own earlier ones); returns them."""
    planned = stored_plan(engine, run_id)
    frame = load_frame(engine, run_id)
    checked = agreement(engine, run_id, n_boot=200)
    with session_scope(engine, read_only=True) as session:
        run = session.get(EvalRun, run_id)
        assert run is not None
        run_name = run.name
    cards = []
    for (model, condition), group in frame.groupby(["model", "condition"], sort=False):
        metrics: dict[str, dict[str, float | None]] = {}
        for name in CARD_METRICS:
            means = per_query(group, name, [])[name].to_numpy(float)
            value, low, high = interval(means, rate=True)
            metrics[name] = {"value": _clean(value), "low": _clean(low), "high": _clean(high), "queries": len(means)}
        previous = _previous(engine, str(model), str(condition), run_id)
        change = {}
        for name in CARD_METRICS:
            old = previous.card["metrics"][name]["value"] if previous else None
            new = metrics[name]["value"]
            change[name] = None if old is None or new is None else round(new - old, 4)
        card: dict[str, Any] = {
            "model": model, "condition": condition, "prompt_version": str(group["prompt_version"].iloc[0]),
            "run_id": run_id, "run_name": run_name, "queries": int(group["query_id"].nunique()),
            "judge": planned.grid.judge, "rubric_version": _rubric(engine, run_id),
            "judge_agreement": None if not checked.rated else checked.table[["dimension", "kappa"]].to_dict("records"),
            "judge_flagged": checked.flagged, "agreement_threshold": planned.grid.agreement_threshold,
            "metrics": metrics, "change": change, "written_at": now().isoformat(timespec="seconds"),
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


@dataclass(frozen=True)
class CardListing:
    card: dict[str, Any]
    markdown: str

    def line(self) -> str:
        c = self.card
        parts = []
        for name in CARD_METRICS:
            value = c["metrics"][name]["value"]
            change = c["change"].get(name)
            if value is None:
                continue
            parts.append(f"{name} {value:.2f}" + ("" if change is None else f" ({change:+.2f})"))
        since = (f"since run {c['previous']['run_id']} v{c['previous']['prompt_version']}" if c["previous"]
                 else "first version")
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
