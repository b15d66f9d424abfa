"""The migrations build exactly the schema the models declare, on the database the tests run on
(SQLite or PostgreSQL): every table, column, type, index and constraint, none missing, none extra."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Engine
from sqlalchemy.schema import SchemaItem

import analysis.tables  # noqa: F401 - every package's tables, as migrations/env.py registers them
import chat.models  # noqa: F401
import evals.models  # noqa: F401
import scheduler.models  # noqa: F401
import study.models  # noqa: F401
import surveys.models  # noqa: F401
from study.db import Base


def _test_tables() -> set[str]:
    """Tables that test modules declare on Base (tests/api/test_withdrawal.py's stand-in research
    data): they are registered whenever those modules are collected, and no migration makes them."""
    return {str(getattr(mapper.local_table, "name", "")) for mapper in Base.registry.mappers
            if mapper.class_.__module__.startswith("tests.")}


def test_the_migrated_schema_has_no_drift_from_the_models(engine: Engine) -> None:
    skipped = _test_tables()

    def application_object(item: SchemaItem, name: str | None, kind: str, reflected: bool, compare_to: object) -> bool:
        table = name if kind == "table" else getattr(getattr(item, "table", None), "name", None)
        return table not in skipped

    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True,
                                                               "include_object": application_object})
        diffs = compare_metadata(context, Base.metadata)
    assert diffs == []
