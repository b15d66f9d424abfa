"""Data quality: missingness per instrument and wave, attrition, and scores resting on few items.
Researchers and admins."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import auth, data, show

DUE = ["completed", "expired", "open", "overdue"]


def missingness(panel: pd.DataFrame) -> pd.DataFrame:
    """Per instrument and wave: surveys due (completed, expired, still open or overdue), and the
    share of them not answered."""
    due = panel[panel["response_status"].astype(str).isin(DUE)]
    counts = (due.groupby(["instrument_id", "wave"], observed=True)["response_status"]
              .value_counts().unstack(fill_value=0).reindex(columns=DUE, fill_value=0))
    counts["due"] = counts.sum(axis=1)
    counts["missing_share"] = ((counts["due"] - counts["completed"]) / counts["due"]).round(3)
    return counts.reset_index().rename(columns={"instrument_id": "instrument"})


def render(context: auth.Context) -> None:
    st.title("Data quality")
    loaded = data.study(context.database_url, context.slug)
    counts = data.counts(context.database_url, context.study_id)
    show.refreshed(loaded, counts)
    missing = missingness(loaded["panel"])
    if missing.empty:
        show.empty("surveys due")
    else:
        show.chart(alt.Chart(missing).mark_rect().encode(
            x=alt.X("wave:N", sort=None), y="instrument:N",
            color=alt.Color("missing_share:Q", scale=alt.Scale(domain=[0, 1]), title="not answered"),
            tooltip=["instrument", "wave", "due", "completed", "expired", "missing_share"]),
            caption="Share of due surveys not answered, per instrument and wave")
        show.table(missing, "Missingness per instrument and wave", file_name="missingness")
    survival = loaded["survival"]
    if not survival.empty:
        attrition = (survival.assign(outcome=survival["event_type"].astype(str))
                     .groupby("outcome").size().rename("participants").reset_index())
        show.table(attrition, "Attrition: how each participant's follow-up ended or stands",
                   file_name="attrition", caption="missed_followup and withdrew are dropouts; censored: still taking "
                                                  "part or done")
    few = counts["few_items"]
    show.table(few, "Scores resting on few items", file_name="few-items",
               caption="fewer_items: computed from fewer items than the instrument has; under_half_items: from "
                       "fewer than half of them")


render(auth.require(participant_level=True))
