"""Recruitment on a panel (protocol ``recruitment``): a participant arrives by the study link with
the panel's id, completes two waves through the participant pages and lands on the panel's
completion address after each; the payment export lists both (and the bulk form their sum); a
second arrival with the same id is refused without using the link; someone who declines the
consent goes to the screen-out address; the panel id is in no research export."""

from __future__ import annotations

import datetime as dt
import io
import re
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from analysis.payments import payments, write_csv
from api.cli import app
from scheduler.dispatcher import Dispatcher
from study import studies
from study.clock import FrozenClock
from study.db import session_scope
from study.models import StaffRole
from study.protocol import ProtocolError, parse_protocol
from study.settings import Settings
from tests.analysis.panel_builders import perma_answers
from tests.builders import TEST_ACTOR, csrf_of, load_study, make_invites, make_staff
from tests.test_cli import cli_database  # noqa: F401 (a fixture)

BASE = "https://app.prolific.com/submissions/complete?cc=BASE1"
WEEK1 = "https://app.prolific.com/submissions/complete?cc=WEEK1"
SCREEN_OUT = "https://app.prolific.com/submissions/complete?cc=NOCONS"
PANEL = f"""
recruitment:
  name: Prolific
  completion:
    baseline: "{BASE}"
    perma-week-1: "{WEEK1}"
  screen_out: "{SCREEN_OUT}"
  payments: {{baseline: 1.5, perma-week-1: 2.0}}
  currency: GBP
"""
PID = "5f8a1b2c3d4e5f6a7b8c9d0e"
T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)


@pytest.fixture
def panel_study(engine: Engine, example_protocol: str) -> tuple[str, str]:
    slug = load_study(engine, example_protocol + PANEL)
    [link] = make_invites(engine, slug, max_uses=50)  # the study link given to the panel
    return slug, link


def arrive(client: TestClient, link: str, panel_id: str) -> str:
    """Open the study link as the panel sends it, and join; the consent page."""
    landing = client.get(f"/?code={link}&panel_id={panel_id}")
    assert f'name="panel_id" value="{panel_id}"' in landing.text
    pre = re.search(r'name="pre" value="([^"]+)"', landing.text)
    assert pre
    joined = client.post("/join", data={"pre": pre.group(1), "invite_code": link, "panel_id": panel_id},
                         follow_redirects=False)
    assert joined.status_code == 303, joined.text
    return client.get("/consent").text


def answer_perma(client: TestClient, assignment: int, csrf: str) -> str:
    """Save every PERMA-Profiler answer, submit from the survey page; the address it sends to."""
    saved = client.put(f"/api/v1/me/surveys/{assignment}/answers", headers={"X-CSRF-Token": csrf},
                       json={"answers": perma_answers(dict.fromkeys("PERMANH", 6), loneliness=3, happiness=7)})
    assert saved.status_code == 200, saved.text
    form = client.get(f"/surveys/{assignment}")
    steps = int(re.search(r'<progress max="(\d+)"', form.text).group(1))  # type: ignore[union-attr]
    done = client.post(f"/surveys/{assignment}", data={"csrf": csrf_of(form.text), "step": str(steps - 1),
                                                       "submission_id": f"submit-{assignment}", "go": "submit"},
                       follow_redirects=False)
    assert done.status_code == 303, done.text
    return done.headers["location"]


def open_survey(engine: Engine, followup_key: str | None) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            "SELECT id FROM survey_assignments WHERE instrument_id = 'perma-profiler' AND status = 'open' AND "
            + ("followup_key = :key" if followup_key else "purpose = 'baseline'")), {"key": followup_key}).scalar_one())


