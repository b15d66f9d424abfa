"""The codebook of an export: one ``Column`` per exported column, rendered three ways: a
Frictionless Data Package (``datapackage.json``), a human-readable ``CODEBOOK.md``, and the
variable and value labels pyreadstat writes into SPSS and Stata files.

    >>> from analysis.codebook import Column
    >>> Column("status", "string", "Participant status.", enum={"enrolled": "Enrolled"})
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from analysis.spreadsheet import neutralize

ColumnType = Literal["integer", "number", "string", "boolean", "datetime"]
BOOLEAN_LABELS = {0: "false", 1: "true"}


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
        """Integer codes for the categories in SPSS/Stata files (Stata labels only numbers)."""
        return {value: code for code, value in enumerate(self.enum or {}, start=1)}

    def value_labels(self) -> dict[int, str] | None:
        if self.type == "boolean":
            return dict(BOOLEAN_LABELS)
        if self.type == "string" and self.enum:
            return {code: f"{value}: {self.enum[value]}" if self.enum[value] != value else value
                    for value, code in self.value_codes().items()}
        return dict(self.point_labels) if self.point_labels else None


@dataclass
class TableSpec:
    name: str
    description: str
    columns: list[Column] = field(default_factory=list)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


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
    return spec


def write_datapackage(path: Path, name: str, title: str, tables: list[TableSpec], export_format: str,
                      row_counts: dict[str, int], description: str) -> None:
    extension, media = _MEDIA[export_format]
    resources = []
    for table in tables:
        resource: dict[str, Any] = {
            "name": table.name.replace("_", "-"), "path": file_name(table.name, export_format),
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


def write_codebook_markdown(path: Path, title: str, tables: list[TableSpec], row_counts: dict[str, int]) -> None:
    lines = [f"# Codebook: {title}", "",
             "Every column of every table. Times are UTC (ISO 8601) unless dates were shifted (see README.md). "
             "Empty cells are missing values. Lists are ';'-separated.", ""]
    for table in tables:
        lines += [f"## {table.name} ({row_counts.get(table.name, 0)} rows)", "", table.description, "",
                  "| column | type | description | allowed values |", "|---|---|---|---|"]
        for c in table.columns:
            allowed = ", ".join(f"`{v}` ({label})" if label != v else f"`{v}`" for v, label in (c.enum or {}).items())
            lines.append(f"| `{c.name}` | {c.type} | {_cell(c.full_description())} | {_cell(allowed)} |")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
