from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from study import audit
from study.clock import FrozenClock
from study.db import session_scope, table_of
from study.models import AuditEntry
from study.settings import get_settings
from tests.waiting import WAIT_SECONDS

ACTOR = audit.Actor("staff", "r@example.org")


@pytest.fixture(autouse=True)
def anchor_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "anchors" / "audit-anchors.jsonl"
    monkeypatch.setenv("AFTERWARD_AUDIT_ANCHOR_PATH", str(path))
    monkeypatch.delenv("AFTERWARD_AUDIT_ANCHOR_WEBHOOK_URL", raising=False)
    get_settings.cache_clear()
    return path


def _append(engine: Engine, n: int) -> None:
    with session_scope(engine) as session:
        for i in range(n):
            audit.record(session, ACTOR, "participants.listed", study_id=1, count=i)


def _verify(engine: Engine) -> audit.VerifyResult:
    with session_scope(engine) as session:
        return audit.verify(session)


def _anchor(engine: Engine) -> audit.Anchored:
    return audit.anchor(engine)


@contextmanager
def _tampering(engine: Engine) -> Iterator[Connection]:
    """What someone with direct database access could do: get the trigger out of the way, then tamper."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only"))
            yield connection
            connection.execute(sa.text("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only"))
        else:
            connection.execute(sa.text("DROP TRIGGER audit_log_no_update"))
            connection.execute(sa.text("DROP TRIGGER audit_log_no_delete"))
            yield connection


def _without_guard(engine: Engine, statement: str) -> None:
    with _tampering(engine) as connection:
        connection.execute(sa.text(statement))


def _attacker_body(row: dict[str, object]) -> bytes:
    """An entry's hashed content, as an attacker reading this project's source would rebuild it."""
    at = row["at"]
    assert hasattr(at, "isoformat")
    fields = {"seq": row["seq"], "at": at.isoformat(), "actor_type": row["actor_type"], "actor": row["actor"],
              "action": row["action"], "study_id": row["study_id"], "participant_code": row["participant_code"],
              "detail": row["detail"], "prev": row["prev_hash"]}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()


def _delete_and_recompute(engine: Engine, deleted_seq: int, digest: Callable[[bytes], str]) -> None:
    """Delete one entry, renumber the later ones and recompute every later link and hash with ``digest``."""
    table = table_of(AuditEntry)
    with session_scope(engine) as session:
        rows = [dict(r._mapping) for r in session.execute(sa.select(table).order_by(table.c.seq))]
    later = rows[deleted_seq:]
    prev = rows[deleted_seq - 2]["entry_hash"] if deleted_seq > 1 else audit.GENESIS
    for row in later:
        row["seq"], row["prev_hash"] = row["seq"] - 1, prev
        row["entry_hash"] = prev = digest(_attacker_body(row))
    with _tampering(engine) as connection:
        connection.execute(sa.text("DELETE FROM audit_log WHERE seq >= :seq"), {"seq": deleted_seq})
        if later:
            connection.execute(table.insert(), later)


def _plain_sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _hmac_with(key: bytes) -> Callable[[bytes], str]:
    return lambda body: hmac.new(key, body, hashlib.sha256).hexdigest()


# --- the keyed chain ----------------------------------------------------------------------------


def test_intact_chain_verifies(engine: Engine) -> None:
    _append(engine, 5)
    result = _verify(engine)
    assert (result.ok, result.entries, result.head_seq, result.last_anchor) == (True, 5, 5, None)


def test_database_refuses_update_and_delete(engine: Engine) -> None:
    _append(engine, 2)
    for statement in ("UPDATE audit_log SET actor = 'x' WHERE seq = 1", "DELETE FROM audit_log WHERE seq = 1"):
        with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as connection:
            connection.execute(sa.text(statement))


def test_edited_entry_is_detected(engine: Engine) -> None:
    _append(engine, 4)
    _without_guard(engine, "UPDATE audit_log SET actor = 'someone-else@example.org' WHERE seq = 2")
    assert _verify(engine).problems == ["entry 2: content does not match its HMAC (edited or forged?)"]


def test_edited_entry_with_recomputed_hash_breaks_the_next_link(engine: Engine) -> None:
    _append(engine, 4)
    with session_scope(engine) as session:
        entry = session.get(AuditEntry, 2)
        assert entry is not None
        entry.detail = {"count": 99}
        forged = audit._entry_hash(entry, get_settings().audit_hmac_key())
        session.expunge(entry)
    _without_guard(engine, f"UPDATE audit_log SET detail = '{{\"count\": 99}}', entry_hash = '{forged}' WHERE seq = 2")
    assert _verify(engine).problems == ["entry 3: link to the previous entry is broken"]


def test_deleted_entry_is_detected(engine: Engine) -> None:
    _append(engine, 4)
    _without_guard(engine, "DELETE FROM audit_log WHERE seq = 3")
    problems = _verify(engine).problems
    assert "entries 3..3 are missing (deleted?)" in problems
    assert "entry 4: link to the previous entry is broken" in problems


@pytest.mark.parametrize("digest", [_plain_sha256, _hmac_with(b"a key the attacker guessed")],
                         ids=["plain-sha256", "hmac-wrong-key"])
def test_chain_recomputed_without_the_key_is_detected(engine: Engine, digest: Callable[[bytes], str]) -> None:
    _append(engine, 6)
    _delete_and_recompute(engine, 3, digest)
    result = _verify(engine)
    assert result.entries == 5
    assert result.problems == [f"entry {seq}: content does not match its HMAC (edited or forged?)"
                               for seq in (3, 4, 5)]


def test_only_the_key_holder_can_recompute_the_chain(engine: Engine) -> None:
    # The control for the test above: the attacker's recomputation is faithful, so what catches it
    # there is the key alone. And a key holder's rewrite is exactly what anchors are for (below).
    _append(engine, 6)
    _delete_and_recompute(engine, 3, _hmac_with(get_settings().audit_hmac_key()))
    assert _verify(engine).problems == []


# --- anchors ------------------------------------------------------------------------------------


def test_intact_chain_with_anchors_verifies(engine: Engine, anchor_file: Path, frozen_clock: FrozenClock) -> None:
    _append(engine, 3)
    first = _anchor(engine)
    frozen_clock.advance(dt.timedelta(hours=1))
    _append(engine, 2)
    second = _anchor(engine)
    assert (first.new, first.anchor.seq, second.new, second.anchor.seq) == (True, 3, True, 5)
    assert len(anchor_file.read_text().splitlines()) == 2
    result = _verify(engine)
    assert result.problems == []
    assert result.last_anchor == second.anchor
    assert result.last_anchor.describe() == "seq 5 (2026-03-02 10:00:00 UTC)"


def test_anchor_line_is_signed_json(engine: Engine, anchor_file: Path, frozen_clock: FrozenClock) -> None:
    _append(engine, 2)
    _anchor(engine)
    line = json.loads(anchor_file.read_text())
    with session_scope(engine) as session:
        head = session.get(AuditEntry, 2)
        assert head is not None
        head_hash = head.entry_hash
    assert line["seq"] == 2
    assert line["entry_hash"] == head_hash
    assert line["anchored_at"] == "2026-03-02T09:00:00+00:00"
    signed = json.dumps({k: line[k] for k in ("seq", "entry_hash", "anchored_at")}, sort_keys=True,
                        separators=(",", ":")).encode()
    assert line["hmac"] == hmac.new(get_settings().audit_hmac_key(), signed, hashlib.sha256).hexdigest()


def test_anchor_writes_nothing_while_the_head_is_unchanged(engine: Engine, anchor_file: Path) -> None:
    _append(engine, 2)
    assert _anchor(engine).new
    again = _anchor(engine)
    assert (again.new, again.anchor.seq) == (False, 2)
    assert len(anchor_file.read_text().splitlines()) == 1
    _append(engine, 1)
    assert _anchor(engine).anchor.seq == 3
    assert len(anchor_file.read_text().splitlines()) == 2


@pytest.mark.parametrize(("deleted_from", "head"), [(4, 3), (1, 0)], ids=["newest-two", "all"])
def test_deleting_the_newest_entries_after_an_anchor_is_detected(engine: Engine, deleted_from: int,
                                                                 head: int) -> None:
    _append(engine, 5)
    _anchor(engine)
    _without_guard(engine, f"DELETE FROM audit_log WHERE seq >= {deleted_from}")
    result = _verify(engine)
    assert len(result.problems) == 1
    assert result.problems[0].startswith(f"entries after {head} were deleted: the chain was anchored at seq 5 (")
    assert result.problems[0].endswith(f"but now ends at seq {head} (truncated)")


def test_key_holder_rewrite_is_caught_by_the_anchors(engine: Engine) -> None:
    _append(engine, 4)
    _anchor(engine)
    _append(engine, 2)
    _anchor(engine)
    # Even with the key, deleting entry 3 and recomputing changes entry 4 and shortens the chain.
    _delete_and_recompute(engine, 3, _hmac_with(get_settings().audit_hmac_key()))
    problems = _verify(engine).problems
    assert len(problems) == 2
    assert problems[0].startswith("entry 4 is not the entry anchored at seq 4 (")
    assert problems[0].endswith("the chain was rewritten")
    assert problems[1].startswith("entries after 5 were deleted: the chain was anchored at seq 6 (")


def test_forged_and_edited_anchor_lines_are_detected(engine: Engine, anchor_file: Path) -> None:
    _append(engine, 3)
    _anchor(engine)
    genuine = json.loads(anchor_file.read_text())
    edited = {**genuine, "seq": 2}  # moved back, e.g. to hide later deletions
    forged = dict(genuine, seq=9)
    signed = json.dumps({k: forged[k] for k in ("seq", "entry_hash", "anchored_at")}, sort_keys=True,
                        separators=(",", ":")).encode()
    forged["hmac"] = hmac.new(b"not the audit key", signed, hashlib.sha256).hexdigest()
    with anchor_file.open("a") as file:
        file.write(json.dumps(edited) + "\n" + json.dumps(forged) + "\n" + "{not json\n")
    problems = _verify(engine).problems
    assert len(problems) == 3
    assert problems[0].startswith(f"anchor file {anchor_file} line 2: its HMAC is wrong (forged anchor, claims seq 2 (")
    assert problems[1].startswith(f"anchor file {anchor_file} line 3: its HMAC is wrong (forged anchor, claims seq 9 (")
    assert problems[2] == f"anchor file {anchor_file} line 4: not an anchor (edited or corrupted)"


def test_anchor_refuses_a_head_written_without_the_key(engine: Engine, anchor_file: Path) -> None:
    _append(engine, 2)
    _without_guard(engine, "UPDATE audit_log SET actor = 'someone-else@example.org' WHERE seq = 2")
    with pytest.raises(audit.AnchorError, match=r"newest audit entry \(seq 2\) does not match its HMAC"):
        _anchor(engine)
    assert not anchor_file.exists()


# --- the webhook --------------------------------------------------------------------------------


@contextmanager
def _webhook(status: int = 200, answers: threading.Event | None = None) -> Iterator[tuple[str, list[object]]]:
    """A local HTTP endpoint that records what is POSTed to it; with ``answers``, it answers only once that is set."""
    received: list[object] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            if answers is not None:
                answers.wait(WAIT_SECONDS)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.handle_error = lambda *_args: None  # type: ignore[method-assign]  # a client that gave up
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/anchors", received
    finally:
        server.shutdown()
        server.server_close()


def _use_webhook(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("AFTERWARD_AUDIT_ANCHOR_WEBHOOK_URL", url)
    get_settings.cache_clear()


def test_anchor_is_posted_to_the_webhook(engine: Engine, anchor_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _append(engine, 2)
    with _webhook() as (url, received):
        _use_webhook(monkeypatch, url)
        _anchor(engine)
        _anchor(engine)  # unchanged head: not posted again
    assert received == [json.loads(anchor_file.read_text())]


def test_webhook_failure_is_reported_and_the_file_keeps_the_anchor(engine: Engine, anchor_file: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _append(engine, 2)
    with _webhook(status=500) as (url, _received):
        _use_webhook(monkeypatch, url)
        with pytest.raises(audit.AnchorError, match=r"anchored seq 2 \(.*\) in .*, but the POST to "
                                                    r"http://127\.0\.0\.1:\d+/anchors failed: answered HTTP 500"):
            _anchor(engine)
    assert json.loads(anchor_file.read_text())["seq"] == 2


def test_webhook_that_never_answers_times_out(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    _append(engine, 1)
    monkeypatch.setattr(audit, "WEBHOOK_TIMEOUT_SECONDS", 0.3)
    answers = threading.Event()
    with _webhook(answers=answers) as (url, _received):
        _use_webhook(monkeypatch, url)
        try:  # the endpoint answers only after the anchor gave up on it: it did not wait for the answer
            with pytest.raises(audit.AnchorError, match="failed: ReadTimeout"):
                _anchor(engine)
        finally:
            answers.set()
