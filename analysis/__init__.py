"""The read side of a study: conversation features, the participant x wave panel, exports.

A library first (``import analysis`` in a notebook), with the CLI and the staff API on top. It
reads the other packages' tables (never writes them) and computes set-based, in SQL or in
chunks, never row by row over ORM objects.
"""
