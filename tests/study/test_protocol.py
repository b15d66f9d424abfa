from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from study import studies
from study.db import session_scope
from study.errors import Conflict
from study.models import ConsentVersion, ProtocolVersion
from study.protocol import ProtocolError, parse_protocol
from tests.builders import TEST_ACTOR, load_study


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
    broken = example_protocol.replace("  version: \"1.1\"\n", "")
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


def test_consent_text_change_needs_new_version(engine: Engine, example_protocol: str) -> None:
    load_study(engine, example_protocol)
    sneaky = example_protocol.replace("Taking part is voluntary.", "Taking part is expected.")
    with session_scope(engine) as session, pytest.raises(Conflict, match="new version"):
        studies.load_protocol(session, sneaky, TEST_ACTOR)
    with session_scope(engine) as session:
        studies.load_protocol(session, sneaky.replace('version: "1.1"', 'version: "1.2"'), TEST_ACTOR)
        assert session.scalars(select(ConsentVersion.version).order_by(ConsentVersion.id)).all() == ["1.1", "1.2"]
