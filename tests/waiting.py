"""Waiting for what a test can observe (a row, a message, a log line, a process exiting).

The limit is a bound on the wait, never the thing a test asserts: a loaded machine only takes
longer to reach the state waited for. A negative check ("X did not happen") waits for an event
that proves X would have happened by then (a cycle completed, a process exited), not for a time.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import httpx

T = TypeVar("T")

# Long enough that only a hang reaches it, however busy the machine.
WAIT_SECONDS = 120.0
_POLL_SECONDS = 0.05


def _check(what: str, deadline: float, processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        assert process.poll() is None, f"{process.args!r} exited ({process.returncode}) while waiting for {what}"
    assert time.monotonic() < deadline, f"timed out waiting for {what}"


def until(condition: Callable[[], T], what: str, *, timeout: float = WAIT_SECONDS,
          processes: Sequence[subprocess.Popen[bytes]] = ()) -> T:
    """Poll ``condition`` until it is truthy and return its value; fail naming ``what`` if
    ``timeout`` passes first or one of ``processes`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        _check(what, deadline, processes)
        time.sleep(_POLL_SECONDS)
    return value


async def until_async(condition: Callable[[], T], what: str, *, timeout: float = WAIT_SECONDS) -> T:
    """``until`` for a coroutine: ``condition`` (a database read, say) runs on a thread, never on the loop."""
    deadline = time.monotonic() + timeout
    while not (value := await asyncio.to_thread(condition)):
        _check(what, deadline, ())
        await asyncio.sleep(_POLL_SECONDS)
    return value


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now (a server that is not up yet does not)."""
    try:
        return httpx.get(url, timeout=5, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False
