"""Estimands that answer the question: coverage and false positives over many simulated studies.

    nice -n 19 .venv/bin/python bench/estimands.py                       # 200 seeds x 2 scenarios, 300 people
    nice -n 19 .venv/bin/python bench/estimands.py --seeds 50 --workers 1

Each seed draws a study with ``analysis.simulation.synthetic.synthetic_study`` (the example protocol:
PERMA at baseline, day 7 and day 28; decision regret at day 3 and 14) with the default arm x time
effect (0.4 PERMA points per follow-up in the well-being arm, so 0.4 at day 7 and 0.8 at day 28)
and no regret effects, in two scenarios:

- ``null features``: no conversation feature affects any outcome within arm. Every feature row of
  the screen has the truth 0, so each 95% interval's coverage of 0 and the share of raw p < 0.05
  are the screen's false positives; the BH rows say how often a seed declares any feature. Beside
  them, the same features one at a time without the arm (the screen before this change), to show
  the arm standing in. The PERMA mixed model's arm x day term (truth 0.4 / (d2 - d1), d the waves'
  days), its difference at enrollment (0.4 - d1 x that), the differences at each wave (0.4, 0.8),
  the subgroups' arm x day within every level (the same truth) and the coach contrast on regret
  within every level (0) give the coverage of every other reported effect; the headline's within-arm
  R² intervals of the exit rating and the features say how often it claims information that is
  not there.
- ``feature effect``: the same, plus ``--gamma`` PERMA points per unit of the agree share of the
  conversations before the wave, added to each PERMA follow-up (a feature effect within arm; the
  agree share also differs between arms, so it is the feature an unadjusted screen confuses with
  the arm). Coverage of the screen's agree-share interval of ``--gamma``, its power after BH, and
  how often the headline's within-arm R² of the features excludes 0.

Wilson 95% intervals beside every share. Prints the command, the 1-minute load average and the
cores at the start; the figures go in bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import pandas as pd
from common import ROOT  # first: sets the environment and sys.path

from analysis.estimates import (
    StudyData,
    feature_screen,
    immediate_vs_delayed,
    perma_change_outcomes,
    perma_trajectories,
    subgroup_effects,
)
from analysis.estimates.common import OBSERVABLE, floats, perma_rows
from analysis.robust import cluster_ols
from analysis.simulation.population import Effects
from analysis.simulation.synthetic import synthetic_study

ARM_PER_WAVE = Effects().wellbeing_arm_perma_per_wave


def _study(seed: int, participants: int, gamma: float) -> StudyData:
    effects = dataclasses.replace(Effects(), regret_coach=0.0, regret_per_agree_share=0.0)
    study = synthetic_study(participants, seed=seed, effects=effects)
    panel = study.panel()
    if gamma:
        follow_up = perma_change_outcomes(StudyData(panel=panel)).index  # the same index as the panel's rows
        rows = panel.loc[follow_up]
        assistant = floats(rows["conv_assistant_turns"])
        share = (floats(rows["conv_agree_turns"]) / assistant.where(assistant > 0)).fillna(0.0)
        shifted = floats(rows["perma_overall_wellbeing"]) + gamma * share
        panel["perma_overall_wellbeing"] = floats(panel["perma_overall_wellbeing"])
        panel.loc[follow_up, "perma_overall_wellbeing"] = shifted
    return StudyData(panel=panel, conversations=study.conversation_features(), survival=study.survival())


def _unadjusted_false_positives(data: StudyData) -> list[bool]:
    """The screen before: each PERMA-change feature alone (no arm), CR2; p < 0.05 per feature."""
    perma = perma_change_outcomes(data)
    perma = perma[perma["response_status"].astype(str).isin(OBSERVABLE)]
    y = floats(perma["perma_change"])
    out = []
    for feature in ("agree_share", "role_coach", "conv_affirmation_per_100_words", "conv_overrides",
                    "conv_pushback_rate", "conv_mean_exit_rating"):
        x = floats(perma[feature])
        used = y.notna() & x.notna()
        design = pd.DataFrame({"Intercept": 1.0, "x": x[used]})
        result = cluster_ols(y[used], design, perma.loc[used, "participant_code"])
        out.append(bool(result.pvalues["x"] < 0.05))
    return out


def one_seed(seed: int, participants: int, gamma: float, n_boot: int) -> dict[str, Any]:
    warnings.simplefilter("ignore")  # a bench prints figures; the fits' own notes are not read here
    null = _study(seed, participants, 0.0)
    rows, waves, days = perma_rows(null.panel)
    first, last = sorted(days)[0], sorted(days)[-1]
    per_day = ARM_PER_WAVE * (last - first) / (days[last] - days[first])
    truths = {"wellbeing vs control x day": per_day, "wellbeing vs control": ARM_PER_WAVE - days[first] * per_day}

    out: dict[str, Any] = {"seed": seed}
    screen = feature_screen(null)
    table = screen.table
    out["screen_null_covered"] = ((table["ci_low"] <= 0) & (table["ci_high"] >= 0)).tolist()
    out["screen_null_rejected"] = (table["p"] < 0.05).tolist()
    out["screen_null_any_bh"] = {o: bool(table.loc[table["outcome"] == o, "significant_bh"].any())
                                 for o in ("regret", "perma_change")}
    out["unadjusted_rejected"] = _unadjusted_false_positives(null)

    perma = perma_trajectories(null)
    out["perma_covered"] = {term: bool(perma.effect(term)["ci_low"] <= truth <= perma.effect(term)["ci_high"])
                            for term, truth in truths.items()}
    contrasts = perma.contrasts
    out["contrasts_covered"] = [bool(r["ci_low"] <= ARM_PER_WAVE * r["wave_number"] <= r["ci_high"])
                                for r in contrasts.to_dict(orient="records")]

    subgroups = subgroup_effects(null).effects.dropna(subset=["estimate"])
    out["subgroups_covered"] = [bool(r["ci_low"] <= (per_day if r["outcome"] != "regret" else 0.0) <= r["ci_high"])
                                for r in subgroups.to_dict(orient="records")]
    headline = immediate_vs_delayed(null, n_boot=n_boot, seed=seed)
    r2 = headline.table[headline.table["metric"] == "r2"].set_index("outcome")
    out["headline_null_features_low_above_0"] = bool(r2.loc["perma_change", "features_low"] > 0)
    out["headline_null_exit_low_above_0"] = bool(r2.loc["perma_change", "exit_rating_low"] > 0)
    out["headline_arm_low_above_0"] = bool(r2.loc["perma_change", "arm_low"] > 0)

    effect = _study(seed, participants, gamma)
    screen = feature_screen(effect).table
    row = screen[(screen["outcome"] == "perma_change") & (screen["feature"] == "agree_share")].iloc[0]
    out["feature_covered"] = bool(row["ci_low"] <= gamma <= row["ci_high"])
    out["feature_bh"] = bool(row["significant_bh"])
    out["feature_estimate"] = float(row["estimate"])
    headline = immediate_vs_delayed(effect, n_boot=n_boot, seed=seed)
    r2 = headline.table[headline.table["metric"] == "r2"].set_index("outcome")
    out["headline_effect_features_low_above_0"] = bool(r2.loc["perma_change", "features_low"] > 0)
    return out


def wilson(hits: int, n: int) -> str:
    if n == 0:
        return "n/a"
    z = 1.959964
    share = hits / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"{100 * share:5.1f}% ({100 * (centre - half):.1f}-{100 * (centre + half):.1f}), n = {n}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--participants", type=int, default=300)
    parser.add_argument("--gamma", type=float, default=1.0, help="PERMA points per unit of agree share")
    parser.add_argument("--bootstrap", type=int, default=100, help="replicates of the headline's intervals")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"afterward at {ROOT}")
    print("command: " + " ".join(sys.argv))
    print(f"1-minute load average at the start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; "
          f"{args.workers} workers")
    began = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(one_seed, range(1, args.seeds + 1), [args.participants] * args.seeds,
                                [args.gamma] * args.seeds, [args.bootstrap] * args.seeds))
    seconds = time.perf_counter() - began

    def share(values: list[bool]) -> str:
        return wilson(int(sum(values)), len(values))

    def flat(key: str) -> list[bool]:
        return [v for r in results for v in r[key]]

    print(f"\n{args.seeds} seeds x 2 scenarios, {args.participants} participants each, {seconds:.0f} s\n")

    def line(label: str, values: list[bool]) -> None:
        print(f"  {label:44s} {share(values)}")

    print("Coverage of the 95% intervals (target 93-97%):")
    line("PERMA arm x day (mixed model)", [r["perma_covered"]["wellbeing vs control x day"] for r in results])
    line("PERMA arm difference at enrollment", [r["perma_covered"]["wellbeing vs control"] for r in results])
    line("PERMA arm difference at each wave", flat("contrasts_covered"))
    line("subgroup levels (arm x day; coach on regret)", flat("subgroups_covered"))
    line("screen, null features (truth 0)", flat("screen_null_covered"))
    line(f"screen, agree share (truth {args.gamma:g})", [r["feature_covered"] for r in results])
    print("False positives (target at most 6%):")
    line("screen, null features, raw p < 0.05", flat("screen_null_rejected"))
    for outcome in ("regret", "perma_change"):
        line(f"screen, any BH discovery ({outcome})", [r["screen_null_any_bh"][outcome] for r in results])
    line("headline, features' within-arm R² > 0", [r["headline_null_features_low_above_0"] for r in results])
    line("headline, exit rating's within-arm R² > 0", [r["headline_null_exit_low_above_0"] for r in results])
    print("Without the arm (the screen before), null features on PERMA change:")
    line("raw p < 0.05", flat("unadjusted_rejected"))
    print("Power:")
    line("screen, agree share significant after BH", [r["feature_bh"] for r in results])
    line("headline, features' within-arm R² > 0", [r["headline_effect_features_low_above_0"] for r in results])
    line("headline, the arm's R² > 0 (reported apart)", [r["headline_arm_low_above_0"] for r in results])
    estimates = np.array([r["feature_estimate"] for r in results])
    print(f"  agree-share estimate: mean {estimates.mean():.3f} (truth {args.gamma:g}), SD {estimates.std(ddof=1):.3f}")


if __name__ == "__main__":
    main()
