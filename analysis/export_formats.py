"""The file formats of a study export: one table written chunk by chunk as Parquet or CSV (through
Arrow; CSV text cells neutralized against formulas, ``analysis.spreadsheet``), or whole as SPSS
(.sav) or Stata (.dta) with labelled values (pyreadstat cannot append); chunks normalized to their
table's spec so every chunk and every format has the same types; Stata's 32-character names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pyreadstat

from analysis.codebook import TableSpec
from analysis.spreadsheet import neutralized

STATA_NAME_LIMIT = 32


def stata_names(spec: TableSpec) -> tuple[TableSpec, dict[str, str]]:
    """Stata names are at most 32 characters: longer ones are cut, numbered where two would
    clash, and the codebook gives the full name."""
    used = {c.name for c in spec.columns if len(c.name) <= STATA_NAME_LIMIT}
    renamed: dict[str, str] = {}
    columns = []
    for column in spec.columns:
        if len(column.name) > STATA_NAME_LIMIT:
            short, n = column.name[:STATA_NAME_LIMIT], 1
            while short in used:
                n += 1
                short = f"{column.name[:STATA_NAME_LIMIT - 1 - len(str(n))]}_{n}"
            used.add(short)
            renamed[column.name] = short
            column = replace(column, name=short, description=f"{column.description} (full name: {column.name})")
        columns.append(column)
    return TableSpec(spec.name, spec.description, columns), renamed


def normalize(chunk: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    out = pd.DataFrame(index=chunk.index)
    for column in spec.columns:
        values = chunk[column.name] if column.name in chunk.columns else pd.Series(None, index=chunk.index)
        if column.type == "datetime":
            out[column.name] = pd.to_datetime(values, utc=True).astype("datetime64[us, UTC]")
        elif column.type == "integer":
            out[column.name] = pd.to_numeric(values).astype("Int64")
        elif column.type == "number":
            out[column.name] = pd.to_numeric(values).astype("float64")
        elif column.type == "boolean":
            out[column.name] = values.astype("boolean")
        else:
            out[column.name] = values.astype("string")
    return out


_ARROW: dict[str, pa.DataType] = {"integer": pa.int64(), "number": pa.float64(), "string": pa.string(),
                                  "boolean": pa.bool_(), "datetime": pa.timestamp("us", tz="UTC")}


class TableWriter:
    """Writes one table chunk by chunk: Parquet and CSV through Arrow (CSV datetimes as ISO 8601
    with their UTC offset, booleans as true/false, missing values empty); SPSS and Stata whole
    at the end (pyreadstat cannot append)."""

    def __init__(self, path: Path, spec: TableSpec, export_format: str) -> None:
        self.path, self.spec, self.format = path, spec, export_format
        self.schema = pa.schema([pa.field(c.name, _ARROW[c.type]) for c in spec.columns])
        self.arrow: pq.ParquetWriter | pa_csv.CSVWriter | None = None
        self.parts: list[pd.DataFrame] = []
        self.rows = 0
        if export_format == "parquet":
            self.arrow = pq.ParquetWriter(path, self.schema)
        elif export_format == "csv":
            self.text_schema = pa.schema([pa.field(f.name, pa.string() if f.type == _ARROW["datetime"] else f.type)
                                          for f in self.schema])
            self.arrow = pa_csv.CSVWriter(path, self.text_schema,
                                          write_options=pa_csv.WriteOptions(quoting_style="needed"))

    def write(self, chunk: pd.DataFrame) -> None:
        self.rows += len(chunk)
        if self.arrow is None:
            self.parts.append(chunk)
            return
        if self.format == "csv":
            chunk = neutralized(chunk)
        table = pa.Table.from_pandas(chunk, schema=self.schema, preserve_index=False)
        if self.format == "csv":
            table = pa.Table.from_arrays(
                [pc.strftime(column, format="%Y-%m-%dT%H:%M:%S+00:00") if column.type == _ARROW["datetime"]
                 else column for column in table.columns], schema=self.text_schema)
        self.arrow.write_table(table)

    def close(self) -> None:
        if self.arrow is not None:
            self.arrow.close()
        else:
            frame = pd.concat(self.parts, ignore_index=True) if self.parts else normalize(pd.DataFrame(), self.spec)
            _write_labelled(self.path, frame, self.spec, self.format)


def _write_labelled(path: Path, frame: pd.DataFrame, spec: TableSpec, export_format: str) -> None:
    """SPSS/Stata: categories and booleans as labelled integers, datetimes as naive UTC."""
    out = pd.DataFrame(index=frame.index)
    value_labels: dict[str, dict[int | float, str]] = {}
    for column in spec.columns:
        values = frame[column.name]
        if column.type == "datetime":
            out[column.name] = values.dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")
        elif column.type == "boolean":
            out[column.name] = values.astype("float64")
        elif column.type == "string" and column.enum:
            out[column.name] = values.map(column.value_codes()).astype("float64")
        elif column.type in ("integer", "number"):
            out[column.name] = values.astype("float64")
        else:
            out[column.name] = values.fillna("").astype(object)
        labels = column.value_labels()
        if labels:
            value_labels[column.name] = {float(code): label for code, label in labels.items()}
    limit = 80 if export_format == "stata" else 255  # variable label lengths the formats allow
    titles: list[str | None] = [column.full_description()[:limit] for column in spec.columns]
    if export_format == "spss":
        pyreadstat.write_sav(out, str(path), column_labels=titles, variable_value_labels=value_labels,
                             file_label=spec.name)
    else:
        pyreadstat.write_dta(out, str(path), column_labels=titles, variable_value_labels=value_labels,
                             file_label=spec.name[:80], version=15)
