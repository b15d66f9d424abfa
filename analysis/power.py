"""Sample size by simulation: the power of the planned analysis for a target effect.

For each sample size in a grid, ``replicates`` synthetic studies are drawn from the generative
model of ``afterward simulate`` (``analysis.simulation.synthetic``: the protocol's arms, follow-up schedule
and attrition), the analysis model for the effect is fitted to each, and the power is the share of
replicates with p < alpha, with a Wilson interval. The answer is the smallest n of the grid whose
estimated power reaches the target::

    from analysis.power import simulate_power
    curve = simulate_power("regret-role", effect=-5, sizes=[100, 200, 400], replicates=200, seed=1)
    curve.table                    # n, power, ci_low, ci_high, mean estimate, rows analysed
    curve.n_reaching               # smallest n with power >= target, or None

``n`` is the number of participants enrolled, all arms together. The kinds of effect:

- ``regret-role``: decision regret (0-100) after conversations that ended in the coach role minus
  after other roles (``Effects.regret_coach``). Fit: OLS of every answered regret score on
  "ended in coach" and the conversation's share of agree turns (the generative model's other
  term), standard errors clustered by participant (t with clusters - 1 degrees of freedom).
- ``perma-arm``: PERMA overall well-being (0-10) in the well-being arm minus control at one PERMA
  follow-up (by default the last; the effect is ``Effects.wellbeing_arm_perma_per_wave`` x that
  follow-up's number). Fit: OLS of that wave's score on arm and baseline score (ANCOVA) among
  those who answered it, complete-case as the models' default. It is fast, and for one wave it is
  what a MixedLM estimates; a MixedLM over every wave also uses the earlier waves, so this power
  is, if anything, slightly conservative.
- ``two-means``: the textbook setting, n/2 per arm of a normal outcome with SD ``sd``, each value
  missing with probability ``attrition``, Student's t-test. Its closed form is
  ``closed_form_n_per_arm``; the simulation reproducing it checks the machinery.

Attrition: for the generative kinds by default the Effects' own (answering and withdrawal that
depend on baseline well-being, as in the full simulation); a number instead makes each follow-up
go unanswered with that probability, at random, with no withdrawals. Every replicate's seed comes
from (seed, n, replicate), so a point of the curve does not change when the grid does.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from analysis.panel import PERMA, REGRET
from analysis.simulation.population import Effects
from analysis.simulation.synthetic import SyntheticStudy, load_protocol, synthetic_study
from study.protocol import Protocol

FloatArray = npt.NDArray[np.float64]
Kind = Literal["regret-role", "perma-arm", "two-means"]
KINDS: tuple[Kind, ...] = ("regret-role", "perma-arm", "two-means")
MODELS: dict[Kind, str] = {
    "regret-role": "OLS regret ~ coach + agree share, SE clustered by participant",
    "perma-arm": "OLS (ANCOVA) PERMA overall at the wave ~ arm + baseline, those who answered",
    "two-means": "Student's t-test of two arms of n/2",
}


def closed_form_n_per_arm(delta: float, sd: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """n per arm = 2 (z_{1-alpha/2} + z_{power})^2 sd^2 / delta^2: two arms, two-sided test of
    their means with known SD (normal approximation)."""
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return float(2 * z**2 * sd**2 / delta**2)


def closed_form_power(n_per_arm: float, delta: float, sd: float, alpha: float = 0.05) -> float:
    """The power of the same test with ``n_per_arm`` per arm (both tails counted)."""
    shift = abs(delta) / (sd * math.sqrt(2 / n_per_arm))
    z = stats.norm.ppf(1 - alpha / 2)
    return float(stats.norm.cdf(shift - z) + stats.norm.cdf(-shift - z))


def sample_sizes(minimum: int, maximum: int, steps: int) -> list[int]:
    """``steps`` sizes from ``minimum`` to ``maximum``, evenly spaced, rounded to even numbers (two
    arms of equal size), distinct."""
    if minimum < 4 or maximum < minimum or steps < 1:
        raise ValueError("sizes need 4 <= min <= max and at least one step")
    points = np.linspace(minimum, maximum, steps) if steps > 1 else np.array([maximum])
    return sorted({int(2 * round(p / 2)) for p in points})


@dataclass(frozen=True)
class PowerPoint:
    """One n of the curve: how many replicates rejected at alpha, with a Wilson 95% interval."""

    n: int
    replicates: int
    rejections: int
    ci_low: float
    ci_high: float
    mean_estimate: float  # the fitted effect averaged over the replicates (should be near the truth)
    sd_estimate: float  # its SD over the replicates: the estimator's standard error at this n
    mean_rows: float  # observations analysed per replicate (after attrition)

    @property
    def power(self) -> float:
        return self.rejections / self.replicates


@dataclass
class PowerCurve:
    """The result of ``simulate_power``: the points, what was assumed, and the answer."""

    kind: Kind
    effect: float
    alpha: float
    target: float
    replicates: int
    seed: int
    model: str
    attrition: float | None
    sd: float | None
    wave: str | None
    points: list[PowerPoint] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def table(self) -> pd.DataFrame:
        return pd.DataFrame([{"n": p.n, "replicates": p.replicates, "power": p.power, "ci_low": p.ci_low,
                              "ci_high": p.ci_high, "mean_estimate": p.mean_estimate, "sd_estimate": p.sd_estimate,
                              "mean_rows": p.mean_rows} for p in self.points])

    @property
    def n_reaching(self) -> int | None:
        """The smallest n of the grid whose estimated power reaches the target."""
        return next((p.n for p in self.points if p.power >= self.target), None)

    @property
    def closed_form_n(self) -> float | None:
        """For two-means: the closed-form total n (both arms) for the target power, inflated by
        1 / (1 - attrition) for the values that go missing."""
        if self.kind != "two-means" or self.sd is None:
            return None
        return 2 * closed_form_n_per_arm(self.effect, self.sd, self.alpha, self.target) / (1 - (self.attrition or 0))


def with_attrition(effects: Effects, attrition: float) -> Effects:
    """The Effects with each follow-up unanswered with probability ``attrition`` at random and
    nobody withdrawing (0: everyone answers everything)."""
    if not 0 <= attrition < 1:
        raise ValueError("attrition must be at least 0 and below 1")
    answer = math.inf if attrition == 0 else math.log((1 - attrition) / attrition)
    return dataclasses.replace(effects, answer_logit=answer, answer_per_baseline_point=0.0,
                               withdraw_weekly_logit=-math.inf, withdraw_per_baseline_point=0.0)


def perma_waves(protocol: Protocol) -> list[str]:
    """The protocol's enrollment-anchored PERMA follow-ups in order (k = 1, 2, ...)."""
    return [f.id for f in sorted((f for f in protocol.followups if f.instrument == PERMA
                                  and f.anchor == "enrollment"), key=lambda f: f.offset)]


