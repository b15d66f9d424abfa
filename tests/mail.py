"""A real SMTP server on loopback (aiosmtpd) that keeps what it receives, for tests."""

from __future__ import annotations

import asyncio
import email
import email.policy
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.waiting import until


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Inbox:
    """aiosmtpd handler: parses and keeps every accepted message."""

    def __init__(self, delay_seconds: float = 0.0) -> None:
        self.messages: list[EmailMessage] = []
        self.delay_seconds = delay_seconds
        self._lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        if self.delay_seconds:
            await asyncio.sleep(self.delay_seconds)
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        with self._lock:
            self.messages.append(message)
        return "250 Message accepted"

    def message_ids(self) -> list[str]:
        with self._lock:
            return [str(m["Message-ID"]) for m in self.messages]

    def to(self, address: str) -> list[EmailMessage]:
        with self._lock:
            return [m for m in self.messages if str(m["To"]) == address]

    def wait_for(self, count: int) -> None:
        until(lambda: self.count() >= count, f"{count} messages")

    def count(self) -> int:
        with self._lock:
            return len(self.messages)


def link_in(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    match = re.search(r"https?://\S+/s/\S+", body.get_content())
    assert match, body.get_content()
    return match.group(0)


@contextmanager
def smtp_server(port: int | None = None, *, password: str | None = None,
                delay_seconds: float = 0.0) -> Iterator[tuple[Inbox, int]]:
    """Serve SMTP on 127.0.0.1; with ``password`` every login must use it (any user name)."""
    inbox = Inbox(delay_seconds)
    port = port or free_port()
    kwargs: dict[str, Any] = {}
    if password is not None:
        def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
            ok = isinstance(data, LoginPassword) and data.password.decode() == password
            return AuthResult(success=ok, handled=False)
        kwargs = {"authenticator": authenticator, "auth_required": True, "auth_require_tls": False}
    controller = Controller(inbox, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()
