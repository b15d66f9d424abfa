"""Validating the judge against people: a stratified sample of a run's cells exported for raters
(CSV, condition and model blinded), their ratings imported (every rubric dimension, and per pushback
message whether the reply gave in: ``capitulated``), and agreement per dimension, all as
quadratic-weighted Cohen's kappa (statsmodels; on yes/no, plain kappa):

- the judge with each rater (with Spearman's rho, scipy), over the cells that rater rated;
- the judge with the raters pooled by rater: the mean of the raters' kappas, so each rater counts
  once and a rater who disagrees is not outweighed by rows of one who agrees; ``cells`` counts cells,
  not rater rows;
- each pair of raters with each other, over the cells both rated.

Every interval is a percentile bootstrap over cells (a cell's ratings, by every rater and for every
pushback message, drawn together). A judge is flagged when, on some dimension, the pooled interval's
lower end is below the grid's ``agreement_threshold`` or the interval could not be estimated
(``degenerate``: every draw gave one value, so it shows no uncertainty, or none gave one).

    >>> export_sample(engine, run_id, Path("to-rate.csv"), per_stratum=3, seed=1)
    >>> import_ratings(engine, run_id, Path("rated.csv"), rater="rater-a")
    >>> checked = agreement(engine, run_id)
    >>> checked.table, checked.by_rater, checked.between_raters
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
from dataclasses import dataclass
from itertools import combinations, count
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from sqlalchemy import select
from sqlalchemy.engine import Engine
from statsmodels.stats.inter_rater import cohens_kappa

from evals.grid import RATED
from evals.judge import DIMENSIONS, shown
from evals.models import EvalCell, EvalHumanRating, EvalScore
from evals.runner import stored_plan
from study.clock import now
from study.db import session_scope
from study.errors import Invalid, NotFound

LEVELS = {**{dimension: 5 for dimension in DIMENSIONS}, "capitulated": 2}  # capitulated: no 1, yes 2


def kappa_of_table(table: np.ndarray) -> float:
    """Quadratic-weighted Cohen's kappa of a square table of counts (two categories: plain kappa)."""
    if table.sum() == 0:
        return math.nan
    with np.errstate(invalid="ignore", divide="ignore"):  # one category only (a bootstrap draw): undefined
        value = cohens_kappa(table, wt="quadratic", return_results=False)
    return float(value)


def weighted_kappa(a: np.ndarray, b: np.ndarray, levels: int = 5) -> float:
    """Quadratic-weighted Cohen's kappa of two raters' scores 1..``levels``."""
    table = np.zeros((levels, levels))
    np.add.at(table, (a.astype(int) - 1, b.astype(int) - 1), 1)
    return kappa_of_table(table)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan
    return float(stats.spearmanr(a, b).statistic)


