"""Simulated studies with effects known in advance.

- ``population``: the generative model (``Effects``) and what synthetic participants say;
- ``simulate``: synthetic participants through the real services, the clock moved forward;
- ``driver``: their side of the chat, through the same turn pipeline as the API (``chat.turn``);
- ``synthetic``, ``synthetic_tables``: the analysis tables drawn straight from the same model
  with numpy, for power analysis and coverage benches.
"""
