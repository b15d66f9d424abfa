"""The codebook of an export: one ``Column`` per exported column, rendered three ways: a
Frictionless Data Package (``datapackage.json``), a human-readable ``CODEBOOK.md``, and the
variable and value labels pyreadstat writes into SPSS and Stata files; and the one list of the
codes of every coded column (``codes_for``, ``coded``).

A coded column holds one of a closed list of values that the platform (statuses, roles, stances,
...) or the study's protocol and records (arms, waves, instruments, ...) define. SPSS and Stata
files store each value as its code, its position in the list counted from 1, labelled with the
value itself (so R's ``haven::as_factor`` gives the strings the CSV and Parquet files hold), and
a missing value as system-missing; CSV and Parquet hold the value. The same column name has the
same codes in every table, so the tables join on them.

    >>> from analysis.codebook import Column
    >>> Column("status", "string", "Participant status.", enum={"enrolled": "Enrolled"})
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from analysis.panel import STATUSES
from analysis.spreadsheet import neutralize
from chat import triage
from chat.reading import ABOUT
from chat.roles import CONCERNS, STANCES
from study.models import ParticipantStatus, WithdrawalLevel

ColumnType = Literal["integer", "number", "string", "boolean", "datetime"]
BOOLEAN_LABELS = {0: "false", 1: "true"}
LABELLED_FORMATS = ("spss", "stata")  # formats that store coded columns as labelled integer codes


@dataclass(frozen=True)
class Column:
    """One exported column. ``enum`` maps each allowed value to its label (categorical columns);
    ``free_text`` columns are dropped by ``drop_free_text``; ``dated`` datetime columns belong to
    one participant and move with ``shift_dates``."""

    name: str
    type: ColumnType
    description: str
    unit: str | None = None
    enum: dict[str, str] | None = None
    free_text: bool = False
    dated: bool = True
    point_labels: dict[int, str] | None = None  # labelled points of a numeric scale (may be partial)

    def full_description(self) -> str:
        points = "; ".join(f"{k} = {v}" for k, v in (self.point_labels or {}).items())
        return (self.description + (f" Unit: {self.unit}." if self.unit else "")
                + (f" Labelled points: {points}." if points else ""))

    def frictionless_field(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": self.name, "type": self.type, "title": self.name,
                                "description": self.full_description()}
        if self.type == "datetime":
            spec["format"] = "any"  # ISO 8601 with an explicit UTC offset
        if self.enum:
            values: list[Any] = [int(v) for v in self.enum] if self.type == "integer" else list(self.enum)
            spec["constraints"] = {"enum": values}
        return spec

    def value_codes(self) -> dict[str, int]:
        """Integer codes for the categories in SPSS/Stata files (Stata labels only numbers): each
        value's position in ``enum``, from 1."""
        return {value: code for code, value in enumerate(self.enum or {}, start=1)}

    def value_labels(self) -> dict[int, str] | None:
        """The value labels of the SPSS and Stata files: a category's code labelled with the value
        (what CSV and Parquet hold; its meaning is in the codebook), a boolean's 0 and 1, the
        labelled points of a numeric scale."""
        if self.type == "boolean":
            return dict(BOOLEAN_LABELS)
        if self.type == "string" and self.enum:
            return {code: value for value, code in self.value_codes().items()}
        if self.type == "integer" and self.enum:
            return {int(value): label for value, label in self.enum.items()}
        return dict(self.point_labels) if self.point_labels else None

    def labelled(self) -> bool:
        """Stored as labelled integer codes in SPSS and Stata (a category or a boolean)."""
        return self.type == "boolean" or (self.type == "string" and bool(self.enum))


@dataclass
class TableSpec:
    name: str
    description: str
    columns: list[Column] = field(default_factory=list)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


# The codes of every coded column. Codes = each value and its meaning, in code order (code 1 first).

Codes = dict[str, str]

ROLES: Codes = {"concierge": "Concierge", "collaborator": "Collaborator", "coach": "Coach",
                "standard": "Standard assistant (default mode)"}
