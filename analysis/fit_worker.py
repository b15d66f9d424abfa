"""The process a claimed model fit runs in: ``python -m analysis.fit_worker FIT_ID``.

``analysis.fits.start_fit`` starts it, detached, for the dashboard, so a fit is made by the read
side's own entry and not through the ``afterward`` command (the edge). The database is the one
``AFTERWARD_DATABASE_URL`` names; what it prints goes to ``var/model-fits.log``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from sqlalchemy.engine import Engine

from analysis.fits import StoredFit, run_fit
from study import wiring
from study.db import get_engine


def run_claimed(engine: Engine, fit_id: int, say: Callable[[str], object]) -> StoredFit:
    """Run the claimed fit ``fit_id`` and say what was stored (``afterward models fit`` says the
    same). Raises LookupError when no such fit is running."""
    say(f"fitting the models (fit {fit_id})")
    stored = run_fit(engine, fit_id)
    say(f"fit {stored.id}: {len(stored.tables)} tables from {stored.participants} participants "
        f"in {stored.seconds:.1f} s")
    for note in stored.notes:
        say(f"  {note}")
    return stored


def main(argv: list[str]) -> int:
    """0 when the fit ``argv[0]`` is stored; 1 (the reason on stderr) when no such fit is running;
    2 for a bad argument. A fit that fails is stored as failed and its error raised."""
    if len(argv) != 1 or not argv[0].isdigit():
        sys.stderr.write("usage: python -m analysis.fit_worker FIT_ID\n")
        return 2
    wiring.wire()  # like every process of the platform: withdrawal and completion wired first
    try:
        run_claimed(get_engine(), int(argv[0]), lambda line: sys.stdout.write(line + "\n"))
    except LookupError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
