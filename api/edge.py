"""The HTTP edge, before any route: request size and NUL checks, and the headers every response
carries (errors and 500s included).

A pure ASGI middleware rather than ``BaseHTTPMiddleware``: it streams bodies through untouched
(chat replies are server-sent events) and counts request bytes as they arrive, so an oversized
body is refused before it is read into memory or parsed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'")
API_EXPLORER = ("/docs", "/redoc")  # FastAPI's API explorer pages carry inline script and style
# The explorer's own policy: its inline script and style, and nothing from another site (ReDoc would otherwise
# fetch its logo from a CDN; api.docs serves every file it needs).
EXPLORER_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'; "
                "form-action 'self'; base-uri 'none'; object-src 'none'")


def security_headers(path: str) -> dict[str, str]:
    """Headers for every response: a strict CSP, no sniffing or framing, no referrer (survey links
    carry a token), and nothing stored by browsers or proxies except the static assets."""
    headers = {
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": "public, max-age=3600" if path.startswith(("/static/", "/docs/assets/")) else "no-store",
    }
    headers["Content-Security-Policy"] = EXPLORER_CSP if path.startswith(API_EXPLORER) else CSP
    return headers


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, too_large(limit))


def too_large(limit: int) -> str:
    return f"the request body is larger than {limit:,} bytes; send less at once"


def _error(status: int, code: str, message: str) -> tuple[dict[str, Any], bytes]:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return {"type": "http.response.start", "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}, body


class Edge:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        extra = [(k.lower().encode(), v.encode()) for k, v in security_headers(path).items()]

        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in extra if h[0] not in present)]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            start, body = _error(*refusal)
            await send_with_headers(start)
            await send({"type": "http.response.body", "body": body})
            return

        received = 0

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        try:
            await self.app(scope, receive_limited, send_with_headers)
        except asyncio.CancelledError:
            # The server is stopping (SIGTERM past the grace period): a clear, retryable answer
            # instead of the 500 the server would send. (A unit of work already on its thread
            # finishes first: retries are idempotent, e.g. a resent client_message_id.)
            if not started:
                start, body = _error(503, "shutting_down", "the server is restarting; please try again "
                                                           "in a moment")
                start["headers"].append((b"retry-after", b"2"))
                await send_with_headers(start)
                await send({"type": "http.response.body", "body": body})
            raise

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        query: bytes = scope.get("query_string", b"")
        if b"\x00" in raw_path or b"%00" in raw_path.lower() or b"\x00" in query or b"%00" in query.lower():
            return 400, "invalid_request", "the address must not contain NUL (%00) characters"
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                if not value.isdigit():
                    return 400, "invalid_request", "Content-Length must be a number"
                if int(value) > self.max_body_bytes:
                    return 413, "body_too_large", too_large(self.max_body_bytes)
        return None
