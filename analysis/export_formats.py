"""The file formats of a study export: one table written chunk by chunk as Parquet or CSV (through
Arrow; CSV text cells neutralized against formulas, ``analysis.spreadsheet``), or whole as SPSS
(.sav) or Stata (.dta) with labelled values (pyreadstat cannot append); chunks normalized to their
table's spec so every chunk and every format has the same types; Stata's 32-character names.

With ``partition``, a Parquet table is a folder of files instead (``ParquetDataset``): the Hive layout
``<table>/study=<slug>/part-00000.parquet`` that DuckDB, Spark and warehouses read as one table, a new part
every ``ROWS_PER_FILE`` rows, and several studies' exports side by side read as one dataset.

SPSS and Stata files are read back for Frictionless validation by ``ExportReaders``, through
ReadStat (pyreadstat), the library R's haven reads them with (frictionless's own SPSS reader needs
savReaderWriter, which does not import on Python 3.10 or later, and it has none for Stata), and so
are the parts of a partitioned Parquet table (frictionless's own reader reads only the first)::

    python -m analysis.export_formats validate exports/datapackage.json
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import frictionless
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pyreadstat

from analysis.codebook import TableSpec, file_name
from analysis.spreadsheet import neutralized

STATA_NAME_LIMIT = 32
READSTAT_FORMATS = {"sav": pyreadstat.read_sav, "dta": pyreadstat.read_dta}  # file extension -> reader
READ_CHUNK_ROWS = 10_000
ROWS_PER_FILE = 1_000_000  # a partitioned Parquet table starts a new part after this many rows


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


class UncodedValue(ValueError):
    """A coded column holds a value its codes (``analysis.codebook``) do not list."""


def normalize(chunk: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    """The chunk's columns in their spec's types. A value of a coded text column that its codes do
    not list raises ``UncodedValue``: SPSS and Stata could not store it, and no format should hold
    a value its codebook does not describe."""
    out = pd.DataFrame(index=chunk.index)
    for column in spec.columns:
        values = chunk[column.name] if column.name in chunk.columns else pd.Series(None, index=chunk.index)
        if column.type == "string" and column.enum:
            unknown = set(values.dropna().astype(str)) - set(column.enum)
            if unknown:
                raise UncodedValue(f"{spec.name}.{column.name} holds {sorted(unknown)}, not among its codes "
                                   "(add them to analysis/codebook.py)")
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


def arrow_schema(spec: TableSpec) -> pa.Schema:
    """A table's Arrow schema, from its spec's column types."""
    return pa.schema([pa.field(c.name, _ARROW[c.type]) for c in spec.columns])


class TableWriter:
    """Writes one table chunk by chunk: Parquet and CSV through Arrow (CSV datetimes as ISO 8601
    with their UTC offset, booleans as true/false, missing values empty); SPSS and Stata whole
    at the end (pyreadstat cannot append)."""

    def __init__(self, path: Path, spec: TableSpec, export_format: str) -> None:
        self.path, self.spec, self.format = path, spec, export_format
        self.schema = arrow_schema(spec)
        self.files = [path]
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


PARTITIONED_NOTE = ("- layout: each table a folder of Parquet parts partitioned by study, `<table>/study=<slug>/"
                    "part-00000.parquet`; read one as a table with DuckDB's `read_parquet('<table>/*/*.parquet', "
                    "hive_partitioning = true)` (Spark: `spark.read.parquet('<table>')`), which adds the `study` "
                    "column")


def table_writer(out_dir: Path, spec: TableSpec, export_format: str, partition: str | None,
                 rows_per_file: int = ROWS_PER_FILE) -> TableWriter | ParquetDataset:
    """A table's writer: one file ``<table>.<extension>``, or with ``partition`` (Parquet only) a folder
    ``<table>/<partition>/`` of parts."""
    if partition is None:
        return TableWriter(out_dir / file_name(spec.name, export_format), spec, export_format)
    if export_format != "parquet":
        raise ValueError("only a Parquet export can be partitioned")
    return ParquetDataset(out_dir / spec.name, spec, partition, rows_per_file)


class ParquetDataset:
    """Writes one table as a Hive-partitioned folder of Parquet files, ``path/<partition>/part-00000.parquet``
    (``partition`` is ``key=value``, e.g. ``study=wellbeing-pilot``), a new part after every ``rows_per_file``
    rows (checked between chunks, so a part holds at most one chunk more). Read back as one table::

        SELECT * FROM read_parquet('out/turns/*/*.parquet', hive_partitioning = true)   -- DuckDB

    Every part has the table's full schema; an empty table is one part with no rows."""

    def __init__(self, path: Path, spec: TableSpec, partition: str, rows_per_file: int = ROWS_PER_FILE) -> None:
        if rows_per_file < 1:
            raise ValueError("rows_per_file must be at least 1")
        key, _, value = partition.partition("=")
        if not key or not value or "/" in partition:
            raise ValueError(f"a partition is key=value without '/', not {partition!r}")
        self.path, self.spec, self.rows_per_file = path, spec, rows_per_file
        self.folder = path / partition
        self.folder.mkdir(parents=True, exist_ok=True)
        self.schema = arrow_schema(spec)
        self.files: list[Path] = []
        self.part: pq.ParquetWriter | None = None
        self.rows = self.rows_in_part = 0

    def _next_part(self) -> pq.ParquetWriter:
        if self.part is not None:
            self.part.close()
        self.files.append(self.folder / f"part-{len(self.files):05d}.parquet")
        self.part, self.rows_in_part = pq.ParquetWriter(self.files[-1], self.schema), 0
        return self.part

    def write(self, chunk: pd.DataFrame) -> None:
        part = self.part if self.part is not None and self.rows_in_part < self.rows_per_file else self._next_part()
        part.write_table(pa.Table.from_pandas(chunk, schema=self.schema, preserve_index=False))
        self.rows += len(chunk)
        self.rows_in_part += len(chunk)

    def close(self) -> None:
        (self.part or self._next_part()).close()


