"""Every viewer surface together: on a study of 6 participants of whom 1 withdrew, an attacker who
collects every number the staff API's summary, the dashboard's viewer pages and the aggregate
export show a viewer, and every relation between them (margins, totals, the same cell on two
surfaces, the summary's cells in the tables), works out no hidden count: neither by
subtraction nor by an exhaustive search."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator

import pandas as pd
import pytest
import streamlit as st
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from analysis.aggregates import SUPPRESSED, aggregate_tables
from api.app import create_app
from api.routers.staff import viewer_summary
from dashboard import data
from study import clock
from study.models import StaffRole, WithdrawalLevel
from study.settings import get_settings
from tests.analysis.attacker import LOW, attack, cells_of, viewer_view
from tests.analysis.panel_builders import PanelBuilder, Person, populate
from tests.builders import make_staff
from tests.dashboard.conftest import VIEWER_PAGES, sign_in, visit

VIEWER = "viewer@uni.example"
# Six participants, one of whom withdraws (keeping data): the withdrawal must stay hidden.
SIX = [Person("wellbeing", baseline=6, chats=True, crisis=True, decides=True),
       Person("wellbeing", baseline=7, chats=True, decides=True),
       Person("wellbeing", baseline=5, chats=True, withdraws=WithdrawalLevel.STOP_CONTACT),
       Person("control", baseline=4, chats=True, crisis=True, reviewed=True),
       Person("control", baseline=6, chats=True, decides=True),
       Person("control", baseline=5)]


@pytest.fixture
def six(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """The study and a viewer's API token; the dashboard reads it with an empty cache."""
    build = PanelBuilder(engine, example_protocol)
    populate(build, SIX, frozen_clock)
    token = make_staff(engine, build.slug, StaffRole.VIEWER, VIEWER)
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    st.cache_data.clear()
    data._generations.clear()
    yield build.slug, token
    st.cache_data.clear()


def dashboard_tables(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Every table the viewer's dashboard pages show, by the aggregate table it is."""
    app = sign_in(VIEWER)
    seen: dict[str, pd.DataFrame] = {}
    for page in VIEWER_PAGES:
        visit(app, page)
        for frame in app.dataframe:
            value = frame.value.reset_index(drop=True)
            name = next(n for n, t in tables.items() if list(t.columns) == list(value.columns))
            seen[name] = value
    return seen


def test_no_viewer_surface_gives_away_what_another_hides(engine: Engine, six: tuple[str, str]) -> None:
    slug, token = six
    viewer = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        summary = client.get(f"/api/v1/staff/studies/{slug}/summary", headers=viewer).json()
        response = client.get(f"/api/v1/staff/studies/{slug}/exports", params={"format": "aggregates"},
                              headers=viewer)
    assert response.status_code == 200, response.text
    bundle = zipfile.ZipFile(io.BytesIO(response.content))
    export = {name.rsplit("/", 1)[1].removesuffix(".csv"): pd.read_csv(io.BytesIO(bundle.read(name)), dtype=str,
                                                                       keep_default_na=False)
              for name in bundle.namelist() if name.endswith(".csv")}
    dashboard = dashboard_tables(export)
    assert set(dashboard) == {"enrollment", "followups", "wellbeing", "regret", "safety_events", "safety_reviews"}

    # Each surface shows a cell as the others do.
    exported = cells_of(export)
    for cell, value in cells_of(dashboard).items():
        assert str(value) == exported[cell], cell

    # The withdrawal (1 of 6) is hidden everywhere, and so is what would give it away.
    whole = aggregate_tables(engine, slug, threshold=0)
    enrollment = export["enrollment"].set_index("arm")
    assert (whole["enrollment"].set_index("arm").at["all", "withdrawn"], enrollment.at["all", "withdrawn"]) == (1, LOW)
    assert summary["participants_by_status"]["withdrawn"] == LOW
    assert SUPPRESSED in (enrollment.at["all", "enrolled"], enrollment.at["all", "participants"])

    # The attacker: every number, every relation, every subtraction.
    versions = {key: summary[key] for key in ("study", "protocol_version", "consent_version", "channel_alerts_open")}
    cells, sums, counts = viewer_view(export, summary, dashboard)
    truth, _, _ = viewer_view(whole, viewer_summary(versions, whole).model_dump(), {n: whole[n] for n in dashboard})
    assert len([v for v in cells.values() if v in (LOW, SUPPRESSED)]) > 50
    assert attack(cells, truth, sums, counts) == ({}, [])
    # The attack is real: with the "suppressed" cells shown, hidden ones are worked out.
    naive = {cell: truth[cell] if value == SUPPRESSED else value for cell, value in cells.items()}
    found, pinned = attack(naive, truth, sums, counts)
    assert found or pinned
