"""Alembic environment. The URL comes from the Alembic config (``study.db.migrate``) or, when
run as ``alembic upgrade head``, from AFTERWARD_DATABASE_URL."""

from __future__ import annotations

from typing import Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext

import analysis.tables  # noqa: F401
import chat.models  # noqa: F401
import evals.models  # noqa: F401
import scheduler.models  # noqa: F401
import study.models  # noqa: F401 - register tables on the metadata
import surveys.models  # noqa: F401
from study.db import Base, UTCDateTime, make_engine
from study.settings import get_settings

config = context.config


def _render_item(type_: str, obj: object, autogen_context: AutogenContext) -> str | Literal[False]:
    # Revisions must not import application code: write our UTC type as the plain column type.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False

target_metadata = Base.metadata


def run_migrations() -> None:
    url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=target_metadata, literal_binds=True,
                          render_as_batch=url.startswith("sqlite"))
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(url, timeouts=False)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=connection.dialect.name == "sqlite",
                          render_item=_render_item)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
