"""Conversations: search the study's conversations and read a transcript with its stances,
rationales, overrides and role switches; every listing and every read is audited. Researchers
and admins."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis.transcripts import ConversationFilters
from dashboard import auth, staff_reads
from study.errors import DomainError

PAGE = 50
PAGE_KEY = "conversation-page"
SEARCH_KEY = "afterward_conversation_search"  # the study and filters the page number belongs to
ROLES = ["", "concierge", "collaborator", "coach", "standard"]
STANCES = ["", "agree", "nudge", "challenge", "check_in", "decline", "escalate"]


def transcript(context: auth.Context, conversation_id: int) -> None:
    found = staff_reads.transcript(context, conversation_id)
    st.subheader(f"Conversation {found.id} · participant {found.participant}")
    st.caption(f"arm {found.arm} ({found.mode} mode) · roles {' → '.join(found.roles_used)} · {found.status} · "
               f"started {found.started_at:%Y-%m-%d %H:%M} UTC")
    switches = {switch.after_seq: switch for switch in found.role_switches}
    for turn in found.turns:
        if turn.seq - 1 in switches:
            switch = switches[turn.seq - 1]
            st.info(f"role switched from {switch.from_role} to {switch.to_role}")
        with st.chat_message("user" if turn.speaker == "participant" else "assistant"):
            head = "Participant" if turn.speaker == "participant" else f"Assistant ({turn.role})"
            if turn.stance:
                head += f" · stance: {turn.stance}" + (f" ({turn.concern})" if turn.concern else "")
            st.markdown(f"**{head}** · {turn.created_at:%H:%M:%S}")
            st.text(turn.content)
            if turn.rationale:
                st.caption(f"rationale shown: {turn.rationale}")
            if turn.response:
                st.caption(f"participant's answer to this pushback: {turn.response}")
            if turn.after_override:
                st.caption("reply after an override")
    if found.decision:
        st.markdown(f"**Decision:** {found.decision.text}")
    if found.exit_rating and found.exit_rating.rating is not None:
        st.markdown(f"**Exit rating:** {found.exit_rating.rating:g} / 7")
    for event in found.safety_events:
        st.warning(f"safety event #{event.id}: {event.level.replace('_', '-')}, {event.category} ({event.source})"
                   + (f", reviewed by {event.reviewed_by}" if event.reviewed_by else ", not reviewed yet"))


def render(context: auth.Context) -> None:
    st.title("Conversations")
    with st.form("conversation-search"):
        first, second, third, fourth = st.columns(4)
        participant = first.text_input("Participant code", max_chars=16)
        arm = second.text_input("Arm", max_chars=64)
        role = third.selectbox("Held in role", ROLES, format_func=lambda r: r or "any")
        stance = fourth.selectbox("With a stance", STANCES, format_func=lambda s: s or "any")
        st.form_submit_button("Search")
    filters = ConversationFilters(participant=participant.strip().upper() or None, arm=arm.strip() or None,
                                  role=role or None, stance=stance or None)
    # A new search, or another study, starts on its first page: the page number of the last one may
    # be past the end of this one.
    search = (context.study_id, filters)
    if st.session_state.get(SEARCH_KEY) != search:
        st.session_state[SEARCH_KEY] = search
        st.session_state[PAGE_KEY] = 1
    page = int(st.number_input("Page", min_value=1, step=1, key=PAGE_KEY))
    try:
        found = staff_reads.conversations(context, filters, limit=PAGE, offset=(page - 1) * PAGE)
    except DomainError as exc:
        st.error(exc.message)
        return
    st.caption(f"{found.total} conversation(s) match; page {page} of {max(1, -(-found.total // PAGE))}. "
               "Every listing and every transcript you open is recorded in the audit log.")
    if not found.items:
        return
    st.dataframe(pd.DataFrame([{
        "id": item.id, "participant": item.participant, "arm": item.arm, "roles": " → ".join(item.roles_used),
        "status": item.status, "started_at": item.started_at, "turns": item.turn_count,
        "pushbacks": item.stance_counts.get("nudge", 0) + item.stance_counts.get("challenge", 0),
        "safety event": item.has_safety_event} for item in found.items]), hide_index=True, width="stretch")
    labels = {item.id: f"#{item.id} · {item.participant} · {item.started_at:%Y-%m-%d %H:%M}" for item in found.items}
    chosen = st.selectbox("Read a transcript", [None, *labels],
                          format_func=lambda c: "choose a conversation" if c is None else labels[c],
                          key="conversation-open")
    if chosen is not None:
        transcript(context, chosen)


render(auth.require(participant_level=True))
