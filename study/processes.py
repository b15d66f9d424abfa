"""Which process this is, written so that another process can tell for sure whether it still runs.

An owner is ``"<pid>.<start>@<host>.<scope>"``: the start is the process's start time (clock ticks
since boot, so a reused pid is told apart), the scope a hash of the machine's boot id and the PID
namespace (two processes share it exactly when each sees the other's pid). A claim that records
its owner this way (a chat reply being written) is released the moment the owner is known to be
gone, instead of when its lease runs out. Linux only; elsewhere no owner is ever known to be gone,
and leases alone decide.
"""

from __future__ import annotations

import hashlib
import os
import socket
from functools import lru_cache
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, str] | None:
    """The process's state letter and start time, or None when there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    return fields[0], fields[19]  # state (field 3), starttime (field 22)


@lru_cache
def _scope() -> str:
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(PROC / "self/ns/pid")
    except OSError:
        return ""
    return hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()[:12]


@lru_cache
def owner_of(pid: int) -> str:
    """A process of this machine (and PID namespace), as an owner."""
    stat = _stat(pid)
    return f"{pid}.{stat[1] if stat else 0}@{socket.gethostname()[:64]}.{_scope()}"


def this_process() -> str:
    """This process, as an owner to record on a claim."""
    return owner_of(os.getpid())  # not cached itself: a forked child is a process of its own


def is_gone(owner: str | None) -> bool:
    """True only when certain: ``owner`` ran where this process can see its pid, and no process
    with that pid and start time runs now (a zombie counts as gone). An owner on another machine
    or in another container is never known to be gone here."""
    if not owner or "@" not in owner:
        return False
    process, _, where = owner.partition("@")
    scope = where.rpartition(".")[2]
    pid, _, start = process.partition(".")
    if not scope or scope != _scope() or not pid.isdigit():
        return False
    stat = _stat(int(pid))
    return stat is None or stat[0] in ("Z", "X") or stat[1] != start
