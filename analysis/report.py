"""The analysis report: one self-contained HTML file with the study's numbers at the top and every
model of ``analysis.estimates`` below (tables, plots, and who is in each fit), for researchers and
admins; every run is audited (``study.analyze``).

    >>> from analysis.report import write_report
    >>> result = write_report(engine, "wellbeing-pilot", Path("report.html"), actor=Actor.system("cli"))
    >>> result.suite.headline.table                      # the same tables the report shows

From frames instead of a database (a notebook, a synthetic study, the bench)::

    suite = fit_models(StudyData(panel=..., conversations=..., survival=...))
    page = render_report(ReportHeader(...), suite)

Opening the file reaches no network: the style is inline and the plots are inline SVG drawn by
matplotlib (a bare ``Figure``, so no GUI backend; text kept as SVG text). Every shown string is
escaped. Each number carries its full value in a ``data-value`` attribute (intervals also
``data-low`` and ``data-high``), so a reader or a test can check it against the models' tables.

Who may run it: the study's researchers and admins, and system actors (the CLI without ``--as``).
Viewers are refused. The report is computed from row-level data and is not put through the
aggregate tables' disclosure rule (``analysis.aggregates``): Kaplan-Meier curves step at each
dropout's day and their numbers at risk count single people, and a model's cells (an arm at a
wave, a subgroup level, a feature's estimate) may rest on a handful of participants. Viewers
have the aggregates export, which is.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session
from threadpoolctl import ThreadpoolController

from analysis.diagnostics import DIAGNOSTICS_TITLE, Diagnostics, diagnose, diagnostics_section
from analysis.estimates import (
    DropoutSurvival,
    FeatureScreen,
    ImmediateVsDelayed,
    PermaTrajectories,
    RegretModel,
    Sample,
    StudyData,
    SubgroupEffects,
    dropout_survival,
    feature_screen,
    immediate_vs_delayed,
    perma_trajectories,
    regret_model,
    subgroup_effects,
)
from analysis.estimates.dropout import COMPETING, ESTIMAND
from analysis.exports import ExportRefused, open_study
from analysis.flow import flow_table, participant_flow
from analysis.methods import METHODS_TITLE, methods_section
from analysis.panel import participant_states
from analysis.plan import FileCheck, check_file, frozen_plan
from analysis.plan_report import PlanRun, plan_section, run_plan
from analysis.reading import Source, connect, resolve_study_id
from analysis.report_html import _Col, _format, _notes, _table
from analysis.report_plots import Forest, figure_html, forest_plot, km_plot, trajectory_plot
from analysis.sensitivity import IMPUTATIONS, SENSITIVITY_TITLE, Sensitivity, sensitivity_analyses, sensitivity_section
from analysis.software import packages_line
from study import audit
from study.clock import now
from study.db import READ_ONLY, session_scope
from study.errors import Forbidden
from study.models import Participant, ProtocolVersion

ACTION = "study.analyze"  # the audit log's action for a report run
STILL_TO_COME = ("open", "not_yet_due", "overdue")  # panel statuses of a survey not over yet
MODEL_TITLES = {
    "headline": "Immediate rating vs the life afterwards",
    "perma": "PERMA well-being over time",
    "regret": "Decision regret and the conversation that led to the decision",
    "screen": "Many features at once",
    "dropout": "Dropping out of follow-ups",
    "subgroups": "Effects within subgroups",
}


_threads = ThreadpoolController()


class ReportRefused(Forbidden):
    """The actor may not see the report of this study (viewers; staff without a role in it)."""


def software_version() -> str:
    try:
        return metadata.version("afterward")
    except metadata.PackageNotFoundError:
        return "unknown"


# The study's numbers


def participant_numbers(panel: pd.DataFrame, deleted: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Participants by arm and an ``all`` row: ``enrolled`` (assigned to the arm), ``active`` (taking
    part with a survey still to come: open, not yet due or overdue), ``completed`` (taking part,
    nothing left to come), ``withdrawn`` (including ``data_deleted``: those whose research data
    were deleted at their request; absent from the panel, so counted from ``deleted`` by arm)."""
    people = panel.drop_duplicates("participant_code")
    pending = set(panel.loc[panel["response_status"].astype(str).isin(STILL_TO_COME), "participant_code"])
    withdrawn = people["participant_status"].astype(str) == "withdrawn"
    active = ~withdrawn & people["participant_code"].isin(pending)
    status = pd.DataFrame({"arm": people["arm"].astype(str), "active": active, "completed": ~withdrawn & ~active,
                           "withdrawn": withdrawn})
    return _numbers(status.groupby("arm")[["active", "completed", "withdrawn"]].sum().astype("int64"), deleted)


def study_numbers(source: Source, study: int | str) -> pd.DataFrame:
    """``participant_numbers`` of a study in the database, counted in SQL by the same rule
    (``analysis.panel.participant_states``) instead of from its panel."""
    states = participant_states(source, study, still_to_come=STILL_TO_COME)
    with connect(source) as connection:
        deleted = deleted_by_arm(connection, resolve_study_id(connection, study))
    return _numbers(states.set_index("arm").astype("int64"), deleted)


