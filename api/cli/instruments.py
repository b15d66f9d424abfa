"""``afterward instruments``: custom survey instruments."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy import select

from api.cli.common import CLI_ACTOR, fail
from study.db import session_scope
from study.errors import DomainError
from surveys import registry
from surveys.definitions import InstrumentError
from surveys.translations import Translation

app = typer.Typer(no_args_is_help=True, help="Survey instruments.")


@app.command("load")
def instruments_load(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)]) -> None:
    """Load a custom instrument from YAML (a changed definition needs a new version), or a translation of
    one (a file with ``translation_of``, ``version`` and ``language``: every item, label and option)."""
    try:
        with session_scope() as session:
            instrument = registry.load_custom(session, file.read_text(encoding="utf-8"), CLI_ACTOR)
    except InstrumentError as exc:
        fail(f"{file}: {exc}")
    except DomainError as exc:
        fail(f"{file}: {exc.message}")
    if isinstance(instrument, Translation):
        typer.echo(f"translation {instrument.key} loaded ({len(instrument.items)} items)")
    else:
        typer.echo(f"instrument {instrument.key} loaded ({len(instrument.items)} items)")


@app.command("list")
def instruments_list() -> None:
    """Built-in and custom instruments."""
    from surveys.models import CustomInstrument, InstrumentTranslation

    for instrument in registry.builtin().values():
        typer.echo(f"{instrument.key}\tbuilt in\t{instrument.title}")
    with session_scope() as session:
        for row in session.scalars(select(CustomInstrument).order_by(CustomInstrument.instrument_id)):
            typer.echo(f"{row.instrument_id}@{row.version}\tcustom\t{row.definition['title']}")
        for translated in session.scalars(select(InstrumentTranslation).order_by(
                InstrumentTranslation.instrument_id, InstrumentTranslation.language)):
            typer.echo(f"{translated.instrument_id}@{translated.version}\ttranslation {translated.language}\t"
                       f"{translated.definition['title']}")
