from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from study import studies
from study.db import session_factory, session_scope
from study.errors import Conflict
from study.models import ConsentVersion, ProtocolVersion
from study.protocol import Protocol, ProtocolError, parse_protocol
from tests.builders import TEST_ACTOR, counting_statements, load_study


def test_example_protocol_parses(example_protocol: str) -> None:
    protocol = parse_protocol(example_protocol)
    assert [arm.name for arm in protocol.arms] == ["wellbeing", "control"]
    assert protocol.followups[0].offset.days == 7
    assert protocol.instruments() == {"perma-profiler", "decision-regret"}


def test_confirmations_are_required_unless_marked_optional_and_ids_are_unique(example_protocol: str) -> None:
    consent = parse_protocol(example_protocol).consent
    assert [(c.id, c.required) for c in consent.confirmations] == [
        ("read-and-understood", True), ("adult", True), ("voluntary", True), ("share-conversation-text", False)]
    with pytest.raises(ProtocolError, match=r"consent \(line \d+\): confirmation ids must be unique"):
        parse_protocol(example_protocol.replace("- id: share-conversation-text", "- id: adult"))


def test_invalid_field_is_named_with_its_line(example_protocol: str) -> None:
    broken = example_protocol.replace("    mode: default\n", "    mode: engagement\n")
    line = broken.splitlines().index("    mode: engagement") + 1
    with pytest.raises(ProtocolError) as error:
        parse_protocol(broken)
    assert len(error.value.problems) == 1
    assert error.value.problems[0].startswith(f"arms[1].mode (line {line}): Input should be")


def test_bad_duration_and_reminder_outside_window(example_protocol: str) -> None:
    broken = example_protocol.replace("offset: P28D", "offset: four weeks").replace(
        "reminders: [P1D, P2D]", "reminders: [P5D]")
    with pytest.raises(ProtocolError) as error:
        parse_protocol(broken)
    text = "\n".join(error.value.problems)
    assert "followups[1].offset (line" in text
    assert "followups[0] (line" in text
    assert "inside the response window" in text


def test_missing_required_field_points_at_parent(example_protocol: str) -> None:
    broken = example_protocol.replace("  version: \"1.2\"\n", "")
    with pytest.raises(ProtocolError) as error:
        parse_protocol(broken)
    consent_line = broken.splitlines().index("consent:") + 1
    assert error.value.problems == [f"consent.version (line {consent_line}): Field required"]


def test_unknown_field_and_bad_yaml_are_refused(example_protocol: str) -> None:
    with pytest.raises(ProtocolError, match=r"arms\[0\].colour .*Extra inputs"):
        parse_protocol(example_protocol.replace("    weight: 1\n", "    weight: 1\n    colour: red\n", 1))
    with pytest.raises(ProtocolError, match=r"not valid YAML \(line 3\)"):
        parse_protocol("study:\n  id: x\n  - broken")


def test_wellbeing_arm_default_role_must_be_allowed(example_protocol: str) -> None:
    broken = example_protocol.replace("default_role: collaborator", "default_role: therapist")
    with pytest.raises(ProtocolError, match=r"arms\[0\].default_role"):
        parse_protocol(broken)


def test_changed_protocol_creates_version_and_keeps_old(engine: Engine, example_protocol: str) -> None:
    load_study(engine, example_protocol)
    revised = example_protocol.replace("window: P3D\n    reminders: [P1D, P2D]",
                                       "window: P4D\n    reminders: [P1D, P2D]")
    with session_scope(engine) as session:
        assert studies.load_protocol(session, example_protocol, TEST_ACTOR).changed is False
        result = studies.load_protocol(session, revised, TEST_ACTOR)
        assert (result.version, result.changed) == (2, True)
    with session_scope(engine) as session:
        versions = session.scalars(select(ProtocolVersion).order_by(ProtocolVersion.version)).all()
        assert [v.version for v in versions] == [1, 2]
        assert versions[0].source_yaml == example_protocol
        assert studies.current_protocol(session, versions[0].study_id).followups[0].window.days == 4


