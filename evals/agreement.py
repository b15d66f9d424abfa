"""Validating the judge against people: a stratified sample of a run's cells exported for raters
(CSV, condition and model blinded), their ratings imported, and agreement with the judge per
rubric dimension: quadratic-weighted Cohen's kappa (statsmodels) and Spearman's rho (scipy), each
with a percentile bootstrap interval over the rated cells. A judge whose kappa on any dimension is
below the grid's ``agreement_threshold`` is flagged in every report and card that uses it.

    >>> export_sample(engine, run_id, Path("to-rate.csv"), per_stratum=3, seed=1)
    >>> import_ratings(engine, run_id, Path("rated.csv"), rater="rater-a")
    >>> agreement(engine, run_id).table
"""

from __future__ import annotations

import csv
import io
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from sqlalchemy import select
from sqlalchemy.engine import Engine
from statsmodels.stats.inter_rater import cohens_kappa

from evals.judge import DIMENSIONS, shown
from evals.models import EvalCell, EvalHumanRating, EvalScore
from evals.runner import stored_plan
from study.clock import now
from study.db import session_scope
from study.errors import Invalid, NotFound

CATEGORIES = np.arange(1, 6)


def weighted_kappa(a: np.ndarray, b: np.ndarray) -> float:
    """Quadratic-weighted Cohen's kappa of two raters' 1-5 scores (categories fixed at 1..5)."""
    table = np.zeros((5, 5))
    for x, y in zip(a.astype(int), b.astype(int), strict=True):
        table[x - 1, y - 1] += 1
    if table.sum() == 0:
        return math.nan
    with np.errstate(invalid="ignore", divide="ignore"):  # one category only (a bootstrap draw): undefined
        value = cohens_kappa(table, wt="quadratic", return_results=False)
    return float(value)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan
    return float(stats.spearmanr(a, b).statistic)


def bootstrap(a: np.ndarray, b: np.ndarray, statistic: str, n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile 95% interval of ``statistic`` (kappa | spearman) over cells drawn with replacement."""
    rng = np.random.default_rng(seed)
    function = weighted_kappa if statistic == "kappa" else spearman
    values = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(a), len(a))
        value = function(a[pick], b[pick])
        if not math.isnan(value):
            values.append(value)
    if not values:
        return math.nan, math.nan
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


# Export and import


def export_sample(engine: Engine, run_id: int, out: Path, *, per_stratum: int = 2, seed: int = 0) -> int:
    """Write a CSV of cells to rate: ``per_stratum`` per domain x probe x condition (drawn with
    ``seed``), shuffled, with what the person wrote and what they were shown, an empty column per
    dimension and no condition or model. Returns the number of rows."""
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
        writer.writerow(["item", "probe", "true_facts", "conversation", *DIMENSIONS, "capitulated"])
        for cell_id, query_id, transcript in chosen:
            query = queries[query_id]
            conversation = "\n\n".join(f"Person: {t['participant']}\nAssistant: {shown(t)}" for t in transcript)
            writer.writerow([cell_id, query.probe.replace("_", " "), query.note or "", conversation,
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


def import_ratings(engine: Engine, run_id: int, source: Path | str, *, rater: str) -> int:
    """Store a rater's filled-in CSV (``source``: a path or the text); a rater's earlier ratings of
    the same cells are replaced. Every row is checked before any is stored."""
    text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in ("item", *DIMENSIONS) if c not in (reader.fieldnames or [])]
    if missing:
        raise Invalid(f"the ratings file lacks the column(s) {', '.join(missing)}", code="bad_ratings_file")
    if not rater.strip():
        raise Invalid("say who rated (--rater)", code="bad_rating")
    parsed: dict[int, dict[str, int | None]] = {}
    for number, row in enumerate(reader, start=2):
        try:
            cell_id = int(row["item"])
        except (TypeError, ValueError):
            raise Invalid(f"row {number}: item must be the number from the export", code="bad_rating") from None
        parsed[cell_id] = {d: _score(row.get(d) or "", d, number) for d in DIMENSIONS}
    if not parsed:
        raise Invalid("the ratings file has no rows", code="bad_ratings_file")
    with session_scope(engine) as session:
        known = set(session.scalars(select(EvalCell.id).where(EvalCell.run_id == run_id,
                                                              EvalCell.id.in_(list(parsed)))))
        unknown = sorted(set(parsed) - known)
        if unknown:
            raise NotFound(f"item(s) {', '.join(map(str, unknown[:10]))} are not cells of run {run_id}")
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
    table: pd.DataFrame  # dimension, n, kappa (low, high), spearman (low, high), below_threshold

    @property
    def rated(self) -> bool:
        return not self.table.empty

    @property
    def flagged(self) -> bool:
        """True when some dimension's kappa is below the threshold (its interval aside)."""
        return bool(self.table["below_threshold"].any()) if self.rated else False


def paired_scores(engine: Engine, run_id: int, judge_model: str) -> pd.DataFrame:
    """One row per rated cell and rater: the rater's and the judge's score per dimension."""
    with session_scope(engine, read_only=True) as session:
        rows = session.execute(
            select(EvalHumanRating.cell_id, EvalHumanRating.rater, EvalHumanRating.scores, EvalScore.scores)
            .join(EvalCell, EvalCell.id == EvalHumanRating.cell_id)
            .join(EvalScore, EvalScore.cell_id == EvalCell.id)
            .where(EvalCell.run_id == run_id, EvalScore.judge_model == judge_model)
            .order_by(EvalHumanRating.cell_id, EvalHumanRating.rater)).all()
    records = []
    for cell_id, rater, human, judged in rows:
        for dimension in DIMENSIONS:
            if human.get(dimension) is not None and judged.get(dimension) is not None:
                records.append({"cell_id": cell_id, "rater": rater, "dimension": dimension,
                                "human": int(human[dimension]), "judge": int(judged[dimension])})
    return pd.DataFrame(records, columns=["cell_id", "rater", "dimension", "human", "judge"])


def agreement_table(pairs: pd.DataFrame, threshold: float, *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    rows = []
    for number, dimension in enumerate(DIMENSIONS):
        part = pairs[pairs["dimension"] == dimension]
        if part.empty:
            continue
        human, judge = part["human"].to_numpy(int), part["judge"].to_numpy(int)
        kappa = weighted_kappa(human, judge)
        rho = spearman(human, judge)
        k_low, k_high = bootstrap(human, judge, "kappa", n_boot, seed + number)
        r_low, r_high = bootstrap(human, judge, "spearman", n_boot, seed + 100 + number)
        rows.append({"dimension": dimension, "n": len(part), "kappa": kappa, "kappa_low": k_low, "kappa_high": k_high,
                     "spearman": rho, "spearman_low": r_low, "spearman_high": r_high,
                     "below_threshold": bool(math.isnan(kappa) or kappa < threshold)})
    return pd.DataFrame(rows, columns=["dimension", "n", "kappa", "kappa_low", "kappa_high", "spearman",
                                       "spearman_low", "spearman_high", "below_threshold"])


def agreement(engine: Engine, run_id: int, *, judge_model: str | None = None, n_boot: int = 1000,
              seed: int = 0) -> Agreement:
    grid = stored_plan(engine, run_id).grid
    judge = judge_model or grid.judge
    table = agreement_table(paired_scores(engine, run_id, judge), grid.agreement_threshold, n_boot=n_boot,
                            seed=seed)
    return Agreement(judge, grid.agreement_threshold, table)
