"""Loading protocols: a study is created on first load and versioned on every change.

A study is live (the default) or simulated: made for ``afterward simulate`` by ``load_simulated``
under a slug of its own, and simulated for good. Simulations write only to a simulated study
(``simulated_study``), a simulated study takes no real participants
(``study.participants.create_invites``), and no live dispatcher touches its rows
(``scheduler.scope``). A protocol is never loaded into a study of the other kind.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ScalarSelect, event, func, or_, select
from sqlalchemy.orm import Session, SessionTransaction

from study import audit, recruitment
from study.errors import Conflict, Invalid, NotFound
from study.models import ConsentVersion, InviteCode, Participant, ProtocolVersion, Study
from study.protocol import SLUG_PATTERN, Protocol, parse_protocol

# The label of a simulation's invites is "simulation <run id>" (``analysis.simulation.simulate``):
# in a simulated study, a participant who came through any other way is a real one.
SIMULATION_INVITE_LABEL = "simulation "


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class LoadResult:
    study: Study
    version: int
    created_study: bool
    changed: bool


def load_protocol(
    session: Session, source_yaml: str, actor: audit.Actor,
    instruments: Mapping[str, Collection[str]] | None = None,
) -> LoadResult:
    """Create the study or add a protocol version; an unchanged file is a no-op.

    Raises ProtocolError for an invalid file or an instrument not among ``instruments`` (the
    instruments the study may use, ``surveys.registry.catalog``; None: not checked), and Conflict when the consent text
    changed but its version did not (participants must know which text they signed), or when the
    protocol's id is a simulated study's.
    """
    protocol = parse_protocol(source_yaml, instruments)
    return _load(session, protocol, source_yaml, actor, protocol.study.id, simulated=False)


def load_simulated(
    session: Session, source_yaml: str, actor: audit.Actor, slug: str,
    instruments: Mapping[str, Collection[str]] | None = None,
) -> LoadResult:
    """Load the protocol as the simulated study ``slug`` (created, marked simulated, on first load;
    a new version on every change), whatever the protocol's own id: a simulation of a live study
    runs beside it, in a study of its own. Refused (Conflict) when ``slug`` is a live study."""
    if not re.fullmatch(SLUG_PATTERN, slug):
        raise Invalid(f"'{slug}' cannot be a study's slug: lower-case letters, digits and '-', at most 63, "
                      "starting with a letter or a digit", code="invalid_slug")
    return _load(session, parse_protocol(source_yaml, instruments), source_yaml, actor, slug, simulated=True)


def _load(session: Session, protocol: Protocol, source_yaml: str, actor: audit.Actor, slug: str, *,
          simulated: bool) -> LoadResult:
    study = session.scalar(select(Study).where(Study.slug == slug))
    created = study is None
    if study is not None:
        if study.simulated and not simulated:
            raise Conflict(f"'{slug}' is a simulated study: a live study's protocol needs an id of its own",
                           code="simulated_study")
        if simulated and not study.simulated:
            raise Conflict(f"'{slug}' is a live study: a simulation runs in a simulated study of its own; "
                           "choose another slug for it", code="not_simulated")
        recruitment.require_writable(study, "loading a protocol")
    if study is None:
        study = Study(slug=slug, title=protocol.study.title, allocation_seed=secrets.token_hex(16),
                      allocation_count=0, simulated=simulated)
        session.add(study)
        session.flush()
        if simulated:
            audit.record(session, actor, "study.created", study_id=study.id, slug=study.slug, simulated=True)
        else:
            audit.record(session, actor, "study.created", study_id=study.id, slug=study.slug)

    latest = current_version(session, study.id) if not created else None
    digest = sha256(source_yaml)
    if latest is not None and latest.source_sha256 == digest:
        return LoadResult(study, latest.version, created_study=False, changed=False)

    consent = _consent_version(session, study, protocol, actor)
    version = (latest.version + 1) if latest else 1
    study.title = protocol.study.title
    loaded = ProtocolVersion(
        study_id=study.id, version=version, protocol=protocol.model_dump(mode="json"),
        source_yaml=source_yaml, source_sha256=digest, consent_version_id=consent.id,
    )
    session.add(loaded)
    session.flush()
    note_in_force(session, loaded)
    audit.record(session, actor, "protocol.loaded", study_id=study.id, version=version,
                 sha256=digest, consent_version=consent.version)
    return LoadResult(study, version, created_study=created, changed=True)


def simulated_study(session: Session, slug: str) -> Study:
    """The study ``slug`` for a simulation to write to. Refused (Conflict) unless it is marked
    simulated and every participant in it came from a simulation's invites: a simulation never
    writes to a study that has, or may get, real participants."""
    study = get_study(session, slug)
    if not study.simulated:
        raise Conflict(f"'{slug}' is not a simulated study: a simulation writes only to a study made for it, never "
                       f"to one that has or may get real participants; make one with `afterward simulate "
                       f"{slug}-simulated --protocol FILE` (the protocol file this study was loaded from)",
                       code="not_simulated")
    real = real_participants(session, study.id)
    if real:
        raise Conflict(f"'{slug}' has {real} participant(s) who did not come from a simulation: a simulation never "
                       "writes to a study with real participants", code="real_participants")
    return study


def real_participants(session: Session, study_id: int) -> int:
    """How many of the study's participants came through an invite that is not a simulation's."""
    return session.scalar(
        select(func.count()).select_from(Participant)
        .outerjoin(InviteCode, InviteCode.id == Participant.invite_id)
        .where(Participant.study_id == study_id,
               or_(InviteCode.label.is_(None), InviteCode.label.not_like(f"{SIMULATION_INVITE_LABEL}%")))) or 0


def _consent_version(
    session: Session, study: Study, protocol: Protocol, actor: audit.Actor
) -> ConsentVersion:
    wanted = protocol.consent
    existing = session.scalar(select(ConsentVersion).where(
        ConsentVersion.study_id == study.id, ConsentVersion.version == wanted.version))
    # Defaults left out (a required confirmation is stored as {id, text}, as before optional ones
    # existed), so an unchanged protocol still matches the consent rows already stored.
    confirmations = [c.model_dump(exclude_defaults=True) for c in wanted.confirmations]
    translations = {language: t.model_dump(mode="json") for language, t in wanted.translations.items()}
    if existing is not None:
        if (existing.text_sha256 != sha256(wanted.text) or existing.confirmations != confirmations
                or existing.language != protocol.languages[0] or (existing.translations or {}) != translations):
            raise Conflict(
                f"consent.version is still '{wanted.version}' but its text, confirmations or translations "
                "changed; give the revised consent a new version so participants re-consent"
            )
        return existing
    consent = ConsentVersion(study_id=study.id, version=wanted.version, text_markdown=wanted.text,
                             text_sha256=sha256(wanted.text), confirmations=confirmations,
                             language=protocol.languages[0], translations=translations)
    session.add(consent)
    session.flush()
    audit.record(session, actor, "consent.version_added", study_id=study.id, version=wanted.version)
    return consent


def get_study(session: Session, slug: str) -> Study:
    study = session.scalar(select(Study).where(Study.slug == slug))
    if study is None:
        raise NotFound(f"no study '{slug}'")
    return study


def in_force_id(study_id: Any) -> ScalarSelect[int]:
    """SQL: the id of the study's protocol version in force, its newest (``study_id``: a value, or a
    column to correlate with an outer query, which may read protocol versions itself)."""
    return (select(ProtocolVersion.id).where(ProtocolVersion.study_id == study_id)
            .order_by(ProtocolVersion.version.desc()).limit(1).correlate_except(ProtocolVersion).scalar_subquery())


_IN_FORCE = "afterward.protocol_in_force"  # Session.info: study id -> the version in force, for this transaction


def current_version(session: Session, study_id: int) -> ProtocolVersion:
    """The study's protocol version in force, read once per transaction (``note_in_force``)."""
    version = session.info.get(_IN_FORCE, {}).get(study_id)
    if version is None:
        version = session.scalar(select(ProtocolVersion).where(ProtocolVersion.id == in_force_id(study_id)))
        if version is None:
            raise NotFound("the study has no protocol loaded")
        note_in_force(session, version)
    return version


