"""Analysis: the model suite and the report on a large simulated panel, and coverage by simulation.

    .venv/bin/python bench/analysis_models.py                                   # 10,000 participants x 4 waves
    .venv/bin/python bench/analysis_models.py --participants 2000 --bootstrap 200
    .venv/bin/python bench/analysis_models.py --coverage --replicates 100 --coverage-participants 400

The suite: ``analysis.simulation.synthetic.synthetic_study`` draws the analysis tables of a study straight from
the generative model (the example protocol: baseline, perma-week-1, perma-week-4 and the
decision-anchored regret-day-3 and regret-day-14), then ``analysis.report.fit_models`` fits every
model of the report and ``render_report`` writes it, in a process of its own as ``afterward models
fit`` runs (the frames handed over as Parquet; ``--in-process``: in this one). Seconds per model and
in total, and peak RSS after each step. Baseline, in the same run: one statsmodels ``MixedLM`` fit (REML, participant
random intercepts) of the same PERMA follow-ups on baseline, wave, arm and arm x wave, from a table
built here.

``--coverage``: R seeds of synthetic studies with the default effects and R with every effect zero
(``null_effects``); for each effect, the share of 95% intervals that contain the truth, and under
the null the share of p < 0.05 (Wilson 95% intervals beside both).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import statsmodels.api as sm
from common import ROOT  # first: sets the environment and sys.path

from analysis.estimates import StudyData, dropout_survival, perma_trajectories, regret_model
from analysis.estimates.common import model_columns, narrowed_column
from analysis.panel import PERMA
from analysis.report import ReportHeader, fit_models, participant_numbers, render_report
from analysis.simulation.synthetic import SyntheticStudy, null_effects, synthetic_study


def peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM, which starts afresh at exec (ru_maxrss keeps the forking
    parent's, so the suite's process reported the 5.5 GB parent's peak from its first line)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def frames(study: SyntheticStudy) -> StudyData:
    return StudyData(panel=study.panel(), conversations=study.conversation_features(), survival=study.survival(),
                     study="synthetic", read_at=study.read_at)


def baseline_mixedlm(panel: pd.DataFrame) -> tuple[float, int]:
    """One MixedLM fit of the PERMA follow-ups, the table built by hand: (seconds, rows)."""
    rows = panel[(panel["instrument_id"] == PERMA) & (panel["anchor_key"] == "enrollment")
                 & (panel["wave"] != "baseline") & (panel["response_status"] == "completed")]
    rows = rows[rows["baseline_perma_overall_wellbeing"].notna() & rows["perma_overall_wellbeing"].notna()]
    rows = rows.sort_values(["participant_code", "days_since_enrollment"])
    wave = (rows["wave"] == "perma-week-4").astype(float) + 1.0
    arm = (rows["arm"] == "wellbeing").astype(float)
    design = pd.DataFrame({"Intercept": 1.0, "baseline": rows["baseline_perma_overall_wellbeing"].astype(float),
                           "wave": wave, "arm": arm, "arm_wave": arm * wave})
    began = time.perf_counter()
    sm.MixedLM(rows["perma_overall_wellbeing"].astype(float), design, groups=rows["participant_code"]).fit(reml=True)
    return time.perf_counter() - began, len(rows)


def run_suite(args: argparse.Namespace) -> None:
    steps: list[tuple[str, float, float]] = []

    def step(name: str, seconds: float) -> None:
        steps.append((name, seconds, peak_rss_mb()))
        print(f"  {name:<34} {seconds:7.2f} s   peak RSS {steps[-1][2]:7.0f} MB", flush=True)

    print(f"suite: {args.participants:,} participants, seed {args.seed}, {args.bootstrap} bootstrap replicates; "
          f"peak RSS after the imports {peak_rss_mb():.0f} MB")
    began = time.perf_counter()
    study = synthetic_study(args.participants, seed=args.seed)
    step("draw the synthetic study", time.perf_counter() - began)
    began = time.perf_counter()
    data = frames(study)
    step("shape panel, features, survival", time.perf_counter() - began)
    panel = data.panel
    waves = panel[panel["anchor_key"] == "enrollment"].groupby("wave")["response_status"].value_counts().unstack()
    print(f"  panel: {len(panel):,} rows, {panel['participant_code'].nunique():,} participants; conversations: "
          f"{len(data.conversations):,}\n{waves.fillna(0).astype(int).to_string()}")
    seconds, rows = baseline_mixedlm(panel)
    step(f"baseline: one MixedLM ({rows:,} rows)", seconds)
    baseline = seconds

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp()) / "report.html"
    if args.in_process:
        suite_seconds, suite_rss = suite_and_report(data, study, args, out, step)
    else:
        # The suite in a process of its own, as `afterward models fit` runs it: the frames handed over
        # as Parquet (the synthetic draw's own memory is not the suite's), its peak RSS its own.
        folder = Path(tempfile.mkdtemp())
        for name in ("panel", "conversations", "survival"):
            getattr(data, name).to_parquet(folder / f"{name}.parquet")
        assert data.read_at is not None
        (folder / "study.txt").write_text(f"{study.start.isoformat()}\n{data.read_at.isoformat()}")
        study.people[["arm", "data_deleted"]].to_parquet(folder / "people.parquet")
        del data, panel, study
        began = time.perf_counter()
        child = subprocess.run([sys.executable, __file__, "--suite-from", str(folder), "--out", str(out),
                                "--bootstrap", str(args.bootstrap), "--seed", str(args.seed),
                                "--participants", str(args.participants)], check=True, capture_output=True, text=True)
        print(child.stdout, end="", flush=True)
        found = dict(line.split("=", 1) for line in child.stdout.splitlines() if line.startswith("suite_"))
        suite_seconds, suite_rss = float(found["suite_seconds"]), float(found["suite_peak_rss_mb"])
        print(f"  (the suite's CPU seconds in its own process: {float(found['suite_cpu_seconds']):.1f})")
        print(f"  (the child process, started to finished: {time.perf_counter() - began:.1f} s)")
    print(f"report: {out} ({out.stat().st_size / 1e6:.1f} MB)")
    print("\n| step | seconds | peak RSS MB |\n|---|---|---|")
    for name, s, rss in steps:
        print(f"| {name} | {s:.2f} | {rss:.0f} |")
    print(f"\nsuite (models + report) {suite_seconds:.1f} s, peak RSS {suite_rss:.0f} MB"
          f"{'' if args.in_process else ' in its own process'}; {suite_seconds / baseline:.2f}x the baseline "
          f"MixedLM fit of {baseline:.1f} s in the same run")


def suite_and_report(data: StudyData, study: SyntheticStudy | None, args: argparse.Namespace, out: Path,
                     step: Callable[[str, float], None], people: pd.DataFrame | None = None,
                     start: Any = None) -> tuple[float, float]:
    """fit_models and render_report: (seconds, peak RSS MB of this process)."""
    suite = fit_models(data, n_boot=args.bootstrap, seed=args.seed, progress=lambda name, s: step(f"model {name}", s))
    began = time.perf_counter()
    people = study.people if study is not None else people
    assert people is not None
    deleted = {str(arm): int(n) for arm, n in people[people["data_deleted"]].groupby("arm").size().items()}
    versions = pd.DataFrame({"version": [1], "loaded_at": [study.start if study is not None else start],
                             "sha256": ["(synthetic)"]})
    assert data.read_at is not None
    header = ReportHeader("synthetic", f"Synthetic study, {args.participants:,} participants", data.read_at,
                          participant_numbers(data.panel, deleted), versions)
    page = render_report(header, suite)
    out.write_text(page, encoding="utf-8")
    rendering = time.perf_counter() - began
    step("render and write the report", rendering)
    print(f"\nnot estimated: {suite.not_estimated or 'none'}")
    return sum(suite.seconds.values()) + rendering, peak_rss_mb()


def read_for_models(path: Path) -> pd.DataFrame:
    """Only the columns the suite reads, each narrowed as it comes out of Arrow, as
    ``StudyData.for_models`` narrows what ``afterward models fit`` loads (no second whole copy)."""
    table = pq.read_table(path, columns=model_columns(pq.read_schema(path).names))
    columns = {}
    for name in table.column_names:
        columns[name] = narrowed_column(name, table.select([name]).to_pandas()[name])
    frame = pd.DataFrame(columns)
    del table, columns
    pa.default_memory_pool().release_unused()
    return frame


def run_suite_from(args: argparse.Namespace) -> None:
    """The child: read the frames, fit and render, print the figures."""
    folder = Path(args.suite_from)
    print(f"  suite process: peak RSS after the imports {peak_rss_mb():.0f} MB")
    began = time.perf_counter()
    start, read_at = (folder / "study.txt").read_text().splitlines()
    data = StudyData(panel=read_for_models(folder / "panel.parquet"),
                     conversations=read_for_models(folder / "conversations.parquet"),
                     survival=pd.read_parquet(folder / "survival.parquet"), study="synthetic",
                     read_at=dt.datetime.fromisoformat(read_at))
    print(f"  {'read the frames (Parquet)':<34} {time.perf_counter() - began:7.2f} s   peak RSS "
          f"{peak_rss_mb():7.0f} MB", flush=True)
    cpu = [time.process_time()]  # CPU seconds per step: comparable between runs on a loaded machine

    def step(name: str, seconds: float) -> None:
        cpu.append(time.process_time())
        print(f"  {name:<34} {seconds:7.2f} s   CPU {cpu[-1] - cpu[-2]:7.2f} s   peak RSS {peak_rss_mb():7.0f} MB",
              flush=True)

    seconds, rss = suite_and_report(data, None, args, Path(args.out), step,
                                    people=pd.read_parquet(folder / "people.parquet"),
                                    start=dt.datetime.fromisoformat(start))
    print(f"suite_seconds={seconds}\nsuite_cpu_seconds={time.process_time() - cpu[0]}\nsuite_peak_rss_mb={rss}")


# Coverage


def _wilson(successes: int, n: int) -> tuple[float, float]:
    if n == 0:
        return math.nan, math.nan
    z = 1.959963984540054
    share = successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


Estimate = Callable[[dict[str, Any]], tuple[float, float, float, float]]  # estimate, 95% interval, p


def _row(frame: pd.DataFrame, term: str, estimate: str = "estimate", low: str = "ci_low",
         high: str = "ci_high") -> tuple[float, float, float, float]:
    row: Any = frame.set_index("term").loc[term]
    return float(row[estimate]), float(row[low]), float(row[high]), float(row["p"])


def _cox(fits: dict[str, Any]) -> tuple[float, float, float, float]:
    """The Cox model's log hazard ratio of baseline well-being, with its interval."""
    ratio, low, high, p = _row(fits["dropout"].cox, "baseline_wellbeing", "hazard_ratio", "hr_low", "hr_high")
    return math.log(ratio), math.log(low), math.log(high), p