def test_a_panel_participant_is_sent_back_after_each_wave_and_paid_for_both(
    engine: Engine, app_client: TestClient, panel_study: tuple[str, str], frozen_clock: FrozenClock, tmp_path: Path,
) -> None:
    slug, link = panel_study
    frozen_clock.set(T0)
    consent = arrive(app_client, link, PID)
    signed = app_client.post("/consent", data={"csrf": csrf_of(consent), "version": "1.2", "typed_signature": "AP",
                                               "confirmations": ["read-and-understood", "adult", "voluntary"]})
    assert signed.status_code == 200
    onboarding = app_client.get("/onboarding")
    csrf = csrf_of(onboarding.text)
    app_client.post("/onboarding", data={"csrf": csrf, "timezone": "Europe/London", "contact_email": ""})
    assert answer_perma(app_client, open_survey(engine, None), csrf) == BASE

    frozen_clock.set(T0 + dt.timedelta(days=7, hours=2))  # week 1 opens at 10:00 local on day 7
    assert not Dispatcher(engine, Settings(), name="panel", channels={}).tick().errors
    assert answer_perma(app_client, open_survey(engine, "perma-week-1"), csrf) == WEEK1

    with session_scope(engine) as session:
        paid = payments(session, TEST_ACTOR, studies.get_study(session, slug))
    assert [(p.panel_id, p.wave, p.amount, p.currency) for p in paid] == [
        (PID, "baseline", 1.5, "GBP"), (PID, "perma-week-1", 2.0, "GBP")]
    assert write_csv(paid, tmp_path / "rows.csv") == 2
    rows = (tmp_path / "rows.csv").read_text().splitlines()
    assert rows[0] == "panel_id,wave,occurrence,completed_at,amount,currency"
    assert rows[1].startswith(f"{PID},baseline,0,2026-03-02T09:")
    assert rows[2].startswith(f"{PID},perma-week-1,0,2026-03-09T11:00")
    assert write_csv(paid, tmp_path / "bulk.csv", bulk=True) == 1
    assert (tmp_path / "bulk.csv").read_bytes() == f"{PID},3.50\r\n".encode()

    # The panel id is in no research export.
    token = make_staff(engine, slug, StaffRole.RESEARCHER, "researcher@uni.example")
    export = app_client.get(f"/api/v1/staff/studies/{slug}/exports", params={"format": "csv"},
                            headers={"Authorization": f"Bearer {token}"})
    assert export.status_code == 200, export.text
    with zipfile.ZipFile(io.BytesIO(export.content)) as bundle:
        assert not [name for name in bundle.namelist() if PID in bundle.read(name).decode(errors="replace")]


def test_a_second_arrival_with_the_same_panel_id_is_refused_without_using_the_link(
    engine: Engine, app_client: TestClient, panel_study: tuple[str, str],
) -> None:
    _, link = panel_study
    arrive(app_client, link, PID)
    app_client.cookies.clear()
    landing = app_client.get(f"/?code={link}&panel_id={PID}")
    pre = re.search(r'name="pre" value="([^"]+)"', landing.text)
    assert pre
    again = app_client.post("/join", data={"pre": pre.group(1), "invite_code": link, "panel_id": PID})
    assert again.status_code == 400
    assert "This panel ID has already joined the study" in again.text
    refused = app_client.post("/api/v1/enrollment", json={"invite_code": link, "panel_id": PID})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "duplicate_panel_id"
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT use_count FROM invite_codes")).scalar_one() == 1
        assert connection.execute(sa.text("SELECT count(*) FROM participants")).scalar_one() == 1
    assert app_client.post("/api/v1/enrollment", json={"invite_code": link, "panel_id": "not a panel id!"}
                           ).status_code == 422


def test_declining_the_consent_sends_a_panel_participant_to_the_screen_out_address(
    engine: Engine, app_client: TestClient, panel_study: tuple[str, str],
) -> None:
    _, link = panel_study
    consent = arrive(app_client, link, "screened-out-1")
    declined = app_client.post("/consent/decline", data={"csrf": csrf_of(consent)}, follow_redirects=False)
    assert (declined.status_code, declined.headers["location"]) == (303, SCREEN_OUT)
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT status FROM participants")).scalar_one() == "withdrawn"


def test_the_panel_section_names_only_the_study_s_waves_and_links_print_the_entry_template(
    cli_database: Engine, example_protocol: str,  # noqa: F811
) -> None:
    with pytest.raises(ProtocolError, match="perma-wek-1 is not a wave of the study"):
        parse_protocol(example_protocol + PANEL.replace("perma-week-1:", "perma-wek-1:", 1))
    slug = load_study(cli_database, example_protocol + PANEL)
    created = CliRunner().invoke(app, ["invites", "create", slug, "--max-uses", "500"])
    assert created.exit_code == 0, created.output
    code = created.output.splitlines()[0]
    assert f"entry link for Prolific: http://127.0.0.1:8000/?code={code}&panel_id={{{{%PROLIFIC_PID%}}}}" \
        in created.output
