"""People's own answers beside the models': a checked import (nothing stored from a bad file), the
paired comparison worked by hand, and the report's column from an imported file."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from evals.grid import load_queries
from evals.human_baseline import baselines_for_run, import_baseline
from evals.models import EvalHumanBaseline
from evals.report import render_report
from evals.results import human_comparison
from study.db import session_scope
from study.errors import Invalid
from tests.builders import evaluate_grid
from tests.evals.conftest import Cli


def _stored(engine: Engine) -> int:
    with session_scope(engine, read_only=True) as session:
        return session.scalar(select(func.count()).select_from(EvalHumanBaseline)) or 0


def test_a_bad_file_is_refused_whole_with_each_row_said(engine: Engine) -> None:
    queries = load_queries("default")
    text = ("query_id,affirmed,respondent\nrel-conflict-1,yes,p1\nrel-conflict-9999,no,p2\n"
            "rel-conflict-2,maybe,p3\nrel-conflict-2,0,p4\n")
    with pytest.raises(Invalid) as refused:
        import_baseline(engine, text, queries, name="panel-2026-12")
    assert "row 3: 'rel-conflict-9999' is not a query of afterward-probes@" in refused.value.message
    assert "row 4: affirmed is yes or no (1 or 0), not 'maybe'" in refused.value.message
    assert _stored(engine) == 0
    with pytest.raises(Invalid, match="lacks the column"):
        import_baseline(engine, "query,affirmed\nrel-conflict-1,yes\n", queries, name="panel")
    with pytest.raises(Invalid, match="name the baseline"):
        import_baseline(engine, "query_id,affirmed\nrel-conflict-1,yes\n", queries, name=" ")
    assert _stored(engine) == 0


def test_the_comparison_with_people_worked_by_hand() -> None:
    """Five queries; the model affirmed on four, people's shares 0.5, 0.25, 1, 0, 0.5. Differences
    +0.5, +0.75, 0, +1, -0.5: mean 0.35; three up, one down, so the exact sign test gives
    2 x P(X >= 3 | 4, 0.5) = 2 x 5/16 = 0.625. Bonett-Price: centre 1.75 / 7 = 0.25, spread
    (2.0625 + 2) / 7 - 0.0625 = 0.517857, half-width 1.959964 x sqrt(0.517857 / 7) = 0.533094."""
    frame = pd.DataFrame({"condition": "role/coach", "model": "m", "query_id": list("abcde"),
                          "affirmed": [1.0, 1.0, 1.0, 1.0, 0.0]})
    humans = pd.DataFrame({"query_id": list("abcdez"), "responses": 4, "affirmed": [0.5, 0.25, 1.0, 0.0, 0.5, 1.0]})
    row = human_comparison(frame, humans).iloc[0]
    assert row["n"] == 5
    assert row["difference"] == pytest.approx(0.35)
    assert row["p"] == pytest.approx(0.625)
    assert (row["positive"], row["negative"]) == (3, 1)
    assert row["low"] == pytest.approx(0.25 - 0.533094, abs=1e-6)
    assert row["high"] == pytest.approx(0.25 + 0.533094, abs=1e-6)
    assert row["model_mean"] == pytest.approx(0.8)
    assert row["humans_mean"] == pytest.approx(0.45)  # the queries both answered: z is not among them


def test_the_report_sets_the_imported_answers_beside_the_models(engine: Engine, tmp_path: Path, cli: Cli) -> None:
    """Through ``afterward eval import-baseline``: the sycophant affirms every conflict; people
    affirmed one of the three conflicts' tellers (shares 1/2, 0/2, 0/1), 1/6 on average."""
    run_id = evaluate_grid(engine, tmp_path, "humans", "models: [offline/sycophant]\nconditions: [bare/neutral]\n"
                                                       "judge: offline/rules\n")
    answers = tmp_path / "people.csv"
    answers.write_text("query_id,affirmed\nrel-conflict-1,yes\nrel-conflict-1,no\nrel-conflict-2,no\n"
                       "rel-conflict-2,no\nrel-conflict-3,no\n", encoding="utf-8")
    done = cli("eval", "import-baseline", answers, "--name", "panel-2026-12")
    assert done.exit_code == 0, done.output
    assert "imported 5 answers to 3 queries of afterward-probes@" in done.output
    baseline = baselines_for_run(engine, run_id)["panel-2026-12"]
    assert baseline.set_index("query_id")["affirmed"].to_dict() == {"rel-conflict-1": 0.5, "rel-conflict-2": 0.0,
                                                                    "rel-conflict-3": 0.0}
    page = render_report(engine, run_id)
    assert "Beside people&#x27;s answers: panel-2026-12" in page or "Beside people's answers: panel-2026-12" in page
    section = page.split('id="humans-1"', 1)[1].split("</section>", 1)[0]
    assert "0.167" in section  # people's share on the three conflicts
    again = cli("eval", "import-baseline", answers, "--name", "panel-2026-12")  # replaces, never doubles
    assert again.exit_code == 0
    assert _stored(engine) == 3
    bad = tmp_path / "bad.csv"
    bad.write_text("query_id,affirmed\nnot-a-query,yes\n", encoding="utf-8")
    refused = cli("eval", "import-baseline", bad, "--name", "panel-2026-12")
    assert refused.exit_code != 0
    assert "not a query of afterward-probes@" in refused.output
    assert _stored(engine) == 3
    assert not math.isnan(float(baseline["affirmed"].mean()))
