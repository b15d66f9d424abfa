"""The dashboard's address of one safety event, as the on-call notice links to it
(``scheduler.oncall.event_link``): ``/safety?study=SLUG&event=ID``, the study's slug and the
event's id, nothing else.

Opened signed out, the address keeps its page and parameters while the staff member signs in
(``app`` registers every page's address for the sign-in page). Once signed in, ``app`` applies the
link once per session: it chooses the link's study in the sidebar when the staff member has a role
in it that sees participant-level data, or says why the event cannot be shown; the safety review
(``views.safety``) then shows the event while the address names it and its study is the chosen one.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from study.validation import MAX_ROW_ID, form_int

STUDY = "study"
EVENT = "event"
APPLIED_KEY = "afterward_link_applied"


@dataclass(frozen=True)
class EventLink:
    slug: str
    event_id: int


NOT_A_LINK = ("This address does not name a safety event (it needs a study and an event number, as in the link "
              "of an on-call email). Open the link in the email again, or choose the event in the review queue.")


def requested() -> EventLink | str | None:
    """The safety event the address names; a message a person can act on when its parameters do
    not name one; None when the address names no event."""
    params = st.query_params
    if EVENT not in params and STUDY not in params:
        return None
    event_id = form_int(params.get(EVENT), lo=1, hi=MAX_ROW_ID)
    slug = params.get(STUDY, "")
    if event_id is None or not slug:
        return NOT_A_LINK
    return EventLink(slug, event_id)


def to_apply() -> EventLink | str | None:
    """What ``requested`` gives, the first time this session's address names it; None after that,
    so the staff member can choose another study while the address still names the event."""
    link = requested()
    if link is None or st.session_state.get(APPLIED_KEY) == link:
        return None
    st.session_state[APPLIED_KEY] = link
    return link


def drop() -> None:
    """Take the event out of the address (the review queue is shown again)."""
    for name in (STUDY, EVENT):
        st.query_params.pop(name, None)


def shown(slug: str) -> int | None:
    """The event the safety review of study ``slug`` shows alone: the address's, when it names
    this study's."""
    link = requested()
    return link.event_id if isinstance(link, EventLink) and link.slug == slug else None