def _cr1(term: str) -> Estimate:
    """The regret model's ``term`` with statsmodels' CR1 cluster-robust errors and normal
    intervals (what the model used before CR2): the baseline for the false-positive rate."""
    def estimate(fits: dict[str, Any]) -> tuple[float, float, float, float]:
        model = fits["regret"]
        groups = pd.factorize(model.frame["participant_code"])[0]
        direct = sm.OLS(model.fit.ols.model.endog, model.fit.ols.model.exog).fit(
            cov_type="cluster", cov_kwds={"groups": groups})
        j = list(model.fit.params.index).index(term)
        low, high = direct.conf_int()[j]
        return float(direct.params[j]), float(low), float(high), float(direct.pvalues[j])
    return estimate


def _arm_per_follow_up(fits: dict[str, Any]) -> tuple[float, float, float, float]:
    """The PERMA model's arm x day effect times the days between the first two follow-ups: the
    change in the arm difference from one follow-up to the next (the truth's units)."""
    means = fits["perma"].marginal_means.drop_duplicates("wave_number").set_index("wave_number")["days"]
    span = float(means.iloc[1] - means.iloc[0])
    estimate, low, high, p = _row(fits["perma"].fixed_effects, "wellbeing vs control x day")
    return estimate * span, low * span, high * span, p


