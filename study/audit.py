"""The append-only, keyed, hash-chained audit log, and the anchors that pin its head.

Each entry's hash is an HMAC (key kept outside the database, ``Settings.audit_hmac_key``) over its
content and the previous entry's hash, so editing, deleting or inserting an entry breaks the chain,
and someone with only database access cannot recompute it. Appends are serialized (an advisory lock
on PostgreSQL, the write lock that every SQLite transaction takes) so the chain never forks.

A keyed chain cannot show that its newest entries were deleted, nor stop the key holder from
rewriting it, so ``anchor()`` copies the head (seq and hash) outside the database: one HMAC-signed
JSON line appended to ``Settings.audit_anchor_path`` and, when configured, POSTed to a webhook.
``verify()`` checks the chain with the key and against every anchor.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from study.clock import now
from study.db import is_postgres, session_scope
from study.errors import DomainError
from study.models import AuditEntry
from study.settings import Settings, get_settings

GENESIS = "0" * 64
_PG_LOCK_KEY = 0x41465457  # "AFTW": one advisory lock for the chain head
WEBHOOK_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Actor:
    type: str  # participant | staff | system
    name: str  # participant code, staff email, or a process name

    @classmethod
    def system(cls, name: str = "afterward") -> Actor:
        return cls("system", name)


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()


def _mac(key: bytes, fields: dict[str, Any]) -> str:
    return hmac.new(key, _canonical(fields), hashlib.sha256).hexdigest()


def _entry_hash(entry: AuditEntry, key: bytes) -> str:
    return _mac(key, {
        "seq": entry.seq,
        "at": entry.at.isoformat(),
        "actor_type": entry.actor_type,
        "actor": entry.actor,
        "action": entry.action,
        "study_id": entry.study_id,
        "participant_code": entry.participant_code,
        "detail": entry.detail,
        "prev": entry.prev_hash,
    })


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
    entry.entry_hash = _entry_hash(entry, get_settings().audit_hmac_key())
    session.add(entry)
    session.flush()
    return entry


# --- anchors ------------------------------------------------------------------------------------


class AnchorError(DomainError):
    code = "audit_anchor_failed"


@dataclass(frozen=True)
class Anchor:
    """The chain head at one moment, signed with the audit key: ``seq`` 0 is the empty chain."""

    seq: int
    entry_hash: str
    anchored_at: str  # ISO 8601, UTC; kept as written because the HMAC covers the exact text
    mac: str

    @classmethod
    def sign(cls, seq: int, entry_hash: str, anchored_at: dt.datetime, key: bytes) -> Anchor:
        at = anchored_at.astimezone(dt.UTC).isoformat()
        return cls(seq, entry_hash, at, _mac(key, {"seq": seq, "entry_hash": entry_hash, "anchored_at": at}))

    def signed_by(self, key: bytes) -> bool:
        expected = _mac(key, {"seq": self.seq, "entry_hash": self.entry_hash, "anchored_at": self.anchored_at})
        return hmac.compare_digest(expected, self.mac)

    def as_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "entry_hash": self.entry_hash, "anchored_at": self.anchored_at, "hmac": self.mac}

    def describe(self) -> str:
        try:
            when = dt.datetime.fromisoformat(self.anchored_at).strftime("%Y-%m-%d %H:%M:%S UTC")
        except ValueError:
            when = self.anchored_at
        return f"seq {self.seq} ({when})"

    @classmethod
    def parse(cls, line: str) -> Anchor | None:
        """The anchor on one line of the anchor file, or None when the line is not one."""
        try:
            fields = json.loads(line)
        except ValueError:
            return None
        if not isinstance(fields, dict):
            return None
        seq, entry_hash, at, mac = (fields.get(k) for k in ("seq", "entry_hash", "anchored_at", "hmac"))
        if type(seq) is int and isinstance(entry_hash, str) and isinstance(at, str) and isinstance(mac, str):
            return cls(seq, entry_hash, at, mac)
        return None


@dataclass(frozen=True)
class Anchored:
    anchor: Anchor
    new: bool  # False when the head had not moved since the last anchor, so nothing was written


def _read_head(session: Session, key: bytes) -> tuple[int, str]:
    head = session.scalars(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1)).first()
    if head is None:
        return 0, GENESIS
    # Anchoring a head written without the key would vouch for a forgery: refuse, loudly.
    if not hmac.compare_digest(_entry_hash(head, key), head.entry_hash):
        raise AnchorError(f"the newest audit entry (seq {head.seq}) does not match its HMAC; "
                          "not anchoring it. Run: afterward audit verify")
    return head.seq, head.entry_hash


def _last_line(path: Path) -> str | None:
    """The file's last line, read from its end (the file grows by one line per anchor)."""
    try:
        with path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - 4096))
            lines = file.read().splitlines()
    except FileNotFoundError:
        return None
    return lines[-1].decode(errors="replace") if lines else None


