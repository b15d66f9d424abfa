"""Where instruments come from: the built-in YAML files beside this module, and researchers'
custom instruments stored in the database (versioned)."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from study import audit
from study.errors import Conflict, NotFound
from surveys.definitions import Instrument, parse_instrument
from surveys.models import CustomInstrument

BUILTIN_DIR = Path(__file__).resolve().parent / "instruments"


@cache
def builtin() -> dict[str, Instrument]:
    instruments = [parse_instrument(path.read_text(encoding="utf-8")) for path in sorted(BUILTIN_DIR.glob("*.yaml"))]
    return {instrument.id: instrument for instrument in instruments}


def get(session: Session, instrument_id: str, version: str | None = None) -> Instrument:
    """The instrument (newest version unless ``version`` is given)."""
    known = builtin().get(instrument_id)
    if known is not None and version in (None, known.version):
        return known
    query = select(CustomInstrument).where(CustomInstrument.instrument_id == instrument_id)
    if version is not None:
        query = query.where(CustomInstrument.version == version)
    row = session.scalar(query.order_by(CustomInstrument.id.desc()).limit(1))
    if row is None:
        raise NotFound(f"no instrument '{instrument_id}'" + (f" version {version}" if version else ""))
    return Instrument.model_validate(row.definition)


def catalog(session: Session) -> dict[str, frozenset[str]]:
    """Every instrument a protocol may name (the built-in ones and the newest version of each custom
    one loaded) with the names a protocol's answer rule may use: its item ids and score names."""
    found = {instrument_id: get(session, instrument_id)
             for instrument_id in session.scalars(select(CustomInstrument.instrument_id).distinct())}
    found.update(builtin())
    return {instrument_id: frozenset([*(item.id for item in instrument.items), *(s.name for s in instrument.scores)])
            for instrument_id, instrument in found.items()}


def exists(session: Session, instrument_id: str) -> bool:
    return instrument_id in builtin() or session.scalar(
        select(CustomInstrument.id).where(CustomInstrument.instrument_id == instrument_id).limit(1)) is not None


def load_custom(session: Session, source_yaml: str, actor: audit.Actor) -> Instrument:
    """Store a researcher's instrument. A changed definition needs a new version string, so
    responses always point at the exact items they answered."""
    instrument = parse_instrument(source_yaml)
    if instrument.id in builtin():
        raise Conflict(f"'{instrument.id}' is a built-in instrument; give yours another id")
    digest = hashlib.sha256(source_yaml.encode()).hexdigest()
    existing = session.scalar(select(CustomInstrument).where(
        CustomInstrument.instrument_id == instrument.id, CustomInstrument.version == instrument.version))
    if existing is not None:
        if existing.definition != instrument.model_dump(mode="json"):
            raise Conflict(f"{instrument.key} is already loaded with different items; raise its version")
        return instrument
    session.add(CustomInstrument(instrument_id=instrument.id, version=instrument.version,
                                 definition=instrument.model_dump(mode="json"), source_yaml=source_yaml,
                                 source_sha256=digest))
    session.flush()
    audit.record(session, actor, "instrument.loaded", instrument=instrument.key, sha256=digest)
    return instrument
