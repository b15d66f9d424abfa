"""The DuckDB recipe of docs/SCALING.md, run on a partitioned Parquet export and checked against pandas.

    .venv/bin/afterward export STUDY --format parquet --partitioned --out EXPORT --as EMAIL
    nice -n 10 .venv/bin/python bench/duckdb_recipe.py EXPORT [--memory-limit 1GB] [--threads 2]

Three questions a study team asks of a large study, each one SQL statement over the export's
folders (``<table>/study=<slug>/part-*.parquet``, read as one table each with the study from the
folder name, so several studies' exports side by side are read the same way):

1. mean PERMA (overall well-being) and its change from baseline by arm and wave;
2. adherence: of the follow-ups sent (answered, expired or still open), the share answered, by arm and wave;
3. conversation features joined to outcomes: each participant's share of agreeing replies over all
   their conversations, against their PERMA change at the last wave, by arm (slope and correlation).

DuckDB runs each with a memory limit (it spills past it); the truth is the same computation in
pandas on the same files, and the two must agree (counts exactly, numbers to 1e-9 relative). Printed:
each statement, its result, DuckDB's time, pandas' time, and the process's peak RSS after each.
Needs the ``duckdb`` extra (installed by ``make``, locked in ``requirements/dev.txt``).
"""

from __future__ import annotations

import argparse
import resource
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

LAST_PERMA_WAVE = "perma-week-4"  # examples/wellbeing-pilot.yaml


def source(export: Path, table: str) -> str:
    return f"read_parquet('{export}/{table}/*/*.parquet', hive_partitioning = true)"


def recipe(export: Path) -> dict[str, str]:
    """The statements, as docs/SCALING.md shows them (``export`` in place of the folder)."""
    return {
        "perma by arm and wave": f"""
SELECT arm, wave, count(*) AS answered,
       avg(perma_overall_wellbeing) AS mean_perma,
       avg(perma_overall_wellbeing - baseline_perma_overall_wellbeing) AS mean_change
FROM {source(export, 'panel')}
WHERE instrument_id = 'perma-profiler' AND response_status = 'completed'
GROUP BY arm, wave
ORDER BY arm, wave""",
        "adherence by arm and wave": f"""
SELECT arm, wave, count(*) AS sent,
       avg(CASE WHEN response_status = 'completed' THEN 1 ELSE 0 END) AS completed_share
FROM {source(export, 'panel')}
WHERE wave <> 'baseline' AND response_status IN ('completed', 'expired', 'open')
GROUP BY arm, wave
ORDER BY arm, wave""",
        "agree share against perma change": f"""
WITH talk AS (
    SELECT study, participant_code, sum(agree_turns) / sum(assistant_turns) AS agree_share
    FROM {source(export, 'conversations')}
    GROUP BY study, participant_code
    HAVING sum(assistant_turns) > 0
), outcome AS (
    SELECT study, participant_code, arm,
           perma_overall_wellbeing - baseline_perma_overall_wellbeing AS perma_change
    FROM {source(export, 'panel')}
    WHERE wave = '{LAST_PERMA_WAVE}' AND response_status = 'completed'
)
SELECT arm, count(*) AS participants, avg(agree_share) AS mean_agree_share,
       avg(perma_change) AS mean_perma_change,
       regr_slope(perma_change, agree_share) AS slope, corr(perma_change, agree_share) AS r
FROM outcome JOIN talk USING (study, participant_code)
GROUP BY arm
ORDER BY arm""",
    }


def read(export: Path, table: str, columns: list[str]) -> pd.DataFrame:
    """A table's parts through pyarrow, the study from the folder name (as DuckDB's hive_partitioning)."""
    frame = pd.read_parquet(export / table, columns=[c for c in columns if c != "study"], partitioning="hive")
    if "study" in columns:
        parts = sorted((export / table).glob("study=*/*.parquet"))
        studies = {part.parent.name.removeprefix("study=") for part in parts}
        if len(studies) != 1:  # the truth below reads one study's export
            raise SystemExit(f"{table}: expected one study's parts, found {sorted(studies)}")
        frame["study"] = studies.pop()
    return frame


def truth_perma(export: Path) -> pd.DataFrame:
    panel = read(export, "panel", ["arm", "wave", "instrument_id", "response_status", "perma_overall_wellbeing",
                                   "baseline_perma_overall_wellbeing"])
    done = panel[(panel.instrument_id == "perma-profiler") & (panel.response_status == "completed")]
    done = done.assign(change=done.perma_overall_wellbeing - done.baseline_perma_overall_wellbeing)
    return done.groupby(["arm", "wave"]).agg(answered=("perma_overall_wellbeing", "size"),
                                             mean_perma=("perma_overall_wellbeing", "mean"),
                                             mean_change=("change", "mean")).reset_index()