def _numbers(counts: pd.DataFrame, deleted: Mapping[str, int] | None) -> pd.DataFrame:
    """Active, completed and withdrawn per arm (``counts``, indexed by arm), with the deleted."""
    gone = pd.Series(dict(deleted or {}), dtype="int64")
    counts = counts.reindex(counts.index.union(gone.index), fill_value=0)
    counts["data_deleted"] = gone.reindex(counts.index, fill_value=0)
    counts["withdrawn"] += counts["data_deleted"]
    counts["enrolled"] = counts["active"] + counts["completed"] + counts["withdrawn"]
    counts.loc["all"] = counts.sum()
    counts.index.name = "arm"
    return counts.reset_index()[["arm", "enrolled", "active", "completed", "withdrawn", "data_deleted"]]


@dataclass(frozen=True)
class ReportHeader:
    """What the top of the report says: the study, when its data were read, the participants by
    arm (``participant_numbers``), the protocol versions (version, loaded_at, sha256), the
    software version and the analysis packages' releases (checked against the lock)."""

    study: str
    title: str
    read_at: dt.datetime
    numbers: pd.DataFrame
    protocol_versions: pd.DataFrame
    software: str = field(default_factory=software_version)
    packages: str = field(default_factory=packages_line)
    flow: pd.DataFrame | None = None  # analysis.flow.participant_flow: the CONSORT-style flow


def deleted_by_arm(connection: Connection, study_id: int) -> dict[str, int]:
    rows = connection.execute(select(Participant.arm, func.count()).where(
        Participant.study_id == study_id, Participant.data_deleted_at.is_not(None), Participant.arm.is_not(None))
        .group_by(Participant.arm)).all()
    return {str(arm): int(n) for arm, n in rows}


def _protocol_versions(connection: Connection, study_id: int) -> pd.DataFrame:
    rows = connection.execute(select(ProtocolVersion.version, ProtocolVersion.loaded_at, ProtocolVersion.source_sha256)
                              .where(ProtocolVersion.study_id == study_id).order_by(ProtocolVersion.version)).all()
    return pd.DataFrame([tuple(row) for row in rows], columns=["version", "loaded_at", "sha256"])


# The models


@dataclass(frozen=True)
class ModelSuite:
    """Every model of the report, fitted to one ``StudyData``. A model the data cannot support
    (too few participants, no follow-up yet) is ``None`` with its reason in ``not_estimated``;
    ``seconds``: each model's fitting time. The checks on them (``diagnostics``, ``sensitivity``)
    are ``None`` when not asked for or, with the reason in ``unchecked``, not possible."""

    perma: PermaTrajectories | None
    headline: ImmediateVsDelayed | None
    regret: RegretModel | None
    screen: FeatureScreen | None
    dropout: DropoutSurvival | None
    subgroups: SubgroupEffects | None
    not_estimated: dict[str, str]
    seconds: dict[str, float]
    options: dict[str, Any]
    diagnostics: tuple[Diagnostics, ...] | None = None  # analysis.diagnostics, per model
    sensitivity: Sensitivity | None = None  # analysis.sensitivity: the primary estimate under missing-data assumptions
    unchecked: dict[str, str] = field(default_factory=dict)


def fit_models(data: StudyData, *, perma_outcomes: Sequence[str] = ("overall_wellbeing",), n_boot: int = 500,
               seed: int = 0, focal_role: str = "coach", checks: bool = True, imputations: int = IMPUTATIONS,
               primary_outcome: str | None = None, progress: Callable[[str, float], None] | None = None) -> ModelSuite:
    """Fit the report's models with their defaults (``analysis.estimates``): PERMA trajectories of
    ``perma_outcomes`` (each a mixed model; ``analysis.panel.PERMA_SCORES`` for every domain), the
    immediate-vs-delayed table (``n_boot`` bootstrap replicates, seeded by ``seed``), the regret
    model, the feature screen, dropout survival and the subgroup effects; with ``checks`` their
    diagnostics and the sensitivity analyses of the primary PERMA estimate (of ``primary_outcome``,
    by default the first; ``imputations`` imputed data sets). ``progress(model, seconds)`` is called after each."""
    fits: dict[str, Callable[[], Any]] = {
        "perma": lambda: perma_trajectories(data, outcomes=perma_outcomes),
        "headline": lambda: immediate_vs_delayed(data, focal_role=focal_role, n_boot=n_boot, seed=seed),
        "regret": lambda: regret_model(data, focal_role=focal_role),
        "screen": lambda: feature_screen(data, focal_role=focal_role),
        "dropout": lambda: dropout_survival(data),
        "subgroups": lambda: subgroup_effects(data, focal_role=focal_role),
    }
    checked: dict[str, Callable[[], Any]] = {
        "diagnostics": lambda: diagnose(results["perma"], results["regret"]),
        "sensitivity": lambda: sensitivity_analyses(data, results["perma"], outcome=primary_outcome,
                                                    imputations=imputations, seed=seed)} if checks else {}
    results: dict[str, Any] = {}
    not_estimated: dict[str, str] = {}
    unchecked: dict[str, str] = {}
    seconds: dict[str, float] = {}
    # One BLAS thread: the models' products are small and many (bootstrap folds, CR2 blocks), where
    # OpenBLAS's threads spin against each other and the machine's other work (x4-x20 slower here).
    with _threads.limit(limits=1, user_api="blas"):
        for name, fit in {**fits, **checked}.items():
            began = time.perf_counter()
            try:
                results[name] = fit()
            except ValueError as exc:  # the models' way of saying the data cannot support them
                results[name] = None
                (not_estimated if name in fits else unchecked)[name] = str(exc)
            seconds[name] = time.perf_counter() - began
            if progress is not None:
                progress(name, seconds[name])
    return ModelSuite(**results, not_estimated=not_estimated, seconds=seconds, unchecked=unchecked,
                      options={"perma_outcomes": list(perma_outcomes), "n_boot": n_boot, "seed": seed,
                               "focal_role": focal_role, **({"imputations": imputations} if checks else {})})


