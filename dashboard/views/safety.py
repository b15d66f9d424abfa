"""Safety review: the queue of safety events waiting for review (every risk finding, at its level:
check-in, escalation or unanswered check-in) with each one's check-in answers and the turns around
it, a review form that records what was done (audited), escalations and overrides over time, and
the mode's calibration card (pushback rate by role, model and prompt version over time).
Researchers and admins.

When the address names one of the study's events (``links``: an on-call email's link), the page
shows that event alone, reviewed or not, and what it is, with its turns, its reviews and the form,
sized for a phone; "Open the review queue" goes back to the whole page."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from analysis.schemas import SafetyEventContextRead
from chat.schemas import SafetyEventRead
from chat.triage import ANSWER_LABELS
from dashboard import auth, data, links, show, staff_reads
from study.errors import DomainError, Gone, Invalid, NotFound

NOTE_MAX = 4000  # as the API's SafetyReview
LEVELS = {"check_in": "check-in", "escalation": "escalation", "unanswered": "unanswered check-in"}
STATUSES = {"open": "waiting for answers", "answered": "answered", "unanswered": "not answered in time",
            "replaced": "replaced by a newer check-in"}


def level_of(event: SafetyEventRead) -> str:
    """The event's level as the queue names it, and whether it pages."""
    return LEVELS[event.level] + (" (paging)" if event.page_since is not None else "")


def check_in(event: SafetyEventRead) -> None:
    """The event's level, and its check-in: each question with the answer and how it was given."""
    st.markdown(f"**Level:** {level_of(event)}"
                + (f" · **answers due:** {event.answer_due_at:%Y-%m-%d %H:%M} UTC" if event.answer_due_at else "")
                + (f" · **unanswered since:** {event.unanswered_at:%Y-%m-%d %H:%M} UTC" if event.unanswered_at else ""))
    asked = event.check_in
    if asked is None:
        return
    outcome = f" · the answers say: {asked.outcome}" if asked.outcome else ""
    st.markdown(f"**Check-in** ({asked.kind.replace('_', ' ')}): {STATUSES[asked.status]}{outcome}"
                + (" · the participant was shown the follow-up" if asked.followed_up_at else ""))
    # A list, not a table: it is read on a phone too (an on-call email's link), and wraps.
    st.markdown("\n".join(
        f"- {answer.text} **{ANSWER_LABELS[answer.answer]}** ({answer.given}, "  # type: ignore[index]
        f"{answer.answered_at:%H:%M} UTC)" if answer.answer else f"- {answer.text} *not answered*"
        for answer in asked.answers))


def turns(found: SafetyEventContextRead) -> None:
    """The turns around the event, the triggering reply marked; for an event a safety rule on survey
    answers raised, the rule and the answer."""
    if found.conversation_id is None:
        st.markdown(f"**Raised by the study's safety rule on survey answers:** {found.event.cue}")
        return
    st.markdown(f"**Turns around the event** (conversation {found.conversation_id}; the triggering turn "
                "is marked)")
    for turn in found.turns:
        who = "Participant" if turn.speaker == "participant" else f"Assistant ({turn.role}, {turn.stance})"
        marker = " ⚠ triggered the event" if turn.id == found.trigger_turn_id else ""
        with st.chat_message("user" if turn.speaker == "participant" else "assistant"):
            st.markdown(f"**{who}**{marker} · {turn.created_at:%Y-%m-%d %H:%M} UTC")
            st.text(turn.content)
            if turn.rationale:
                st.caption(f"rationale: {turn.rationale}")


def review_form(context: auth.Context, event_id: int) -> None:
    """Record what was done about the event (audited); the page shows it recorded."""
    with st.form(f"review-{event_id}", clear_on_submit=True):
        note = st.text_area("What was done", max_chars=NOTE_MAX, placeholder="e.g. contacted per protocol")
        submitted = st.form_submit_button("Record review", type="primary")
    if submitted:
        if not note.strip():
            st.error("say what was done before recording the review")
            return
        try:
            reviewed = staff_reads.review(context, event_id, note.strip())
        except Invalid as exc:
            st.error(exc.message)
            return
        st.session_state["afterward_reviewed"] = f"review of event #{reviewed.id} recorded"
        st.rerun()


