"""Where instruments come from: the built-in YAML files beside this module, researchers' custom
instruments stored in the database (versioned), and the study team's translations of either
(``surveys.translations``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from study import audit
from study.errors import Conflict, NotFound
from study.i18n import SOURCE
from study.translated import InstrumentCatalog
from surveys.definitions import Instrument, parse_instrument
from surveys.models import CustomInstrument, InstrumentTranslation
from surveys.translations import Translation, is_translation, parse_translation

# Instruments are written in English, the built-in ones and custom ones alike; other languages come
# from translations.
INSTRUMENT_LANGUAGE = SOURCE

BUILTIN_DIR = Path(__file__).resolve().parent / "instruments"


@cache
def builtin() -> dict[str, Instrument]:
    instruments = [parse_instrument(path.read_text(encoding="utf-8")) for path in sorted(BUILTIN_DIR.glob("*.yaml"))]
    return {instrument.id: instrument for instrument in instruments}


def get(session: Session, instrument_id: str, version: str | None = None) -> Instrument:
    """The instrument (newest version unless ``version`` is given). A custom one is read by its row
    and digest (a small query); its definition is read and validated once per digest."""
    known = builtin().get(instrument_id)
    if known is not None and version in (None, known.version):
        return known
    query = select(CustomInstrument.id, CustomInstrument.source_sha256).where(
        CustomInstrument.instrument_id == instrument_id)
    if version is not None:
        query = query.where(CustomInstrument.version == version)
    row = session.execute(query.order_by(CustomInstrument.id.desc()).limit(1)).first()
    if row is None:
        raise NotFound(f"no instrument '{instrument_id}'" + (f" version {version}" if version else ""))
    # A stored definition never changes under its row and digest.
    return _custom.get((row.id, row.source_sha256), lambda: Instrument.model_validate(
        session.scalar(select(CustomInstrument.definition).where(CustomInstrument.id == row.id))))


class _ByDigest:
    """Instruments built from stored text, kept by a key that holds the text's digest (the text never
    changes under it), so a hot path validates a definition once; at most ``limit``, then started afresh."""

    def __init__(self, limit: int = 256) -> None:
        self._kept: dict[tuple[object, str], Instrument] = {}
        self._limit = limit

    def get(self, key: tuple[object, str], build: Callable[[], Instrument]) -> Instrument:
        found = self._kept.get(key)
        if found is None:
            if len(self._kept) >= self._limit:
                self._kept.clear()
            found = self._kept[key] = build()
        return found


_custom = _ByDigest()
_translated = _ByDigest()


def in_language(session: Session, instrument: Instrument, language: str | None) -> tuple[Instrument, str]:
    """``instrument`` as shown in ``language`` and the language it is shown in: the study team's
    translation of that version when one is loaded, else as written (English)."""
    if language is None or language == INSTRUMENT_LANGUAGE:
        return instrument, INSTRUMENT_LANGUAGE
    found = session.execute(select(InstrumentTranslation.source_sha256, InstrumentTranslation.definition).where(
        InstrumentTranslation.instrument_id == instrument.id, InstrumentTranslation.version == instrument.version,
        InstrumentTranslation.language == language)).first()
    if found is None:
        return instrument, INSTRUMENT_LANGUAGE
    # A translation's text never changes under its digest.
    return _translated.get((instrument.key, found.source_sha256),
                           lambda: Translation.model_validate(found.definition).apply(instrument)), language


def catalog(session: Session) -> InstrumentCatalog:
    """Every instrument a protocol may name (the built-in ones and the newest version of each custom
    one loaded) with the names a protocol's answer rule may use (its item ids and score names) and
    the languages it can be shown in (its own, and those translated for that version)."""
    found = {instrument_id: get(session, instrument_id)
             for instrument_id in session.scalars(select(CustomInstrument.instrument_id).distinct())}
    found.update(builtin())
    translated: dict[str, set[str]] = {}
    for instrument_id, version, language in session.execute(select(
            InstrumentTranslation.instrument_id, InstrumentTranslation.version, InstrumentTranslation.language)):
        if instrument_id in found and found[instrument_id].version == version:
            translated.setdefault(instrument_id, set()).add(language)
    return InstrumentCatalog(
        {instrument_id: frozenset([*(item.id for item in instrument.items), *(s.name for s in instrument.scores)])
         for instrument_id, instrument in found.items()},
        {instrument_id: frozenset({INSTRUMENT_LANGUAGE, *translated.get(instrument_id, ())})
         for instrument_id in found})


def exists(session: Session, instrument_id: str) -> bool:
    return instrument_id in builtin() or session.scalar(
        select(CustomInstrument.id).where(CustomInstrument.instrument_id == instrument_id).limit(1)) is not None


def load_custom(session: Session, source_yaml: str, actor: audit.Actor) -> Instrument | Translation:
    """Store a researcher's instrument, or a translation of one (a file with ``translation_of``). A
    changed definition needs a new version string, so responses always point at the exact items they
    answered; a changed translation replaces the one loaded (it changes no item, value or score)."""
    if is_translation(source_yaml):
        return _load_translation(session, source_yaml, actor)
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


def _load_translation(session: Session, source_yaml: str, actor: audit.Actor) -> Translation:
    import yaml

    document = yaml.safe_load(source_yaml)
    instrument = get(session, str(document["translation_of"]), str(document.get("version") or "") or None)
    translation = parse_translation(source_yaml, instrument)
    digest = hashlib.sha256(source_yaml.encode()).hexdigest()
    row = session.scalar(select(InstrumentTranslation).where(
        InstrumentTranslation.instrument_id == instrument.id, InstrumentTranslation.version == instrument.version,
        InstrumentTranslation.language == translation.language))
    if row is not None and row.source_sha256 == digest:
        return translation
    if row is None:
        row = InstrumentTranslation(instrument_id=instrument.id, version=instrument.version,
                                    language=translation.language)
        session.add(row)
    row.definition = translation.model_dump(mode="json")
    row.source_yaml = source_yaml
    row.source_sha256 = digest
    session.flush()
    audit.record(session, actor, "instrument.translation_loaded", instrument=instrument.key,
                 language=translation.language, sha256=digest)
    return translation