def _sample(sample: Sample, what: str, table_id: str) -> str:
    """Who is in a fit, next to its estimates: the counts in a sentence, missingness by wave."""
    withdrawn = (f"; {sample.withdrawn} of the eligible participants withdrew (attrition)"
                 if sample.withdrawn else "; none of the eligible participants withdrew")
    sentence = (f"{what}: {sample.observations:,} observations from {sample.participants:,} participants in the fit, "
                f"of {sample.eligible_observations:,} eligible observations (outcome in, or missing for good) "
                f"from {sample.eligible_participants:,} participants{withdrawn}.")
    missing = sample.missingness
    cols = [_Col("wave", "wave", "text"), *(_Col(str(c).replace("_", " "), str(c), "count")
                                              for c in missing.columns if c != "wave")]
    return (f'<div class="sample" data-sample="{html.escape(table_id)}"><p>{html.escape(sentence)}</p>'
            f"<details><summary>Missingness by wave (response status counts; eligible, missing, used)</summary>"
            f"{_table(missing, cols, table_id)}</details></div>")


# Sections


def _section(name: str, body: str, suite: ModelSuite, label: str = "") -> str:
    title = MODEL_TITLES[name]
    if name in suite.not_estimated:
        body = f'<p class="not-estimated">Not estimated: {html.escape(suite.not_estimated[name])}</p>'
    label = f'<p class="plan-label" data-plan="{name}">{html.escape(label)}</p>' if label else ""
    return (f'<section id="{name}" aria-labelledby="{name}-title"><h2 id="{name}-title">{html.escape(title)}</h2>'
            f"{label}{body}</section>")


def _headline(fit: ImmediateVsDelayed | None) -> str:
    if fit is None:
        return ""
    table = fit.table
    if table.empty:
        return _notes(fit.notes)
    shown = table.assign(metric_label=table["metric"].map({"r2": "R² (out of fold)", "auc": "AUC"}),
                         outcome_label=table["outcome"].map({"regret": "decision regret",
                                                             "perma_change": "PERMA change"}))
    intro = ("<p>The question behind the study: does the rating a participant gives when a conversation ends "
             "(the immediate signal) tell how their decisions and well-being turn out weeks later, and do the "
             "features of the conversation tell more? Estimand: for the exit rating and for the conversation "
             "features, how much of the outcome's variation between participants of the same arm (and wave and "
             "baseline score) each explains out of sample; the randomized arm is not among the features, it is "
             "held fixed, so a feature cannot score by standing in for it. The arm's own R² and AUC are in "
             "their own columns. An interval covering the no-information value means no evidence the predictor "
             "carries information.</p>")
    cols = [_Col("outcome", "outcome_label", "text"), _Col("metric", "metric_label", "text"),
            _Col("exit rating (95% CI)", "exit_rating", "interval", "exit_rating_low", "exit_rating_high"),
            _Col("features (95% CI)", "features", "interval", "features_low", "features_high"),
            _Col("features minus exit rating", "difference", "interval", "difference_low", "difference_high"),
            _Col("the arm alone (95% CI)", "arm", "interval", "arm_low", "arm_high"),
            _Col("no information", "no_information"), _Col("observations", "observations", "count"),
            _Col("participants", "participants", "count")]
    panels = []
    for metric, title, reference in (("r2", "R² (out of fold)", 0.0), ("auc", "AUC", 0.5)):
        rows = shown[shown["metric"] == metric]
        labels, estimate, low, high = [], [], [], []
        for row in rows.to_dict(orient="records"):
            for predictor, name in (("exit_rating", "exit rating"), ("features", "features within arm")):
                labels.append(f"{row['outcome_label']}: {name}")
                estimate.append(row[predictor])
                low.append(row[f"{predictor}_low"])
                high.append(row[f"{predictor}_high"])
        values = np.array(estimate, dtype=float)
        panels.append(Forest(title, labels, values, np.array(low, dtype=float), np.array(high, dtype=float),
                             np.array([not label.endswith("exit rating") for label in labels]), reference, title))
    plot = figure_html(forest_plot(panels, "headline", "Immediate vs delayed: R² and AUC with 95% intervals"),
                       "Filled: the conversation features within arm; hollow: the exit rating within arm. Dashed: no "
                       "information.")
    used = "; ".join(f"{r['outcome']}: {r['features_used']}" for r in table.drop_duplicates("outcome")
                     .to_dict(orient="records"))
    definitions = "; ".join(f"{r['outcome']}: {r['definition']}" for r in table[table["metric"] == "auc"]
                            .to_dict(orient="records"))
    samples = "".join(_sample(s, f"{o}", f"headline-{o}-missingness") for o, s in fit.samples.items())
    replicates = ", ".join(f"{r['outcome']} {r['replicates']}" for r in table.drop_duplicates("outcome")
                           .to_dict(orient="records"))
    return (intro + _table(shown, cols, "headline-table", "The headline table") + plot
            + _notes([f"Features used: {used}.", f"AUC outcome: {definitions}.", f"Bootstrap replicates: {replicates}.",
                      "PERMA change: overall well-being at a follow-up minus at baseline.", *fit.notes]) + samples)