def test_the_version_in_force_is_read_once_a_transaction_and_a_load_replaces_it(
    engine: Engine, example_protocol: str,
) -> None:
    """``current_version`` reads the version in force once per transaction (the participant's consent
    check reads it with the participant, so a request's later reads cost nothing); a version loaded in
    the same transaction replaces it at once, a savepoint rolled back takes its version with it, and
    the session's next transaction reads the version in force again."""
    load_study(engine, example_protocol)

    def loaded(session: Session, days: int) -> int:
        text = example_protocol.replace("window: P3D", f"window: P{days}D", 1)
        return studies.load_protocol(session, text, TEST_ACTOR).version

    with session_scope(engine) as session:
        study_id = session.scalars(select(ProtocolVersion.study_id)).one()
        with counting_statements(engine) as statements:
            assert studies.current_version(session, study_id).version == 1
            assert studies.current_version(session, study_id).version == 1
        assert len(statements) == 1
        assert loaded(session, 4) == 2
        with counting_statements(engine) as statements:
            assert studies.current_protocol(session, study_id).followups[0].window.days == 4
        assert statements == []
        savepoint = session.begin_nested()
        assert loaded(session, 5) == 3
        assert studies.current_version(session, study_id).version == 3
        savepoint.rollback()
        assert studies.current_version(session, study_id).version == 2
    with session_factory(engine)() as session:
        assert studies.current_version(session, study_id).version == 2
        session.commit()
        with session_scope(engine) as other:  # another request, between two transactions of this session
            assert loaded(other, 6) == 3
        assert studies.current_version(session, study_id).version == 3
        assert studies.current_protocol(session, study_id).followups[0].window.days == 6


def test_consent_text_change_needs_new_version(engine: Engine, example_protocol: str) -> None:
    load_study(engine, example_protocol)
    sneaky = example_protocol.replace("Taking part is voluntary.", "Taking part is expected.")
    with session_scope(engine) as session, pytest.raises(Conflict, match="new version"):
        studies.load_protocol(session, sneaky, TEST_ACTOR)
    with session_scope(engine) as session:
        studies.load_protocol(session, sneaky.replace('version: "1.2"', 'version: "1.3"'), TEST_ACTOR)
        assert session.scalars(select(ConsentVersion.version).order_by(ConsentVersion.id)).all() == ["1.2", "1.3"]


def test_durations_without_a_unit_are_refused_with_field_and_line(example_protocol: str) -> None:
    broken = (example_protocol.replace("offset: P7D", "offset: 7", 1)
              .replace("window: P3D\n    reminders: [P1D, P2D]", "window: 3\n    reminders: [1, \"2\"]", 1)
              .replace("renotify_after: PT4H", "renotify_after: 4"))
    lines = broken.splitlines()
    offset, window, reminders, renotify = (lines.index(text) + 1 for text in (
        "    offset: 7", "    window: 3", '    reminders: [1, "2"]', "  renotify_after: 4"))
    with pytest.raises(ProtocolError) as error:
        parse_protocol(broken)
    unit = "has no unit; write an ISO 8601 duration like P7D or PT2H, or a number with a unit like '7 days'"
    assert [p.split(": ", 1)[0] for p in error.value.problems] == [
        f"followups[0].offset (line {offset})", f"followups[0].window (line {window})",
        f"followups[0].reminders[0] (line {reminders})", f"followups[0].reminders[1] (line {reminders})",
        f"safety.renotify_after (line {renotify})"]
    assert all(unit in problem for problem in error.value.problems)


@pytest.mark.parametrize("written", ["P7D", "P1W", "p7d", "7 days", "7d", "7 Days", "1 week", "1w", "168 hours",
                                     "10080 minutes", "6 days 24 hours", "6d, 1440 min", "P6DT24H", "PT168H"])
def test_durations_in_iso_8601_or_with_a_unit_are_accepted(example_protocol: str, written: str) -> None:
    protocol = parse_protocol(example_protocol.replace("offset: P7D", f"offset: {written}", 1))
    assert protocol.followups[0].offset == dt.timedelta(days=7)


@pytest.mark.parametrize(("written", "message"), [
    ("P1M", "years and months have no fixed length"),
    ("2 months", "years and months have no fixed length"),
    ("3m", "m could be minutes or months"),
    ("seven days", "is not a duration"),
    ("7 fortnights", "is not a duration"),
    ("'7'", "has no unit"),
    ("7.5", "has no unit"),
    ("P", "is not a duration"),
    ("02:00:00", "is not a duration"),
    ("1 day 2 days", "names days twice"),
])
def test_ambiguous_or_unreadable_durations_are_refused(example_protocol: str, written: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=r"followups\[0\].offset \(line \d+\): .*" + re.escape(message)):
        parse_protocol(example_protocol.replace("offset: P7D", f"offset: {written}", 1))


