"""Exports R users can trust: every table of an SPSS and a Stata export, read back with pyreadstat
(ReadStat, the library R's haven reads them with), holds the same values as the Parquet export of
the same study, every coded column labelled with its codes and every missing value missing; the
survival table is in every format; Frictionless validates the package of every format, reading
the SPSS and Stata files row by row. The R check users run is in the README's exports section."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyreadstat
import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from analysis.codebook import FROM_STUDY, SHARED, Column, StudyCodes, TableSpec, codes_for
from analysis.export_formats import UncodedValue, normalize, validate_package
from analysis.exports import ExportResult, export_study
from analysis.panel import PANEL_COLUMNS, STATUSES, SURVIVAL_COLUMNS, survival
from chat import check_ins
from study import audit, clock
from study.db import session_scope
from study.models import Participant, WithdrawalLevel
from study.safety import SafetyCheckIn
from tests.analysis.panel_builders import PanelBuilder, perma_answers

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # enrollment, 10:00 in Berlin
MINUTE = dt.timedelta(minutes=1)
ACTOR = audit.Actor.system("tests")
READERS = {"spss": pyreadstat.read_sav, "stata": pyreadstat.read_dta}
EXTENSIONS = {"csv": "csv", "parquet": "parquet", "spss": "sav", "stata": "dta"}
# The panel's and the survival table's text columns that are not coded: identifiers, lists, versions,
# wall-clock times. Every other text column of theirs must have codes (a new one must be decided).
TEXT = {"participant_code", "roles_used", "timezone", "anchor_key", "instrument_version", "intended_local",
        "conv_roles_used", "conv_concerns_raised", "conv_safety_categories", "conv_models", "conv_prompt_versions"}


@dataclass
class Study:
    slug: str
    alice: str  # wellbeing, coach: a crisis message, a decision, every PERMA follow-up answered
    bob: str  # control, no conversation: answers the baseline only, so stops answering at week 1
    carol: str  # wellbeing, New York: never answers, withdraws on day 2


@pytest.fixture
def study(engine: Engine, example_protocol: str, frozen_clock: clock.FrozenClock) -> Study:
    build = PanelBuilder(engine, example_protocol)
    alice, bob = build.participant("wellbeing"), build.participant("control")
    carol = build.participant("wellbeing", timezone="America/New_York")
    dave = build.participant("control")
    answers = perma_answers(dict.fromkeys("PERMANH", 6), loneliness=3, happiness=7)
    frozen_clock.set(T0 + 10 * MINUTE)
    for code in (alice, bob, dave):
        build.answer(code, purpose="baseline", instrument="perma-profiler", answers=answers)
    conversation = build.start(alice, "coach")
    frozen_clock.advance(MINUTE)
    build.say(alice, conversation, "Help me decide about the flat", "Let us weigh it up.")
    frozen_clock.advance(MINUTE)
    build.say(alice, conversation, "I want to kill myself", "Please call 988 now.")
    with session_scope(engine) as session:  # two of the check-in's questions answered, the others not
        who = session.scalars(select(Participant).where(Participant.code == alice)).one()
        [check_in] = session.scalars(select(SafetyCheckIn.id)).all()
        check_ins.answer(session, who, conversation, check_in, {"plan": "no", "behaviour": "declined"})
    frozen_clock.advance(MINUTE)
    build.end(alice, conversation, rating=6, decision="Take the flat")
    frozen_clock.set(T0 + dt.timedelta(hours=1))
    build.withdraw(dave, WithdrawalLevel.DELETE_DATA)
    frozen_clock.set(dt.datetime(2026, 3, 4, 12, 0, tzinfo=dt.UTC))
    build.withdraw(carol, WithdrawalLevel.STOP_CONTACT)
    # PERMA week 1 is due 9 March 10:00 CET, week 4 on 30 March 10:00 CEST: Alice answers both.
    for due in (dt.datetime(2026, 3, 9, 9, 0, tzinfo=dt.UTC), dt.datetime(2026, 3, 30, 8, 0, tzinfo=dt.UTC)):
        frozen_clock.set(due)
        build.tick()
        frozen_clock.set(due + dt.timedelta(hours=2))
        build.answer(alice, purpose="followup", instrument="perma-profiler", answers=answers)
    frozen_clock.set(dt.datetime(2026, 4, 20, 0, 0, tzinfo=dt.UTC))
    build.tick()  # every window has closed: Bob's two expired
    return Study(build.slug, alice, bob, carol)


def export(engine: Engine, study: Study, folder: Path, export_format: str) -> ExportResult:
    return export_study(engine, study.slug, folder / export_format, format=export_format,  # type: ignore[arg-type]
                        turns=True, actor=ACTOR)


def text_missing(values: pd.Series) -> pd.Series:
    """Missing text as the Parquet file has it: null, or empty (the codebook: empty is missing)."""
    return values.isna() | (values.astype(object) == "")


def check_column(column: Column, stored: pd.Series, labels: dict[Any, str] | None, expected: pd.Series,
                 export_format: str, where: str) -> None:
    """One column of an SPSS or Stata file as pyreadstat reads it (codes, not labels) against the
    same column of the Parquet file."""
    coded = column.labelled()  # a category or a boolean: integer codes
    if coded or (column.type == "integer" and column.enum):
        assert labels == column.value_labels(), where  # labelled with the codebook's codes
    if column.type == "string" and not coded:
        missing = text_missing(expected)
        # SPSS declares the empty text user-missing: read as missing. Stata's missing text is "".
        stored_missing = stored.isna() if export_format == "spss" else stored == ""
        assert stored.notna().all() or export_format == "spss", where
    else:
        missing = expected.isna()
        stored_missing = stored.isna()  # system-missing
    assert stored_missing.tolist() == missing.tolist(), where
    got, want = stored[~missing], expected[~missing]
    if column.type == "string" and coded:
        assert labels is not None
        assert got.map(labels).tolist() == want.tolist(), where  # the file's own labels give the values
    elif column.type == "string":
        assert got.tolist() == want.tolist(), where
    elif column.type == "boolean":
        assert set(got) <= {0, 1}, where
        assert (got == 1).tolist() == want.astype(bool).tolist(), where
    elif column.type == "datetime":
        naive = pd.to_datetime(want, utc=True).dt.tz_localize(None)
        assert ((pd.to_datetime(got) - naive).abs() <= pd.Timedelta(milliseconds=1)).all(), where  # Stata: ms
    else:
        assert np.allclose(got.astype(float), want.astype(float)), where


@pytest.mark.parametrize("export_format", ["spss", "stata"])
def test_every_table_reads_back_with_its_value_labels_and_missing_values(
        engine: Engine, study: Study, tmp_path: Path, export_format: str) -> None:
    reference = export(engine, study, tmp_path, "parquet")
    result = export(engine, study, tmp_path, export_format)
    assert [spec.name for spec in result.tables] == [spec.name for spec in reference.tables]
    assert "survival" in result.row_counts
    labelling: dict[str, set[tuple[tuple[Any, str], ...]]] = {}
    for spec, full in zip(result.tables, reference.tables, strict=True):
        path = result.out_dir / f"{spec.name}.{EXTENSIONS[export_format]}"
        stored, meta = READERS[export_format](str(path))  # as haven reads: codes, user-missing as missing
        expected = pd.read_parquet(reference.out_dir / f"{full.name}.parquet")
        assert list(stored.columns) == [c.name for c in spec.columns], spec.name
        assert len(stored) == len(expected) == result.row_counts[spec.name], spec.name
        for i, column in enumerate(spec.columns):  # Stata's names may be cut to 32 characters: by position
            labels = meta.variable_value_labels.get(column.name)
            check_column(column, stored.iloc[:, i], labels, expected.iloc[:, i], export_format,
                         f"{spec.name}.{column.name}")
            if labels:
                labelling.setdefault(column.name, set()).add(tuple(sorted(labels.items())))
        if export_format == "spss":  # the empty text declared user-missing, nothing else
            _, declared = READERS[export_format](str(path), metadataonly=True, user_missing=True)
            text = {c.name for c in spec.columns if c.type == "string" and not c.enum}
            assert {name: [{"lo": "", "hi": ""}] for name in text} == declared.missing_ranges, spec.name
    # A shared column has the same codes in every table it is in (so the tables join on them);
    # others (a participant's, a conversation's, a follow-up's status) are their table's own.
    alike = set(SHARED) | set(FROM_STUDY)
    assert {name: len(found) for name, found in labelling.items() if len(found) > 1 and name in alike} == {}
    assert {"arm", "mode", "first_role", "wave", "response_status", "event_type"} <= set(labelling)

    # What a researcher looks at in the panel: labelled codes, and missing where nothing was there.
    panel, meta = READERS[export_format](str(result.out_dir / f"panel.{EXTENSIONS[export_format]}"),
                                         apply_value_formats=True)
    assert set(meta.variable_value_labels["response_status"].values()) == set(STATUSES)
    rows = panel.set_index(["participant_code", "wave"])

    def cell(who: str, wave: str, column: str) -> Any:
        return rows.loc[(who, wave), column]

    assert cell(study.alice, "perma-week-4", "response_status") == "completed"
    assert cell(study.bob, "perma-week-1", "response_status") == "expired"
    assert cell(study.carol, "perma-week-1", "response_status") == "withdrawn"
    assert cell(study.alice, "baseline", "first_role") == "coach"
    assert pd.isna(cell(study.bob, "baseline", "first_role"))  # no conversation: system-missing
    assert pd.isna(cell(study.carol, "baseline", "baseline_perma_overall_wellbeing"))
    version = cell(study.carol, "perma-week-4", "instrument_version")  # never opened: missing text
    assert pd.isna(version) if export_format == "spss" else version == ""
    dropout = READERS[export_format](str(result.out_dir / f"survival.{EXTENSIONS[export_format]}"),
                                     apply_value_formats=True)[0].set_index("participant_code")
    assert dropout["event_type"].astype(object).to_dict() == {
        study.alice: "censored", study.bob: "stopped_answering", study.carol: "withdrew"}


def test_the_survival_table_is_in_every_format_as_analysis_computes_it(engine: Engine, study: Study,
                                                                       tmp_path: Path) -> None:
    computed = survival(engine, study.slug)
    assert set(computed["event_type"]) == {"censored", "stopped_answering", "withdrew"}
    for export_format in ("csv", "parquet"):
        result = export(engine, study, tmp_path, export_format)
        path = result.out_dir / f"survival.{EXTENSIONS[export_format]}"
        frame = pd.read_csv(path) if export_format == "csv" else pd.read_parquet(path)
        assert list(frame.columns) == list(SURVIVAL_COLUMNS)
        assert frame["participant_code"].tolist() == computed["participant_code"].tolist()
        assert frame["event_type"].tolist() == computed["event_type"].tolist()
        assert frame["duration_days"].tolist() == pytest.approx(computed["duration_days"].tolist())
        codebook = (result.out_dir / "CODEBOOK.md").read_text()
        assert f"## survival ({len(computed)} rows)" in codebook
        assert "| `event_type` | string |" in codebook


@pytest.mark.parametrize("export_format", ["csv", "parquet", "spss", "stata"])
def test_frictionless_validates_the_package_of_every_format(engine: Engine, study: Study, tmp_path: Path,
                                                            export_format: str) -> None:
    result = export(engine, study, tmp_path, export_format)
    report = validate_package(result.out_dir / "datapackage.json")
    assert report.valid, report.flatten(["rowNumber", "fieldName", "type", "note"])
    # Every table was read as a table, row by row (a resource's rows are checked against its stats).
    assert [task.name for task in report.tasks] == [spec.name.replace("_", "-") for spec in result.tables]
    assert {task.name: task.stats["rows"] for task in report.tasks} == {
        name.replace("_", "-"): rows for name, rows in result.row_counts.items()}
    assert all(task.type == "table" for task in report.tasks)


@pytest.mark.parametrize("export_format", ["spss", "stata"])
def test_frictionless_finds_a_code_the_codebook_does_not_list(engine: Engine, study: Study, tmp_path: Path,
                                                              export_format: str) -> None:
    result = export(engine, study, tmp_path, export_format)
    path = result.out_dir / f"panel.{EXTENSIONS[export_format]}"
    frame, meta = READERS[export_format](str(path), user_missing=True)  # SPSS: the empty text as it is
    frame.loc[1, "response_status"] = 99.0
    if export_format == "spss":
        pyreadstat.write_sav(frame, str(path), variable_value_labels=meta.variable_value_labels)
    else:
        pyreadstat.write_dta(frame, str(path), variable_value_labels=meta.variable_value_labels, version=15)
    report = validate_package(result.out_dir / "datapackage.json")
    broken = {task.name: task.flatten(["rowNumber", "fieldName", "type"]) for task in report.tasks if not task.valid}
    assert broken == {"panel": [[3, "response_status", "constraint-error"]]}  # the file's row 3: the header first


def test_spss_and_stata_codebooks_document_the_codes_and_the_missing_values(engine: Engine, study: Study,
                                                                           tmp_path: Path) -> None:
    for export_format in ("spss", "stata"):
        result = export(engine, study, tmp_path, export_format)
        codebook = (result.out_dir / "CODEBOOK.md").read_text()
        status = next(line for line in codebook.splitlines() if line.startswith("| `response_status` |"))
        at = [status.index(f"{code} = `{value}`") for code, value in enumerate(STATUSES, start=1)]
        assert at == sorted(at)
        assert "Missing values:" in codebook
        assert "Missing values:" in (result.out_dir / "README.md").read_text()
        assert ("user-missing" in codebook) == (export_format == "spss")
        assert ("zap_empty" in codebook) == (export_format == "stata")
    csv_codebook = (export(engine, study, tmp_path, "csv").out_dir / "CODEBOOK.md").read_text()
    assert "`completed`" in csv_codebook
    assert "1 = `completed`" not in csv_codebook  # codes only where the files hold them


def test_every_text_column_of_the_panel_and_survival_table_is_coded_or_plain_text() -> None:
    study = StudyCodes(arms={}, waves={}, instruments={}, consent_versions={}, timezone_regions={})
    for table, columns in (("panel", PANEL_COLUMNS), ("survival", SURVIVAL_COLUMNS)):
        text = {name for name, column in columns.items() if column.type == "string"}
        coded = {name for name in text if codes_for(table, name, study) is not None}
        assert text - coded == TEXT & set(columns), table
    assert list(SHARED["response_status"]) == list(STATUSES)


def test_a_value_the_codes_do_not_list_stops_the_export() -> None:
    spec = TableSpec("t", "A table.", [Column("status", "string", "Status.", enum={"a": "a", "b": "b"})])
    assert normalize(pd.DataFrame({"status": ["a", None, "b"]}), spec)["status"].tolist() == ["a", pd.NA, "b"]
    with pytest.raises(UncodedValue, match=r"t.status holds \['c'\]"):
        normalize(pd.DataFrame({"status": ["a", "c"]}), spec)