def _perma(fit: PermaTrajectories | None) -> str:
    if fit is None:
        return ""
    parts = []
    for outcome, sample in fit.samples.items():
        means = fit.marginal_means[fit.marginal_means["outcome"] == outcome]
        parts.append(f"<h3>{html.escape(outcome.replace('_', ' '))}</h3>")
        parts.append(figure_html(trajectory_plot(means, outcome),
                                 f"PERMA {outcome.replace('_', ' ')}: the mixed model's mean per wave and group at "
                                 f"the mean baseline ({means['at_baseline'].iloc[0]:.2f}), 95% bands; crosses: "
                                 "observed means."))
        parts.append(_sample(sample, outcome.replace("_", " "), f"perma-{outcome}-missingness"))
    mean_cols = [_Col("outcome", "outcome", "text"), _Col("group", "group", "text"), _Col("wave", "wave", "text"),
                 _Col("day", "days"), _Col("model mean (95% CI)", "mean", "interval", "ci_low", "ci_high"),
                 _Col("observed mean", "observed_mean"), _Col("observed n", "observed_n", "count")]
    contrast_cols = [_Col("outcome", "outcome", "text"), _Col("group", "group", "text"),
                     _Col("vs", "reference", "text"), _Col("wave", "wave", "text"),
                     _Col("difference (95% CI)", "estimate", "interval", "ci_low", "ci_high"), _Col("p", "p", "p"),
                     _Col("standardized (baseline SD)", "d", "interval", "d_low", "d_high")]
    fixed_cols = [_Col("outcome", "outcome", "text"), _Col("term", "term", "text"),
                  _Col("estimate (95% CI)", "estimate", "interval", "ci_low", "ci_high"), _Col("SE", "se"),
                  _Col("df", "df"), _Col("p", "p", "p")]
    random_cols = [_Col("outcome", "outcome", "text"), _Col("random part", "structure", "text"),
                   _Col("parameter", "parameter", "text"), _Col("value", "value")]
    return ("<p>Estimand (primary): the arm x time effect, how much the difference in the score between an arm "
            "and the reference arm, at a given baseline, changes per day since enrollment (the term ending "
            "'x day'); beside it, the difference at each wave. Estimator: linear mixed model (REML) of the score "
            "at each enrollment-anchored follow-up on time x group, time being the wave's day since enrollment "
            "(not its index), adjusted for the baseline score, with participant random intercepts and random "
            "slopes where at least three waves identify them (the notes say which structure was fitted and why). "
            "Intervals: Student's t on participants minus fixed effects (column df).</p>" + "".join(parts)
            + _table(fit.marginal_means, mean_cols, "perma-marginal-means", "Marginal means per wave and group")
            + _table(fit.contrasts, contrast_cols, "perma-contrasts", f"Group minus {fit.reference} at each wave")
            + _table(fit.fixed_effects, fixed_cols, "perma-fixed-effects", "Fixed effects")
            + _table(fit.random_effects, random_cols, "perma-random-effects", "Variance components")
            + _notes(fit.notes))


COEFFICIENT_COLS = [_Col("term", "term", "text"), _Col("meaning", "label", "text"),
                    _Col("estimate (95% CI)", "estimate", "interval", "ci_low", "ci_high"), _Col("SE", "se"),
                    _Col("p", "p", "p")]


def _regret(fit: RegretModel | None) -> str:
    if fit is None:
        return ""
    return ("<p>OLS of each Decision Regret response (0-100) on the features of the conversation the decision was "
            "made in, with standard errors clustered by participant.</p>"
            + _table(fit.coefficients, COEFFICIENT_COLS, "regret-coefficients", "Coefficients (regret points)")
            + _sample(fit.sample, "decision regret", "regret-missingness") + _notes(fit.notes))