def truth_adherence(export: Path) -> pd.DataFrame:
    panel = read(export, "panel", ["arm", "wave", "response_status"])
    sent = panel[(panel.wave != "baseline") & panel.response_status.isin(["completed", "expired", "open"])]
    sent = sent.assign(completed=(sent.response_status == "completed").astype(float))
    return sent.groupby(["arm", "wave"]).agg(sent=("completed", "size"),
                                             completed_share=("completed", "mean")).reset_index()


def truth_agree(export: Path) -> pd.DataFrame:
    conversations = read(export, "conversations", ["study", "participant_code", "agree_turns", "assistant_turns"])
    talk = conversations.groupby(["study", "participant_code"])[["agree_turns", "assistant_turns"]].sum()
    talk = talk[talk.assistant_turns > 0]
    talk = (talk.agree_turns / talk.assistant_turns).rename("agree_share").reset_index()
    panel = read(export, "panel", ["study", "participant_code", "arm", "wave", "response_status",
                                   "perma_overall_wellbeing", "baseline_perma_overall_wellbeing"])
    outcome = panel[(panel.wave == LAST_PERMA_WAVE) & (panel.response_status == "completed")]
    outcome = outcome.assign(perma_change=outcome.perma_overall_wellbeing - outcome.baseline_perma_overall_wellbeing)
    both = outcome.merge(talk, on=["study", "participant_code"])
    rows = []
    for arm, group in both.groupby("arm"):
        x, y = group.agree_share.to_numpy(float), group.perma_change.to_numpy(float)
        varies = len(group) > 1 and x.var() > 0 and y.var() > 0
        slope = np.cov(x, y, bias=True)[0, 1] / x.var() if x.var() > 0 else np.nan
        rows.append({"arm": arm, "participants": len(group), "mean_agree_share": x.mean(),
                     "mean_perma_change": y.mean(), "slope": slope,
                     "r": np.corrcoef(x, y)[0, 1] if varies else np.nan})
    return pd.DataFrame(rows)


TRUTHS: dict[str, Callable[[Path], pd.DataFrame]] = {
    "perma by arm and wave": truth_perma, "adherence by arm and wave": truth_adherence,
    "agree share against perma change": truth_agree}


def same(name: str, got: pd.DataFrame, truth: pd.DataFrame) -> None:
    """Equal row for row: keys and counts exactly, numbers to 1e-9 relative (both missing counts as equal)."""
    keys = [c for c in got.columns if got[c].dtype == object or pd.api.types.is_string_dtype(got[c])]
    got = got.sort_values(keys).reset_index(drop=True)
    truth = truth[list(got.columns)].sort_values(keys).reset_index(drop=True)
    if len(got) != len(truth) or not (got[keys].astype(str).to_numpy() == truth[keys].astype(str).to_numpy()).all():
        raise SystemExit(f"{name}: DuckDB's groups differ from pandas'\n{got}\n{truth}")
    for column in got.columns.difference(keys):
        a, b = got[column].to_numpy(float), truth[column].to_numpy(float)
        if not np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True):
            raise SystemExit(f"{name}.{column}: DuckDB {a} against pandas {b}")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", type=Path, help="a folder written by afterward export --format parquet --partitioned")
    parser.add_argument("--memory-limit", default="1GB", help="DuckDB's memory_limit")
    parser.add_argument("--threads", type=int, default=2, help="DuckDB's threads")
    args = parser.parse_args()
    export = args.export.resolve()
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"load at start: {Path('/proc/loadavg').read_text().strip()}; duckdb {duckdb.__version__}, "
          f"pandas {pd.__version__}")
    parts = sorted(export.glob("*/study=*/*.parquet"))
    print(f"export: {export}, {len(parts)} Parquet parts, {sum(p.stat().st_size for p in parts) / 2**20:,.1f} MB")
    connection = duckdb.connect()
    connection.execute(f"SET memory_limit = '{args.memory_limit}'")
    connection.execute(f"SET threads = {args.threads}")
    results = {}
    for name, statement in recipe(export).items():
        started = time.perf_counter()
        got = connection.execute(statement).df()
        results[name] = (got, time.perf_counter() - started, peak_mb())
    for name, (got, seconds, rss) in results.items():
        started = time.perf_counter()
        truth = TRUTHS[name](export)
        pandas_seconds = time.perf_counter() - started
        same(name, got, truth)
        print(f"\n-- {name}: DuckDB {seconds:.2f} s (peak RSS {rss:,.0f} MB), pandas {pandas_seconds:.2f} s "
              f"(peak RSS {peak_mb():,.0f} MB); the same result")
        print(recipe(Path("EXPORT"))[name].strip())
        with pd.option_context("display.width", 160, "display.max_columns", 20, "display.precision", 4):
            print(got.to_string(index=False))
    print(f"\nload at end: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
