"""Model diagnostics for the report (``analysis.report``): for the PERMA mixed model of each outcome
and for the regret model, the residuals against the fitted values with their normal QQ, the
predicted random effects with their normal QQ (the mixed model only), and the participants with the
most influence on the primary coefficient.

Residuals: the mixed model's are conditional (the outcome less the fixed part and the participant's
predicted random effects: the fit's ``resid`` and ``fittedvalues``, as statsmodels defines them); the
regret model's are OLS residuals. Random effects: the fit's predictions (statsmodels'
``random_effects``), the best linear unbiased predictions (shrunk towards zero, so narrower than
the variance component says).

Influence, leave one participant out: for each participant, the change in the primary coefficient
(the PERMA model's arm x time term, the regret model's focal-role term) when all of that
participant's rows are removed, divided by the coefficient's standard error in the full fit
(DFBETAS); a participant is influential when its absolute value exceeds 2 / sqrt(participants)
(Belsley, Kuh and Welsch's cut-off). Computed for every participant in closed form (cluster
deletion: the generalised least squares estimate without the participant, the variance components
held at the full fit's; for OLS this is the refit itself), with Cook's distance by participant
beside it (all fixed effects; cut-off 4 / participants). The ``TOP`` participants by absolute
DFBETAS are also refitted without them (variance components re-estimated; random intercepts by
``analysis.estimates.mixed``, random slopes by statsmodels) and that change is shown beside the
closed form's.

    >>> checks = diagnose(suite.perma, suite.regret)   # one Diagnostics per PERMA outcome, and regret
    >>> checks[0].top()                                 # the most influential participants
"""

from __future__ import annotations

import html
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats

from analysis.estimates import PermaTrajectories, RegretModel
from analysis.estimates.mixed import RandomInterceptFit, fit_random_intercept
from analysis.estimates.perma import OPTIMIZERS
from analysis.report_html import _Col, _notes, _table
from analysis.report_plots import diagnostics_plot, figure_html

TOP = 8  # participants listed, and refitted without them, per model
DIAGNOSTICS_TITLE = "Model diagnostics"


@dataclass(frozen=True)
class Diagnostics:
    """One model's diagnostics. ``residuals``: a row per observation (participant_code, fitted,
    residual). ``random_effects``: a row per participant, a column per random effect (empty for
    OLS). ``influence``: a row per participant: observations, ``change`` (the primary coefficient
    without the participant minus with everyone, variance components held; ``change_percent``: of
    the full fit's absolute estimate), ``dfbetas`` (change /
    the full fit's standard error), ``cooks_distance``, ``influential`` (|dfbetas| over
    ``threshold``) and ``refitted_change`` (statsmodels refitted without the participant; the
    ``TOP`` only, NaN for the rest). ``shape``: per residual kind, its spread, skewness, excess
    kurtosis, the QQ correlation (scipy's ``probplot`` r) and Shapiro-Wilk's test."""

    model: str
    outcome: str
    term: str
    estimate: float  # the primary coefficient in the full fit
    se: float
    residuals: pd.DataFrame
    random_effects: pd.DataFrame
    influence: pd.DataFrame
    threshold: float
    cooks_threshold: float
    shape: pd.DataFrame
    notes: list[str]

    @property
    def key(self) -> str:
        return f"{self.model}-{self.outcome}"

    def top(self, n: int = TOP) -> pd.DataFrame:
        order = self.influence["dfbetas"].abs().sort_values(ascending=False, kind="stable").index
        return self.influence.loc[order].head(n).reset_index(drop=True)

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"influence": self.influence, "shape": self.shape}