def _screen(fit: FeatureScreen | None) -> str:
    if fit is None:
        return ""
    table = fit.table
    parts = []
    titles = {"regret": "decision regret (points per SD of the feature)",
              "perma_change": "PERMA change (points per SD of the feature)"}
    for outcome, rows in table.groupby("outcome", sort=False) if not table.empty else ():
        panel = Forest(titles.get(str(outcome), str(outcome)), [str(f) for f in rows["feature"]],
                       rows["estimate_per_sd"].to_numpy(float), rows["ci_low_per_sd"].to_numpy(float),
                       rows["ci_high_per_sd"].to_numpy(float), rows["significant_bh"].to_numpy(bool), 0.0,
                       "estimate per SD, 95% CI")
        plot = forest_plot([panel], f"forest-{outcome}", f"Forest plot of feature effects on {outcome}")
        parts.append(figure_html(plot, f"{outcome}: filled if significant after Benjamini-Hochberg adjustment at "
                                       f"{fit.alpha:g}; ordered by raw p."))
    cols = [_Col("outcome", "outcome", "text"), _Col("feature", "feature", "text"), _Col("meaning", "label", "text"),
            _Col("per unit (95% CI)", "estimate", "interval", "ci_low", "ci_high"),
            _Col("per SD (95% CI)", "estimate_per_sd", "interval", "ci_low_per_sd", "ci_high_per_sd"),
            _Col("p", "p", "p"), _Col("p (BH)", "p_bh", "p"), _Col("significant (BH)", "significant_bh", "flag"),
            _Col("observations", "observations", "count"), _Col("participants", "participants", "count")]
    skipped = _table(fit.skipped, [_Col("outcome", "outcome", "text"), _Col("feature", "feature", "text"),
                                   _Col("reason", "reason", "text")], "feature-screen-skipped", "Features left out")
    return ("<p>Estimand: each feature's difference in the outcome per unit within arm, one feature at a time: "
            "for regret adjusted for the arm and the regret wave, for PERMA change for the arm x wave and the "
            "baseline score, so that a feature that only differs between arms (the arm standing in) shows "
            "nothing. The arm's effect is the PERMA model's. OLS, cluster-robust by participant (CR2, "
            "Bell-McCaffrey t); raw and Benjamini-Hochberg adjusted p-values over the features of each "
            "outcome.</p>" + "".join(parts)
            + f"<details><summary>The feature screen's table ({len(table)} rows)</summary>"
            + _table(table, cols, "feature-screen", "Feature screen") + "</details>" + skipped + _notes(fit.notes))


def _dropout(fit: DropoutSurvival | None) -> str:
    if fit is None:
        return ""
    intro = f"<p>{html.escape(ESTIMAND)} {html.escape(COMPETING)}</p>"
    groups = [_Col("by", "by", "text"), _Col("group", "group", "text"), _Col("participants", "participants", "count"),
              _Col("stopped answering", "events", "count"), _Col("withdrew", "withdrew", "count"),
              _Col("still answering at the end", "still_answering"), _Col("median days", "median_days", "days")]
    incidence = fit.cumulative_incidence
    final = incidence.groupby(["group", "cause"], sort=False).tail(1) if not incidence.empty else incidence
    cumulative = [_Col("arm", "group", "text"), _Col("event", "cause", "text"), _Col("by day", "days", "days"),
                  _Col("cumulative incidence (95% CI)", "cumulative_incidence", "interval", "ci_low", "ci_high"),
                  _Col("still at risk", "at_risk", "count")]
    logrank = [_Col("by", "by", "text"), _Col("groups", "groups", "count"),
               _Col("statistic", "test_statistic"), _Col("df", "df", "count"), _Col("p", "p", "p")]
    cox = [_Col("term", "term", "text"), _Col("meaning", "label", "text"),
           _Col("hazard ratio (95% CI)", "hazard_ratio", "interval", "hr_low", "hr_high"),
           _Col("log hazard ratio", "coef"), _Col("SE", "se"), _Col("p", "p", "p")]
    hazards = [_Col("term", "term", "text"), _Col("columns", "columns", "text"), _Col("chi-square", "test_statistic"),
               _Col("df", "df", "count"), _Col("p", "p", "p"), _Col("time transform", "transform", "text")]
    transform = str(fit.proportional_hazards["transform"].iloc[0]) if not fit.proportional_hazards.empty else "km"
    response = ""
    if not fit.response.empty and fit.response_sample is not None:
        response = (_table(fit.response, COEFFICIENT_COLS, "dropout-response",
                           "Log-odds that a follow-up whose window closed was completed (vs expired)")
                    + _sample(fit.response_sample, "completing a follow-up", "dropout-response-missingness"))
    return (intro + figure_html(km_plot(fit.curves), "Kaplan-Meier estimates of the share still answering follow-ups "
                                "(withdrawal censored), with 95% intervals (exponential Greenwood), by arm and by the "
                                "first conversation's role.")
            + _table(fit.groups, groups, "dropout-groups", "Participants, dropouts and withdrawals per group")
            + _table(final, cumulative, "dropout-cumulative-incidence",
                     "Cumulative incidence (Aalen-Johansen) of stopping answering and of withdrawing, by arm, at the "
                     "last time observed")
            + _table(fit.logrank, logrank, "dropout-logrank", "Log-rank tests (withdrawal censored)")
            + _table(fit.cox, cox, "dropout-cox", "Cox model of stopping answering (cause-specific: withdrawal "
                     "censored; Efron ties)")
            + _table(fit.proportional_hazards, hazards, "dropout-proportional-hazards",
                     "Proportional-hazards test: the score test of R's cox.zph (survival 3.x) per term and GLOBAL, "
                     f"time transform '{transform}'" + (" (1 - Kaplan-Meier, R's default)" if transform == "km" else "")
                     + "; a small p: the hazard ratio changes over time")
            + _sample(fit.sample, "Cox model", "dropout-missingness")
            + response + _notes([note for note in fit.notes if note not in (ESTIMAND, COMPETING)]))


