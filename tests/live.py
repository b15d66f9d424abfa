"""A real uvicorn server on a loopback port, in a thread of the test process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from sqlalchemy.engine import Engine

from tests.mail import free_port


@contextmanager
def live_server(engine: Engine) -> Iterator[str]:
    from api.app import create_app

    config = uvicorn.Config(create_app(engine), host="127.0.0.1", port=free_port(), log_level="warning",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
