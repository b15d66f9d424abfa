"""Nothing blocks the event loop: the engine refuses statements on a thread that runs an event
loop, so a coroutine endpoint that touches the database fails in every test that calls it."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import Engine
from starlette.routing import BaseRoute

from api.deps import SessionDep
from study.db import DatabaseWorkOnEventLoop, session_scope


def test_a_coroutine_endpoint_touching_the_database_fails_loudly(engine: Engine) -> None:
    from api.app import create_app

    app: FastAPI = create_app(engine)

    @app.get("/on-the-loop")
    async def on_the_loop() -> dict[str, int]:
        with session_scope(engine) as session:
            return {"one": session.execute(text("SELECT 1")).scalar_one()}

    @app.get("/in-the-thread-pool")
    def in_the_thread_pool(session: SessionDep) -> dict[str, int]:
        return {"one": session.execute(text("SELECT 1")).scalar_one()}

    with TestClient(app, raise_server_exceptions=True) as client:
        assert client.get("/in-the-thread-pool").json() == {"one": 1}
        with pytest.raises(DatabaseWorkOnEventLoop, match="database work on the event loop"):
            client.get("/on-the-loop")


def api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):  # FastAPI's wrapper of an included router
            yield from api_routes(route.original_router.routes)


def test_only_handlers_that_await_something_are_coroutines(engine: Engine) -> None:
    """Every other handler is a plain function run in the thread pool; a new coroutine handler must
    be added here knowingly (and run its database work with api.deps.run_unit)."""
    from api.app import create_app

    app = create_app(engine)
    routes = list(api_routes(app.routes))
    assert len(routes) > 40
    coroutines = {f"{route.endpoint.__module__}.{route.endpoint.__name__}" for route in routes
                  if inspect.iscoroutinefunction(route.endpoint)}
    assert coroutines == {
        # They await the LLM between two units of work.
        "api.routers.chat.send_message", "api.routers.chat.retry_reply", "api.routers.chat.override_pushback",
        "api.chat_pages.chat_send", "api.chat_pages.chat_retry", "api.chat_pages.chat_override",
        # These share the chat pages' action (CSRF, one unit of work, the same error page).
        "api.chat_pages.chat_reconsider", "api.chat_pages.chat_role",
        # It awaits its access check (one unit) and the archive built in the thread pool.
        "api.routers.exports.download_export",
        # Hot write paths: the whole request one unit on one worker thread (api.deps.run_as_consented).
        "api.routers.surveys.save_my_answers", "api.routers.surveys.submit_my_survey",
        # No database work: HTML built in memory, a file streamed by Starlette.
        "api.docs.swagger_ui", "api.docs.redoc", "api.app.favicon",
    }