def perma_wave(protocol: Protocol, wave: str | None) -> tuple[str, int]:
    """The PERMA follow-up perma-arm looks at (default the last) and its number k; ValueError when
    the protocol has none or ``wave`` is not one of them."""
    waves = perma_waves(protocol)
    if not waves:
        raise ValueError("the protocol has no enrollment-anchored perma-profiler follow-up")
    chosen = wave or waves[-1]
    if chosen not in waves:
        raise ValueError(f"'{chosen}' is not a PERMA follow-up of the protocol; one of {', '.join(waves)}")
    return chosen, waves.index(chosen) + 1


def _regret_rows(study: SyntheticStudy) -> pd.DataFrame:
    """Answered regret waves with the conversation that led to the decision."""
    deleted = study.people["data_deleted"].to_numpy(dtype=bool)
    waves = study.waves
    rows = waves[(waves["instrument_id"] == REGRET) & (waves["response_status"] == "completed")
                 & waves["decision_conversation_id"].notna()]
    rows = rows[~deleted[rows["person"].to_numpy(dtype=np.int64)]]
    source = study.conversations.set_index("conversation_id").loc[
        rows["decision_conversation_id"].to_numpy(dtype=np.int64)]
    return pd.DataFrame({"person": rows["person"].to_numpy(), "regret": rows["regret"].to_numpy(dtype=float),
                         "coach": (source["final_role"] == "coach").to_numpy(dtype=float),
                         "agree_share": source["agree_share"].to_numpy(dtype=float)})