MODES: Codes = {"wellbeing": "well-being mode", "default": "default mode"}
PARTICIPANT_STATUSES: Codes = {s.value: s.value for s in ParticipantStatus}
_RESPONSE_STATUS_MEANINGS = {
    "open": "sent, window open, not answered", "expired": "window closed unanswered",
    "withdrawn": "cancelled because the participant withdrew", "not_yet_due": "planned, due later",
    "overdue": "planned, due time passed, not opened yet", "cancelled": "cancelled for another reason",
    "not_assigned": "baseline never assigned"}
RESPONSE_STATUSES: Codes = {s: _RESPONSE_STATUS_MEANINGS.get(s, s) for s in STATUSES}
PURPOSES: Codes = {"baseline": "baseline", "followup": "follow-up", "exit": "exit check"}
ANSWERS: Codes = {"yes": "yes", "no": "no", "declined": "prefer not to say"}

# Columns coded alike in every table but the responses_<instrument> ones (whose other columns are
# the instrument's items, coded by the instrument).
SHARED: dict[str, Codes] = {
    "mode": MODES, "conv_mode": MODES,
    **dict.fromkeys(("starting_role", "final_role", "first_role", "role"), ROLES),
    "participant_status": PARTICIPANT_STATUSES, "response_status": RESPONSE_STATUSES, "purpose": PURPOSES,
}
# Columns whose codes are the table's own.
BY_TABLE: dict[str, dict[str, Codes]] = {
    "participants": {
        "status": PARTICIPANT_STATUSES,
        "withdrawal_level": {WithdrawalLevel.STOP_CONTACT.value: "stop contact, keep data",
                             WithdrawalLevel.DELETE_DATA.value: "stop contact and delete research data"}},
    "conversations": {"status": {"active": "active", "ended": "ended"}},
    "followups": {"status": {s: s for s in ("planned", "sent", "completed", "expired", "cancelled")}},
    "turns": {
        "speaker": {"participant": "participant", "assistant": "assistant"},
        "about": {a: a for a in ABOUT},
        "llm_reader_status": {"ok": "a complete verdict", "malformed": "an answer without a complete verdict",
                              "timeout": "the call timed out", "error": "the call failed"},
        "stance": {s: s for s in STANCES}, "model_stance": {s: s for s in STANCES},
        "concern": {c: c for c in CONCERNS},
        "stance_source": {"platform": "platform", "model": "model"}},
    "safety_events": {
        "category": {c: c for c in CONCERNS if c != "none"},
        "source": {"lexicon": "the crisis lexicon", "semantic": "the semantic classifier (chat.semantic)",
                   "lexicon+semantic": "both the lexicon and the semantic classifier",
                   "classifier": "the optional LLM reader (chat.llm_reader)", "model": "the chat model's own stance",
                   "survey": "a safety rule on survey answers (the protocol's safety.answer_rules)"},
        "level": {"check_in": "a sign of risk met by a check-in, for staff to review",
                  "escalation": "an escalation: pages the on-call contacts",
                  "unanswered": "its check-in was not answered by the protocol's deadline (or the participant "
                                "withdrew first)"},
        "check_in": {"risk_to_self": "the risk-to-self questions", "risk_from_others": "safe now from someone else"},
        "check_in_outcome": {outcome: outcome for outcome in triage.OUTCOMES},
        **{f"answer_{q.id}": ANSWERS for q in (*triage.RISK_TO_SELF, *triage.RISK_FROM_OTHERS)},
        "review_status": {"reviewed": "reviewed", "unreviewed": "not yet reviewed"}},
    "survival": {  # analysis.panel.STOP_RULE
        "event_type": {"stopped_answering": "missed a follow-up and answered none after it (event 1)",
                       "withdrew": "withdrew before stopping answering (the competing event)",
                       "censored": "neither, by the end of follow-up or when the data were read"},
        "censored_because": {"withdrew": "withdrew (the competing event)",
                             "end_of_follow_up": "every window closed with no miss after the last answer",
                             "data_cut": "a window still open or due when the data were read"},
        "event": {"0": "not seen to stop answering", "1": "stopped answering"}},
}
# Columns whose codes the study defines (its protocol versions and records): StudyCodes' fields.
FROM_STUDY = {"arm": "arms", "conv_arm": "arms", "wave": "waves", "followup_key": "waves", "event_wave": "waves",
              "instrument_id": "instruments", "consent_version": "consent_versions",
              "timezone_region": "timezone_regions"}


