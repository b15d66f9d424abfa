"""What every page is made of: the "refreshed at" line, tables with a CSV download, Altair
charts (Streamlit's chart menu saves them as PNG or SVG), the viewer's form of a table, and the
notice of a page of outcomes while the study is blinded (with an admin's form to unblind it)."""

from __future__ import annotations

import re

import altair as alt
import pandas as pd
import streamlit as st

from analysis import spreadsheet
from analysis.aggregates import SUPPRESSED, below
from analysis.plan import UNBLIND_ROLES, OutcomeBlinding
from dashboard import auth, data, staff_reads
from study.errors import DomainError

HIDDEN = (below(), SUPPRESSED)
UNBLIND_KEY = "afterward_unblinded"  # an admin's unblinding: ((email, role, study, page), reason)
DOWNLOAD_HELP = f"Safe to open in a spreadsheet: {spreadsheet.RULE}; numbers are as shown. To undo, {spreadsheet.UNDO}."


def refreshed(*reads: data.Read) -> None:
    """The "refreshed at" line: when the oldest of the page's cached reads was taken."""
    if not reads:
        return
    oldest = min(read.refreshed_at for read in reads)
    st.caption(f"Refreshed at {oldest:%Y-%m-%d %H:%M:%S} UTC · figures are cached for "
               f"{data.CACHE_SECONDS // 60} minutes (Refresh in the sidebar reads them again)")


def fitted(models: data.Models) -> None:
    """Which fit of the models the page shows, and whether a newer one is on its way."""
    fit, status = models.fit, models.status
    if fit is not None:
        st.caption(f"Models fitted at {fit.finished_at:%Y-%m-%d %H:%M} UTC from the data as read at "
                   f"{fit.data_read_at:%Y-%m-%d %H:%M} UTC ({fit.participants:,} participants, "
                   f"{fit.options.get('n_boot')} bootstrap replicates, {fit.seconds:.0f} s to fit)")
        for note in fit.notes:
            st.caption(note)
    if status.running_since is not None:
        what = "A newer fit" if fit is not None else "The first fit of the models"
        why = " (started by this view: the last fit was too old, or there was none)" if models.started else ""
        st.info(f"{what} has been running in the background since {status.running_since:%Y-%m-%d %H:%M} UTC"
                f"{why}; it appears here when it ends (fitting takes minutes on a large study; reload the page).")
    if status.failed:
        st.warning(f"The last fit failed: {status.failed}")


def _key(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def table(frame: pd.DataFrame, title: str, *, file_name: str | None = None, caption: str | None = None) -> None:
    """A table with its CSV download (text cells neutralized against formula injection,
    ``analysis.spreadsheet``). Hidden cells (``"< 5"``, ``"suppressed"``) are shown as such."""
    st.markdown(f"**{title}**")
    if caption:
        st.caption(caption)
    shown = frame.copy()
    for column in shown.columns:
        if shown[column].dtype == object and shown[column].isin(HIDDEN).any():
            shown[column] = shown[column].map(lambda v: "" if v is None else str(v))
    st.dataframe(shown, hide_index=True, width="stretch")
    name = file_name or _key(title)
    st.download_button(f"Download {title} (CSV)", spreadsheet.csv_text(frame).encode("utf-8"), file_name=f"{name}.csv",
                       mime="text/csv", key=f"csv-{name}", help=DOWNLOAD_HELP)


def numeric(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The frame with ``columns`` as numbers; hidden cells become missing (never plotted)."""
    out = frame.copy()
    for column in columns:
        out[column] = pd.to_numeric(out[column].where(~out[column].isin(HIDDEN)), errors="coerce")
    return out


def chart(figure: alt.Chart | alt.LayerChart, caption: str | None = None) -> None:
    """An interactive Altair chart; its menu (top right) saves it as PNG or SVG."""
    st.altair_chart(figure, width="stretch")
    if caption:
        st.caption(caption)


def hidden_note(frame: pd.DataFrame) -> None:
    if frame.isin(HIDDEN).to_numpy().any():
        st.caption(f"'{below()}': fewer than 5 participants; '{SUPPRESSED}': hidden so that a '{below()}' cell "
                   "cannot be worked out from the others. Hidden cells are left out of the charts.")


def empty(what: str) -> None:
    st.info(f"No {what} yet.")


def blinding(context: auth.Context, view: str) -> OutcomeBlinding:
    """The study's blinding for a page of outcomes (``analysis.plan``, read at every view). While it
    is blinded the page says so and, for an admin, offers to unblind this page with a reason: audited
    each time the unblinded page comes into view (``staff_reads.unblinded``), until "Blind this page
    again" or the end of the session. The page hides the arm while the returned value is ``blinded``."""
    found = data.blinding(context.database_url, context.study_id)
    if not found.blinded:
        return found
    key = (context.email, context.role, context.slug, view)
    held = st.session_state.get(UNBLIND_KEY)
    if isinstance(held, tuple) and held[0] == key:
        try:
            lifted = staff_reads.unblinded(context, view, held[1])
        except DomainError as exc:
            st.session_state.pop(UNBLIND_KEY, None)
            st.error(exc.message)
            return found
        st.warning(f"Unblinded by you: outcomes by arm are shown although the analysis plan is not frozen. Your "
                   f"reason, recorded in the audit log each time this page comes into view: {held[1]}")
        if st.button("Blind this page again", key="blind-again"):
            st.session_state.pop(UNBLIND_KEY, None)
            st.rerun()
        return lifted
    st.info(found.message(view))
    if context.role in UNBLIND_ROLES:
        with st.form("unblind"):
            reason = st.text_input("Why this page must show outcomes by arm now (recorded in the audit log)",
                                   max_chars=500, key="unblind-reason")
            asked = st.form_submit_button("Unblind this page (admins)")
        if asked and reason.strip():
            st.session_state[UNBLIND_KEY] = (key, reason.strip())
            st.rerun()
        elif asked:
            st.error("say why this page must be unblinded: the reason is recorded in the audit log")
    return found
