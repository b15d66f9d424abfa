"""Listing a study's participants, through the staff API and ``afterward participants list``: the
same filters (status, arm, consent version, enrollment time) in both, each read audited with its
filters, bad filters refused with a message."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from api.cli import app
from study import clock
from study.models import StaffRole, WithdrawalLevel
from tests.analysis.panel_builders import PanelBuilder
from tests.api.test_blinding import entries
from tests.builders import make_staff
from tests.test_cli import cli_database  # noqa: F401 (a fixture)

T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)
runner = CliRunner()


@pytest.fixture
def listed(engine: Engine, frozen_clock: clock.FrozenClock,
           example_protocol: str) -> tuple[str, dict[str, str], list[str]]:
    """An unblinded study: two participants enrolled on day 0 in each arm, one on day 3 who then
    withdrew, and a researcher."""
    build = PanelBuilder(engine, example_protocol)
    frozen_clock.set(T0)
    codes = [build.participant(arm, timezone="UTC") for arm in ("wellbeing", "control", "wellbeing", "control")]
    frozen_clock.set(T0 + dt.timedelta(days=3))
    late = build.participant("control", timezone="UTC")
    build.withdraw(late, WithdrawalLevel.STOP_CONTACT)
    headers = {"Authorization": f"Bearer {make_staff(engine, build.slug, StaffRole.RESEARCHER, 'r@uni.example')}"}
    return build.slug, headers, [*codes, late]


def listing(client: TestClient, slug: str, headers: dict[str, str], **params: str) -> list[dict]:
    response = client.get(f"/api/v1/staff/studies/{slug}/participants", headers=headers, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_api_narrows_the_listing_by_each_filter_and_audits_it(
    engine: Engine, app_client: TestClient, listed: tuple[str, dict[str, str], list[str]],
) -> None:
    slug, headers, codes = listed
    assert [p["participant_code"] for p in listing(app_client, slug, headers)] == codes
    assert {p["participant_code"] for p in listing(app_client, slug, headers, arm="wellbeing")} == {codes[0], codes[2]}
    assert [p["participant_code"] for p in listing(app_client, slug, headers, status="withdrawn")] == [codes[4]]
    assert len(listing(app_client, slug, headers, status="enrolled", arm="control")) == 2
    since = (T0 + dt.timedelta(days=1)).isoformat()
    assert [p["participant_code"] for p in listing(app_client, slug, headers, enrolled_since=since)] == [codes[4]]
    assert len(listing(app_client, slug, headers, enrolled_before=since)) == 4
    assert listing(app_client, slug, headers, consent_version="no-such-version") == []

    audited = entries(engine, "participants.listed")
    assert audited[0].detail == {"count": 5}
    assert audited[-1].detail == {"count": 0, "consent_version": "no-such-version"}
    assert audited[-2].detail == {"count": 4, "enrolled_before": str(
        dt.datetime.fromisoformat(since))}

    for params, field in (({"status": "active"}, "status"), ({"enrolled_since": "2026-03-02T10:00:00"},
                                                               "enrolled_since")):
        response = app_client.get(f"/api/v1/staff/studies/{slug}/participants", headers=headers, params=params)
        assert response.status_code == 422, response.text
        assert field in response.text


def test_the_command_line_lists_with_the_same_filters(
    cli_database: Engine, listed: tuple[str, dict[str, str], list[str]],  # noqa: F811
) -> None:
    slug, _, codes = listed
    result = runner.invoke(app, ["participants", "list", slug])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"5 participant(s) in '{slug}'\n")
    assert all(code in result.output for code in codes)

    result = runner.invoke(app, ["participants", "list", slug, "--status", "withdrawn", "--enrolled-since",
                                 "2026-03-03"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (f"1 participant(s) in '{slug}' (status withdrawn, enrolled since "
                                             "2026-03-03 00:00:00+00:00)")
    assert codes[4] in result.output
    assert "withdrawn 2026-03-05" in result.output

    refused_status = runner.invoke(app, ["participants", "list", slug, "--status", "active"])
    assert refused_status.exit_code == 2
    assert "active" in refused_status.output
    missing = runner.invoke(app, ["participants", "list", "no-such-study"])
    assert missing.exit_code == 1
    assert "no study 'no-such-study'" in missing.output
    with cli_database.connect() as connection:
        details = connection.execute(sa.text("SELECT actor, detail FROM audit_log WHERE action = "
                                             "'participants.listed' ORDER BY seq")).all()
    assert [actor for actor, _ in details] == ["cli", "cli"]
