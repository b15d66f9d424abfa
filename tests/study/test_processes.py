"""An owner is known to be gone only when that is certain: same machine and PID namespace, and
no process with its pid and start time."""

from __future__ import annotations

import os
import subprocess

from study import processes


def test_this_process_and_a_running_one_are_not_gone() -> None:
    assert not processes.is_gone(processes.this_process())
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            assert not processes.is_gone(processes.owner_of(child.pid))
        finally:
            child.kill()


def test_a_process_that_exited_is_gone_even_before_it_is_reaped() -> None:
    with subprocess.Popen(["sleep", "30"]) as child:
        owner = processes.owner_of(child.pid)
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie now: exited, not reaped
        assert processes.is_gone(owner)
    assert processes.is_gone(owner)


def test_a_reused_pid_does_not_keep_an_owner_alive() -> None:
    pid, _, where = processes.this_process().partition(".")
    start, _, place = where.partition("@")
    assert processes.is_gone(f"{pid}.{int(start) + 1}@{place}")  # this pid, started at another time


def test_an_owner_elsewhere_or_unreadable_is_never_known_to_be_gone() -> None:
    pid, _, rest = processes.this_process().partition(".")
    host_and_scope = rest.partition("@")[2]
    host = host_and_scope.rpartition(".")[0]
    assert not processes.is_gone(f"999999.1@{host}.0123456789ab")  # another machine or container
    assert not processes.is_gone(f"999999.1@{host}.")
    for unreadable in (None, "", "no owner", "x.1@host.scope"):
        assert not processes.is_gone(unreadable)
