"""The staff dashboard's entry point: ``streamlit run dashboard/app.py`` (``afterward dashboard``).

Every page view runs this script first: it checks the session (``dashboard.auth``), offers the
studies the staff member has a role in, and registers only the pages that role may open, before
any page reads a number. While a page is open, it checks the session's limits every
``auth.WATCH_SECONDS`` and signs out (clearing the page) once they are passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from dashboard import auth, data, links, staff_reads
from study.errors import Forbidden

VIEWS = Path(__file__).parent / "views"
# The participant pages' icon, served by Streamlit itself: a ":material/...:" page icon is fetched from
# a public font service by every staff browser (nothing the platform serves loads from outside).
ICON = Path(__file__).resolve().parent.parent / "api" / "static" / "favicon.ico"


@dataclass(frozen=True)
class PageSpec:
    module: str
    title: str
    icon: str
    participant_level: bool  # researchers and admins only


PAGES = [
    PageSpec("overview", "Overview", ":material/monitor_heart:", False),
    PageSpec("enrollment", "Enrollment", ":material/group_add:", False),
    PageSpec("followups", "Follow-ups", ":material/schedule_send:", False),
    PageSpec("outcomes", "Outcomes", ":material/trending_up:", False),
    PageSpec("conversation_outcomes", "Conversations → outcomes", ":material/forest:", True),
    PageSpec("safety", "Safety review", ":material/health_and_safety:", True),
    PageSpec("conversations", "Conversations", ":material/forum:", True),
    PageSpec("data_quality", "Data quality", ":material/rule:", True),
    PageSpec("model_cards", "Model cards", ":material/fact_check:", False),
    PageSpec("exports", "Exports", ":material/download:", False),
]


def sign_in_page() -> None:
    st.title("Afterward staff dashboard")
    reason = st.session_state.pop("afterward_signed_out_because", None)
    if reason:
        st.info(reason)
    link = links.requested()
    if isinstance(link, links.EventLink):
        st.info(f"Sign in to open safety event #{link.event_id}.")
    with st.form("sign-in"):
        email = st.text_input("Email", autocomplete="username")
        password = st.text_input("Password", type="password", autocomplete="current-password")
        submitted = st.form_submit_button("Sign in", type="primary")
    if submitted:
        problem = auth.sign_in(email, password, auth.client_address())
        if problem is None:
            st.rerun()
        st.error(problem)
    st.markdown("Use your Afterward staff account (the same as the staff API). After several wrong passwords "
               "each further attempt has to wait, longer each time.")


def follow_link(email: str, studies: list[auth.Membership]) -> None:
    """Apply a link to a safety event (``links``) once: choose its study, or say why it cannot be shown."""
    link = links.to_apply()
    if link is None:
        return
    problem = link if isinstance(link, str) else None
    if isinstance(link, links.EventLink):
        membership = next((m for m in studies if m.slug == link.slug), None)
        if membership is None:
            problem = (f"The safety event in this link is in a study where your account ({email}) has no role, so it "
                       "cannot be shown. Sign in with the staff account of that study (the on-call email names it), "
                       "or ask one of its admins for a role.")
        elif not membership.participant_level:
            problem = (f"The safety event in this link is in {membership.title}, where your role (viewer) sees "
                       "aggregate figures only. Its researchers and admins review safety events.")
        else:
            st.session_state[auth.STUDY_KEY] = membership.slug
    if problem is not None:
        links.drop()
        st.error(problem)  # above the page the staff member lands on, for this view


def main() -> None:
    st.set_page_config(page_title="Afterward · staff dashboard", page_icon=str(ICON), layout="wide")
    held = auth.current()
    if held is None:
        # Each page's address signs in too, so a link to one (an on-call email's) opens it once signed in.
        st.navigation([st.Page(sign_in_page, title="Sign in", url_path="sign-in", default=True)]
                      + [st.Page(sign_in_page, title="Sign in", url_path=spec.module, visibility="hidden")
                         for spec in PAGES], position="hidden").run()
        return
    staff_reads.begin_run()  # what this run reads and audits comes into view now (see staff_reads)
    studies = auth.memberships(held.email)
    follow_link(held.email, studies)
    with st.sidebar:
        st.caption(f"Signed in as {held.email}")
        if st.button("Sign out", key="sign-out"):
            auth.sign_out("you signed out")
            st.rerun()
        # Reruns on its own (only this, not the page, and not as activity): a page left open signs
        # out and clears itself once the session's limits are passed.
        st.fragment(auth.watch, run_every=auth.WATCH_SECONDS)()
    if not studies:
        st.error("your account has no role in any open study; ask an admin to grant you one")
        return
    # The slug beside the title: two studies may share a title, never a slug.
    labels = {m.slug: f"{m.title} · {m.slug} ({m.role})" + (" · SIMULATED" if m.simulated else "") for m in studies}
    with st.sidebar:
        chosen = st.selectbox("Study", list(labels), format_func=labels.__getitem__, key=auth.STUDY_KEY)
        refresh = st.button("Refresh figures", key="refresh",
                            help="read this study's figures again now, not from the cache")
    membership = next(m for m in studies if m.slug == chosen)
    if membership.simulated:
        st.sidebar.info("A simulated study: synthetic participants made by `afterward simulate`, not research "
                           "data. Its figures show what the analyses find, not how anyone is doing.")
    try:
        context = auth.set_context(held, membership)
    except Forbidden as exc:
        st.error(exc.message)
        return
    if refresh and not data.refresh(context.database_url, context.slug):
        st.sidebar.caption(f"These figures were read again less than {data.REFRESH_SECONDS} s ago; "
                           "they are as current as they get.")
    pages = [st.Page(VIEWS / f"{spec.module}.py", title=spec.title, icon=spec.icon, url_path=spec.module,
                     default=spec.module == "overview")
             for spec in PAGES if context.participant_level or not spec.participant_level]
    st.navigation(pages).run()


main()