def deletion(x: np.ndarray, y: np.ndarray, groups: np.ndarray, z: np.ndarray | None = None,
             psi: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Leave-one-group-out generalised least squares with the covariance of a group's rows
    proportional to ``I + z psi z'`` (ordinary least squares without ``z``): (the group labels in
    sorted order, their row counts, the estimate without each group (groups x columns; NaN where the
    rest do not identify it), the estimate with all, and X'V^-1 X up to the scale)."""
    codes, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    k = x.shape[1]
    parts = np.zeros((len(codes), k, k))
    sums = np.zeros((len(codes), k))
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for size in np.unique(counts):
        which = np.flatnonzero(counts == size)
        rows = order[starts[which][:, None] + np.arange(size)]  # groups of this size x their rows
        xg, yg = x[rows], y[rows][:, :, None]
        v = np.broadcast_to(np.eye(size), (len(which), size, size))
        if z is not None and psi is not None:
            zg = z[rows]
            v = v + zg @ psi @ zg.transpose(0, 2, 1)
        parts[which] = xg.transpose(0, 2, 1) @ np.linalg.solve(v, xg)
        sums[which] = (xg.transpose(0, 2, 1) @ np.linalg.solve(v, yg))[:, :, 0]
    information, total = parts.sum(axis=0), sums.sum(axis=0)
    beta = np.linalg.solve(information, total)
    rest = information[None] - parts
    identified = np.linalg.matrix_rank(rest, hermitian=True) == k
    without = np.full((len(codes), k), np.nan)
    if identified.any():
        without[identified] = np.linalg.solve(rest[identified], (total[None] - sums)[identified][:, :, None])[:, :, 0]
    return codes, counts, without, beta, information


def _shape(name: str, values: np.ndarray) -> dict[str, Any]:
    values = values[np.isfinite(values)]
    n = len(values)
    row: dict[str, Any] = {"quantity": name, "n": n, "sd": np.nan, "skewness": np.nan, "excess_kurtosis": np.nan,
                           "qq_correlation": np.nan, "shapiro_w": np.nan, "shapiro_p": np.nan}
    if n >= 3 and np.ptp(values) > 0:
        row.update(sd=float(np.std(values, ddof=1)), skewness=float(stats.skew(values)),
                   excess_kurtosis=float(stats.kurtosis(values)),
                   qq_correlation=float(stats.probplot(values, dist="norm")[1][2]))
        if n <= 5000:  # scipy's Shapiro-Wilk p-value is accurate up to 5000 values
            w, p = stats.shapiro(values)
            row.update(shapiro_w=float(w), shapiro_p=float(p))
    return row


def _influence(codes: np.ndarray, counts: np.ndarray, without: np.ndarray, beta: np.ndarray,
               information: np.ndarray, scale: float, j: int, se: float) -> tuple[pd.DataFrame, float, float]:
    change = without - beta[None]
    cooks = np.einsum("ij,jk,ik->i", change, information, change) / (len(beta) * scale)
    threshold, cooks_threshold = 2 / np.sqrt(len(codes)), 4 / len(codes)
    dfbetas = change[:, j] / se
    frame = pd.DataFrame({"participant_code": codes.astype(str), "observations": counts.astype("int64"),
                          "change": change[:, j], "change_percent": 100 * change[:, j] / abs(beta[j]),
                          "dfbetas": dfbetas, "cooks_distance": cooks,
                          "influential": np.abs(dfbetas) > threshold, "refitted_change": np.nan})
    return frame, threshold, cooks_threshold


def _refitted(frame: pd.DataFrame, refit: Any, top: int) -> pd.DataFrame:
    """``refitted_change`` for the ``top`` participants by absolute DFBETAS (``refit(code)``: the
    coefficient without them, NaN when the refit fails)."""
    order = frame["dfbetas"].abs().sort_values(ascending=False, kind="stable").index[:top]
    for index in order:
        frame.loc[index, "refitted_change"] = refit(frame.loc[index, "participant_code"])
    return frame


def mixed_diagnostics(result: Any, term: str, outcome: str, *, top: int = TOP) -> Diagnostics:
    """Diagnostics of a mixed model fit of ``analysis.estimates.perma`` (a ``RandomInterceptFit`` or a
    statsmodels ``MixedLM`` result) for ``term``."""
    model = result.model
    names = list(model.exog_names)
    j = names.index(term)
    x, y, groups = np.asarray(model.exog, float), np.asarray(model.endog, float), np.asarray(model.groups)
    z = np.asarray(model.exog_re, float)
    cov_re = np.atleast_2d(np.asarray(result.cov_re, float))
    codes, counts, without, beta, information = deletion(x, y, groups, z, cov_re / result.scale)
    estimate, se = float(np.asarray(result.fe_params)[j]), float(np.asarray(result.bse_fe)[j])
    frame, threshold, cooks_threshold = _influence(codes, counts, without, beta, information, float(result.scale),
                                                   j, se)

    def refit(code: str) -> float:
        """Without the participant: random intercepts as the model fitted them; with slopes from
        statsmodels' defaults, the optimizers in the order the model tries them."""
        keep = groups != code
        if isinstance(result, RandomInterceptFit):
            try:
                return float(fit_random_intercept(y[keep], x[keep], groups[keep]).fe_params.iloc[j]) - estimate
            except np.linalg.LinAlgError:
                return np.nan
        for optimizers in OPTIMIZERS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    again = sm.MixedLM(y[keep], x[keep], groups=groups[keep], exog_re=z[keep]).fit(
                        reml=True, method=list(optimizers))
                except (np.linalg.LinAlgError, ValueError):
                    continue
            if again.converged:
                return float(np.asarray(again.fe_params)[j]) - estimate
        return np.nan

    frame = _refitted(frame, refit, top)
    labels = ["intercept", "slope (per week)"][: cov_re.shape[0]]
    effects = (result.predicted_intercepts() if isinstance(result, RandomInterceptFit) else
               pd.DataFrame([(str(code), *np.asarray(values, float)) for code, values in result.random_effects.items()],
                            columns=["participant_code", *labels]))
    residuals = pd.DataFrame({"participant_code": groups.astype(str), "fitted": np.asarray(result.fittedvalues, float),
                              "residual": np.asarray(result.resid, float)})
    shape = pd.DataFrame([_shape("conditional residuals", residuals["residual"].to_numpy()),
                          *(_shape(f"random {label}", effects[label].to_numpy()) for label in labels)])
    notes = [f"Mixed model ({result.method}): conditional residuals (the score less the fixed part and the "
             "participant's predicted random effects). Random effects: the predicted (shrunk) participant effects."]
    if np.any(np.diag(cov_re) <= 0):
        notes.append("A random-effect variance is estimated at zero: its predictions are all zero.")
    return Diagnostics("perma", outcome, term, estimate, se, residuals, effects, frame, threshold, cooks_threshold,
                       shape, notes)


def ols_diagnostics(y: np.ndarray, x: pd.DataFrame, groups: np.ndarray, term: str, se: float, outcome: str, *,
                    top: int = TOP) -> Diagnostics:
    """Diagnostics of an OLS fit of ``y`` on ``x`` with participants ``groups`` (the regret model's),
    for ``term`` with standard error ``se`` (its cluster-robust one)."""
    names = list(x.columns)
    j = names.index(term)
    design = x.to_numpy(float)
    codes, counts, without, beta, information = deletion(design, y, groups)
    residual = y - design @ beta
    scale = float(residual @ residual / (len(y) - np.linalg.matrix_rank(design)))
    frame, threshold, cooks_threshold = _influence(codes, counts, without, beta, information, scale, j, se)

    def refit(code: str) -> float:
        keep = groups != code
        return float(np.asarray(sm.OLS(y[keep], design[keep]).fit().params)[j]) - float(beta[j])

    frame = _refitted(frame, refit, top)
    residuals = pd.DataFrame({"participant_code": groups.astype(str), "fitted": design @ beta, "residual": residual})
    return Diagnostics("regret", outcome, term, float(beta[j]), se, residuals,
                       pd.DataFrame(columns=["participant_code"]), frame, threshold, cooks_threshold,
                       pd.DataFrame([_shape("residuals", residual)]),
                       ["OLS residuals; no random effects (the participant enters through the cluster-robust errors). "
                        "DFBETAS uses the cluster-robust (CR2) standard error."])


def primary_term(fit: PermaTrajectories, outcome: str) -> str:
    """The PERMA model's primary coefficient: the first arm's arm x time term (its difference at
    the one wave when only one was observed)."""
    terms = list(fit.fixed_effects.loc[fit.fixed_effects["outcome"] == outcome, "term"])
    timed = [t for t in terms if t.endswith(" x day") and " vs " in t]
    return timed[0] if timed else next(t for t in terms if " vs " in t)


def diagnose(perma: PermaTrajectories | None, regret: RegretModel | None, *, top: int = TOP) -> tuple[Diagnostics, ...]:
    """The diagnostics of the report's complete-case PERMA mixed model (each outcome) and of its
    regret model. Raises ValueError when there is no model to diagnose."""
    found: list[Diagnostics] = []
    skipped: list[str] = []
    if perma is not None and perma.method == "complete-case":
        for outcome, result in perma.fits.items():
            if not hasattr(result, "random_effects"):  # one row per participant: fitted by OLS
                skipped.append(f"PERMA {outcome}: one observation per participant (fitted by OLS)")
                continue
            found.append(mixed_diagnostics(result, primary_term(perma, outcome), outcome, top=top))
    if regret is not None:
        roles = [t for t in regret.coefficients["term"] if str(t).startswith("role_")]
        ols = regret.fit.ols
        if roles and roles[0] in list(ols.model.exog_names):
            term = roles[0]
            x = pd.DataFrame(np.asarray(ols.model.exog, float), columns=list(ols.model.exog_names))
            found.append(ols_diagnostics(np.asarray(ols.model.endog, float), x,
                                         regret.frame["participant_code"].astype(str).to_numpy(), term,
                                         float(regret.effect(term)["se"]), "regret", top=top))
        else:
            skipped.append("regret: the focal-role term is not estimable on these data")
    if not found:
        raise ValueError("no model to diagnose" + (f" ({'; '.join(skipped)})" if skipped else
                                                   ": neither the PERMA model nor the regret model was estimated"))
    if skipped:
        found[0].notes.append("Not diagnosed: " + "; ".join(skipped) + ".")
    return tuple(found)


# The report's section

INFLUENCE_COLS = [_Col("participant", "participant_code", "text"), _Col("observations", "observations", "count"),
                  _Col("change (variance held)", "change"), _Col("% of the estimate", "change_percent"),
                  _Col("change (refitted)", "refitted_change"),
                  _Col("DFBETAS", "dfbetas"), _Col("Cook's distance", "cooks_distance"),
                  _Col("over the cut-off", "influential", "flag")]
SHAPE_COLS = [_Col("quantity", "quantity", "text"), _Col("n", "n", "count"), _Col("SD", "sd"),
              _Col("skewness", "skewness"), _Col("excess kurtosis", "excess_kurtosis"),
              _Col("QQ correlation", "qq_correlation"), _Col("Shapiro-Wilk W", "shapiro_w"),
              _Col("Shapiro-Wilk p", "shapiro_p", "p")]


def _one(d: Diagnostics) -> str:
    name = "PERMA " + d.outcome.replace("_", " ") if d.model == "perma" else "Decision regret"
    over = int(d.influence["influential"].sum())
    top = d.top()
    largest = top.iloc[0]
    sentence = (f"Influence on '{d.term}' ({d.estimate:.4g}, SE {d.se:.3g}): {over} of {len(d.influence)} "
                f"participants exceed the cut-off |DFBETAS| > 2/sqrt({len(d.influence)}) = {d.threshold:.3f}; the "
                f"largest, {largest['participant_code']}, moves the estimate by {largest['change']:.3g} "
                f"({largest['dfbetas']:.2f} standard errors). Cook's distance cut-off 4/{len(d.influence)} = "
                f"{d.cooks_threshold:.4f}: {int((d.influence['cooks_distance'] > d.cooks_threshold).sum())} over it.")
    return (f'<div class="diagnostics" data-model="{html.escape(d.key)}"><h3>{html.escape(name)}</h3>'
            + figure_html(diagnostics_plot(d.residuals, d.random_effects, d.influence, d.threshold,
                                           f"diagnostics-{d.key}", f"Diagnostics of the {name} model"),
                          "Residuals against fitted values (with a lowess line) and their normal QQ plot"
                          + ("; the predicted random effects, their spread and normal QQ plot" if d.model == "perma"
                             else "") + "; each participant's DFBETAS on the primary coefficient, dashed at the "
                          "cut-off, the largest labelled.")
            + f"<p>{html.escape(sentence)}</p>"
            + _table(top, INFLUENCE_COLS, f"diagnostics-{d.key}-influence",
                     f"The {len(top)} most influential participants (by |DFBETAS|): change in '{d.term}' without them")
            + _table(d.shape, SHAPE_COLS, f"diagnostics-{d.key}-shape", "The shape of the residuals and random effects")
            + _notes(d.notes) + "</div>")


def diagnostics_section(checks: tuple[Diagnostics, ...] | None, reason: str | None = None) -> str:
    body = ("".join(_one(d) for d in checks) if checks else
            f'<p class="not-estimated">Not computed: {html.escape(reason or "not asked for")}.</p>')
    intro = ("<p>Whether the models' assumptions hold and whether any one participant drives the primary estimates. "
             "A model is checked as fitted: residuals should scatter evenly around zero whatever the fitted value "
             "and follow the QQ line; random effects should look roughly normal; no participant should move the "
             "primary coefficient by much of its standard error. Influence is measured as the change in the primary "
             "coefficient when one participant is left out, in standard errors (DFBETAS, cut-off 2/sqrt(N)), for "
             "every participant with the variance components held, and refitted for the most influential.</p>")
    return ('<section id="diagnostics" aria-labelledby="diagnostics-title">'
            f'<h2 id="diagnostics-title">{DIAGNOSTICS_TITLE}</h2>{intro}{body}</section>')
