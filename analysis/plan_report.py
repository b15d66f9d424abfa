"""The frozen analysis plan in the report: its analyses run on the report's fits (``run_plan``) and
the report's first section (``plan_section``): the primary analysis with its estimate and interval at
the plan's alpha, the secondary ones with the plan's multiplicity rule, every deviation from the plan,
and which analyses of the report are exploratory (``PlanRun.labels``, one per report section).

The planned figures are the report's own: the PERMA estimands are rows of the report's mixed model
(``PermaTrajectories.fixed_effects`` and ``contrasts``, fitted with every PERMA outcome the plan
names), the regret estimand the role term of its regret model (refitted only when the plan's
covariates differ from the report's). Intervals are at 1 - alpha on the model's own degrees of
freedom (at alpha 0.05 the report's 95% intervals)."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis.estimates import StudyData, regret_model
from analysis.plan import ESTIMANDS, MULTIPLICITY, REGRET_COVARIATES, FileCheck, FrozenPlan, PlannedAnalysis
from analysis.report_html import _Col, _notes, _table

SECTIONS = ("headline", "perma", "regret", "screen", "dropout", "subgroups")  # the report's model sections
NO_PLAN = ("No analysis plan was frozen for this study (`afterward plan freeze`): every analysis in this report is "
           "exploratory.")


@dataclass(frozen=True)
class PlanRun:
    """The plan as run on one report's fits: ``results`` (one row per planned analysis: role,
    label, estimate, interval, p, adjusted p, whether significant, or why not estimated),
    ``deviations`` (sentences), ``exploratory`` (the analyses the plan did not name) and ``labels``
    (what each report section is: pre-registered or exploratory)."""

    frozen: FrozenPlan | None
    results: pd.DataFrame = field(default_factory=pd.DataFrame)
    deviations: list[str] = field(default_factory=list)
    exploratory: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=lambda: dict.fromkeys(SECTIONS, "Exploratory: no analysis "
                                                                                    "plan was frozen."))

    def primary(self) -> dict[str, Any]:
        return dict(self.results[self.results["role"] == "primary"].iloc[0])


def _interval(estimate: float, se: float, df: float, alpha: float) -> tuple[float, float]:
    critical = float(stats.norm.ppf(1 - alpha / 2) if math.isinf(df) else stats.t.ppf(1 - alpha / 2, df))
    return estimate - critical * se, estimate + critical * se


def _estimate(analysis: PlannedAnalysis, frozen: FrozenPlan, suite: Any, data: StudyData | None,
              fit_regret: Callable[..., Any]) -> dict[str, Any]:
    """The planned analysis's row (estimate, se, df, p, participants, observations) or its ``reason``."""
    plan = frozen.plan
    if analysis.model == "perma":
        fit = suite.perma
        if fit is None:
            return {"reason": f"the PERMA model was not estimated: {suite.not_estimated.get('perma', 'no fit')}"}
        if fit.reference != plan.reference_arm:
            return {"reason": f"the PERMA model's reference arm is '{fit.reference}', the plan's "
                              f"'{plan.reference_arm}'"}
        if analysis.estimand == "arm_x_time":
            table = fit.fixed_effects
            rows = table[(table["outcome"] == analysis.outcome)
                         & (table["term"] == f"{plan.arm} vs {plan.reference_arm} x day")]
        else:
            table = fit.contrasts
            rows = table[(table["outcome"] == analysis.outcome) & (table["group"] == plan.arm)
                         & (table["wave"] == analysis.wave)] if not table.empty else table
        if rows.empty:
            return {"reason": f"the PERMA model of {analysis.outcome} has no such estimate (the arm or the wave is "
                              "not in the data, or only one wave was observed)"}
        row = rows.iloc[0]
        df = float(row["df"]) if "df" in row else float(fit.fixed_effects.loc[
            fit.fixed_effects["outcome"] == analysis.outcome, "df"].iloc[0])
        sample = fit.samples[analysis.outcome]
        return {"estimate": float(row["estimate"]), "se": float(row["se"]), "df": df, "p": float(row["p"]),
                "participants": sample.participants, "observations": sample.observations}
    same = (suite.regret is not None and list(analysis.adjusted_for) == list(REGRET_COVARIATES)
            and suite.options.get("focal_role") == plan.focal_role)
    if same:
        regret = suite.regret
    elif data is None:
        return {"reason": "the regret model with the plan's covariates needs the study's data"}
    else:
        try:
            regret = fit_regret(data, features=["role", *analysis.adjusted_for], focal_role=plan.focal_role)
        except ValueError as exc:
            return {"reason": f"the regret model was not estimated: {exc}"}
    if regret is None:
        return {"reason": f"the regret model was not estimated: {suite.not_estimated.get('regret', 'no fit')}"}
    term = f"role_{plan.focal_role}"
    coefficients = regret.coefficients
    rows = coefficients[coefficients["term"] == term]
    if rows.empty or not math.isfinite(float(rows.iloc[0]["se"])):
        return {"reason": f"the regret model has no estimate of the {plan.focal_role} role (no decision after a "
                          f"conversation in that role, or only such decisions)"}
    row = rows.iloc[0]
    return {"estimate": float(row["estimate"]), "se": float(row["se"]), "df": float(regret.fit.df[term]),
            "p": float(row["p"]), "participants": regret.sample.participants,
            "observations": regret.sample.observations}


