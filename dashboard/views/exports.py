"""Exports: the research-data exports as downloads (a zip of the tables, codebook and README),
made by the same ``analysis`` functions as ``afterward export`` and the staff API, and audited
there. Viewers may download the aggregate tables only. While the study is blinded until its analysis
plan is frozen (``analysis.plan``), the aggregates' outcome tables are pooled over the arms and the
other formats are refused, unless an admin gives a reason to unblind the export (audited)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st

from analysis.aggregates import AGGREGATES
from analysis.archive import export_archive
from analysis.exports import FORMATS
from analysis.plan import UNBLIND_ROLES
from dashboard import auth, data, staff_reads
from study.db import engine_for
from study.errors import DomainError

DESCRIPTIONS = {
    AGGREGATES: "aggregate tables, every cell under 5 participants suppressed",
    "csv": "every table, CSV", "parquet": "every table, Parquet", "spss": "every table, SPSS (.sav)",
    "stata": "every table, Stata (.dta)",
    "trajectories": "outcome-labelled conversations of those who agreed to share them (JSONL)",
}
BUNDLE_KEY = "afterward_export"


def build(context: auth.Context, export_format: str, *, turns: bool, shift_dates: bool,
          drop_free_text: bool, unblind: str | None = None) -> bytes:
    """The export's zip archive (``analysis.archive.export_archive``, which audits it)."""
    with tempfile.TemporaryDirectory(prefix="afterward-export-") as folder:
        archive = export_archive(engine_for(context.database_url), staff_reads.actor(context), context.study_id,
                                 Path(folder), export_format, turns=turns, shift_dates=shift_dates,
                                 drop_free_text=drop_free_text, unblind=unblind)
        return archive.read_bytes()


def render(context: auth.Context) -> None:
    st.title("Exports")
    formats = [AGGREGATES, *FORMATS, "trajectories"] if context.participant_level else [AGGREGATES]
    if not context.participant_level:
        st.caption("Your role (viewer) may download the aggregate tables, with every cell under 5 participants "
                   "suppressed.")
    export_format = st.radio("Format", formats, format_func=lambda f: f"{f}: {DESCRIPTIONS.get(f, f)}",
                             key="export-format")
    row_level = export_format in FORMATS
    turns = st.checkbox("Include every message (scrubbed of emails and phone numbers)", disabled=not row_level)
    shift_dates = st.checkbox("De-identify: shift each participant's dates by a random number of days, rename "
                              "participants and ids for this export, rows in a random order", disabled=not row_level)
    drop_free_text = st.checkbox("Leave out free-text columns", disabled=not row_level)
    unblind = None
    if data.blinding(context.database_url, context.study_id).blinded:
        st.info("This study is blinded until its analysis plan is frozen (`afterward plan freeze`): the aggregate "
                "outcome tables are pooled over the arms, and every other format, which carries the arm beside "
                "outcomes, is refused.")
        if context.role in UNBLIND_ROLES:
            unblind = st.text_input("Admins: why this export must show outcomes by arm (recorded in the audit "
                                    "log; leave empty to stay blind)", max_chars=500, key="export-unblind").strip()
    if st.button("Prepare the export", type="primary", key="export-prepare"):
        try:
            with st.spinner("Exporting…"):
                payload = build(context, export_format, turns=turns and row_level,
                                shift_dates=shift_dates and row_level, drop_free_text=drop_free_text and row_level,
                                unblind=unblind or None)
        except (DomainError, LookupError) as exc:
            st.error(exc.message if isinstance(exc, DomainError) else str(exc))
            return
        st.session_state[BUNDLE_KEY] = ((context.email, context.role, context.slug), export_format, payload)
    bundle = st.session_state.get(BUNDLE_KEY)
    # Offered only to who prepared it, in the role and study it was prepared in (a role change or
    # another person signing in on this tab does not inherit it).
    if bundle and bundle[0] == (context.email, context.role, context.slug):
        slug, made, payload = context.slug, bundle[1], bundle[2]
        st.success(f"The {made} export is ready ({len(payload) / 1024:.0f} KB); it was recorded in the audit log.")
        st.download_button(f"Download {slug}-{made}.zip", payload, file_name=f"{slug}-{made}.zip",
                           mime="application/zip", key="export-download")


render(auth.require())