def _write_labelled(path: Path, frame: pd.DataFrame, spec: TableSpec, export_format: str) -> None:
    """SPSS/Stata: categories and booleans as labelled integer codes, datetimes as naive UTC, a
    missing number, date, code or boolean as system-missing (NaN). Text has no system-missing: a
    missing one is written empty, and SPSS files declare the empty text user-missing, so haven and
    pyreadstat read it as NA (Stata has no user-missing text: its missing string is the empty one)."""
    out = pd.DataFrame(index=frame.index)
    value_labels: dict[str, dict[int | float, str]] = {}
    missing: dict[str, list[Any]] = {}
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
            missing[column.name] = [""]
        labels = column.value_labels()
        if labels:
            value_labels[column.name] = {float(code): label for code, label in labels.items()}
    limit = 80 if export_format == "stata" else 255  # variable label lengths the formats allow
    titles: list[str | None] = [column.full_description()[:limit] for column in spec.columns]
    if export_format == "spss":
        pyreadstat.write_sav(out, str(path), column_labels=titles, variable_value_labels=value_labels,
                             missing_ranges=missing, file_label=spec.name)
    else:
        pyreadstat.write_dta(out, str(path), column_labels=titles, variable_value_labels=value_labels,
                             file_label=spec.name[:80], version=15)


# Frictionless validation of SPSS and Stata files, and of partitioned Parquet tables


def _cell(value: Any) -> Any:
    """A value pyreadstat read, as frictionless takes it: missing as None, numpy scalars as Python's."""
    if value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, pd.Timestamp):
        return value.to_pydatetime()
    return value.item() if hasattr(value, "item") else value


class ReadstatParser(frictionless.Parser):
    """Reads a .sav or .dta file's rows, as stored (codes, not labels), through pyreadstat in
    chunks: a system-missing or declared user-missing value is None, as in haven's ``read_sav``
    and ``read_dta``."""

    supported_types = ["integer", "number", "string", "datetime"]

    def read_cell_stream_create(self) -> Iterator[list[Any]]:
        read, path = READSTAT_FORMATS[str(self.resource.format)], str(self.resource.normpath)
        _, meta = read(path, metadataonly=True)
        yield list(meta.column_names)
        for chunk, _ in pyreadstat.read_file_in_chunks(read, path, chunksize=READ_CHUNK_ROWS):
            for row in chunk.itertuples(index=False, name=None):
                yield [_cell(value) for value in row]


class ParquetPartsParser(frictionless.Parser):
    """Reads a partitioned table's Parquet parts (a multipart resource) one after the other, each as
    frictionless's own Parquet reader reads a file (through pandas)."""

    supported_types = ["boolean", "datetime", "integer", "number", "string"]

    def read_cell_stream_create(self) -> Iterator[list[Any]]:
        for n, path in enumerate(self.resource.normpaths):
            with frictionless.resources.TableResource(data=pq.read_table(path).to_pandas(), format="pandas") as part:
                cells = iter(part.cell_stream)
                header = next(cells)
                if n == 0:
                    yield header
                yield from cells


class ExportReaders(frictionless.Plugin):
    """Frictionless reads .sav and .dta resources as tables with ``ReadstatParser``, and a Parquet
    resource of several parts with ``ParquetPartsParser``."""

    def create_parser(self, resource: frictionless.Resource) -> frictionless.Parser | None:
        if resource.format in READSTAT_FORMATS:
            return ReadstatParser(resource)
        if resource.format == "parquet" and resource.multipart:
            return ParquetPartsParser(resource)
        return None

    def detect_resource(self, resource: frictionless.Resource) -> None:
        if resource.format in READSTAT_FORMATS:
            resource.datatype = resource.datatype or "table"


def register_readers() -> None:
    """Let frictionless read SPSS and Stata files and partitioned Parquet tables (a registered plugin
    comes before its own readers). Registering again replaces the plugin."""
    frictionless.system.register("readstat", ExportReaders())
    # register() drops frictionless's cached plugin list only when its table of hooks was built
    # too (frictionless 5.x): drop both, so the plugin is seen whichever was built first.
    for cached in ("plugins", "methods"):
        vars(frictionless.system).pop(cached, None)


def validate_package(path: Path | str) -> frictionless.Report:
    """``frictionless validate`` of an export's ``datapackage.json``, SPSS and Stata files and Parquet
    parts read by ``ExportReaders``: every row of every table against its schema (types, allowed codes, row
    counts)."""
    register_readers()
    return frictionless.validate(str(path))


def main(argv: list[str] | None = None) -> None:
    """The ``frictionless`` command line with ``ExportReaders`` registered."""
    register_readers()
    from frictionless.console import console

    console(args=sys.argv[1:] if argv is None else argv, prog_name="frictionless")


if __name__ == "__main__":
    main()