def _perma_rows(study: SyntheticStudy, wave: str) -> pd.DataFrame:
    """One answered PERMA follow-up ``wave`` per participant, with the baseline and the arm."""
    people = study.people
    waves = study.waves
    rows = waves[(waves["wave"] == wave) & (waves["response_status"] == "completed")]
    person = people.iloc[rows["person"].to_numpy(dtype=np.int64)]
    kept = ~person["data_deleted"].to_numpy(dtype=bool)
    return pd.DataFrame({"overall": rows["perma_overall_wellbeing"].to_numpy(dtype=float)[kept],
                         "baseline": person["baseline_perma_overall_wellbeing"].to_numpy(dtype=float)[kept],
                         "wellbeing": (person["mode"] == "wellbeing").to_numpy(dtype=float)[kept]})


def fit_regret_role(study: SyntheticStudy) -> tuple[float, float, int]:
    """(estimate, p-value, rows) of the coach effect on regret; p is NaN when it cannot be fitted
    (no coach or no other decision answered, or fewer than three participants)."""
    rows = _regret_rows(study).dropna()
    if rows["coach"].nunique() < 2 or rows["person"].nunique() < 3:
        return math.nan, math.nan, len(rows)
    design = np.column_stack([np.ones(len(rows)), rows["coach"], rows["agree_share"]])
    fit = sm.OLS(rows["regret"].to_numpy(), design).fit(
        cov_type="cluster", cov_kwds={"groups": rows["person"].to_numpy()}, use_t=True)
    return float(fit.params[1]), float(fit.pvalues[1]), len(rows)


def fit_perma_arm(study: SyntheticStudy, wave: str) -> tuple[float, float, int]:
    """(estimate, p-value, rows) of the arm difference at ``wave``, adjusted for baseline."""
    rows = _perma_rows(study, wave).dropna()
    if rows["wellbeing"].nunique() < 2 or len(rows) < 4:
        return math.nan, math.nan, len(rows)
    design = np.column_stack([np.ones(len(rows)), rows["wellbeing"], rows["baseline"]])
    fit = sm.OLS(rows["overall"].to_numpy(), design).fit()
    return float(fit.params[1]), float(fit.pvalues[1]), len(rows)


