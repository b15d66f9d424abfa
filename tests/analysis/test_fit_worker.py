"""``analysis.fit_worker``: the dashboard's model fits run through the read side's own entry, not
through the ``afterward`` command, in a process that never imports ``api``."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy.engine import Engine

from analysis import fits
from study import audit

RESEARCHER = audit.Actor("staff", "r@uni.example")


def test_a_started_fit_runs_in_analysis_own_process_and_is_stored(engine: Engine, slug: str) -> None:
    fit_id = fits.request_fit(engine, slug, requested_by=RESEARCHER, n_boot=10)
    assert fit_id is not None
    process = fits.start_fit(engine.url.render_as_string(hide_password=False), fit_id)
    assert isinstance(process.args, list)
    assert process.args[1:3] == ["-m", "analysis.fit_worker"]
    assert process.wait(timeout=600) == 0
    stored = fits.load_fit(engine, fit_id)
    assert stored.status == "done"
    assert stored.requested_by == "staff:r@uni.example"
    assert fits.fit_status(engine, slug).latest_id == fit_id


def test_the_worker_refuses_a_fit_that_is_not_running(engine: Engine, slug: str) -> None:
    url = engine.url.render_as_string(hide_password=False)
    done = subprocess.run([sys.executable, "-m", "analysis.fit_worker", "999"], capture_output=True, text=True,
                          env={**os.environ, "AFTERWARD_DATABASE_URL": url}, timeout=300, check=False)
    assert done.returncode == 1
    assert "no running model fit 999" in done.stderr


def test_the_worker_imports_nothing_of_the_edge() -> None:
    probe = ("import sys, analysis.fit_worker; "
             "print(sorted(m for m in sys.modules if m == 'api' or m.startswith('api.')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "[]"
