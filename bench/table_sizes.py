"""What grows with participants and turns: PostgreSQL table and index sizes of a bulk study at two sizes.

    nice -n 10 .venv/bin/python bench/table_sizes.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/DB \\
        --participants 10000,100000 --like sim400 [--keep]

Each size is a study written by ``bench/analysis_data.generate`` (COPY) into a schema of its own,
``sizes_<n>``, at the proportions of a study that ran through the real services: ``--like SCHEMA``
names a schema holding one made by ``afterward simulate``, from which the conversations per
participant, the turns per conversation and the stored columns of a participant's message and of a
reply (features, rationale) are read, so the bulk rows are as many and as wide as real ones. Every
participant also gets the baseline and the protocol's follow-ups with their deliveries
(``analysis_data.Waves``). After ``VACUUM ANALYZE``, per table: rows, ``pg_table_size`` (heap,
TOAST, free-space and visibility maps), ``pg_indexes_size``, ``pg_total_relation_size``, and the
total per 10,000 participants; then the ratio of the two sizes' totals per table (linear growth:
the ratio of participants). The simulated study's own sizes per 10,000 participants are printed
first, to compare the bulk rows with the services' own. ``--keep`` leaves the schemas (e.g. to
export the largest, ``docs/SCALING.md``); otherwise they are dropped.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from analysis_data import generate
from common import ROOT  # noqa: F401  (first: sets the environment and sys.path)

from study.db import make_engine, migrate

SIZES = """
SELECT c.relname AS table_name, c.reltuples::bigint AS estimated_rows,
       pg_relation_size(c.oid) AS heap, pg_table_size(c.oid) AS table_bytes,
       pg_indexes_size(c.oid) AS index_bytes, pg_total_relation_size(c.oid) AS total_bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :schema AND c.relkind = 'r' ORDER BY total_bytes DESC
"""
MB = 1024 * 1024


def scoped(url: str, schema: str) -> str:
    return sa.engine.make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False)


def proportions(url: str, schema: str) -> tuple[int, float, float, dict[str, dict[str, Any]]]:
    """From a simulated study: participants, conversations per participant, turns per conversation,
    and the stored columns of the participant message and the reply with the widest features."""
    engine = make_engine(scoped(url, schema), timeouts=False)
    with engine.connect() as connection:
        people = connection.execute(sa.text("SELECT count(*) FROM participants WHERE enrolled_at IS NOT NULL"))
        n = int(people.scalar_one())
        conversations = int(connection.execute(sa.text("SELECT count(*) FROM conversations")).scalar_one())
        turns = int(connection.execute(sa.text("SELECT count(*) FROM turns")).scalar_one())
        like: dict[str, dict[str, Any]] = {}
        for speaker, columns in (("participant", "features"),
                                 ("assistant", "features, rationale, stance_source, model_stance")):
            row = connection.execute(sa.text(
                f"SELECT {columns} FROM turns WHERE speaker = :speaker "
                "ORDER BY pg_column_size(features) DESC LIMIT 1"), {"speaker": speaker}).mappings().one()
            like[speaker] = dict(row)
    engine.dispose()
    return n, conversations / n, turns / conversations, like


def sizes(url: str, schema: str) -> list[dict[str, Any]]:
    engine = make_engine(scoped(url, schema), timeouts=False)
    with engine.connect() as connection:
        found = [dict(row) for row in connection.execute(sa.text(SIZES), {"schema": schema}).mappings()]
        for row in found:  # exact counts: reltuples is an estimate
            row["rows"] = int(connection.execute(sa.text(f'SELECT count(*) FROM "{row["table_name"]}"')).scalar_one())
    engine.dispose()
    return found


def show(label: str, found: list[dict[str, Any]], participants: int, top: int = 14) -> dict[str, int]:
    per = 10_000 / participants
    print(f"{label}: {participants:,} participants; per table rows, table (heap+TOAST), indexes, total; "
          "then the total per 10,000 participants")
    for row in found[:top]:
        print(f"  {row['table_name']:<24} {row['rows']:>11,} rows {row['table_bytes'] / MB:>9.1f} MB "
              f"{row['index_bytes'] / MB:>9.1f} MB {row['total_bytes'] / MB:>9.1f} MB   per 10,000: "
              f"{row['rows'] * per:>10,.0f} rows {row['total_bytes'] * per / MB:>8.1f} MB "
              f"({row['total_bytes'] / max(row['rows'], 1):,.0f} B a row)")
    rest = found[top:]
    total = sum(row["total_bytes"] for row in found)
    tables = sum(row["table_bytes"] for row in found)
    indexes = sum(row["index_bytes"] for row in found)
    print(f"  the other {len(rest)} tables: {sum(row['total_bytes'] for row in rest) / MB:.1f} MB")
    print(f"  all tables: {tables / MB:,.1f} MB tables + {indexes / MB:,.1f} MB indexes = {total / MB:,.1f} MB; "
          f"per 10,000 participants {total * per / MB:,.1f} MB")
    return {row["table_name"]: row["total_bytes"] for row in found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", required=True, help="a database of your own (schemas sizes_<n> are made in it)")
    parser.add_argument("--participants", default="10000,100000", help="two sizes, comma-separated")
    parser.add_argument("--like", required=True, help="the schema of a study made by afterward simulate")
    parser.add_argument("--keep", action="store_true", help="leave the schemas sizes_<n> in place")
    args = parser.parse_args()
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"load at start: {Path('/proc/loadavg').read_text().strip()}")
    n, conversations_each, turns_each, like = proportions(args.postgres, args.like)
    print(f"simulated study ({args.like}): {n} participants, {conversations_each:.2f} conversations each, "
          f"{turns_each:.2f} turns a conversation")
    show(f"simulated ({args.like})", sizes(args.postgres, args.like), n)
    conversations, turns = round(conversations_each), 2 * round(turns_each / 2)  # a turn pair: message and reply
    totals = []
    for participants in (int(size) for size in args.participants.split(",")):
        schema = f"sizes_{participants}"
        admin = sa.create_engine(args.postgres)
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        url = scoped(args.postgres, schema)
        migrate(url)
        engine = make_engine(url, timeouts=False)
        started = time.perf_counter()
        slug, codes = generate(engine, participants * conversations * turns, conversations_each=conversations,
                               turns_each=turns, waves=True, like=like)
        engine.dispose()
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            for table in connection.scalars(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = :schema"),
                                            {"schema": schema}).all():
                connection.execute(sa.text(f'VACUUM ANALYZE "{schema}"."{table}"'))
        print(f"generated {slug} in {schema}: {len(codes):,} participants ({conversations} conversations of {turns} "
              f"turns each) in {time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.2f}")
        totals.append((len(codes), show(f"bulk ({schema})", sizes(args.postgres, schema), len(codes))))
        if not args.keep:
            with admin.begin() as connection:
                connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    (small, first), (large, second) = totals
    print(f"growth from {small:,} to {large:,} participants (x{large / small:g}), total bytes per table:")
    for table, size in sorted(second.items(), key=lambda item: -item[1])[:8]:
        print(f"  {table:<24} x{size / max(first.get(table, 1), 1):.2f}")
    print(f"  all tables               x{sum(second.values()) / sum(first.values()):.2f}")
    print(f"load at end: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