def _two_means(n: int, effect: float, sd: float, attrition: float, seeds: list[int]
               ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(estimates, p-values, values kept) of one two-arm study per seed: n/2 per arm, each value
    missing with probability ``attrition``, Student's t-test (scipy, on the arms' summaries)."""
    half = n // 2
    arms = np.empty((len(seeds), 2, half))
    for r, seed in enumerate(seeds):
        rng = np.random.default_rng(seed)
        arms[r] = rng.normal([[0.0], [effect]], sd, (2, half))
        arms[r][rng.random((2, half)) < attrition] = np.nan
    kept = np.sum(~np.isnan(arms), axis=2)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an arm with fewer than two values: p NaN
        means, sds = np.nanmean(arms, axis=2), np.nanstd(arms, axis=2, ddof=1)
        test = stats.ttest_ind_from_stats(means[:, 1], sds[:, 1], kept[:, 1], means[:, 0], sds[:, 0], kept[:, 0])
    usable = (kept >= 2).all(axis=1)
    return (np.where(usable, means[:, 1] - means[:, 0], np.nan), np.where(usable, test.pvalue, np.nan),
            kept.sum(axis=1).astype(float))


def replicate_seed(seed: int, n: int, replicate: int) -> int:
    """The seed of one replicate: from (seed, n, replicate), so points do not depend on the grid."""
    return int(np.random.SeedSequence([seed, n, replicate]).generate_state(1)[0])


def simulate_power(kind: Kind, effect: float, *, sizes: Sequence[int], replicates: int = 200, alpha: float = 0.05,
                   target: float = 0.8, sd: float = 1.0, attrition: float | None = None,
                   effects: Effects | None = None, protocol: Protocol | None = None, wave: str | None = None,
                   weeks: int | None = None, seed: int = 0,
                   progress: Callable[[PowerPoint], None] | None = None) -> PowerCurve:
    """Power at each n of ``sizes`` (see the module docstring for the kinds, fits and attrition).
    ``effects`` gives the rest of the generative model (default ``Effects()``); ``sd`` is used by
    two-means only; ``wave`` is the PERMA follow-up of perma-arm (default the last)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind '{kind}'; one of {', '.join(KINDS)}")
    if not 0 < alpha < 1 or not 0 < target < 1:
        raise ValueError("alpha and the target power must be between 0 and 1")
    if replicates < 1 or not sizes or min(sizes) < 4:
        raise ValueError("need at least one replicate and sample sizes of at least 4")
    if seed < 0:
        raise ValueError("the seed must not be negative")
    if attrition is not None and not 0 <= attrition < 1:
        raise ValueError("attrition must be at least 0 and below 1")
    if kind == "two-means" and not sd > 0:
        raise ValueError("sd must be positive")
    began = time.perf_counter()
    protocol = protocol or load_protocol()
    model = effects or Effects()
    if attrition is not None and kind != "two-means":
        model = with_attrition(model, attrition)
    chosen: str | None = None
    if kind == "regret-role":
        model = dataclasses.replace(model, regret_coach=effect)
    elif kind == "perma-arm":
        chosen, k = perma_wave(protocol, wave)
        model = dataclasses.replace(model, wellbeing_arm_perma_per_wave=effect / k)
    curve = PowerCurve(kind=kind, effect=effect, alpha=alpha, target=target, replicates=replicates, seed=seed,
                       model=MODELS[kind], attrition=attrition, sd=sd if kind == "two-means" else None, wave=chosen)
    for n in sorted(set(sizes)):
        seeds = [replicate_seed(seed, n, r) for r in range(replicates)]
        if kind == "two-means":
            estimates, p_values, rows = _two_means(n, effect, sd, attrition or 0.0, seeds)
        else:
            fits = []
            for seed_r in seeds:
                study = synthetic_study(n, weeks=weeks, seed=seed_r, effects=model, protocol=protocol,
                                        chat=kind == "regret-role")
                fits.append(fit_regret_role(study) if kind == "regret-role" else fit_perma_arm(study, chosen or ""))
            estimates, p_values, rows = (np.array(column, dtype=float) for column in zip(*fits, strict=True))
        rejected = int(np.sum(p_values < alpha))  # a replicate that could not be fitted (p NaN) did not reject
        low, high = proportion_confint(rejected, replicates, alpha=0.05, method="wilson")
        fitted = estimates[~np.isnan(estimates)]
        point = PowerPoint(n=n, replicates=replicates, rejections=rejected, ci_low=float(low), ci_high=float(high),
                           mean_estimate=float(fitted.mean()) if len(fitted) else math.nan,
                           sd_estimate=float(fitted.std(ddof=1)) if len(fitted) > 1 else math.nan,
                           mean_rows=float(rows.mean()))
        curve.points.append(point)
        if progress is not None:
            progress(point)
    curve.seconds = time.perf_counter() - began
    return curve


def text_plot(curve: PowerCurve, width: int = 40) -> list[str]:
    """The curve as lines of text: a bar per n (power from 0 to 1), '|' at the target power."""
    mark = round(curve.target * width)
    lines = []
    for point in curve.points:
        filled = round(point.power * width)
        bar = "".join("|" if i == mark else "#" if i < filled else "." for i in range(width + 1))
        lines.append(f"{point.n:>7}  {bar}  {point.power:.2f}")
    return lines
