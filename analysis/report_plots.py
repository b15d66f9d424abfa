"""The report's plots: matplotlib figures drawn on a bare ``Figure`` (no GUI backend) and
inlined as SVG with text kept as text, no metadata and ids unique on the page: PERMA
trajectories by wave and group, forest plots, Kaplan-Meier curves."""

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
