"""The migrations build exactly the schema the models declare, on the database the tests run on
(SQLite or PostgreSQL): every table, column, type, index and constraint, none missing, none extra."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Engine

import analysis.tables  # noqa: F401 - every package's tables, as migrations/env.py registers them
import chat.models  # noqa: F401
import evals.models  # noqa: F401
import scheduler.models  # noqa: F401
import study.models  # noqa: F401
import surveys.models  # noqa: F401
from study.db import Base


def test_the_migrated_schema_has_no_drift_from_the_models(engine: Engine) -> None:
    with engine.connect() as connection:
        diffs = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata)
    assert diffs == []