def run_plan(frozen: FrozenPlan | None, suite: Any, data: StudyData | None = None, *,
             file_check: FileCheck | None = None, protocol_versions: pd.DataFrame | None = None,
             fit_regret: Callable[..., Any] = regret_model) -> PlanRun:
    """Run the frozen plan's analyses on the report's fits (``suite``: an ``analysis.report.ModelSuite``
    fitted with the plan's PERMA outcomes and focal role; ``data`` for a regret model with other
    covariates) and list the deviations: the plan file changed since freezing (``file_check``),
    frozen after outcomes had been read, a protocol version loaded after freezing
    (``protocol_versions``: version, loaded_at), a planned analysis not estimated."""
    if frozen is None:
        return PlanRun(None, exploratory=[NO_PLAN])
    plan = frozen.plan
    rows = []
    for where, analysis in plan.analyses():
        found = _estimate(analysis, frozen, suite, data, fit_regret)
        low, high = (_interval(found["estimate"], found["se"], found["df"], plan.alpha) if "estimate" in found
                     else (math.nan, math.nan))
        rows.append({"role": "primary" if where == "primary" else "secondary", "where": where,
                     "analysis": analysis.label, "outcome": analysis.outcome, "estimand": analysis.estimand,
                     "covariates": ", ".join(analysis.adjusted_for), "estimate": math.nan, "se": math.nan,
                     "df": math.nan, "p": math.nan, "participants": pd.NA, "observations": pd.NA,
                     "reason": None, **found, "ci_low": low, "ci_high": high})
    results = pd.DataFrame(rows)
    results["p_adjusted"] = results["p"]
    secondary = (results["role"] == "secondary") & results["p"].notna()
    if plan.multiplicity != "none" and secondary.any():
        results.loc[secondary, "p_adjusted"] = multipletests(results.loc[secondary, "p"].to_numpy(float),
                                                             alpha=plan.alpha, method=plan.multiplicity)[1]
    results["significant"] = [None if math.isnan(p) else bool(p < plan.alpha) for p in results["p_adjusted"]]

    deviations: list[str] = []
    if file_check is not None and file_check.status != "matches":
        described = file_check.describe()
        deviations.append(described[0].upper() + described[1:] + ". The report runs the plan as it was frozen.")
    if frozen.outcome_reads_before:
        deviations.append(f"The plan was frozen after {frozen.outcome_reads_before} read(s) of the study's outcomes "
                          "had been audited (reports, exports, model fits, response listings): it was not fixed "
                          "before any outcome was read.")
    if protocol_versions is not None and not protocol_versions.empty:
        loaded = pd.to_datetime(protocol_versions["loaded_at"], utc=True)
        for version, at in zip(protocol_versions["version"], loaded, strict=True):
            if at > pd.Timestamp(frozen.frozen_at):
                deviations.append(f"Protocol version {version} was loaded at {at.isoformat(timespec='seconds')}, "
                                  "after the plan was frozen.")
    for row in results[results["estimate"].isna()].to_dict(orient="records"):
        deviations.append(f"The planned {row['role']} analysis '{row['analysis']}' was not estimated: "
                          f"{row['reason']}.")
    return PlanRun(frozen, results, deviations, *_exploratory(frozen))


