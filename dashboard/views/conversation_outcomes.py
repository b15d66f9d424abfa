"""Conversations → outcomes: the forest plot of feature effects with intervals, Kaplan-Meier
curves of staying in the study by role, and subgroup effects. Researchers and admins; while the
study is blinded until its analysis plan is frozen (``analysis.plan``), nothing unless an admin
unblinds it (every table here is a model fitted within or across arms)."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import auth, data, show, staff_reads


def forest(frame: pd.DataFrame, label: str, estimate: str, low: str, high: str, facet: str | None) -> None:
    rows = frame.dropna(subset=[estimate, low, high])
    if rows.empty:
        return
    base = alt.Chart(rows).encode(y=alt.Y(f"{label}:N", title=None, sort=None))
    layer = (base.mark_rule().encode(x=alt.X(f"{low}:Q", title="estimate (95% interval)"), x2=f"{high}:Q")
             + base.mark_point(filled=True).encode(x=f"{estimate}:Q", tooltip=[label, estimate, low, high]))
    zero = alt.Chart(pd.DataFrame({"x": [0]})).mark_rule(strokeDash=[4, 4]).encode(x="x:Q")
    chart = (layer + zero)
    show.chart(chart.facet(row=alt.Row(f"{facet}:N", title=None)).resolve_scale(y="independent", x="independent")
               if facet else chart)


def render(context: auth.Context) -> None:
    st.title("Conversations → outcomes")
    if show.blinding(context, "the Conversations → outcomes page").blinded:
        return
    fitted = data.models(context.database_url, context.slug, staff_reads.actor(context))
    show.fitted(fitted)
    screen = fitted.frames.get("screen.feature_screen")
    if screen is not None and not screen.empty:
        st.subheader("Feature effects")
        st.caption("Each feature's association with regret and PERMA change within arm (adjusted for arm and, for "
                   "PERMA, baseline and wave), one at a time, per standard deviation of the feature, cluster-robust "
                   "by participant (analysis.estimates.feature_screen)")
        forest(screen, "label", "estimate_per_sd", "ci_low_per_sd", "ci_high_per_sd", "outcome")
        show.table(screen, "Feature screen", file_name="feature-screen")
    regret = fitted.frames.get("regret.coefficients")
    if regret is not None:
        forest(regret[regret["term"] != "Intercept"], "label", "estimate", "ci_low", "ci_high", None)
        show.table(regret, "Regret model: coefficients", file_name="regret-model")
    curves = fitted.frames.get("dropout.curves")
    if curves is not None and not curves.empty:
        st.subheader("Staying in the study")
        for by in curves["by"].unique():
            rows = curves[curves["by"] == by]
            base = alt.Chart(rows).encode(x=alt.X("days:Q", title="days since enrollment"), color="group:N")
            show.chart(base.mark_line(interpolate="step-after").encode(
                y=alt.Y("survival:Q", scale=alt.Scale(domain=[0, 1]), title="still answering"),
                tooltip=["group", "days", "survival", "ci_low", "ci_high", "at_risk"])
                + base.mark_area(interpolate="step-after", opacity=0.15).encode(y="ci_low:Q", y2="ci_high:Q"),
                caption=f"Kaplan-Meier curves by {by} with 95% intervals")
        groups = fitted.frames.get("dropout.groups")
        if groups is not None:
            show.table(groups, "Dropout by group", file_name="dropout-groups")
    subgroups = fitted.frames.get("subgroups.effects")
    if subgroups is not None and not subgroups.empty:
        st.subheader("Subgroup effects")
        labelled = subgroups.assign(label=subgroups["subgroup"] + ": " + subgroups["level"].astype(str))
        forest(labelled, "label", "estimate", "ci_low", "ci_high", "outcome")
        show.table(subgroups, "Subgroup effects", file_name="subgroup-effects")
    if fitted.fit is not None and screen is None and regret is None and curves is None:
        show.empty("models the data can support")


render(auth.require(participant_level=True))
