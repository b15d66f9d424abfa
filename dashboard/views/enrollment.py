"""Enrollment: the funnel invited → consented → baseline → active → completed, arm balance, and
withdrawals by level and time."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import auth, data, show


def render(context: auth.Context) -> None:
    st.title("Enrollment")
    if not context.participant_level:
        tables = data.aggregates(context.database_url, context.slug, viewer=True)
        show.refreshed(tables)
        enrollment = tables["enrollment"]
        show.table(enrollment, "Arm balance: participants by arm and status", file_name="enrollment")
        show.hidden_note(enrollment)
        shown = show.numeric(enrollment[enrollment["arm"] != "all"], ["participants"]).dropna(subset=["participants"])
        if not shown.empty:
            show.chart(alt.Chart(shown).mark_bar().encode(x=alt.X("participants:Q"), y="arm:N",
                                                          tooltip=["arm", "participants"]))
        return
    loaded = data.summary(context.database_url, context.slug, "numbers")
    counts = data.counts(context.database_url, context.slug, context.study_id, "funnel", "withdrawals")
    show.refreshed(loaded, counts)
    numbers = loaded["numbers"]
    everyone = numbers[numbers["arm"] == "all"]
    funnel = counts["funnel"]
    if not everyone.empty:
        later = pd.DataFrame({"stage": ["active", "completed"],
                              "participants": [int(everyone["active"].iloc[0]), int(everyone["completed"].iloc[0])]})
        funnel = pd.concat([funnel, later], ignore_index=True)
    show.chart(alt.Chart(funnel).mark_bar().encode(
        x=alt.X("participants:Q"), y=alt.Y("stage:N", sort=list(funnel["stage"])),
        tooltip=["stage", "participants"]), caption="The funnel: invited (redeemed an invite), consented, "
                                                    "randomized to an arm, baseline answered, then active and "
                                                    "completed as the report counts them.")
    show.table(funnel, "Funnel", file_name="funnel")
    arms = numbers[numbers["arm"] != "all"]
    if not arms.empty:
        show.chart(alt.Chart(arms).mark_bar().encode(x=alt.X("enrolled:Q", title="participants"), y="arm:N",
                                                     tooltip=["arm", "enrolled", "withdrawn"]),
                   caption="Arm balance: participants assigned to each arm")
    show.table(numbers, "Arm balance", file_name="arm-balance")
    withdrawals = counts["withdrawals"]
    if withdrawals.empty:
        show.empty("withdrawals")
        return
    show.chart(alt.Chart(withdrawals).mark_bar().encode(
        x=alt.X("week:T"), y=alt.Y("withdrawn:Q", title="withdrawals"), color="level:N",
        tooltip=["week", "level", "withdrawn"]), caption="Withdrawals per week, by level (keep: data kept; "
                                                         "delete: research data deleted)")
    show.table(withdrawals, "Withdrawals per week and level", file_name="withdrawals")


render(auth.require())