def _subgroups(fit: SubgroupEffects | None) -> str:
    if fit is None:
        return ""
    effects = fit.effects
    parts: list[str] = []
    for (outcome, contrast), rows in effects.groupby(["outcome", "contrast"], sort=False):
        rows = rows[rows["estimate"].notna()]
        if rows.empty:
            continue
        labels = [f"{s}: {lv}" if s != "all" else "all" for s, lv in zip(rows["subgroup"], rows["level"], strict=True)]
        panel = Forest(f"{outcome}: {contrast}", labels, rows["estimate"].to_numpy(float),
                       rows["ci_low"].to_numpy(float), rows["ci_high"].to_numpy(float),
                       (rows["subgroup"] == "all").to_numpy(bool), 0.0, "difference, 95% CI")
        plot = forest_plot([panel], f"subgroups-{outcome}-{len(parts)}", f"Subgroup effects on {outcome}")
        parts.append(figure_html(plot, f"{outcome}, {contrast}: overall (filled) and within each subgroup level."))
    cols = [_Col("outcome", "outcome", "text"), _Col("contrast", "contrast", "text"),
            _Col("subgroup", "subgroup", "text"), _Col("level", "level", "text"),
            _Col("effect (95% CI)", "estimate", "interval", "ci_low", "ci_high"), _Col("p", "p", "p"),
            _Col("p (BH over levels)", "p_bh", "p"),
            _Col("participants", "participants", "count"), _Col("observations", "observations", "count"),
            _Col("note", "note", "text")]
    heterogeneity = [_Col("outcome", "outcome", "text"), _Col("contrast", "contrast", "text"),
                     _Col("subgroup", "subgroup", "text"), _Col("levels", "levels", "count"),
                     _Col("F", "statistic"), _Col("df", "df", "count"),
                     _Col("denominator df", "df_denominator", "count"), _Col("p", "p", "p"),
                     _Col("p (Holm)", "p_holm", "p"), _Col("significant (Holm)", "significant_holm", "flag")]
    definitions = [_Col("subgroup", "subgroup", "text"), _Col("level", "level", "text"),
                   _Col("definition", "definition", "text"), _Col("participants", "participants", "count")]
    return ("<p>Estimand: the primary arm x time effect on PERMA overall well-being (the change per day since "
            "enrollment in the arm difference, at a given baseline) and the focal-role contrast on regret, overall "
            "and within each subgroup level, so that a benefit on average that harms one group is seen. OLS, "
            "CR2 by participant with Bell-McCaffrey t intervals. Per subgroup variable an interaction test "
            "(Wald F that the effect is the same in every level, on participants - 1 denominator df). "
            f"Multiplicity: the interaction tests are adjusted together by Holm's rule (family-wise {fit.alpha:g}); "
            "only a test significant after Holm is evidence that the effect differs between subgroups, and the "
            "estimates within levels are descriptive (their p-values also shown Benjamini-Hochberg adjusted over "
            "the levels).</p>" + "".join(parts)
            + _table(effects, cols, "subgroup-effects", "Effects by subgroup")
            + _table(fit.heterogeneity, heterogeneity, "subgroup-heterogeneity",
                     "Is the effect the same in every level? (interaction test, Holm over the tests)")
            + _table(fit.subgroups, definitions, "subgroup-definitions", "Subgroups") + _notes(fit.notes))


STYLE = """
:root { --ink: #1d2433; --muted: #5b6475; --line: #d9dde5; --accent: #2f5d8a; --soft: #f4f6f9; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff;
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 1.5rem 1.25rem 3rem; }
h1 { font-size: 1.55rem; margin: 0 0 .3rem; }
h2 { font-size: 1.2rem; margin: 2.4rem 0 .6rem; padding-bottom: .25rem; border-bottom: 2px solid var(--line); }
h3 { font-size: 1rem; margin: 1.4rem 0 .4rem; }
p { max-width: 75ch; }
.lede { color: var(--muted); margin-top: 0; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; margin: 1rem 0; }
dl.facts dt { font-weight: 600; }
dl.facts dd { margin: 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: .4rem 0 1.2rem; font-size: .85rem; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: .2rem 0 .35rem; }
th, td { border-bottom: 1px solid var(--line); padding: .28rem .6rem; text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
td.num { text-align: right; white-space: nowrap; }
figure { margin: 1rem 0 1.4rem; }
figure svg { display: block; max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: .85rem; max-width: 90ch; }
.notes { color: var(--muted); font-size: .85rem; max-width: 95ch; }
.sample { background: var(--soft); border-left: 3px solid var(--accent); padding: .3rem .8rem; margin: .6rem 0 1rem;
          font-size: .88rem; }
.sample p { margin: .3rem 0; }
.not-estimated { color: #8a2f2f; }
.plan-status, .plan-label { border-left: 3px solid #8a6d2f; background: #fbf7ee; padding: .3rem .8rem; }
nav ol { columns: 2; padding-left: 1.2rem; }
footer { margin-top: 3rem; color: var(--muted); font-size: .85rem; border-top: 1px solid var(--line); }
@media (max-width: 640px) { nav ol { columns: 1; } main { padding: 1rem .75rem 2rem; } }
@media print { .scroll { overflow: visible; } details { display: block; } h2 { break-after: avoid; } }
"""


