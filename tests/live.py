"""A real uvicorn server on a loopback port, in a thread of the test process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from sqlalchemy.engine import Engine

from tests.mail import free_port
from tests.waiting import WAIT_SECONDS, until


@contextmanager
def live_server(engine: Engine) -> Iterator[str]:
    from api.app import create_app

    config = uvicorn.Config(create_app(engine), host="127.0.0.1", port=free_port(), log_level="warning",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started or not thread.is_alive(), "the test server to start")
    assert server.started, "the test server did not start"
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=WAIT_SECONDS)
