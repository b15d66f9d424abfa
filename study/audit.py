"""The append-only, hash-chained audit log.

Each entry's hash covers its content and the previous entry's hash, so editing or deleting any
entry breaks the chain from that point on. Appends are serialized (an advisory lock on
PostgreSQL, the write lock that every SQLite transaction takes) so the chain never forks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from study.clock import now
from study.db import is_postgres
from study.models import AuditEntry

GENESIS = "0" * 64
_PG_LOCK_KEY = 0x41465457  # "AFTW": one advisory lock for the chain head


@dataclass(frozen=True)
class Actor:
    type: str  # participant | staff | system
    name: str  # participant code, staff email, or a process name

    @classmethod
    def system(cls, name: str = "afterward") -> Actor:
        return cls("system", name)


def _entry_hash(entry: AuditEntry) -> str:
    body = json.dumps(
        {
            "seq": entry.seq,
            "at": entry.at.isoformat(),
            "actor_type": entry.actor_type,
            "actor": entry.actor,
            "action": entry.action,
            "study_id": entry.study_id,
            "participant_code": entry.participant_code,
            "detail": entry.detail,
            "prev": entry.prev_hash,
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(body.encode()).hexdigest()


def record(
    session: Session,
    actor: Actor,
    action: str,
    *,
    study_id: int | None = None,
    participant_code: str | None = None,
    **detail: Any,
) -> AuditEntry:
    """Append one entry in the caller's transaction."""
    if is_postgres(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
    head = session.execute(
        select(AuditEntry.seq, AuditEntry.entry_hash).order_by(AuditEntry.seq.desc()).limit(1)
    ).first()
    seq, prev = (head[0] + 1, head[1]) if head else (1, GENESIS)
    # JSON round trip now, so the hash is computed over exactly what the database returns.
    clean_detail = json.loads(json.dumps(detail, default=str))
    entry = AuditEntry(
        seq=seq,
        at=now(),
        actor_type=actor.type,
        actor=actor.name,
        action=action,
        study_id=study_id,
        participant_code=participant_code,
        detail=clean_detail,
        prev_hash=prev,
    )
    entry.entry_hash = _entry_hash(entry)
    session.add(entry)
    session.flush()
    return entry


@dataclass(frozen=True)
class VerifyResult:
    entries: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(session: Session, batch: int = 5000) -> VerifyResult:
    """Walk the chain and report every entry whose content, link or sequence is wrong."""
    problems: list[str] = []
    expected_prev, expected_seq, count = GENESIS, 1, 0
    last_seq = 0
    while True:
        rows = session.scalars(
            select(AuditEntry).where(AuditEntry.seq > last_seq).order_by(AuditEntry.seq).limit(batch)
        ).all()
        if not rows:
            break
        for entry in rows:
            count += 1
            if entry.seq != expected_seq:
                problems.append(f"entries {expected_seq}..{entry.seq - 1} are missing (deleted?)")
            if entry.prev_hash != expected_prev:
                problems.append(f"entry {entry.seq}: link to the previous entry is broken")
            if _entry_hash(entry) != entry.entry_hash:
                problems.append(f"entry {entry.seq}: content does not match its hash (edited?)")
            expected_prev, expected_seq = entry.entry_hash, entry.seq + 1
            last_seq = entry.seq
        session.expunge_all()
    return VerifyResult(count, problems)
