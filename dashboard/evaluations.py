"""The model cards page's read: the newest card of each condition (a role or a bare prompt) and
model (``evals.cards``), with the change since its previous version paired by query, and the gates
of the runs behind them (``evals.gates.judge_run``), as tables.

Evaluation runs hold no participant data and belong to no study: every role sees them (viewers
too), no read is audited, and every study of the database shows the same cards. The read is cached
for ``data.CACHE_SECONDS`` like a study's figures, and the sidebar's Refresh reads it again. Kept
apart from ``data`` so that only this page imports the harness.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboard.data import CACHE_SECONDS, Read, generation
from evals.cards import CARD_METRICS, CardListing, change_of, comparison_note, latest_cards, since
from evals.gates import GateReport, judge_run
from evals.results import METRICS
from study.clock import now
from study.db import engine_for

CARD_COLUMNS = ["condition", "model", "simulated", "prompt_version", "run", "metric", "value", "low", "high", "queries",
                "change", "change_low", "change_high", "paired_queries", "p", "since"]
GATE_COLUMNS = ["run", "result", "rule", "subject", "figure", "low", "high", "n", "unit", "note"]


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def card_rows(listings: list[CardListing]) -> pd.DataFrame:
    """One row per card and measure: its value with the 95% interval, and its change since the
    previous version (or the draft's named baseline) paired by query, with the interval and the sign
    test's p (empty where the card shows no change). ``simulated``: the card is of a simulated model
    (``evals.simulated``), a scripted stand-in whose numbers show what the harness finds."""
    rows = []
    for listing in listings:
        card = listing.card
        changed_since = since(card)
        for name in CARD_METRICS:
            entry, change = card["metrics"][name], change_of(card, name)
            rows.append({"condition": card["condition"], "model": card["model"],
                         "simulated": bool(card.get("simulated", False)),
                         "prompt_version": card["prompt_version"], "run": card["run_id"], "metric": name,
                         "value": _nan(entry["value"]), "low": _nan(entry["low"]), "high": _nan(entry["high"]),
                         "queries": entry["queries"],
                         "change": math.nan if change is None else change["difference"],
                         "change_low": math.nan if change is None else change["low"],
                         "change_high": math.nan if change is None else change["high"],
                         "paired_queries": 0 if change is None else change["queries"],
                         "p": math.nan if change is None else change["p"], "since": changed_since})
    return pd.DataFrame(rows, columns=CARD_COLUMNS)


def gate_rows(reports: list[GateReport]) -> pd.DataFrame:
    """One row per problem of a run (undone cells, a refused baseline) and per check of its gates."""
    rows = []
    for report in reports:
        rows += [{"run": report.run_id, "result": "FAIL", "rule": "the run", "subject": "the run", "figure": math.nan,
                  "low": math.nan, "high": math.nan, "n": 0, "unit": "", "note": problem}
                 for problem in report.problems]
        rows += [{"run": report.run_id, "result": "PASS" if check.passed else "FAIL", "rule": check.rule,
                  "subject": check.subject, "figure": check.figure, "low": check.low, "high": check.high,
                  "n": check.n, "unit": check.unit, "note": check.note} for check in report.checks]
    return pd.DataFrame(rows, columns=GATE_COLUMNS)


def verdict(report: GateReport) -> str:
    """A run's gates in one line: passed, failed (how many), or nothing to decide."""
    if not report.checks and not report.problems:
        return "its grid has no gates: nothing decided"
    if report.passed:
        return f"gates PASSED ({len(report.checks)} check(s))"
    failed = sum(not check.passed for check in report.checks)
    return (f"gates FAILED: {failed} of {len(report.checks)} check(s) failed"
            + (f", {len(report.problems)} problem(s) with the run" if report.problems else ""))


@st.cache_data(ttl=CACHE_SECONDS, show_spinner="Reading the model cards…", max_entries=16)
def _evaluations(database_url: str, generation: int) -> Read:
    engine = engine_for(database_url)
    listings = latest_cards(engine)
    runs = sorted({listing.card["run_id"] for listing in listings}, reverse=True)
    reports = [judge_run(engine, run_id) for run_id in runs]
    names = {listing.card["run_id"]: listing.card["run_name"] for listing in listings}
    notes = [{"condition": listing.card["condition"], "model": listing.card["model"], "note": note}
             for listing in listings if (note := comparison_note(listing.card))]
    return Read({"cards": card_rows(listings), "gates": gate_rows(reports),
                 "runs": pd.DataFrame([{"run": report.run_id, "name": names[report.run_id],
                                        "passed": report.passed and bool(report.checks), "verdict": verdict(report)}
                                       for report in reports], columns=["run", "name", "passed", "verdict"]),
                 "notes": pd.DataFrame(notes, columns=["condition", "model", "note"]),
                 "markdown": pd.DataFrame([{"condition": listing.card["condition"], "model": listing.card["model"],
                                            "markdown": listing.markdown} for listing in listings],
                                          columns=["condition", "model", "markdown"])}, now())


def evaluations(database_url: str, slug: str) -> Read:
    """The newest model card of each condition and model (``evals.cards.latest_cards``) as rows
    (``card_rows``), with why a card shows no change (``notes``), the cards' Markdown, and the gates
    of the runs behind them judged now (``evals.gates.judge_run``: ``gates`` and one ``runs`` line
    each). No participant data: every role sees it."""
    return _evaluations(database_url, generation(database_url, slug))


METRIC_MEANINGS = {name: METRICS[name][0] for name in CARD_METRICS}