def _arm_at_first_wave(fits: dict[str, Any]) -> tuple[float, float, float, float]:
    row: Any = fits["perma"].contrasts.set_index("wave_number").loc[1]
    return float(row["estimate"]), float(row["ci_low"]), float(row["ci_high"]), float(row["p"])


# (label, its truth: a name in Effects.true_effects(), "zero", or None for no single true value; the estimate)
EFFECTS: list[tuple[str, str | None, Estimate]] = [
    ("arm x time on PERMA (per day x days between follow-ups)", "wellbeing_arm_perma_per_wave", _arm_per_follow_up),
    ("arm at the first follow-up on PERMA (points)", "wellbeing_arm_perma_per_wave", _arm_at_first_wave),
    ("coach role on regret (points)", "regret_coach", lambda f: _row(f["regret"].coefficients, "role_coach")),
    ("agree share on regret (points per unit)", "regret_per_agree_share",
     lambda f: _row(f["regret"].coefficients, "agree_share")),
    ("baseline: coach role on regret, statsmodels CR1", "regret_coach", _cr1("role_coach")),
    ("baseline: agree share on regret, statsmodels CR1", "regret_per_agree_share", _cr1("agree_share")),
    ("baseline on completing a follow-up (log-odds/point)", "answer_log_odds_per_baseline_point",
     lambda f: _row(f["dropout"].response, "baseline_wellbeing")),
    ("baseline on the dropout hazard (Cox log HR/point)", None, _cox),
]


