"""Overview: open alerts and unreviewed safety events first (researchers and admins), then the
participants by arm and status, and recruitment over time (viewers: the suppressed enrollment and
safety-event tables, the same cells as the aggregate export and the staff API's summary)."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import auth, data, show


def render(context: auth.Context) -> None:
    st.title("Overview")
    st.caption(f"{context.title} · your role: {context.role}")
    if not context.participant_level:
        tables = data.aggregates(context.database_url, context.slug, viewer=True)
        show.refreshed(tables)
        enrollment = tables["enrollment"]
        show.table(enrollment, "Participants by arm and status", file_name="enrollment")
        columns = ["enrolled", "withdrawn_kept_data", "withdrawn_data_deleted"]
        shown = show.numeric(enrollment[enrollment["arm"] != "all"], columns).melt("arm", columns, "status", "n")
        shown = shown.dropna(subset=["n"])
        if not shown.empty:
            show.chart(alt.Chart(shown).mark_bar().encode(x=alt.X("n:Q", title="participants"), y="arm:N",
                                                          color="status:N", tooltip=["arm", "status", "n"]))
        show.table(tables["safety_events"], "Safety events per month", file_name="safety-events")
        show.table(tables["safety_reviews"], "Safety events by review status", file_name="safety-reviews",
                   caption="data_deleted: de-identified records (the participant withdrew and deleted their data)")
        show.hidden_note(pd.concat([enrollment, tables["safety_events"], tables["safety_reviews"]]))
        return
    unreviewed, alerts = data.live_alerts(context.database_url, context.study_id)
    first, second = st.columns(2)
    first.metric("Unreviewed safety events", unreviewed)
    second.metric("Open channel alerts", alerts)
    if unreviewed:
        st.warning(f"{unreviewed} safety event(s) wait for review.")
        st.page_link("views/safety.py", label="Open the safety review", icon=":material/health_and_safety:")
    if alerts:
        st.warning(f"{alerts} delivery channel alert(s) are open: follow-ups may not reach participants.")
    loaded = data.summary(context.database_url, context.slug, "numbers")
    counts = data.counts(context.database_url, context.slug, context.study_id, "recruitment")
    show.refreshed(loaded, counts)
    numbers = loaded["numbers"]
    show.table(numbers, "Participants by arm", file_name="participants-by-arm",
               caption="active: a survey still to come; completed: nothing left to come; withdrawn includes "
                       "data_deleted (as in the analysis report).")
    by_arm = numbers[numbers["arm"] != "all"].melt("arm", ["active", "completed", "withdrawn"], "status", "n")
    if not by_arm.empty:
        show.chart(alt.Chart(by_arm).mark_bar().encode(x=alt.X("n:Q", title="participants"), y="arm:N",
                                                       color="status:N", tooltip=["arm", "status", "n"]))
    recruitment = counts["recruitment"]
    if recruitment.empty:
        show.empty("enrollments")
        return
    cumulative = recruitment.sort_values("week").assign(total=lambda f: f.groupby("arm")["enrolled"].cumsum())
    show.chart(alt.Chart(cumulative).mark_line(point=True).encode(
        x=alt.X("week:T", title="week"), y=alt.Y("total:Q", title="enrolled (cumulative)"), color="arm:N",
        tooltip=["week", "arm", "enrolled", "total"]), caption="Recruitment over time, by arm (weeks from Monday, UTC)")
    show.table(recruitment, "Enrolled per week and arm", file_name="recruitment")


render(auth.require())