def test_stored_protocol_reloads_with_the_same_durations(example_protocol: str) -> None:
    protocol = parse_protocol(example_protocol.replace("window: P3D", "window: 2 days 12 hours", 1)
                              .replace("offset: P7D", "offset: 90 minutes", 1))
    stored = json.loads(json.dumps(protocol.model_dump(mode="json")))
    assert stored["followups"][0]["window"] == "P2DT12H"
    assert Protocol.model_validate(stored) == protocol


def test_public_title_and_consent_metadata(example_protocol: str) -> None:
    protocol = parse_protocol(example_protocol)
    assert protocol.study.participant_title == "Conversations with an AI assistant: a four-week study"
    assert "pushback" not in protocol.study.participant_title + protocol.study.public_description
    assert (protocol.consent.principal_investigator, protocol.consent.protocol_number) == (
        "Dr. Jane Example, Department of Psychology, Example University", "REB-2026-0142")
    bare = parse_protocol(example_protocol.replace('  public_title: "Conversations with an AI assistant: '
                                                   'a four-week study"\n', ""))
    assert bare.study.participant_title == "Research study"  # never the internal title


TRIAGE = ("  triage:\n    page: [escalation, unanswered]\n    unanswered_after: PT30M\n"
          "    on_unanswered: [page, follow_up]\n")


def _triage(example: str, replacement: str) -> str:
    assert TRIAGE in example
    return example.replace(TRIAGE, replacement)


def test_triage_defaults_page_escalations_and_unanswered_check_ins_after_thirty_minutes(example_protocol: str) -> None:
    triage = parse_protocol(_triage(example_protocol, "")).safety.triage
    assert (triage.page, triage.unanswered_after, triage.on_unanswered) == (
        ["escalation", "unanswered"], dt.timedelta(minutes=30), ["page"])
    assert [level for level in ("check_in", "escalation", "unanswered") if triage.pages(level)] == [
        "escalation", "unanswered"]
    example = parse_protocol(example_protocol).safety.triage
    assert example.on_unanswered == ["page", "follow_up"]


@pytest.mark.parametrize(("written", "page", "on_unanswered"), [
    ("    page: [escalation]\n", ["escalation"], []),  # the other follows from the one given
    ("    on_unanswered: [follow_up]\n", ["escalation"], ["follow_up"]),
    ("    on_unanswered: [page]\n", ["escalation", "unanswered"], ["page"]),
    ("    page: [check_in, escalation, unanswered]\n", ["check_in", "escalation", "unanswered"], ["page"]),
])
def test_triage_paging_follows_from_either_setting(example_protocol: str, written: str, page: list[str],
                                                    on_unanswered: list[str]) -> None:
    triage = parse_protocol(_triage(example_protocol, "  triage:\n" + written)).safety.triage
    assert (triage.page, triage.on_unanswered) == (page, on_unanswered)


@pytest.mark.parametrize(("written", "message"), [
    ("    unanswered_after: PT2M\n", "unanswered_after must be between PT5M (5 minutes) and PT24H (24 hours)"),
    ("    unanswered_after: P2D\n", "unanswered_after must be between PT5M (5 minutes) and PT24H (24 hours)"),
    ("    unanswered_after: 30\n", "has no unit"),
    ("    page: [check_in]\n", "page must list escalation"),
    ("    page: [escalation, unanswered]\n    on_unanswered: [follow_up]\n", "page and on_unanswered disagree"),
    ("    page: [escalation, urgent]\n", "Input should be 'check_in', 'escalation' or 'unanswered'"),
    ("    on_unanswered: [call]\n", "Input should be 'page' or 'follow_up'"),
])
def test_triage_settings_are_refused_with_the_field_and_the_line(example_protocol: str, written: str,
                                                                 message: str) -> None:
    broken = _triage(example_protocol, "  triage:\n" + written)
    with pytest.raises(ProtocolError) as error:
        parse_protocol(broken)
    [problem] = error.value.problems
    where = re.match(r"^safety\.triage(?:\.\w+)?(?:\[\d\])? \(line (\d+)\): ", problem)
    assert where, problem
    first, last = (broken.splitlines().index("  triage:") + 1, broken.splitlines().index("  triage:") + 3)
    assert first <= int(where.group(1)) <= last  # the triage block's line, or its field's
    assert message in problem
