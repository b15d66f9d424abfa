"""The report's models as the dashboard has them: fitted in a process of their own, stored, and
shown; one fit of a study at a time; a page asking for models too old starts a new fit without
waiting for it."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import delete, select

from analysis import fits
from analysis.estimates import StudyData
from analysis.report import fit_models
from analysis.tables import ModelFit
from study import audit, clock
from study.db import session_scope
from study.models import AuditEntry, StaffRole
from tests.dashboard.conftest import EMAILS, NOW, Simulated, sign_in, visit
from tests.waiting import until

pytestmark = pytest.mark.usefixtures("dashboard_env")
RESEARCHER = audit.Actor("staff", EMAILS[StaffRole.RESEARCHER])


def test_the_stored_fit_is_the_reports_fit(simulated: Simulated) -> None:
    stored = fits.latest_fit(simulated.engine, simulated.slug)
    assert stored is not None
    assert stored.data_read_at == NOW
    suite = fit_models(StudyData.load(simulated.engine, simulated.slug), n_boot=fits.BOOTSTRAP)
    expected = fits.suite_tables(suite)
    assert set(stored.tables) == set(expected)
    assert {"regret.coefficients", "perma.marginal_means", "screen.feature_screen", "dropout.curves"} <= set(expected)
    for name, frame in expected.items():
        pd.testing.assert_frame_equal(stored.tables[name].reset_index(drop=True), frame.reset_index(drop=True),
                                      check_dtype=False, rtol=1e-9, obj=name)
    assert stored.notes == tuple(f"{name}: not estimated ({why})" for name, why in suite.not_estimated.items())


def test_one_fit_of_a_study_runs_at_a_time_and_an_abandoned_one_is_marked_failed(
        simulated: Simulated, dashboard_env: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch) -> None:
    first = fits.request_fit(simulated.engine, simulated.slug, requested_by=RESEARCHER)
    try:
        assert first is not None
        assert fits.request_fit(simulated.engine, simulated.slug, requested_by=RESEARCHER) is None
        assert fits.fit_status(simulated.engine, simulated.slug).running_id == first
        dashboard_env.advance(fits.LEASE + dt.timedelta(minutes=1))  # its worker never finished
        assert fits.fit_status(simulated.engine, simulated.slug).running_id is None
        second = fits.request_fit(simulated.engine, simulated.slug, requested_by=RESEARCHER)
        assert second is not None
        with session_scope(simulated.engine, read_only=True) as session:
            abandoned = session.get(ModelFit, first)
            assert abandoned is not None
            assert abandoned.status == "failed"
            assert abandoned.error == "the fitting process stopped before it finished"

        def fails(*args: object, **kwargs: object) -> None:
            raise np.linalg.LinAlgError("Singular matrix")

        monkeypatch.setattr(fits, "fit_models", fails)
        with pytest.raises(np.linalg.LinAlgError):
            fits.run_fit(simulated.engine, second)
        status = fits.fit_status(simulated.engine, simulated.slug)
        assert status.failed == "LinAlgError: Singular matrix"
        assert status.latest_id is not None  # the pages still show the last good fit
        assert status.running_id is None
    finally:
        with session_scope(simulated.engine) as session:
            session.execute(delete(ModelFit).where(ModelFit.status != "done"))


def test_a_page_with_old_models_starts_a_fit_in_the_background_and_shows_it_when_done(
        simulated: Simulated, dashboard_env: clock.FrozenClock) -> None:
    before = fits.fit_status(simulated.engine, simulated.slug)
    dashboard_env.advance(dt.timedelta(hours=2))  # the stored fit is now over an hour old
    app = sign_in(EMAILS[StaffRole.RESEARCHER])
    try:
        visit(app, "conversation_outcomes")  # the page did not wait for the fit: it is still running below
        assert any("running in the background" in info.value for info in app.info)
        assert any(c.value.startswith("Models fitted at 2026-03-30") for c in app.caption)  # the previous fit
        running = fits.fit_status(simulated.engine, simulated.slug)
        assert running.running_id is not None
        assert running.latest_id == before.latest_id
        visit(app, "outcomes")  # a second view starts no second fit
        assert fits.fit_status(simulated.engine, simulated.slug).running_id == running.running_id
        until(lambda: fits.fit_status(simulated.engine, simulated.slug).running_id is None,
              "the background fit to finish", timeout=600)
        done = fits.fit_status(simulated.engine, simulated.slug)
        assert done.failed is None
        assert done.latest_id == running.running_id
        visit(app, "conversation_outcomes")
        assert not any("running in the background" in info.value for info in app.info)
        shown = fits.load_fit(simulated.engine, done.latest_id)
        assert shown.requested_by == f"staff:{EMAILS[StaffRole.RESEARCHER]}"
        with session_scope(simulated.engine, read_only=True) as session:
            entry = session.scalars(select(AuditEntry).where(AuditEntry.action == fits.ACTION)
                                    .order_by(AuditEntry.seq.desc())).first()
        assert entry is not None
        assert (entry.actor_type, entry.actor) == ("staff", EMAILS[StaffRole.RESEARCHER])
        assert entry.detail["fit_id"] == done.latest_id
    finally:  # the other tests read the fit made at the study's end
        with session_scope(simulated.engine) as session:
            session.execute(delete(ModelFit).where(ModelFit.id != before.latest_id))


def test_only_the_newest_fits_are_kept(simulated: Simulated, monkeypatch: pytest.MonkeyPatch) -> None:
    before = fits.fit_status(simulated.engine, simulated.slug).latest_id
    monkeypatch.setattr(fits, "KEEP", 1)
    claimed = fits.request_fit(simulated.engine, simulated.slug, requested_by=RESEARCHER)
    assert claimed is not None
    fits.run_fit(simulated.engine, claimed)  # at the study's end, as the fit it replaces
    with session_scope(simulated.engine, read_only=True) as session:
        done = session.scalars(select(ModelFit.id).where(ModelFit.status == "done")).all()
    assert done == [claimed]
    assert before != claimed
