"""The report's plots: matplotlib figures drawn on a bare ``Figure`` (no GUI backend) and
inlined as SVG with text kept as text, no metadata and ids unique on the page: PERMA
trajectories by wave and group, forest plots, Kaplan-Meier curves, model diagnostics (residuals,
QQ plots, random effects, influence) and the tipping-point plot of the sensitivity analysis."""

from __future__ import annotations

import html
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from scipy import stats
from statsmodels.nonparametric.smoothers_lowess import lowess


def inline_svg(figure: Figure, key: str, label: str) -> str:
    """The figure as an inline ``<svg>`` element: text as text (no embedded glyphs), no metadata,
    every element id (and every reference to one) prefixed with ``key``, so that the page's
    figures never share an id (matplotlib names each figure's parts figure_1, axes_1, ...)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": key, "font.size": 9}):
        figure.savefig(buffer, format="svg", bbox_inches="tight",
                       metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    ids = set(re.findall(r'\sid="([^"]+)"', text))
    text = re.sub(r'(\sid="|url\(#|href="#)([^")]+)',
                  lambda m: f"{m.group(1)}{key}-{m.group(2)}" if m.group(2) in ids else m.group(0), text)
    return text.replace("<svg ", f'<svg role="img" aria-label="{html.escape(label)}" data-plot="{key}" ', 1)


def figure_html(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def trajectory_plot(means: pd.DataFrame, outcome: str) -> str:
    """Model means per wave and group with their 95% bands; observed means as crosses."""
    figure = Figure(figsize=(7, 3.6), layout="constrained")
    ax = figure.subplots()
    groups = list(dict.fromkeys(means["group"]))
    spread = 0.6 * (np.arange(len(groups)) - (len(groups) - 1) / 2)  # days apart, so intervals do not overlap
    for shift, group in zip(spread, groups, strict=True):
        rows = means[means["group"] == group].sort_values("days")
        days = rows["days"].to_numpy(float) + shift
        mean, low, high = (rows[c].to_numpy(float) for c in ("mean", "ci_low", "ci_high"))
        (line,) = ax.plot(days, mean, marker="o", label=str(group))
        ax.fill_between(days, low, high, alpha=0.18, color=line.get_color(), linewidth=0)
        ax.errorbar(days, mean, yerr=[mean - low, high - mean], fmt="none", color=line.get_color(), capsize=3)
        ax.scatter(days, rows["observed_mean"].to_numpy(float), marker="x", color=line.get_color(), alpha=0.7)
    ticks = means.drop_duplicates("wave").sort_values("days")
    if len(ticks) == 1:  # one wave so far: room around it
        ax.set_xlim(float(ticks["days"].iloc[0]) - 4, float(ticks["days"].iloc[0]) + 4)
    ax.set_xticks(ticks["days"].to_numpy(float), [f"{w}\n(day {d:.0f})" for w, d in zip(ticks["wave"], ticks["days"],
                                                                                        strict=True)])
    ax.set_ylabel(f"{outcome.replace('_', ' ')} (0-10)")
    ax.set_title("Model means at the mean baseline, 95% bands; x: observed means", fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return inline_svg(figure, f"trajectory-{outcome}", f"PERMA {outcome} by wave and group")


@dataclass(frozen=True)
class Forest:
    """One panel of a forest plot: a row per label, estimate with interval, filled or hollow."""

    title: str
    labels: list[str]
    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    filled: np.ndarray
    reference: float
    xlabel: str


def forest_plot(panels: Sequence[Forest], key: str, label: str) -> str:
    rows = max(len(p.labels) for p in panels)
    figure = Figure(figsize=(4.4 * len(panels) + 1.5, 0.24 * rows + 1.2), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    ax: Axes
    for ax, panel in zip(axes, panels, strict=True):
        y = np.arange(len(panel.labels))[::-1].astype(float)
        ax.hlines(y, panel.low, panel.high, color="#2f5d8a", linewidth=1.4)
        ax.scatter(panel.estimate[panel.filled], y[panel.filled], color="#2f5d8a", zorder=3, s=18)
        ax.scatter(panel.estimate[~panel.filled], y[~panel.filled], facecolors="white", edgecolors="#2f5d8a",
                   zorder=3, s=18)
        ax.axvline(panel.reference, color="#777777", linestyle="--", linewidth=0.8)
        ax.set_yticks(y, panel.labels, fontsize=8)
        ax.set_ylim(-0.7, len(panel.labels) - 0.3)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(panel.xlabel, fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    return inline_svg(figure, key, label)


def km_plot(curves: pd.DataFrame) -> str:
    """Kaplan-Meier curves (steps) with 95% bands, by arm and by first role."""
    groupings = [by for by in ("arm", "role") if (curves["by"] == by).any()]
    figure = Figure(figsize=(4.2 * len(groupings) + 0.6, 3.4), layout="constrained")
    axes = figure.subplots(1, len(groupings), squeeze=False, sharey=True)[0]
    for ax, by in zip(axes, groupings, strict=True):
        for group, rows in curves[curves["by"] == by].groupby("group", sort=True):
            days = rows["days"].to_numpy(float)
            (line,) = ax.step(days, rows["survival"].to_numpy(float), where="post", label=str(group))
            ax.fill_between(days, rows["ci_low"].to_numpy(float), rows["ci_high"].to_numpy(float), step="post",
                            alpha=0.15, color=line.get_color(), linewidth=0)
        ax.set_ylim(0, 1.03)
        ax.set_xlabel("days since enrollment")
        ax.set_title(f"by {'first role' if by == 'role' else by}", fontsize=9)
        ax.legend(frameon=False, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("still answering follow-ups")
    return inline_svg(figure, "kaplan-meier", "Kaplan-Meier curves of time to dropping out, by arm and by first role")


SHOWN = 3000  # points drawn at most per scatter (an evenly spaced subset beyond), so the SVG stays small


def _shown(n: int) -> np.ndarray:
    return np.arange(n) if n <= SHOWN else np.linspace(0, n - 1, SHOWN).round().astype(int)


def _qq(ax: Axes, values: np.ndarray, title: str, label: str = "", marker: str = "o") -> None:
    """A normal QQ plot (scipy's ``probplot``: Filliben's plotting positions) with its line."""
    values = values[np.isfinite(values)]
    ax.set_title(title, fontsize=9)
    if len(values) < 3 or np.ptp(values) == 0:  # nothing to compare with a normal (a variance at zero)
        ax.text(0.5, 0.5, "all values equal", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        return
    (theoretical, ordered), (slope, intercept, _) = stats.probplot(values, dist="norm")
    keep = _shown(len(ordered))
    ax.scatter(theoretical[keep], ordered[keep], s=7, alpha=0.55, marker=marker, label=label or None)
    ax.plot(theoretical, slope * theoretical + intercept, color="#777777", linewidth=0.9)
    ax.set_xlabel("normal quantiles", fontsize=8)
    ax.set_ylabel("ordered values", fontsize=8)


def diagnostics_plot(residuals: pd.DataFrame, random_effects: pd.DataFrame, influence: pd.DataFrame,
                     threshold: float, key: str, label: str) -> str:
    """One model's diagnostics (``analysis.diagnostics``): residuals against fitted values with a
    lowess line, the residuals' normal QQ plot, the predicted random effects (histogram and QQ,
    when the model has them) and each participant's DFBETAS with the cut-off, the largest labelled."""
    effects = [c for c in random_effects.columns if c != "participant_code"]
    panels = 3 + (2 if effects else 0)
    rows = (panels + 2) // 3
    figure = Figure(figsize=(10.5, 3.1 * rows), layout="constrained")
    axes = list(figure.subplots(rows, 3, squeeze=False).ravel())
    fitted, residual = residuals["fitted"].to_numpy(float), residuals["residual"].to_numpy(float)
    order = np.argsort(fitted, kind="stable")
    keep = order[_shown(len(order))]
    ax = axes[0]
    ax.scatter(fitted[keep], residual[keep], s=7, alpha=0.45, color="#2f5d8a")
    smooth = lowess(residual[keep], fitted[keep], frac=0.5, it=0, return_sorted=True)
    ax.plot(smooth[:, 0], smooth[:, 1], color="#b5482f", linewidth=1.3)
    ax.axhline(0, color="#777777", linestyle="--", linewidth=0.8)
    ax.set_xlabel("fitted value", fontsize=8)
    ax.set_ylabel("residual", fontsize=8)
    ax.set_title("Residuals vs fitted" + (f" ({SHOWN:,} of {len(fitted):,} shown)" if len(fitted) > SHOWN else ""),
                 fontsize=9)
    _qq(axes[1], residual, "Normal QQ of the residuals")
    used = 2
    if effects:
        ax = axes[2]
        for column in effects:
            values = random_effects[column].to_numpy(float)
            ax.hist(values, bins=min(30, max(5, len(values) // 8)), alpha=0.55, density=True, label=column)
            spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            if spread > 0:
                grid = np.linspace(values.min(), values.max(), 100)
                ax.plot(grid, stats.norm.pdf(grid, 0, spread), linewidth=1)
        ax.set_title("Predicted random effects", fontsize=9)
        ax.set_xlabel("participant effect", fontsize=8)
        ax.legend(frameon=False, fontsize=7)
        for column, marker in zip(effects, ("o", "^"), strict=False):
            _qq(axes[3], random_effects[column].to_numpy(float), "Normal QQ of the random effects", column, marker)
        axes[3].legend(frameon=False, fontsize=7)
        used = 4
    ax = axes[used]
    dfbetas = influence["dfbetas"].to_numpy(float)
    ax.scatter(np.arange(len(dfbetas)), dfbetas, s=7, alpha=0.6, color="#2f5d8a")
    for bound in (threshold, -threshold):
        ax.axhline(bound, color="#b5482f", linestyle="--", linewidth=0.8)
    for rank, index in enumerate(np.argsort(-np.abs(np.nan_to_num(dfbetas)), kind="stable")[:3]):
        ax.annotate(str(influence["participant_code"].iloc[index]), (index, dfbetas[index]), fontsize=7,
                    xytext=(4, -10 * rank if dfbetas[index] > 0 else 10 * rank), textcoords="offset points",
                    ha="left" if index < len(dfbetas) / 2 else "right")
    ax.set_xlabel("participant", fontsize=8)
    ax.set_ylabel("DFBETAS", fontsize=8)
    ax.set_title("Influence on the primary coefficient", fontsize=9)
    for spare in axes[used + 1:]:
        spare.set_axis_off()
    for each in axes[: used + 1]:
        each.grid(alpha=0.3)
        each.tick_params(labelsize=7)
    return inline_svg(figure, key, label)


def tipping_plot(table: pd.DataFrame, tipping: float | None, key: str, label: str) -> str:
    """The delta-adjusted estimates (``analysis.sensitivity``) with their intervals against delta,
    zero dashed, the tipping point (where the conclusion changes) marked."""
    figure = Figure(figsize=(7, 3.4), layout="constrained")
    ax = figure.subplots()
    for arm, rows in table.groupby("arm", sort=False):
        delta = rows["delta"].to_numpy(float)
        (line,) = ax.plot(delta, rows["estimate"].to_numpy(float), marker="o", label=str(arm))
        ax.fill_between(delta, rows["ci_low"].to_numpy(float), rows["ci_high"].to_numpy(float), alpha=0.18,
                        color=line.get_color(), linewidth=0)
    ax.axhline(0, color="#777777", linestyle="--", linewidth=0.8)
    ax.axvline(0, color="#777777", linewidth=0.6)
    if tipping is not None:
        ax.axvline(tipping, color="#b5482f", linestyle=":", linewidth=1.2)
        ax.annotate(f"tipping point {tipping:.2f}", (tipping, ax.get_ylim()[1]), fontsize=8, color="#b5482f",
                    xytext=(4, -12), textcoords="offset points")
    ax.set_xlabel("delta: shift of the imputed scores (points)")
    ax.set_ylabel("arm x time effect per day")
    ax.set_title("The primary estimate as the missing scores depart from missing at random, 95% bands", fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    ax.grid(alpha=0.3)
    return inline_svg(figure, key, label)