def _fits(study: SyntheticStudy) -> dict[str, Any]:
    data = frames(study)
    return {"perma": perma_trajectories(data), "regret": regret_model(data), "dropout": dropout_survival(data)}


def run_coverage(args: argparse.Namespace) -> None:
    n, replicates = args.coverage_participants, args.replicates
    print(f"coverage: {replicates} seeds x (default effects, null effects), {n} participants each")
    records: list[dict[str, Any]] = []
    began = time.perf_counter()
    for seed in range(replicates):
        for world in ("effects", "null"):
            study = synthetic_study(n, seed=10_000 + seed, effects=null_effects() if world == "null" else None)
            truths = {name: effect["value"] for name, effect in study.true_effects.items()}
            fits = _fits(study)
            for label, truth_name, estimate_of in EFFECTS:
                estimate, low, high, p = estimate_of(fits)
                truth = 0.0 if truth_name == "zero" or world == "null" else (
                    truths[truth_name] if truth_name is not None else math.nan)
                records.append({"world": world, "effect": label, "seed": seed, "truth": truth, "estimate": estimate,
                                "low": low, "high": high, "p": p})
        if (seed + 1) % max(1, replicates // 10) == 0:
            print(f"  {seed + 1} seeds, {time.perf_counter() - began:.0f} s", flush=True)
    table = pd.DataFrame(records)
    print(f"\n{replicates} seeds, {n} participants, {time.perf_counter() - began:.0f} s\n")
    print("| effect | truth | mean estimate | 95% CI covers the truth | null: truth 0 covered | "
          "null: p < 0.05 |\n|---|---|---|---|---|---|")
    for label, _, _ in EFFECTS:
        cells = []
        mine = table[(table["effect"] == label) & (table["world"] == "effects")]
        null = table[(table["effect"] == label) & (table["world"] == "null")]
        truth = float(mine["truth"].iloc[0])
        for frame in (mine, null):
            known = frame.dropna(subset=["truth"])
            hits = int(((known["low"] <= known["truth"]) & (known["truth"] <= known["high"])).sum())
            low, high = _wilson(hits, len(known))
            cells.append(f"{hits / len(known):.0%} ({low:.0%}-{high:.0%})" if len(known) else "–")
        positives = int((null["p"] < 0.05).sum())
        low, high = _wilson(positives, len(null))
        shown_truth = f"{truth:+g}" if not math.isnan(truth) else "no single value"
        print(f"| {label} | {shown_truth} | {mine['estimate'].mean():+.3f} | {cells[0]} | {cells[1]} | "
              f"{positives / len(null):.0%} ({low:.0%}-{high:.0%}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--participants", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bootstrap", type=int, default=500, help="replicates of the immediate-vs-delayed table")
    parser.add_argument("--out", help="where to write the report (default: a temporary directory)")
    parser.add_argument("--coverage", action="store_true", help="run the coverage section instead of the suite")
    parser.add_argument("--replicates", type=int, default=100, help="coverage: seeds")
    parser.add_argument("--coverage-participants", type=int, default=400, help="coverage: participants per study")
    parser.add_argument("--in-process", action="store_true",
                        help="fit the suite in this process (its peak RSS then includes the synthetic draw's)")
    parser.add_argument("--suite-from", help=argparse.SUPPRESS)  # the suite's own process: the frames' folder
    args = parser.parse_args()
    if not args.suite_from:
        print(f"afterward at {ROOT}")
    if args.suite_from:
        run_suite_from(args)
    elif args.coverage:
        run_coverage(args)
    else:
        run_suite(args)


if __name__ == "__main__":
    main()