def _flow(flow: pd.DataFrame | None) -> str:
    """The participant flow, a row per stage and a column per arm (``analysis.flow``)."""
    if flow is None:
        return ""
    wide = flow_table(flow)
    cols = [_Col("stage", "stage", "text"), *(_Col(str(c), str(c), "count") for c in wide.columns if c != "stage")]
    return (_table(wide, cols, "participant-flow", "Participant flow (CONSORT-style), by arm")
            + _notes(["Each wave counted from enrollment, by arm: answered, missed (its window closed unanswered), "
                      "withdrawn before it, or still to come when the data were read. Participants whose data were "
                      "deleted at their request are in no wave, so a wave's counts add up to the randomized minus "
                      "them. Follow-ups counted from a decision (several per participant) are in the dropout "
                      "analysis, not here."]))


def render_report(header: ReportHeader, suite: ModelSuite, *, generated_at: dt.datetime | None = None,
                  plan: PlanRun | None = None) -> str:
    """The whole report as one HTML document (nothing to fetch). Its first section is the frozen
    analysis plan's (``analysis.plan_report``; ``plan`` None: no plan frozen, all exploratory)."""
    generated = generated_at or now()
    plan = plan or PlanRun(None)
    numbers_cols = [_Col("arm", "arm", "text"), _Col("enrolled", "enrolled", "count"),
                    _Col("active", "active", "count"), _Col("completed", "completed", "count"),
                    _Col("withdrawn", "withdrawn", "count"),
                    _Col("of them, data deleted", "data_deleted", "count")]
    versions = header.protocol_versions
    protocol_cols = [_Col("version", "version", "count"), _Col("loaded at", "loaded_at", "text"),
                     _Col("source SHA-256", "sha256", "text")]
    options = suite.options
    top = (f"<header><h1>Analysis report: {html.escape(header.title)}</h1>"
           f'<p class="lede">Study <code>{html.escape(header.study)}</code>. Every model of '
           "<code>analysis.estimates</code> with its defaults; the numbers mean what they mean in the exports and "
           "the dashboard.</p>"
           f'<dl class="facts"><dt>Data read at</dt><dd id="read-at">{html.escape(_format(header.read_at, "text"))}'
           f'</dd><dt>Report written at</dt><dd>{html.escape(_format(generated, "text"))}</dd>'
           f'<dt>Software</dt><dd id="software">afterward {html.escape(header.software)}</dd>'
           f'<dt>Packages</dt><dd id="packages">{html.escape(header.packages)}</dd>'
           f"<dt>Options</dt><dd>{html.escape(', '.join(f'{k} = {v}' for k, v in options.items()))}</dd></dl>"
           + _table(versions.assign(loaded_at=versions["loaded_at"].map(lambda v: _format(v, "text"))),
                    protocol_cols, "protocol-versions", "Protocol versions")
           + "</header>")
    participants = (
        '<section id="participants" aria-labelledby="participants-title"><h2 id="participants-title">Participants</h2>'
        + _table(header.numbers, numbers_cols, "study-numbers", "Participants by arm")
        + _notes(["Enrolled: assigned to the arm. Active: taking part with a survey still to come (open, not yet "
                  "due or overdue). Completed: taking part, nothing left to come. Withdrawn: withdrew, including "
                  "those whose research data were deleted at their request (they are in no model). People who "
                  "redeemed an invite but were never assigned an arm are not counted."])
        + _flow(header.flow) + "</section>")
    sections = [("headline", _headline(suite.headline)), ("perma", _perma(suite.perma)),
                ("regret", _regret(suite.regret)), ("screen", _screen(suite.screen)),
                ("dropout", _dropout(suite.dropout)), ("subgroups", _subgroups(suite.subgroups))]
    contents = ("<nav aria-label=\"Contents\"><ol><li><a href=\"#plan\">The pre-registered analysis plan</a></li>"
                "<li><a href=\"#participants\">Participants</a></li>") + "".join(
        f'<li><a href="#{name}">{html.escape(title)}</a></li>' for name, title in [
            *((name, MODEL_TITLES[name]) for name, _ in sections), ("diagnostics", DIAGNOSTICS_TITLE),
            ("sensitivity", SENSITIVITY_TITLE), ("methods", METHODS_TITLE)]) + "</ol></nav>"
    footer = ("<footer><p>For the study's researchers and admins: computed from row-level data and not put through "
              "the aggregate tables' disclosure rule (cells may rest on a few participants; the Kaplan-Meier curves "
              "step at single dropouts). Do not pass it to viewers; they have the aggregates export.</p>"
              f"<p>Written by afterward {html.escape(header.software)} at {html.escape(_format(generated, 'text'))}."
              "</p></footer>")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>Analysis: {html.escape(header.title)}</title><style>{STYLE}</style></head>"
            f"<body><main>{top}{contents}{plan_section(plan)}{participants}"
            + "".join(_section(name, body, suite, plan.labels.get(name, "")) for name, body in sections)
            + diagnostics_section(suite.diagnostics, suite.unchecked.get("diagnostics"))
            + sensitivity_section(suite.sensitivity, suite.unchecked.get("sensitivity"))
            + methods_section(suite, plan, header.software)
            + f"{footer}</main></body></html>\n")


# Writing it