def _exploratory(frozen: FrozenPlan) -> tuple[list[str], dict[str, str]]:
    plan = frozen.plan
    perma = [f"{w}: {a.label}" for w, a in plan.analyses() if a.model == "perma"]
    regret = [f"{w}: {a.label}" for w, a in plan.analyses() if a.model == "regret"]
    none = "Exploratory: the frozen plan names no analysis in this section."
    labels = dict.fromkeys(SECTIONS, none)
    exploratory = [f"{title}: the whole section" for title in (
        "Immediate rating vs the life afterwards", "Many features at once", "Dropping out of follow-ups",
        "Effects within subgroups")]
    if perma:
        labels["perma"] = ("Pre-registered (" + "; ".join(perma) + "), the plan's first section shows them; every "
                           "other estimate in this section is exploratory.")
        exploratory.append("PERMA well-being over time: every estimate but the planned ones")
    else:
        exploratory.append("PERMA well-being over time: the whole section")
    if regret:
        labels["regret"] = ("Pre-registered (" + "; ".join(regret) + ", the plan's covariates), the plan's first "
                            "section shows it; every other coefficient in this section is exploratory.")
        exploratory.append("Decision regret: every coefficient but the planned role effect")
    else:
        exploratory.append("Decision regret: the whole section")
    return exploratory, labels


RESULT_COLS = [_Col("analysis", "analysis", "text"), _Col("estimand", "estimand", "text"),
               _Col("covariates", "covariates", "text"),
               _Col("estimate (CI at 1 - alpha)", "estimate", "interval", "ci_low", "ci_high"), _Col("SE", "se"),
               _Col("df", "df"), _Col("p", "p", "p"), _Col("p (multiplicity rule)", "p_adjusted", "p"),
               _Col("significant", "significant", "flag"), _Col("participants", "participants", "count"),
               _Col("observations", "observations", "count"), _Col("not estimated because", "reason", "text")]


def plan_section(run: PlanRun) -> str:
    """The report's first section: the frozen plan's primary analysis, the secondary ones, the
    deviations and the exploratory analyses; without a frozen plan, that every analysis is exploratory."""
    head = '<section id="plan" aria-labelledby="plan-title"><h2 id="plan-title">The pre-registered analysis plan</h2>'
    frozen = run.frozen
    if frozen is None:
        return head + f'<p class="plan-status" id="plan-status">{html.escape(NO_PLAN)}</p></section>'
    plan = frozen.plan
    primary = run.primary()
    level = f"{(1 - plan.alpha) * 100:g}%"
    if math.isnan(primary["estimate"]):
        figure = f"not estimated: {primary['reason']}."
    else:
        verdict = "below" if primary["p"] < plan.alpha else "not below"
        figure = (f"{primary['estimate']:.3f} ({level} CI {primary['ci_low']:.3f} to {primary['ci_high']:.3f}; "
                  f"p = {primary['p']:.3g}, {verdict} alpha {plan.alpha:g}), from {primary['participants']} "
                  f"participants and {primary['observations']} observations.")
    frozen_at = frozen.frozen_at.isoformat(timespec="seconds")
    status = (f"Frozen at {frozen_at} by {frozen.frozen_by} from {frozen.source_path} (SHA-256 {frozen.sha256}). "
              f"Alpha {plan.alpha:g}; multiplicity: {MULTIPLICITY[plan.multiplicity]}; the primary analysis is "
              f"tested alone at alpha. Compared: {plan.arm} against {plan.reference_arm}; focal role "
              f"{plan.focal_role}.")
    secondary = run.results[run.results["role"] == "secondary"]
    deviations = ("<h3>Deviations from the plan</h3>" + (_notes(run.deviations) if run.deviations else
                  '<p id="plan-no-deviations">None: the plan file matches the frozen plan, it was frozen before any '
                  "outcome was read, and every planned analysis was estimated.</p>"))
    return (head + f'<p class="plan-status" id="plan-status">{html.escape(status)}</p>'
            + '<h3 id="plan-primary-title">Primary analysis</h3>'
            + f'<p id="plan-primary"><strong>{html.escape(primary["analysis"])}</strong> '
            + f"({html.escape(ESTIMANDS[primary['estimand']])}; adjusted for {html.escape(primary['covariates'])}): "
            + f"{html.escape(figure)}</p>"
            + _table(run.results[run.results["role"] == "primary"], RESULT_COLS, "plan-primary-table",
                     f"The primary analysis, with its {level} interval")
            + "<h3>Secondary analyses</h3>"
            + _table(secondary, RESULT_COLS, "plan-secondary-table",
                     f"Secondary analyses: intervals at {level} unadjusted; p adjusted by the plan's rule "
                     f"({plan.multiplicity})")
            + f'<div id="plan-deviations">{deviations}</div>'
            + '<h3>Exploratory analyses (not named by the plan)</h3><div id="plan-exploratory">'
            + _notes(run.exploratory) + "</div></section>")
