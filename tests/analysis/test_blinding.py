"""Blinding in the library and on the command line: the protocol's setting (off by default, checked
like every other field), the one decision (``analysis.plan.blinding``) and who may lift it for a read
(``outcome_access``), the exports (refused, or the aggregates pooled over the arms) and ``afterward
analyze`` (refused until ``afterward plan freeze``, or for one audited read an admin asks for).

The study is ``tests.analysis.test_plan``'s (eight participants with PERMA at baseline, week 1 and
week 4) under the example protocol with ``blinding: {outcomes_until_plan_frozen: true}``."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from analysis.aggregates import export_aggregates
from analysis.exports import export_study
from analysis.plan import BLINDED, UNBLINDED_READ, Blinded, blinding, outcome_access
from study import audit, clock
from study.db import session_scope
from study.errors import Forbidden
from study.models import AuditEntry, StaffRole
from study.protocol import ProtocolError, parse_protocol
from study.settings import get_settings
from study.studies import get_study
from tests.analysis.test_plan import cli, first_section, plan_file, played
from tests.builders import make_staff
from tests.conftest import EXAMPLE

BLINDING = "\nblinding:\n  outcomes_until_plan_frozen: true\n"
EMAILS = {role: f"{role.value}@uni.example" for role in StaffRole}
REASON = "data manager's check of the week-4 wave"


def staff(role: StaffRole) -> audit.Actor:
    return audit.Actor("staff", EMAILS[role])


def entries(engine: Engine, action: str) -> list[AuditEntry]:
    with session_scope(engine, read_only=True) as session:
        return list(session.scalars(select(AuditEntry).where(AuditEntry.action == action).order_by(AuditEntry.seq)))


@pytest.fixture
def study(engine: Engine, frozen_clock: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The plan tests' study, blinded, played to day 40, with staff of every role, and the command
    line on its database."""
    build = played(engine, EXAMPLE.read_text(encoding="utf-8") + BLINDING, frozen_clock)
    for role, email in EMAILS.items():
        make_staff(engine, build.slug, role, email)
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    yield build.slug
    get_settings.cache_clear()


def test_the_protocol_setting_is_off_by_default_and_checked() -> None:
    example = EXAMPLE.read_text(encoding="utf-8")
    assert parse_protocol(example).blinding.outcomes_until_plan_frozen is False
    assert parse_protocol(example + BLINDING).blinding.outcomes_until_plan_frozen is True
    with pytest.raises(ProtocolError) as refused:
        parse_protocol(example + "\nblinding:\n  outcomes: true\n")
    [problem] = refused.value.problems
    assert problem.startswith(f"blinding.outcomes (line {len(example.splitlines()) + 3})"), problem


def test_the_one_decision_and_who_may_lift_it(study: str, engine: Engine, tmp_path: Path) -> None:
    with session_scope(engine, read_only=True) as session:
        study_id = get_study(session, study).id
        found = blinding(session, study_id)
    assert (found.required, found.plan_frozen, found.blinded) == (True, False, True)
    for role in (StaffRole.RESEARCHER, StaffRole.VIEWER):
        with session_scope(engine) as session, pytest.raises(Forbidden) as forbidden:
            outcome_access(session, staff(role), study_id, "a test", unblind=REASON)
        assert forbidden.value.code == "unblind_forbidden"
    with session_scope(engine) as session:
        lifted = outcome_access(session, staff(StaffRole.ADMIN), study_id, "a test", unblind=REASON)
    assert (lifted.blinded, lifted.unblinded_by, lifted.reason) == (False, f"staff:{EMAILS[StaffRole.ADMIN]}", REASON)
    assert [(e.actor, e.detail) for e in entries(engine, UNBLINDED_READ)] == [
        (EMAILS[StaffRole.ADMIN], {"view": "a test", "reason": REASON})]

    assert cli("plan", "freeze", study, str(plan_file(tmp_path)), "--as", EMAILS[StaffRole.RESEARCHER]).exit_code == 0
    with session_scope(engine) as session:
        assert not blinding(session, study_id).blinded
        # Nothing to lift once the plan is frozen: nobody is refused, nothing is recorded.
        assert not outcome_access(session, staff(StaffRole.RESEARCHER), study_id, "a test", unblind=REASON).blinded
    assert len(entries(engine, UNBLINDED_READ)) == 1