@dataclass(frozen=True)
class StudyCodes:
    """The codes one study defines, read when it is exported (``study_codes``)."""

    arms: Codes
    waves: Codes
    instruments: Codes
    consent_versions: Codes
    timezone_regions: Codes


def study_codes(protocols: list[dict[str, Any]], *, consent_versions: list[str], waves: list[str],
                instruments: list[str], timezones: list[str | None]) -> StudyCodes:
    """A study's codes from its protocol documents (oldest first: arms, follow-up ids and
    instruments in the protocol's order, a later version's new ones after) and what its records
    hold besides (``waves``, ``instruments``: follow-up keys and instruments found in its records;
    ``timezones``: its participants' time zones, coded by region, the part before the first '/')."""
    arms: Codes = {}
    wave_codes: Codes = {"baseline": "the baseline survey"}
    instrument_codes: Codes = {}
    for protocol in protocols:
        for arm in protocol.get("arms", []):
            arms.setdefault(arm["name"], f"an arm in {arm['mode']} mode")
        for instrument in protocol.get("baseline", []):
            instrument_codes.setdefault(instrument, instrument)
        for followup in protocol.get("followups", []):
            wave_codes.setdefault(followup["id"], f"follow-up {followup['id']} ({followup['instrument']})")
            instrument_codes.setdefault(followup["instrument"], followup["instrument"])
    for wave in sorted(waves):
        wave_codes.setdefault(wave, wave)
    for instrument in sorted(instruments):
        instrument_codes.setdefault(instrument, instrument)
    # The panel's baseline rows name the PERMA-Profiler whatever the study asks (analysis.panel).
    instrument_codes.setdefault("perma-profiler", "perma-profiler (the panel's baseline rows)")
    regions = sorted({zone.split("/")[0] for zone in timezones if zone})
    return StudyCodes(arms, wave_codes, instrument_codes, {v: v for v in consent_versions},
                      {region: region for region in regions})


def codes_for(table: str, column: str, study: StudyCodes) -> Codes | None:
    """The codes of ``column`` in ``table``, or None when it is not a coded column."""
    if table.startswith("responses_"):  # its other columns are the instrument's items
        return {"purpose": PURPOSES, "followup_key": study.waves}.get(column)
    if column in FROM_STUDY:
        return getattr(study, FROM_STUDY[column])
    return BY_TABLE.get(table, {}).get(column) or SHARED.get(column)


def coded(spec: TableSpec, study: StudyCodes) -> TableSpec:
    """``spec`` with the codes of each of its coded columns (``codes_for``) as the column's ``enum``."""
    columns = []
    for column in spec.columns:
        codes = codes_for(spec.name, column.name, study)
        columns.append(column if codes is None else replace(column, enum=dict(codes)))
    return TableSpec(spec.name, spec.description, columns)


_MEDIA = {"csv": ("csv", "text/csv"), "parquet": ("parquet", "application/vnd.apache.parquet"),
          "spss": ("sav", "application/x-spss-sav"), "stata": ("dta", "application/x-stata-dta")}


def file_name(table: str, export_format: str) -> str:
    return f"{table}.{_MEDIA[export_format][0]}"


