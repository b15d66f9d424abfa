"""The development mailbox: an SMTP server on 127.0.0.1 that keeps every message it receives as a
``.eml`` file, so what the email channel sends (follow-up invitations, sign-in links) can be read
without a mail server. ``afterward mailbox`` runs it (``make run`` starts it on AFTERWARD_SMTP_PORT).
Development only: it needs aiosmtpd, a development dependency.

    >>> controller = start(2525, Path("var/mail"), print)
    >>> serve(controller)                 # until Ctrl-C
"""

from __future__ import annotations

import datetime as dt
import errno
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiosmtpd.controller import Controller

from study.settings import SETTINGS_FILE

HOST = "127.0.0.1"


class MailboxUnavailable(Exception):
    """The mailbox cannot listen on its port; the message says why and what to do."""


@dataclass(frozen=True)
class _Keep:
    """aiosmtpd handler: writes each message to ``folder`` and says where."""

    folder: Path
    say: Callable[[str], object]

    async def handle_DATA(self, server: object, session: object, envelope: Any) -> str:  # noqa: N802
        path = self.folder / f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S.%f}.eml"
        path.write_bytes(envelope.content)
        self.say(f"mail to {', '.join(envelope.rcpt_tos)} kept in {path}")
        return "250 kept"


def start(port: int, folder: Path, say: Callable[[str], object]) -> Controller:
    """Listen on 127.0.0.1:``port``, keeping each message in ``folder`` (created by :func:`serve`'s
    caller before mail arrives) and announcing it with ``say``. Raises MailboxUnavailable."""
    from aiosmtpd.controller import Controller

    controller = Controller(_Keep(folder, say), hostname=HOST, port=port)
    try:
        controller.start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise MailboxUnavailable(
                f"the development mailbox cannot listen on {HOST}:{port}: the port is taken (another mailbox "
                "or mail server?); stop it, or put AFTERWARD_SMTP_PORT=<a free port> in the settings file "
                f"({SETTINGS_FILE}), which `make run` and every later command read") from exc
        raise MailboxUnavailable(f"the development mailbox cannot listen on {HOST}:{port}: {exc.strerror or exc}") \
            from exc
    return controller


def serve(controller: Controller) -> None:
    """Keep the started mailbox running until interrupted (Ctrl-C), then stop it."""
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        controller.stop()