def test_exports_are_refused_or_pooled_from_the_library_and_the_command_line(
    study: str, engine: Engine, tmp_path: Path,
) -> None:
    with pytest.raises(Blinded) as refused:
        export_study(engine, study, tmp_path / "lib", format="csv", actor=audit.Actor.system("tests"))
    assert refused.value.code == BLINDED
    assert not (tmp_path / "lib" / "participants.csv").exists()
    pooled = export_aggregates(engine, study, tmp_path / "agg", actor=staff(StaffRole.VIEWER))
    assert pooled.pooled
    with (tmp_path / "agg" / "wellbeing.csv").open(encoding="utf-8") as handle:
        assert {row["arm"] for row in csv.DictReader(handle)} == {"all"}

    for export_format in ("csv", "stata", "trajectories"):
        result = cli("export", study, "--format", export_format, "--out", str(tmp_path / export_format))
        assert result.exit_code != 0
        assert "blinded until its analysis plan is frozen" in result.output
        assert f"afterward plan freeze {study}" in result.output
    result = cli("export", study, "--format", "aggregates", "--out", str(tmp_path / "cli-agg"))
    assert result.exit_code == 0, result.output
    assert "outcome tables pooled over the arms" in result.output
    result = cli("export", study, "--format", "csv", "--out", str(tmp_path / "r"), "--as", EMAILS[StaffRole.RESEARCHER],
                 "--unblind", REASON)
    assert result.exit_code != 0
    assert "only an admin" in result.output
    # Fitting the models for the dashboard reads the outcomes by arm too.
    fitted = cli("models", "fit", study, "--as", EMAILS[StaffRole.RESEARCHER], "--bootstrap", "5")
    assert fitted.exit_code != 0
    assert "blinded until its analysis plan is frozen" in fitted.output
    assert entries(engine, UNBLINDED_READ) == []

    # The command line without --as holds the database: it may unblind, saying why, audited.
    result = cli("export", study, "--format", "csv", "--out", str(tmp_path / "unblinded"), "--unblind", REASON)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "unblinded" / "participants.csv").read_text(encoding="utf-8")
    assert {row["arm"] for row in csv.DictReader(io.StringIO(text))} == {"wellbeing", "control"}
    [unblinded] = entries(engine, UNBLINDED_READ)
    assert (unblinded.actor_type, unblinded.detail) == ("system", {"view": "the csv export", "reason": REASON})


def test_analyze_is_refused_until_the_plan_is_frozen(study: str, engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    refused = cli("analyze", study, "--out", str(out), "--as", EMAILS[StaffRole.RESEARCHER], "--bootstrap", "20")
    assert refused.exit_code != 0
    assert "blinded until its analysis plan is frozen" in refused.output
    assert f"afterward plan freeze {study}" in refused.output
    viewer = cli("analyze", study, "--out", str(out), "--as", EMAILS[StaffRole.VIEWER])
    assert viewer.exit_code != 0
    assert "viewer" in viewer.output
    assert "blinded" not in viewer.output  # refused for the role first, as without blinding
    not_admin = cli("analyze", study, "--out", str(out), "--as", EMAILS[StaffRole.RESEARCHER], "--unblind", REASON)
    assert not_admin.exit_code != 0
    assert "only an admin" in not_admin.output
    assert not out.exists()
    assert entries(engine, "study.analyze") == []

    unblinded = cli("analyze", study, "--out", str(out), "--as", EMAILS[StaffRole.ADMIN], "--bootstrap", "20",
                    "--unblind", REASON)
    assert unblinded.exit_code == 0, unblinded.output
    assert "wellbeing vs control" in out.read_text(encoding="utf-8")
    [entry] = entries(engine, UNBLINDED_READ)
    assert (entry.actor, entry.detail) == (EMAILS[StaffRole.ADMIN], {"view": "the analysis report", "reason": REASON})
    assert len(entries(engine, "study.analyze")) == 1

    frozen = cli("plan", "freeze", study, str(plan_file(tmp_path)), "--as", EMAILS[StaffRole.RESEARCHER])
    assert frozen.exit_code == 0, frozen.output
    assert "1 read(s) of the study's outcomes were audited before this freeze" in frozen.output
    result = cli("analyze", study, "--out", str(out), "--as", EMAILS[StaffRole.RESEARCHER], "--bootstrap", "20")
    assert result.exit_code == 0, result.output
    section = first_section(out.read_text(encoding="utf-8"))
    assert "The plan was frozen after 1 read(s) of the study&#x27;s outcomes" in section
    assert len(entries(engine, UNBLINDED_READ)) == 1  # no unblinding once frozen
