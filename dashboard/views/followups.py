"""Follow-ups: due, sent, completed and expired per wave; response rates; lateness of the actual
against the intended send time; delivery failures and open channel alerts."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import auth, data, show


def render(context: auth.Context) -> None:
    st.title("Follow-ups")
    reads = data.together(
        lambda: data.aggregates(context.database_url, context.slug, viewer=not context.participant_level),
        *([lambda: data.counts(context.database_url, context.slug, context.study_id, "followup_status", "lateness",
                               "deliveries", "alerts", "adherence_by_occurrence", "adherence_by_participant")]
          if context.participant_level else []))
    tables = reads[0]
    show.refreshed(*reads)
    followups = tables["followups"]
    rates = show.numeric(followups[followups["arm"] != "all"], ["completion_rate"]).dropna(subset=["completion_rate"])
    if not rates.empty:
        show.chart(alt.Chart(rates).mark_bar().encode(
            x=alt.X("wave:N", sort=None), xOffset="arm:N", y=alt.Y("completion_rate:Q", title="response rate",
                                                                      scale=alt.Scale(domain=[0, 1])),
            color="arm:N", tooltip=["wave", "arm", "completion_rate"]), caption="Response rate (completed / due) "
                                                                                "per wave and arm")
    show.table(followups, "Surveys due, completed, expired and pending per wave and arm", file_name="followups")
    show.hidden_note(followups)
    if not context.participant_level:
        return
    counts = reads[1]
    adherence(counts["adherence_by_occurrence"], counts["adherence_by_participant"])
    status = counts["followup_status"]
    if not status.empty:
        show.chart(alt.Chart(status).mark_bar().encode(
            x=alt.X("followups:Q"), y=alt.Y("wave:N"), color="status:N", tooltip=["wave", "status", "followups"]),
            caption="Follow-ups per wave by status (planned: not sent yet; sent: open)")
    show.table(status, "Follow-ups per wave and status", file_name="followup-status")
    lateness = counts["lateness"]
    if lateness.empty:
        show.empty("follow-ups sent")
    else:
        show.chart(alt.Chart(lateness).mark_bar().encode(
            x=alt.X("followups:Q"), y="wave:N", color=alt.Color("lateness:N", sort=list(lateness["lateness"].unique())),
            tooltip=["wave", "lateness", "followups", "mean_minutes", "max_minutes"]),
            caption="How late each follow-up went out against its intended send time")
        show.table(lateness, "Lateness per wave", file_name="lateness")
    show.table(counts["deliveries"], "Deliveries per channel and status (failed: gave up after retries)",
               file_name="deliveries")
    alerts = counts["alerts"]
    if alerts.empty:
        st.success("No channel alert is open.")
    else:
        show.table(alerts, "Open channel alerts", file_name="channel-alerts")


def adherence(by_occurrence: pd.DataFrame, by_participant: pd.DataFrame) -> None:
    """Adherence to repeating follow-ups (diaries): answered / sent per occurrence and per participant."""
    if by_occurrence.empty:
        return
    st.subheader("Adherence to repeating follow-ups")
    show.chart(alt.Chart(show.numeric(by_occurrence, ["adherence"])).mark_line(point=True).encode(
        x=alt.X("occurrence:O", title="occurrence (from 0)"), y=alt.Y("adherence:Q", scale=alt.Scale(domain=[0, 1])),
        color="wave:N", tooltip=["wave", "occurrence", "sent", "answered", "adherence"]),
        caption="Adherence (answered / sent) per occurrence")
    show.table(by_occurrence, "Occurrences sent and answered, per repeating follow-up and occurrence",
               file_name="adherence-by-occurrence")
    show.table(by_participant, "Occurrences planned, sent and answered per participant", file_name="adherence")


render(auth.require())