def _field(column: Column, export_format: str) -> dict[str, Any]:
    spec = column.frictionless_field()
    if export_format == "parquet" and column.type == "integer":
        # A missing integer is read back through pandas as NaN, which frictionless sees as "nan".
        spec["missingValues"] = ["", "nan"]
    if export_format == "csv" and column.type == "string" and "constraints" in spec:
        # The allowed values as the CSV file holds them (analysis.spreadsheet).
        spec["constraints"]["enum"] = [neutralize(value) for value in spec["constraints"]["enum"]]
    labels = column.value_labels()
    if export_format in LABELLED_FORMATS and labels and (column.labelled() or column.enum):
        # What the file holds: integer codes, each labelled (Table Schema v2 "categories").
        spec["type"] = "integer"
        spec["categories"] = [{"value": code, "label": label} for code, label in labels.items()]
        spec["constraints"] = {"enum": list(labels)}
    return spec


def write_datapackage(path: Path, name: str, title: str, tables: list[TableSpec], export_format: str,
                      row_counts: dict[str, int], description: str,
                      parts: dict[str, list[Path]] | None = None) -> None:
    """The Data Package of an export. ``parts``: a table's files where it is not one file named after it
    (a partitioned Parquet table's parts, a multipart resource)."""
    extension, media = _MEDIA[export_format]
    resources = []
    for table in tables:
        files = [part.relative_to(path.parent).as_posix() for part in (parts or {}).get(table.name, [])]
        resource: dict[str, Any] = {
            "name": table.name.replace("_", "-"), "path": files or file_name(table.name, export_format),
            "format": extension, "mediatype": media, "description": table.description,
            "schema": {"fields": [_field(c, export_format) for c in table.columns]},
            "stats": {"rows": row_counts.get(table.name, 0)},
        }
        if export_format == "csv":
            resource["encoding"] = "utf-8"
            resource["dialect"] = {"csv": {"delimiter": ",", "quoteChar": '"'}}
        resources.append(resource)
    package = {"name": name, "title": title, "description": description, "resources": resources}
    path.write_text(json.dumps(package, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


MISSING_NOTE = {
    "spss": "Missing values: numbers, dates, booleans and coded columns are system-missing; an empty text "
            "value is declared user-missing (`MISSING VALUES` ''), so R's haven (`read_sav`) and pyreadstat "
            "read every missing value as NA.",
    "stata": "Missing values: numbers, dates, booleans and coded columns are Stata's missing value `.`, read "
             "as NA by R's haven (`read_dta`) and pyreadstat. Stata has no missing text other than the empty "
             "string (its `missing()` is true for \"\"), so missing text is \"\": in R, `haven::zap_empty()` "
             "makes it NA.",
}


def _allowed(column: Column, export_format: str | None) -> str:
    """A coded column's values with their meanings; in SPSS and Stata exports with their codes."""
    codes = column.value_codes() if export_format in LABELLED_FORMATS and column.type == "string" else {}
    return ", ".join((f"{codes[value]} = " if value in codes else "") + f"`{value}`"
                     + (f" ({meaning})" if meaning != value else "") for value, meaning in (column.enum or {}).items())


def write_codebook_markdown(path: Path, title: str, tables: list[TableSpec], row_counts: dict[str, int],
                            export_format: str | None = None) -> None:
    lines = [f"# Codebook: {title}", "",
             "Every column of every table. Times are UTC (ISO 8601) unless dates were shifted (see README.md). "
             "Empty cells are missing values. Lists are ';'-separated.", ""]
    if export_format in LABELLED_FORMATS:
        lines += ["Coded columns (those with allowed values) hold the number before each value, its code, "
                  "labelled with the value; booleans hold 0 (false) or 1 (true), labelled. The same column "
                  "has the same codes in every table.", "", MISSING_NOTE[export_format], ""]
    for table in tables:
        lines += [f"## {table.name} ({row_counts.get(table.name, 0)} rows)", "", table.description, "",
                  "| column | type | description | allowed values |", "|---|---|---|---|"]
        lines += [f"| `{c.name}` | {c.type} | {_cell(c.full_description())} | {_cell(_allowed(c, export_format))} |"
                  for c in table.columns]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
