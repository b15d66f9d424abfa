"""An OpenAI-compatible server on loopback for a test: ``serve(Handler)`` yields its API base;
``ChatHandler`` is a base for handlers that answer chat completions."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


class ChatHandler(BaseHTTPRequestHandler):
    """Reads a chat-completion request (``body``) and answers one (``complete``); quiet."""

    def log_message(self, *args: Any) -> None:
        pass

    def body(self) -> dict[str, Any]:
        request: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        return request

    def complete(self, model: str, content: str) -> None:
        data = json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": model,
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": content}}],
                           "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
