"""People's own answers to the queries: the optional human column beside the models'.

Social-sycophancy studies compare how often a model affirms a person's framing with how often
people do on the same situations (for conflicts: crowd verdicts on who was in the wrong). A study
team collects people's answers to the queries of a set (each query's first message shown as the
person wrote it) and imports them as a CSV, one row per answer::

    query_id,affirmed
    conflict-roommate-a,no
    conflict-roommate-a,yes

``affirmed``: whether that person's answer affirmed the framing (yes/no, 1/0). Other columns (a
respondent code, a comment) are ignored. Every row is checked before any is stored; a baseline
imported again under the same name and query set replaces the earlier one. The report sets each
condition and model's affirmation beside people's, paired by query
(``evals.results.human_comparison``).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd
from sqlalchemy import delete, select
from sqlalchemy.engine import Engine

from evals.grid import LoadedQueries
from evals.models import EvalHumanBaseline, EvalRun
from study.clock import now
from study.db import bulk_insert, session_scope
from study.errors import Invalid, NotFound

_YES = {"yes", "y", "true", "1"}
_NO = {"no", "n", "false", "0"}


def import_baseline(engine: Engine, source: Path | str, queries: LoadedQueries, *, name: str) -> dict[str, int]:
    """Store people's answers (``source``: a path or the CSV's text) to ``queries`` as the baseline
    ``name``; the counts stored (``queries``, ``answers``)."""
    if not name.strip():
        raise Invalid("name the baseline (--name), e.g. the panel and the month it was collected",
                      code="bad_baseline")
    text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in ("query_id", "affirmed") if c not in (reader.fieldnames or [])]
    if missing:
        raise Invalid(f"the baseline file lacks the column(s) {', '.join(missing)} (one row per person's answer: "
                      "query_id,affirmed)", code="bad_baseline_file")
    known = queries.query_set.by_id()
    counts: dict[str, list[int]] = {}
    problems: list[str] = []
    for number, row in enumerate(reader, start=2):
        query_id, answer = (row.get("query_id") or "").strip(), (row.get("affirmed") or "").strip().lower()
        if query_id not in known:
            problems.append(f"row {number}: {query_id!r} is not a query of {queries.source}")
        elif answer not in _YES | _NO:
            problems.append(f"row {number}: affirmed is yes or no (1 or 0), not {row.get('affirmed')!r}")
        else:
            tally = counts.setdefault(query_id, [0, 0])
            tally[0] += 1
            tally[1] += answer in _YES
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise Invalid("nothing was imported: " + "; ".join(problems[:10]) + more, code="bad_baseline")
    if not counts:
        raise Invalid("the baseline file has no answers", code="bad_baseline_file")
    with session_scope(engine) as session:
        session.execute(delete(EvalHumanBaseline).where(EvalHumanBaseline.name == name,
                                                        EvalHumanBaseline.query_set == queries.source))
        bulk_insert(session, EvalHumanBaseline, [
            {"name": name, "query_set": queries.source, "query_set_sha256": queries.sha256, "query_id": query_id,
             "responses": responses, "affirmed": affirmed, "imported_at": now()}
            for query_id, (responses, affirmed) in counts.items()])
    return {"queries": len(counts), "answers": sum(r for r, _ in counts.values())}


def baselines_for_run(engine: Engine, run_id: int) -> dict[str, pd.DataFrame]:
    """The baselines collected on the run's query set (the same name, version and digest): per
    baseline, one row per query (``query_id``, ``responses``, ``affirmed``: the share of people who
    affirmed)."""
    with session_scope(engine, read_only=True) as session:
        run = session.get(EvalRun, run_id)
        if run is None:
            raise NotFound(f"there is no evaluation run {run_id}")
        rows = session.execute(select(EvalHumanBaseline.name, EvalHumanBaseline.query_id,
                                      EvalHumanBaseline.responses, EvalHumanBaseline.affirmed)
                               .where(EvalHumanBaseline.query_set == run.query_set,
                                      EvalHumanBaseline.query_set_sha256 == run.query_set_sha256)
                               .order_by(EvalHumanBaseline.name, EvalHumanBaseline.query_id)).all()
    found: dict[str, list[dict[str, object]]] = {}
    for name, query_id, responses, affirmed in rows:
        found.setdefault(name, []).append({"query_id": query_id, "responses": responses,
                                           "affirmed": affirmed / responses})
    return {name: pd.DataFrame(records, columns=["query_id", "responses", "affirmed"])
            for name, records in found.items()}