@dataclass(frozen=True)
class ReportResult:
    path: Path
    header: ReportHeader
    suite: ModelSuite
    sha256: str
    seconds: float
    plan: PlanRun = field(default_factory=lambda: PlanRun(None))

    def summary(self) -> list[str]:
        """A few lines for the command line: the file, the participants, the headline."""
        total = self.header.numbers.set_index("arm").loc["all"]
        lines = [f"wrote the analysis report of '{self.header.study}' to {self.path} in {self.seconds:.1f} s",
                 f"  participants: enrolled {total['enrolled']}, active {total['active']}, completed "
                 f"{total['completed']}, withdrawn {total['withdrawn']} (data deleted {total['data_deleted']})"]
        headline = self.suite.headline
        if headline is not None and not headline.table.empty:
            for row in headline.table[headline.table["metric"] == "r2"].to_dict(orient="records"):
                lines.append(f"  {row['outcome']}: R² of the exit rating {row['exit_rating']:.3f} "
                             f"({row['exit_rating_low']:.3f} to {row['exit_rating_high']:.3f}), of the features "
                             f"{row['features']:.3f} ({row['features_low']:.3f} to {row['features_high']:.3f})")
        if self.plan.frozen is None:
            lines.append("  no analysis plan frozen: every analysis is exploratory")
        else:
            primary = self.plan.primary()
            lines.append(f"  planned primary analysis, {primary['analysis']}: " + (
                f"{primary['estimate']:.4g} ({primary['ci_low']:.4g} to {primary['ci_high']:.4g}), p {primary['p']:.3g}"
                if primary["reason"] is None else f"not estimated ({primary['reason']})")
                + f"; {len(self.plan.deviations)} deviation(s) from the plan")
        lines += [f"  not estimated: {MODEL_TITLES[name]}: {reason}"
                  for name, reason in self.suite.not_estimated.items()]
        return lines


def write_report(engine: Engine, study: str, out: Path, *, actor: audit.Actor, n_boot: int = 500, seed: int = 0,
                 perma_outcomes: Sequence[str] = ("overall_wellbeing",), focal_role: str = "coach",
                 audit_in: Session | None = None, plan_file: Path | None = None,
                 unblind: str | None = None, imputations: int = IMPUTATIONS) -> ReportResult:
    """Read the study once (one read-only transaction), fit the models, write the report to ``out``
    and audit the run. Raises LookupError for an unknown study, ReportRefused for a viewer or a
    staff member without a role in the study, ValueError when ``out`` is a directory or
    ``n_boot`` is below 1. ``audit_in``: record the audit entry in this session instead of a
    transaction of its own. With a frozen analysis plan (``analysis.plan``) its PERMA outcomes and
    focal role are fitted, it is run first and the plan file (``plan_file``, by default the file it
    was frozen from) is compared with it. While the study is blinded until that plan is frozen it is
    refused (``analysis.plan.Blinded``) unless an admin gives the reason to ``unblind`` (audited)."""
    if out.is_dir():
        raise ValueError(f"{out} is a directory: give the report's file name, e.g. {out / 'report.html'}")
    if n_boot < 1:
        raise ValueError("the number of bootstrap replicates must be at least 1")
    from analysis.plan import outcome_view

    outcome_view(engine, study, actor, "the analysis report", unblind=unblind)  # every section compares arms
    began = time.perf_counter()
    with engine.execution_options(**{READ_ONLY: True}).connect() as connection:
        try:
            found = open_study(connection, study, actor)
        except ExportRefused as exc:
            raise ReportRefused(f"{exc.message}: the analysis report is for its researchers and admins") from exc
        frozen = frozen_plan(connection, found.id)
        if frozen is not None:  # before narrowing the frames: the plan's outcomes are among the columns kept
            perma_outcomes = list(dict.fromkeys([*perma_outcomes, *frozen.plan.perma_outcomes()]))
            focal_role = frozen.plan.focal_role
        data = StudyData.load(connection, found.id).for_models(perma_outcomes)
        assert data.read_at is not None
        header = ReportHeader(found.slug, found.title, data.read_at,
                              participant_numbers(data.panel, deleted_by_arm(connection, found.id)),
                              _protocol_versions(connection, found.id),
                              flow=participant_flow(connection, found.id, data.panel))
    check: FileCheck | None = None
    if frozen is not None:
        path = plan_file or Path(frozen.source_path)
        check = check_file(frozen, str(path), lambda: path.read_text(encoding="utf-8"))
    primary = frozen.plan.primary if frozen is not None else None
    primary_perma = primary.outcome if primary is not None and primary.model == "perma" else None
    suite = fit_models(data, perma_outcomes=perma_outcomes, n_boot=n_boot, seed=seed, focal_role=focal_role,
                       imputations=imputations, primary_outcome=primary_perma)
    plan = run_plan(frozen, suite, data, file_check=check, protocol_versions=header.protocol_versions)
    page = render_report(header, suite, plan=plan).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(page)
    digest = hashlib.sha256(page).hexdigest()
    details: dict[str, Any] = {"file": out.name, "sha256": digest, "read_at": header.read_at.isoformat(),
                               "options": suite.options,
                               "fitted": [name for name in MODEL_TITLES if name not in suite.not_estimated],
                               "not_estimated": suite.not_estimated, "plan_sha256": frozen.sha256 if frozen else None,
                               "plan_deviations": len(plan.deviations)}
    if audit_in is not None:
        audit.record(audit_in, actor, ACTION, study_id=found.id, **details)
    else:
        with session_scope(engine) as session:
            audit.record(session, actor, ACTION, study_id=found.id, **details)
    return ReportResult(out, header, suite, digest, time.perf_counter() - began, plan)
