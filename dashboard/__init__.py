"""The staff dashboard: a Streamlit app over the same ``analysis`` code as the exports and the
report. Started by ``afterward dashboard`` (``streamlit run dashboard/app.py``).

``app`` signs staff in and registers the pages their role in the chosen study allows; ``data``
holds the cached reads (``st.cache_data`` with a time limit) of ``analysis``; ``staff_reads`` the
audited participant-level reads as the page shows them (``analysis.transcripts``, ``chat.staff``);
``show`` the shared pieces of a page (tables with a CSV download, Altair charts, the "refreshed at"
line); ``links`` the address of one safety event (an on-call email's link); ``views/`` one module
per page.
"""