def note_in_force(session: Session, version: ProtocolVersion) -> None:
    """Keep ``version`` as its study's version in force until the transaction ends: read by
    ``current_version``, with another read (the participant's consent check), or loaded now."""
    session.info.setdefault(_IN_FORCE, {})[version.study_id] = version


@event.listens_for(Session, "after_transaction_end")
def _forget_in_force(session: Session, transaction: SessionTransaction) -> None:
    """The next transaction reads the version in force again, and so does what follows a savepoint
    (one that loaded a version may have been rolled back); a flush's inner transaction keeps it."""
    if transaction.parent is None or transaction.nested:
        session.info.pop(_IN_FORCE, None)


_parsed: dict[tuple[int, str], Protocol] = {}


def current_protocol(session: Session, study_id: int) -> Protocol:
    """The protocol in force. Stored versions never change, so the parsed form is kept per
    (version row, source hash) and a transaction pays at most one small query for it (none after the
    participant's consent check, which reads the version with the participant)."""
    return _protocol_of(current_version(session, study_id))


def protocol_for_consent(session: Session, consent_version_id: int) -> Protocol:
    """The newest protocol that carried this consent version: what was shown with it (the public
    title, the investigator, the ethics contact, the protocol number)."""
    version = session.scalar(select(ProtocolVersion).where(ProtocolVersion.consent_version_id == consent_version_id)
                             .order_by(ProtocolVersion.version.desc()).limit(1))
    if version is None:
        raise NotFound("no protocol carries this consent version")
    return _protocol_of(version)


def _protocol_of(version: ProtocolVersion) -> Protocol:
    key = (version.id, version.source_sha256)
    protocol = _parsed.get(key)
    if protocol is None:
        if len(_parsed) > 256:
            _parsed.clear()
        protocol = _parsed[key] = Protocol.model_validate(version.protocol)
    return protocol


def current_consent(session: Session, study_id: int) -> ConsentVersion:
    consent = session.get(ConsentVersion, current_version(session, study_id).consent_version_id)
    assert consent is not None  # a foreign key guarantees it
    return consent
