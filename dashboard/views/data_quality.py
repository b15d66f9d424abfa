"""Data quality: missingness per instrument and wave, attrition, and scores resting on few items.
Researchers and admins."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from analysis.panel import DUE
from dashboard import auth, data, show


def missingness(surveys: pd.DataFrame) -> pd.DataFrame:
    """Per instrument and wave: surveys due (completed, expired, still open or overdue), and the
    share of them not answered (from ``analysis.panel.survey_cells``)."""
    due = surveys[(surveys["kind"] == "status") & surveys["response_status"].isin(DUE)]
    counts = (due.groupby(["instrument_id", "wave", "response_status"])["surveys"].sum()
              .unstack(fill_value=0).reindex(columns=list(DUE), fill_value=0))
    counts["due"] = counts.sum(axis=1)
    counts.columns.name = None
    counts["missing_share"] = ((counts["due"] - counts["completed"]) / counts["due"]).round(3)
    return counts.reset_index().rename(columns={"instrument_id": "instrument"})


def render(context: auth.Context) -> None:
    st.title("Data quality")
    surveys, attrition, counts = data.together(
        lambda: data.summary(context.database_url, context.slug, "surveys"),
        lambda: data.summary(context.database_url, context.slug, "attrition"),
        lambda: data.counts(context.database_url, context.slug, context.study_id, "few_items"))
    show.refreshed(surveys, attrition, counts)
    missing = missingness(surveys["surveys"])
    if missing.empty:
        show.empty("surveys due")
    else:
        show.chart(alt.Chart(missing).mark_rect().encode(
            x=alt.X("wave:N", sort=None), y="instrument:N",
            color=alt.Color("missing_share:Q", scale=alt.Scale(domain=[0, 1]), title="not answered"),
            tooltip=["instrument", "wave", "due", "completed", "expired", "missing_share"]),
            caption="Share of due surveys not answered, per instrument and wave")
        show.table(missing, "Missingness per instrument and wave", file_name="missingness")
    ended = attrition["attrition"]
    if not ended.empty:
        by_arm = ended.pivot_table(index="event_type", columns="arm", values="participants", aggfunc="sum",
                                   fill_value=0)
        by_arm["all"] = by_arm.sum(axis=1)
        show.table(by_arm.reset_index().rename_axis(columns=None),
                   "Attrition: how each participant's follow-up ended or stands, by arm", file_name="attrition",
                   caption="stopped_answering: no answer to a closed follow-up or any later one (dropout); withdrew: "
                           "withdrew with a follow-up still to answer; censored: still answering or done")
    few = counts["few_items"]
    show.table(few, "Scores resting on few items", file_name="few-items",
               caption="fewer_items: computed from fewer items than the instrument has; under_half_items: from "
                       "fewer than half of them")


render(auth.require(participant_level=True))
