"""``afterward db``: the database schema (migrations)."""

from __future__ import annotations

import typer

from study import signin
from study.db import migrate, session_scope
from study.settings import get_settings

app = typer.Typer(no_args_is_help=True, help="Database schema.")


@app.command("upgrade")
def db_upgrade() -> None:
    """Run the migrations up to the newest revision."""
    url = get_settings().database_url
    before = _schema_revision(url)
    migrate(url)
    after = _schema_revision(url)
    with session_scope() as session:  # addresses on file from before sign-in links: their lookup hashes
        hashed = signin.backfill_lookup_hashes(session)
    if hashed:
        typer.echo(f"{hashed} contact address(es) on file can now be found for sign-in links")
    if before is None:
        typer.echo(f"created the schema in an empty database (revision {after})")
    elif before != after:
        typer.echo(f"migrated the database from revision {before} to {after}")
    else:
        typer.echo(f"database is up to date (revision {after})")


def _schema_revision(url: str) -> str | None:
    """The Alembic revision of the database at ``url`` (None: no schema yet)."""
    from alembic.runtime.migration import MigrationContext

    from study.db import make_engine

    engine = make_engine(url, timeouts=False)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
