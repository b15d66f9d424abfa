"""Outcomes: PERMA trajectories by arm with intervals, regret distributions by role, and the
immediate-vs-delayed comparison (viewers: the suppressed means per wave and arm, and per role).
While the study is blinded until its analysis plan is frozen (``analysis.plan``), every role sees the
means pooled over the arms only, and no model is fitted for the page; an admin may unblind it."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import auth, data, show, staff_reads


def _aggregates(context: auth.Context, *, pooled: bool) -> None:
    """The aggregate tables' means (suppressed for viewers); pooled over the arms while blinded."""
    tables = data.aggregates(context.database_url, context.slug, viewer=not context.participant_level)
    show.refreshed(tables)
    wellbeing, regret = tables["wellbeing"], tables["regret"]
    means = show.numeric(wellbeing if pooled else wellbeing[wellbeing["arm"] != "all"], ["mean"]).dropna(
        subset=["mean"])
    per = "wave, all arms pooled" if pooled else "wave and arm"
    if not means.empty:
        show.chart(alt.Chart(means).mark_line(point=True).encode(
            x=alt.X("wave:N", sort=None), y=alt.Y("mean:Q", title="overall well-being (0-10)"), color="arm:N",
            tooltip=["wave", "arm", "n", "mean", "sd"]), caption=f"Mean PERMA overall well-being per {per}")
    show.table(wellbeing, f"PERMA overall well-being per {per}", file_name="wellbeing")
    show.table(regret, "Decision regret per wave, all roles pooled" if pooled
               else "Decision regret per wave and starting role", file_name="regret")
    show.hidden_note(pd.concat([wellbeing, regret]))


def render(context: auth.Context) -> None:
    st.title("Outcomes")
    blind = show.blinding(context, "the Outcomes page")
    if not context.participant_level or blind.blinded:
        _aggregates(context, pooled=blind.blinded)
        return
    scores = data.summary(context.database_url, context.slug, "regret")
    fitted = data.models(context.database_url, context.slug, staff_reads.actor(context))
    show.fitted(fitted)
    means = fitted.frames.get("perma.marginal_means")
    if means is not None and not means.empty:
        base = alt.Chart(means).encode(x=alt.X("wave:N", sort=None), color="group:N")
        show.chart(base.mark_line(point=True).encode(y=alt.Y("mean:Q", title="overall well-being (0-10)",
                                                             scale=alt.Scale(zero=False)),
                                                     tooltip=["group", "wave", "mean", "ci_low", "ci_high",
                                                              "observed_mean", "observed_n"])
                   + base.mark_errorbar().encode(y="ci_low:Q", y2="ci_high:Q"),
                   caption="PERMA trajectories: the mixed model's mean per wave and arm at the mean baseline, "
                           "with 95% intervals (analysis.estimates.perma_trajectories)")
        show.table(means, "PERMA marginal means", file_name="perma-marginal-means")
    elif fitted.fit is not None:
        show.empty("PERMA follow-ups to model")
    st.subheader("Regret by role")
    show.refreshed(scores)
    regret = scores["regret"].dropna(subset=["starting_role"])
    if regret.empty:
        show.empty("regret answers")
    else:
        show.chart(alt.Chart(regret[["wave", "starting_role", "regret"]]).mark_boxplot().encode(
            x=alt.X("regret:Q", title="Decision Regret Scale (0-100)"), y=alt.Y("starting_role:N", title="role"),
            color="starting_role:N", row=alt.Row("wave:N", title=None)),
            caption="Regret distributions by the role the decision's conversation started in")
        summary = (regret.groupby(["wave", "starting_role"])["regret"].describe()
                   [["count", "mean", "std", "25%", "50%", "75%"]].round(2).reset_index())
        show.table(summary, "Regret by wave and role", file_name="regret-by-role")
    headline = fitted.frames.get("headline.immediate_vs_delayed")
    if headline is not None:
        show.table(headline.drop(columns=["features_used"], errors="ignore"),
                   "Immediate vs delayed: how well the exit rating and the features predict regret and PERMA "
                   "change", file_name="immediate-vs-delayed")


render(auth.require())
