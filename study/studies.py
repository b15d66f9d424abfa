"""Loading protocols: a study is created on first load and versioned on every change."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from study import audit, recruitment
from study.errors import Conflict, NotFound
from study.models import ConsentVersion, ProtocolVersion, Study
from study.protocol import Protocol, ProtocolError, parse_protocol


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
    instrument_exists: Callable[[str], bool] | None = None,
) -> LoadResult:
    """Create the study or add a protocol version; an unchanged file is a no-op.

    Raises ProtocolError for an invalid file or an instrument ``instrument_exists`` does not
    know, and Conflict when the consent text changed but its version did not (participants must
    know which text they signed).
    """
    protocol = parse_protocol(source_yaml)
    if instrument_exists is not None:
        unknown = sorted(i for i in protocol.instruments() if not instrument_exists(i))
        if unknown:
            raise ProtocolError([f"unknown instrument '{name}' (built in: perma-profiler, decision-regret, "
                                 "immediate-rating, decision-clarity, goal-progress; or load a custom one "
                                 "first with `afterward instruments load FILE`)" for name in unknown])
    study = session.scalar(select(Study).where(Study.slug == protocol.study.id))
    created = study is None
    if study is not None:
        recruitment.require_writable(study, "loading a protocol")
    if study is None:
        study = Study(slug=protocol.study.id, title=protocol.study.title,
                      allocation_seed=secrets.token_hex(16), allocation_count=0)
        session.add(study)
        session.flush()
        audit.record(session, actor, "study.created", study_id=study.id, slug=study.slug)

    latest = current_version(session, study.id) if not created else None
    digest = sha256(source_yaml)
    if latest is not None and latest.source_sha256 == digest:
        return LoadResult(study, latest.version, created_study=False, changed=False)

    consent = _consent_version(session, study, protocol, actor)
    version = (latest.version + 1) if latest else 1
    study.title = protocol.study.title
    session.add(ProtocolVersion(
        study_id=study.id, version=version, protocol=protocol.model_dump(mode="json"),
        source_yaml=source_yaml, source_sha256=digest, consent_version_id=consent.id,
    ))
    session.flush()
    audit.record(session, actor, "protocol.loaded", study_id=study.id, version=version,
                 sha256=digest, consent_version=consent.version)
    return LoadResult(study, version, created_study=created, changed=True)


def _consent_version(
    session: Session, study: Study, protocol: Protocol, actor: audit.Actor
) -> ConsentVersion:
    wanted = protocol.consent
    existing = session.scalar(select(ConsentVersion).where(
        ConsentVersion.study_id == study.id, ConsentVersion.version == wanted.version))
    # Defaults left out (a required confirmation is stored as {id, text}, as before optional ones
    # existed), so an unchanged protocol still matches the consent rows already stored.
    confirmations = [c.model_dump(exclude_defaults=True) for c in wanted.confirmations]
    if existing is not None:
        if existing.text_sha256 != sha256(wanted.text) or existing.confirmations != confirmations:
            raise Conflict(
                f"consent.version is still '{wanted.version}' but its text or confirmations "
                "changed; give the revised consent a new version so participants re-consent"
            )
        return existing
    consent = ConsentVersion(study_id=study.id, version=wanted.version, text_markdown=wanted.text,
                             text_sha256=sha256(wanted.text), confirmations=confirmations)
    session.add(consent)
    session.flush()
    audit.record(session, actor, "consent.version_added", study_id=study.id, version=wanted.version)
    return consent


def get_study(session: Session, slug: str) -> Study:
    study = session.scalar(select(Study).where(Study.slug == slug))
    if study is None:
        raise NotFound(f"no study '{slug}'")
    return study


def current_version(session: Session, study_id: int) -> ProtocolVersion:
    version = session.scalar(select(ProtocolVersion).where(ProtocolVersion.study_id == study_id)
                             .order_by(ProtocolVersion.version.desc()).limit(1))
    if version is None:
        raise NotFound("the study has no protocol loaded")
    return version


_parsed: dict[tuple[int, str], Protocol] = {}


def current_protocol(session: Session, study_id: int) -> Protocol:
    """The protocol in force. Stored versions never change, so the parsed form is kept per
    (version row, source hash) and a request pays one small query for it."""
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
