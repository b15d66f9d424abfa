"""The evaluation report: one self-contained HTML file per run (inline style, no scripts, nothing
to fetch), built from the statistics report's pieces (``analysis.report``: its tables carry each
number's full value in ``data-value``, intervals in ``data-low``/``data-high``).

    >>> write_report(engine, run_id, Path("eval.html"))
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from analysis.report import STYLE
from analysis.report_html import _Col, _notes, _table
from evals.agreement import Agreement, agreement
from evals.gates import GateReport, judge_run
from evals.human_baseline import baselines_for_run
from evals.models import EvalCell, EvalRun
from evals.provenance import describe, describe_later, describe_packages
from evals.results import (
    METRICS,
    PAIR_METRICS,
    both_sides_table,
    capitulation_by_turn,
    chosen_judge,
    false_belief_gap,
    human_comparison,
    load_frame,
    paired_comparisons,
    summary_table,
    supportiveness_table,
)
from evals.runner import stored_plan
from evals.simulated import is_simulated
from study.clock import now
from study.db import session_scope
from study.errors import NotFound


def _wide(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """One row per group, a value and interval column per metric."""
    if table.empty:
        return table
    out = table.pivot_table(index=by, columns="metric", values=["mean", "low", "high"], sort=False)
    out.columns = [f"{pair[1]}_{pair[0]}" for pair in out.columns]
    counts = table.groupby(by, sort=False)["queries"].max().rename("queries")
    return out.join(counts).reset_index()


def _agreement_section(checked: Agreement) -> str:
    if not checked.rated:
        return ("<p class=\"not-estimated\" id=\"judge-unvalidated\">The judge has not been checked against human "
                "ratings for this run (<code>afterward eval export-ratings</code>, then "
                "<code>import-ratings</code>).</p>")
    kappa = _Col("quadratic-weighted kappa", "kappa", "interval", "kappa_low", "kappa_high")
    pooled = [_Col("dimension", "dimension", "text"), _Col("cells rated", "cells", "count"),
              _Col("raters", "raters", "count"), kappa, _Col("interval degenerate", "degenerate", "flag"),
              _Col(f"interval reaches below {checked.threshold}", "flagged", "flag")]
    per_rater = [_Col("rater", "rater", "text"), _Col("dimension", "dimension", "text"),
                 _Col("cells rated", "cells", "count"), kappa,
                 _Col("Spearman", "spearman", "interval", "spearman_low", "spearman_high")]
    between = [_Col("rater", "rater_a", "text"), _Col("and rater", "rater_b", "text"),
               _Col("dimension", "dimension", "text"), _Col("cells both rated", "cells", "count"), kappa]
    flag = (f'<p class="not-estimated" id="judge-flagged">Judge flagged: on at least one dimension the interval of '
            f"its agreement with human raters reaches below the threshold ({checked.threshold}); read the results "
            "with care.</p>" if checked.flagged else "")
    return (flag + _table(checked.table, pooled, "agreement", "The judge with the raters, pooled by rater (the mean "
                          "of the raters' kappas; 95% bootstrap intervals over cells)")
            + _table(checked.by_rater, per_rater, "agreement-by-rater", "The judge with each rater")
            + _table(checked.between_raters, between, "agreement-between-raters", "Raters with each other"))


def _gates_section(report: GateReport) -> str:
    if not report.checks and not report.problems:
        return '<p class="empty" id="gates">The grid states no gates.</p>'
    items = "".join(f"<li>{html.escape(line)}</li>" for line in report.lines())
    return f'<ul class="notes" id="gates">{items}</ul>'


def render_report(engine: Engine, run_id: int, judge_model: str | None = None) -> str:
    """The run's report. ``judge_model``: read the scores of another judge the run was re-scored
    with (``eval rescore``; refused when it holds none), instead of the run's own judge's."""
    planned = stored_plan(engine, run_id)
    judge = chosen_judge(engine, run_id, judge_model)
    with session_scope(engine, read_only=True) as session:
        run = session.get(EvalRun, run_id)
        if run is None:
            raise NotFound(f"there is no evaluation run {run_id}")
        counts = dict(session.execute(select(EvalCell.status, func.count()).where(EvalCell.run_id == run_id)
                                      .group_by(EvalCell.status)).all())
        name, status, source, sha = run.name, run.status, run.query_set, run.query_set_sha256
        grid_sha, provenance = run.grid_sha256, run.provenance
    frame = load_frame(engine, run_id, judge)
    checked = agreement(engine, run_id, judge_model=judge, n_boot=500)
    metrics = list(METRICS)
    overall = _wide(summary_table(frame, by=["condition", "model"]), ["condition", "model"])
    by_domain = _wide(summary_table(frame), ["condition", "model", "domain"])

    def metric_cols(prefix: list[_Col]) -> list[_Col]:
        return [*prefix, _Col("queries", "queries", "count"),
                *(_Col(m.replace("_", " "), f"{m}_mean", "interval", f"{m}_low", f"{m}_high") for m in metrics
                  if f"{m}_mean" in overall)]

    comparisons = paired_comparisons(frame)
    comparison_cols = [_Col("family", "family", "text"), _Col("within", "within", "text"), _Col("a", "a", "text"),
                       _Col("b", "b", "text"), _Col("metric", "metric", "text"), _Col("queries", "n", "count"),
                       _Col("a − b", "difference", "interval", "low", "high"), _Col("a higher", "positive", "count"),
                       _Col("b higher", "negative", "count"), _Col("p (sign test)", "p", "p"),
                       _Col("p (BH)", "p_adjusted", "p"), _Col("significant", "significant", "flag")]
    supportive = supportiveness_table(frame, comparisons)
    supportive_cols = [_Col("model", "model", "text"), _Col("metric", "metric", "text"),
                       *(_Col(level, f"{level}_mean", "interval", f"{level}_low", f"{level}_high")
                         for level in ("neutral", "supportive", "validating")),
                       _Col("queries (pairs)", "n", "count"),
                       _Col("validating − neutral", "difference", "interval", "low", "high"),
                       _Col("p (BH)", "p_adjusted", "p"), _Col("significant", "significant", "flag")]
    gap = false_belief_gap(frame)
    gap_cols = [_Col("condition", "condition", "text"), _Col("model", "model", "text"),
                _Col("sad", "sad"), _Col("neutral", "neutral"), _Col("pairs", "n", "count"),
                _Col("sad − neutral", "difference", "interval", "low", "high"), _Col("p (sign test)", "p", "p")]
    sides = both_sides_table(frame)
    sides_cols = [_Col("condition", "condition", "text"), _Col("model", "model", "text"),
                  _Col("conflicts", "pairs", "count"), _Col("side a affirmed", "side_a"),
                  _Col("side b affirmed", "side_b"),
                  _Col("both sides affirmed", "both_sides", "interval", "low", "high")]
    humans = [(name, human_comparison(frame, baseline)) for name, baseline in baselines_for_run(engine, run_id).items()]
    human_cols = [_Col("condition", "condition", "text"), _Col("model", "model", "text"),
                  _Col("queries", "n", "count"), _Col("model affirmed", "model_mean", "interval", "model_low",
                                                      "model_high"),
                  _Col("people affirmed", "humans_mean", "interval", "humans_low", "humans_high"),
                  _Col("model − people", "difference", "interval", "low", "high"), _Col("p (sign test)", "p", "p"),
                  _Col("p (BH)", "p_adjusted", "p"), _Col("significant", "significant", "flag")]
    turns = capitulation_by_turn(frame)
    turn_cols = [_Col("condition", "condition", "text"), _Col("model", "model", "text"),
                 _Col("pushback", "pushback", "count"), _Col("queries", "queries", "count"),
                 _Col("gave in", "rate", "interval", "low", "high")]
    grid = planned.grid
    simulated = [model for model in grid.models if is_simulated(model)]
    facts = {"Run": f"{run_id} ({name}), {status}", "Cells": ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
             "Models": ", ".join(grid.models), "Conditions": ", ".join(
                 f"{c.name} (prompt {c.prompt_version})" for c in planned.conditions),
             "Query set": f"{source} (SHA-256 {sha[:12]})", "Repeats": str(grid.repeats), "Seed": str(grid.seed),
             "Call settings": ", ".join(f"{k} = {v}" for k, v in grid.params.items()) or "provider defaults",
             "Judge": (judge if judge == grid.judge else f"{judge} (re-scored; the run's own judge is {grid.judge})")
             + (" — FLAGGED" if checked.flagged else ""),
             **({"Simulated models": ", ".join(simulated)} if simulated else {}),
             "Grid file": f"SHA-256 {grid_sha}" if grid_sha else "not recorded (a grid not read from a file, or a "
                                                                 "run from before grid files were recorded)",
             "Code": "; ".join([describe(provenance), *describe_later(provenance)]),
             "Packages": describe_packages(provenance),
             "Report written at": now().isoformat(timespec="seconds")}
    simulated_note = (f'<p class="not-estimated" id="simulated-models">Simulated: {html.escape(", ".join(simulated))} '
                      "is a scripted stand-in (evals/simulated.py), not a language model, written to behave like "
                      "published findings on warm and validating assistants. Its figures show what the harness "
                      "finds, not how any real model behaves.</p>" if simulated else "")
    top = (f"<header><h1>Evaluation report: {html.escape(name)}</h1><p class=\"lede\">Each cell is one "
           "conversation: roles through the chat pipeline (monitors, stance policy, safety replies), bare prompts "
           "without it. Queries are the unit of every interval.</p>" + simulated_note + "<dl class=\"facts\">"
           + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in facts.items())
           + "</dl></header>")
    sections = [
        ("release-gates", "Gates", _gates_section(judge_run(engine, run_id, judge))),
        ("judge", "The judge and human ratings", _agreement_section(checked)),
        ("results", "Results by condition and model",
         _table(overall, metric_cols([_Col("condition", "condition", "text"), _Col("model", "model", "text")]),
                "results-overall", "Rates with Wilson 95% intervals over queries; scores with t intervals")
         + _notes([f"{m}: {d}" for m, (d, _) in {**METRICS, **PAIR_METRICS}.items()])),
        ("supportiveness", "Bare prompts by supportiveness",
         _table(supportive, supportive_cols, "supportiveness", "Each bare prompt's figure with its 95% interval; "
                                                                "the validating prompt minus the neutral one paired "
                                                                "by query (both sides: by conflict), as in the "
                                                                "paired comparisons")),
        ("domains", "Results by condition, model and domain",
         _table(by_domain, metric_cols([_Col("condition", "condition", "text"), _Col("model", "model", "text"),
                                        _Col("domain", "domain", "text")]), "results-domain")),
        ("comparisons", "Paired comparisons",
         _table(comparisons, comparison_cols, "comparisons", "Paired by query (both sides: by conflict): exact sign "
                                                             "tests, Benjamini-Hochberg adjusted within each family; "
                                                             "Bonett-Price adjusted Wald intervals (scores: bounded "
                                                             "by their range of 4)")),
        ("false-beliefs", "False beliefs stated sadly versus neutrally",
         _table(gap, gap_cols, "false-belief-gap", "Share of replies affirming the false belief, paired by belief")),
        ("both-sides", "Conflicts told from each side",
         _table(sides, sides_cols, "both-sides", "Share of conflicts whose two tellings, one by each side, were both "
                                                 "affirmed (Wilson 95% intervals over conflicts); replies that "
                                                 "judged the situation could not tell both sides they were right")),
        *((f"humans-{i}", f"Beside people's answers: {name}",
           _table(table, human_cols, f"humans-{i}", "Share of replies affirming the person's framing beside the share "
                                                   "of people who did, on the queries people answered; paired by "
                                                   "query (exact sign test, BH over the rows)"))
          for i, (name, table) in enumerate(humans, start=1)),
        ("capitulation", "Capitulation per turn of pushback",
         _table(turns, turn_cols, "capitulation-by-turn", "Share of replies giving in at each pushback")),
    ]
    contents = "<nav aria-label=\"Contents\"><ol>" + "".join(
        f'<li><a href="#{key}">{html.escape(title)}</a></li>' for key, title, _ in sections) + "</ol></nav>"
    body = "".join(f'<section id="{key}"><h2>{html.escape(title)}</h2>{content}</section>'
                   for key, title, content in sections)
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>Evaluation: {html.escape(name)}</title><style>{STYLE}</style></head>"
            f"<body><main>{top}{contents}{body}</main></body></html>\n")


def write_report(engine: Engine, run_id: int, out: Path, judge_model: str | None = None) -> Path:
    out.write_text(render_report(engine, run_id, judge_model), encoding="utf-8")
    return out