def _append_line(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_APPEND and a single write keep concurrent anchorers (CLI, dispatcher replicas) from
    # interleaving lines; fsync so an anchor reported as written survives a crash.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _post(url: str, anchor: Anchor) -> None:
    import httpx  # only the anchoring job needs it, not every process that records entries

    try:
        response = httpx.post(url, json=anchor.as_json(), timeout=WEBHOOK_TIMEOUT_SECONDS)
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise AnchorError(f"answered HTTP {exc.response.status_code}") from exc
    except httpx.HTTPError as exc:
        raise AnchorError(f"{type(exc).__name__}: {exc or 'no answer'}") from exc


def anchor(engine: Engine | None = None, settings: Settings | None = None) -> Anchored:
    """Record the chain head outside the database; the dispatcher runs this on a schedule.

    It opens its own short read transaction, so no transaction stays open across the file write or
    the webhook. When the head equals the last anchor in the file nothing is written or posted: a
    repeated anchor proves nothing new, and the file and the webhook's mailbox then grow only with
    the log. Raises ``AnchorError`` when the head fails its HMAC or the webhook fails (the file line
    is written first, and the next anchor supersedes a post that failed).
    """
    settings = settings or get_settings()
    key = settings.audit_hmac_key()
    with session_scope(engine, read_only=True) as session:
        seq, entry_hash = _read_head(session, key)
    path = settings.audit_anchor_path
    last_line = _last_line(path)
    last = Anchor.parse(last_line) if last_line else None
    if last and last.signed_by(key) and (last.seq, last.entry_hash) == (seq, entry_hash):
        return Anchored(last, new=False)
    new = Anchor.sign(seq, entry_hash, now(), key)
    _append_line(path, json.dumps(new.as_json(), separators=(",", ":")) + "\n")
    if settings.audit_anchor_webhook_url:
        try:
            _post(settings.audit_anchor_webhook_url, new)
        except AnchorError as exc:
            raise AnchorError(f"anchored {new.describe()} in {path}, but the POST to "
                              f"{settings.audit_anchor_webhook_url} failed: {exc.message}") from exc
    return Anchored(new, new=True)


# --- verification -------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    entries: int
    problems: list[str]
    head_seq: int = 0
    last_anchor: Anchor | None = None  # the newest valid anchor in the file

    @property
    def ok(self) -> bool:
        return not self.problems


def _anchors(path: Path, key: bytes, problems: list[str]) -> Iterator[Anchor]:
    """The file's anchors whose HMAC holds; every other line becomes a problem."""
    try:
        file = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    except OSError as exc:
        problems.append(f"cannot read the anchor file {path}: {exc}")
        return
    with file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            parsed = Anchor.parse(line)
            if parsed is None:
                problems.append(f"anchor file {path} line {number}: not an anchor (edited or corrupted)")
            elif not parsed.signed_by(key):
                problems.append(f"anchor file {path} line {number}: its HMAC is wrong (forged anchor, "
                                f"claims {parsed.describe()})")
            else:
                yield parsed


def verify(session: Session, settings: Settings | None = None, batch: int = 5000) -> VerifyResult:
    """Walk the chain in batches and report every entry whose content, link or sequence is wrong,
    then every anchor the chain no longer matches (rewritten) or no longer reaches (truncated)."""
    settings = settings or get_settings()
    key = settings.audit_hmac_key()
    problems: list[str] = []
    anchors = list(_anchors(settings.audit_anchor_path, key, problems))
    by_seq: dict[int, list[Anchor]] = {}
    for each in anchors:
        by_seq.setdefault(each.seq, []).append(each)

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
            if not hmac.compare_digest(_entry_hash(entry, key), entry.entry_hash):
                problems.append(f"entry {entry.seq}: content does not match its HMAC (edited or forged?)")
            for pinned in by_seq.get(entry.seq, ()):
                if pinned.entry_hash != entry.entry_hash:
                    problems.append(f"entry {entry.seq} is not the entry anchored at {pinned.describe()}: "
                                    "the chain was rewritten")
            expected_prev, expected_seq = entry.entry_hash, entry.seq + 1
            last_seq = entry.seq
        session.expunge_all()

    beyond = [a for a in anchors if a.seq > last_seq]
    if beyond:
        furthest = max(beyond, key=lambda a: a.seq)
        problems.append(f"entries after {last_seq} were deleted: the chain was anchored at {furthest.describe()} "
                        f"but now ends at seq {last_seq} (truncated)")
    return VerifyResult(count, problems, head_seq=last_seq, last_anchor=anchors[-1] if anchors else None)