def _percentile(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def bootstrap(a: np.ndarray, b: np.ndarray, statistic: str, n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile 95% interval of ``statistic`` (kappa | spearman) over pairs drawn with replacement."""
    rng = np.random.default_rng(seed)
    function = weighted_kappa if statistic == "kappa" else spearman
    values = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(a), len(a))
        value = function(a[pick], b[pick])
        if not math.isnan(value):
            values.append(value)
    return _percentile(values)


def _cell_tables(pairs: pd.DataFrame, cells: np.ndarray, levels: int) -> np.ndarray:
    """One table of counts per cell of ``cells`` (x by y), from rows cell_id, x, y."""
    tables = np.zeros((len(cells), levels, levels))
    positions = np.searchsorted(cells, pairs["cell_id"].to_numpy(int))
    np.add.at(tables, (positions, pairs["x"].to_numpy(int) - 1, pairs["y"].to_numpy(int) - 1), 1)
    return tables


def mean_kappa(groups: list[pd.DataFrame], levels: int, *, n_boot: int, seed: int) -> tuple[float, float, float, int]:
    """The mean of the kappas of ``groups`` (each: rows cell_id, x, y; one group per rater or rater
    pair), with a percentile 95% interval from drawing cells with replacement (all of a drawn cell's
    rows, in every group), and the number of cells."""
    cells = np.unique(np.concatenate([g["cell_id"].to_numpy(int) for g in groups]))
    stacks = [_cell_tables(g, cells, levels) for g in groups]

    def statistic(weights: np.ndarray) -> float:
        values = [kappa_of_table(np.tensordot(weights, stack, axes=1)) for stack in stacks]
        defined = [v for v in values if not math.isnan(v)]
        return float(np.mean(defined)) if defined else math.nan

    point = statistic(np.ones(len(cells)))
    rng = np.random.default_rng(seed)
    draws = [statistic(np.bincount(rng.integers(0, len(cells), len(cells)), minlength=len(cells)))
             for _ in range(n_boot)]
    low, high = _percentile([d for d in draws if not math.isnan(d)])
    return point, low, high, len(cells)


# Export and import


def export_sample(engine: Engine, run_id: int, out: Path, *, per_stratum: int = 2, seed: int = 0) -> int:
    """Write a CSV of cells to rate: ``per_stratum`` per domain x probe x condition (drawn with
    ``seed``), shuffled, with what the person wrote and what they were shown, an empty column per
    dimension and for ``capitulated`` (one yes or no per pushback message, as many as ``pushbacks``
    says), and no condition or model. Returns the number of rows."""
    planned = stored_plan(engine, run_id)
    queries = planned.queries.query_set.by_id()
    with session_scope(engine, read_only=True) as session:
        cells = session.execute(select(EvalCell.id, EvalCell.condition, EvalCell.query_id, EvalCell.transcript)
                                .where(EvalCell.run_id == run_id, EvalCell.status == "done")
                                .order_by(EvalCell.id)).all()
    if not cells:
        raise Invalid(f"run {run_id} has no finished cells to rate yet", code="nothing_to_rate")
    strata: dict[tuple[str, str, str], list[tuple[int, str, list[dict[str, object]]]]] = {}
    for cell_id, condition, query_id, transcript in cells:
        query = queries[query_id]
        strata.setdefault((query.domain, query.probe, condition), []).append((cell_id, query_id, transcript or []))
    rng = random.Random(seed)
    chosen = []
    for key in sorted(strata):
        members = strata[key]
        chosen += rng.sample(members, min(per_stratum, len(members)))
    rng.shuffle(chosen)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["item", "probe", "true_facts", "pushbacks", "conversation", *DIMENSIONS, "capitulated"])
        for cell_id, query_id, transcript in chosen:
            query = queries[query_id]
            conversation = "\n\n".join(f"Person: {t['participant']}\nAssistant: {shown(t)}" for t in transcript)
            writer.writerow([cell_id, query.probe.replace("_", " "), query.note or "", query.pushbacks, conversation,
                             *([""] * len(DIMENSIONS)), ""])
    return len(chosen)


def _score(value: str, dimension: str, row: int) -> int | None:
    text = value.strip()
    if not text or text.lower() in ("na", "n/a", "null"):
        return None
    try:
        score = int(float(text))
    except ValueError:
        raise Invalid(f"row {row}: {dimension} must be a score from 1 to 5 (or empty), not {text!r}",
                      code="bad_rating") from None
    if not 1 <= score <= 5 or float(text) != score:
        raise Invalid(f"row {row}: {dimension} must be a whole score from 1 to 5, not {text!r}", code="bad_rating")
    return score


_YES = {"yes", "y", "true", "1"}
_NO = {"no", "n", "false", "0"}


def _capitulated(value: str, pushbacks: int, row: int) -> list[bool] | None:
    """``capitulated``: one yes or no per pushback message, in order (``no, yes``), or empty."""
    text = value.strip().lower()
    if not text or text in ("na", "n/a", "null"):
        return None
    if not pushbacks:
        raise Invalid(f"row {row}: capitulated is rated in pushback conversations only; leave it empty",
                      code="bad_rating")
    words = [w for w in re.split(r"[\s,;/]+", text) if w]
    if any(w not in _YES | _NO for w in words):
        raise Invalid(f"row {row}: capitulated is yes or no per pushback message (e.g. 'no, yes'), not {value!r}",
                      code="bad_rating")
    if len(words) != pushbacks:
        raise Invalid(f"row {row}: capitulated needs one yes or no for each of the {pushbacks} pushback messages, "
                      f"not {len(words)}", code="bad_rating")
    return [w in _YES for w in words]


def import_ratings(engine: Engine, run_id: int, source: Path | str, *, rater: str) -> int:
    """Store a rater's filled-in CSV (``source``: a path or the text): every rubric dimension and
    ``capitulated``; a rater's earlier ratings of the same cells are replaced. Every row is checked
    before any is stored."""
    text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in ("item", *RATED) if c not in (reader.fieldnames or [])]
    if missing:
        raise Invalid(f"the ratings file lacks the column(s) {', '.join(missing)}", code="bad_ratings_file")
    if not rater.strip():
        raise Invalid("say who rated (--rater)", code="bad_rating")
    rows: dict[int, tuple[int, dict[str, str]]] = {}
    for number, row in enumerate(reader, start=2):
        try:
            cell_id = int(row["item"])
        except (TypeError, ValueError):
            raise Invalid(f"row {number}: item must be the number from the export", code="bad_rating") from None
        rows[cell_id] = (number, row)
    if not rows:
        raise Invalid("the ratings file has no rows", code="bad_ratings_file")
    queries = stored_plan(engine, run_id).queries.query_set.by_id()
    with session_scope(engine) as session:
        query_of = dict(session.execute(select(EvalCell.id, EvalCell.query_id).where(
            EvalCell.run_id == run_id, EvalCell.id.in_(list(rows)))).all())
        unknown = sorted(set(rows) - set(query_of))
        if unknown:
            raise NotFound(f"item(s) {', '.join(map(str, unknown[:10]))} are not cells of run {run_id}")
        parsed: dict[int, dict[str, object]] = {}
        for cell_id, (number, row) in rows.items():
            scores: dict[str, object] = {d: _score(row.get(d) or "", d, number) for d in DIMENSIONS}
            scores["capitulated"] = _capitulated(row.get("capitulated") or "", queries[query_of[cell_id]].pushbacks,
                                                 number)
            parsed[cell_id] = scores
        existing = {r.cell_id: r for r in session.scalars(select(EvalHumanRating).where(
            EvalHumanRating.rater == rater, EvalHumanRating.cell_id.in_(list(parsed))))}
        for cell_id, scores in parsed.items():
            if cell_id in existing:
                existing[cell_id].scores = scores
                existing[cell_id].imported_at = now()
            else:
                session.add(EvalHumanRating(cell_id=cell_id, rater=rater, scores=scores, imported_at=now()))
    return len(parsed)


# Agreement


@dataclass(frozen=True)
class Agreement:
    judge_model: str
    threshold: float
    table: pd.DataFrame  # pooled by rater: dimension, cells, raters, kappa (low, high), degenerate, flagged
    by_rater: pd.DataFrame  # rater, dimension, cells, kappa (low, high), spearman (low, high)
    between_raters: pd.DataFrame  # rater_a, rater_b, dimension, cells, kappa (low, high)

    @property
    def rated(self) -> bool:
        return not self.table.empty

    @property
    def flagged(self) -> bool:
        """True when on some rated dimension the pooled kappa's interval reaches below the threshold
        (or could not be estimated)."""
        return bool(self.table["flagged"].any()) if self.rated else False


def _long(cell_id: int, scores: dict[str, object], capitulated: object) -> list[tuple[int, str, int, int]]:
    """A cell's scores as rows (cell, dimension, item, value 1-5), with one row per pushback message
    for ``capitulated`` (no 1, yes 2)."""
    found = [(cell_id, d, 0, int(v)) for d in DIMENSIONS if isinstance(v := scores.get(d), int | float)]
    if isinstance(capitulated, list):
        found += [(cell_id, "capitulated", k, 2 if gave_in else 1) for k, gave_in in enumerate(capitulated)]
    return found


def rated_scores(engine: Engine, run_id: int, judge_model: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The raters' scores (cell_id, rater, dimension, item, human) and the judge's scores of the rated
    cells (cell_id, dimension, item, judge), one row per dimension and pushback message."""
    with session_scope(engine, read_only=True) as session:
        ratings = session.execute(
            select(EvalHumanRating.cell_id, EvalHumanRating.rater, EvalHumanRating.scores)
            .join(EvalCell, EvalCell.id == EvalHumanRating.cell_id).where(EvalCell.run_id == run_id)
            .order_by(EvalHumanRating.cell_id, EvalHumanRating.rater)).all()
        judged = session.execute(
            select(EvalScore.cell_id, EvalScore.scores, EvalScore.capitulated)
            .where(EvalScore.judge_model == judge_model, EvalScore.cell_id.in_({r[0] for r in ratings}))).all()
    human = pd.DataFrame([(rater, *row) for cell_id, rater, scores in ratings
                          for row in _long(cell_id, scores, scores.get("capitulated"))],
                         columns=["rater", "cell_id", "dimension", "item", "human"])
    judge = pd.DataFrame([row for cell_id, scores, gave_in in judged for row in _long(cell_id, scores, gave_in)],
                         columns=["cell_id", "dimension", "item", "judge"])
    return human, judge


def agreement_tables(human: pd.DataFrame, judge: pd.DataFrame, threshold: float, *, n_boot: int = 1000,
                     seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(pooled by rater, per rater, between raters): see the module's docstring."""
    key = ["cell_id", "dimension", "item"]
    pairs = human.merge(judge, on=key)
    raters = sorted(human["rater"].unique())
    pooled, per_rater, between = [], [], []
    seeds = count(seed)  # one seed per interval
    for dimension in RATED:
        levels = LEVELS[dimension]
        part = pairs[pairs["dimension"] == dimension]
        groups = []
        for rater in raters:
            mine = part[part["rater"] == rater].rename(columns={"human": "x", "judge": "y"})
            if mine.empty:
                continue
            groups.append(mine)
            kappa, low, high, cells = mean_kappa([mine], levels, n_boot=n_boot, seed=next(seeds))
            x, y = mine["x"].to_numpy(int), mine["y"].to_numpy(int)
            ordinal = dimension != "capitulated"
            rho = spearman(x, y) if ordinal else math.nan
            r_low, r_high = bootstrap(x, y, "spearman", n_boot, next(seeds)) if ordinal else (math.nan, math.nan)
            per_rater.append({"rater": rater, "dimension": dimension, "cells": cells, "kappa": kappa,
                              "kappa_low": low, "kappa_high": high, "spearman": rho, "spearman_low": r_low,
                              "spearman_high": r_high})
        if groups:
            kappa, low, high, cells = mean_kappa(groups, levels, n_boot=n_boot, seed=next(seeds))
            degenerate = math.isnan(low) or low == high
            pooled.append({"dimension": dimension, "cells": cells, "raters": len(groups), "kappa": kappa,
                           "kappa_low": low, "kappa_high": high, "degenerate": degenerate,
                           "flagged": bool(degenerate or low < threshold)})
        rated = human[human["dimension"] == dimension]
        for a, b in combinations(raters, 2):
            both = rated[rated["rater"] == a].merge(rated[rated["rater"] == b], on=key, suffixes=("_a", "_b"))
            if both.empty:
                continue
            both = both.rename(columns={"human_a": "x", "human_b": "y"})
            kappa, low, high, cells = mean_kappa([both], levels, n_boot=n_boot, seed=next(seeds))
            between.append({"rater_a": a, "rater_b": b, "dimension": dimension, "cells": cells, "kappa": kappa,
                            "kappa_low": low, "kappa_high": high})
    return (pd.DataFrame(pooled, columns=["dimension", "cells", "raters", "kappa", "kappa_low", "kappa_high",
                                          "degenerate", "flagged"]),
            pd.DataFrame(per_rater, columns=["rater", "dimension", "cells", "kappa", "kappa_low", "kappa_high",
                                             "spearman", "spearman_low", "spearman_high"]),
            pd.DataFrame(between, columns=["rater_a", "rater_b", "dimension", "cells", "kappa", "kappa_low",
                                           "kappa_high"]))


def agreement(engine: Engine, run_id: int, *, judge_model: str | None = None, n_boot: int = 1000,
              seed: int = 0) -> Agreement:
    grid = stored_plan(engine, run_id).grid
    judge = judge_model or grid.judge
    human, judged = rated_scores(engine, run_id, judge)
    pooled, by_rater, between = agreement_tables(human, judged, grid.agreement_threshold, n_boot=n_boot, seed=seed)
    return Agreement(judge, grid.agreement_threshold, pooled, by_rater, between)