def queue(context: auth.Context) -> None:
    st.subheader("Review queue")
    pending = staff_reads.safety_queue(context)
    events = pending.events
    if not events:
        st.success("No safety event waits for review.")
        return
    if pending.truncated:
        st.warning(f"{pending.total} safety events wait for review; only the newest {len(events)} are listed "
                   "here. Older ones appear as these are reviewed (the staff API lists them all).")
    else:
        st.caption(f"{pending.total} safety event(s) wait for review, newest first.")
    listing = pd.DataFrame([{"event": e.id, "level": level_of(e), "created_at": e.created_at, "category": e.category,
                             "check-in": (e.check_in.outcome or STATUSES[e.check_in.status]) if e.check_in else "",
                             "source": e.source, "participant": e.participant or e.marker,
                             "conversation": e.conversation_id} for e in events])
    st.dataframe(listing, hide_index=True, width="stretch")
    labels = {e.id: f"#{e.id} · {LEVELS[e.level]} · {e.category} · {e.created_at:%Y-%m-%d %H:%M} UTC · "
                    f"{e.participant or e.marker}" for e in events}
    chosen = st.selectbox("Event to review", list(labels), format_func=labels.__getitem__, key="safety-event")
    check_in(next(e for e in events if e.id == chosen))
    try:
        found = staff_reads.safety_event(context, chosen)
    except DomainError as exc:  # a de-identified record has no turns left; it can still be reviewed
        st.info(exc.message)
    else:
        turns(found)
    review_form(context, chosen)


def linked(context: auth.Context, event_id: int) -> None:
    """The one event the address names (an on-call email's link): what it is, the turns around it,
    its reviews so far and the review form."""
    st.subheader(f"Safety event #{event_id}")
    if st.button("Open the review queue", key="safety-queue",
                 help="all the events that wait for review, and the calibration card"):
        links.drop()
        st.rerun()
    try:
        found = staff_reads.safety_event(context, event_id)
    except NotFound as exc:  # of another study, or none: nothing about it is shown
        st.error(f"{exc.message[:1].upper()}{exc.message[1:]} ({context.title}). Check the link in the on-call "
                 "email, or open the review queue for the events that wait.")
        return
    except Gone as exc:  # a de-identified record has no turns left; it can still be reviewed
        st.info(exc.message)
    else:
        event = found.event
        st.markdown(f"**Category:** {event.category.replace('_', ' ')} · **detected by:** {event.source} · "
                    f"**raised:** {event.created_at:%Y-%m-%d %H:%M} UTC · **participant:** {event.participant}")
        check_in(event)
        if event.reviewed_at is None:
            st.warning("Not reviewed yet." if not event.reviews else "Not reviewed at its level now (the reviews "
                       "below came before it rose).")
        for review in event.reviews:
            st.caption(f"Reviewed {review.reviewed_at:%Y-%m-%d %H:%M} UTC by {review.reviewed_by}:")
            st.text(review.note)
        turns(found)
    review_form(context, event_id)


def calibration(context: auth.Context) -> None:
    tables, counts = data.together(
        lambda: data.aggregates(context.database_url, context.slug, viewer=False),
        lambda: data.counts(context.database_url, context.slug, context.study_id, "escalations", "model_versions"))
    show.refreshed(tables, counts)
    escalations = counts["escalations"]
    if escalations.empty:
        show.empty("escalations or overrides")
    else:
        long = escalations.melt("week", ["escalations", "overrides"], "kind", "n")
        show.chart(alt.Chart(long).mark_line(point=True).encode(x="week:T", y=alt.Y("n:Q", title="per week"),
                                                                color="kind:N", tooltip=["week", "kind", "n"]),
                   caption="Escalations (safety events at level escalation) and overridden pushbacks per week")
        show.table(escalations, "Escalations and overrides per week", file_name="escalations-overrides")
    st.subheader("Calibration card")
    card = tables["conversations"].copy()
    card["override_share"] = [round(o / p, 3) if p else None for o, p in zip(card["overrides"],
                                                                           card["pushback_turns"], strict=True)]
    roles = card[card["starting_role"] != "all"]
    if not roles.empty:
        show.chart(alt.Chart(roles).mark_bar().encode(
            x=alt.X("starting_role:N", title="role"), y=alt.Y("pushback_rate:Q", title="pushback rate"),
            color="arm:N", tooltip=["arm", "starting_role", "pushback_rate", "assistant_turns", "override_share"]),
            caption="Pushback rate (nudge or challenge replies / all replies) by arm and starting role")
    show.table(card, "Pushback and overrides by arm and role", file_name="calibration")
    versions = counts["model_versions"]
    if not versions.empty:
        labelled = versions.assign(version=versions["model"] + " · prompt " + versions["prompt_version"])
        show.chart(alt.Chart(labelled).mark_bar().encode(x="week:T", y=alt.Y("replies:Q"), color="version:N",
                                                         tooltip=["week", "model", "prompt_version", "replies"]),
                   caption="Assistant replies per week by model and prompt version")
        show.table(versions, "Model and prompt version per week", file_name="model-versions")


def render(context: auth.Context) -> None:
    st.title("Safety review")
    done = st.session_state.pop("afterward_reviewed", None)
    if done:
        st.success(done)
    event_id = links.shown(context.slug)
    if event_id is not None:
        linked(context, event_id)
        return
    queue(context)
    calibration(context)


render(auth.require(participant_level=True))
