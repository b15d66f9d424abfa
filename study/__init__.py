"""The kernel and the study domain: settings, database, clock, protocol, participants, consent,
withdrawal, staff and the audit log. Imports nothing else of ours."""
