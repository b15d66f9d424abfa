"""The FastAPI application: ``create_app()`` for tests and ``app`` for uvicorn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

from fastapi import FastAPI
from fastapi.responses import FileResponse
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, configure_mappers

from api import chat_pages, docs, errors, pages, rehearsal
from api.deps import run_unit_on
from api.edge import Edge
from api.routers import chat, exports, followups, participants, recruitment, sign_in, staff, surveys, transcripts
from chat import semantic, steps
from chat.gateway import Gateway
from chat.replies import Replies
from study import wiring
from study.db import get_engine, session_scope
from study.settings import get_settings

log = logging.getLogger("afterward.api")

API_PREFIX = "/api/v1"
FAVICON = Path(__file__).resolve().parent / "static" / "favicon.ico"  # pages link /static/favicon.ico
T = TypeVar("T")


WARM_UP_PATH = "/.afterward-warm-up"  # matches no route
_rehearsed = False  # rehearse_once


async def warm_routes(app: FastAPI) -> None:
    """Build what FastAPI and SQLAlchemy build on first use, before the process serves: FastAPI
    prepares each included router's routes (their request and response models, ~0.4 s for this
    app) when a request first walks them, and SQLAlchemy configures the mappers on the first
    query. One in-process request to an address no route matches walks every router; its 404
    goes nowhere (bench/first_reply.py measures the first reply against later ones)."""
    configure_mappers()
    await rehearsal.asgi_request(app, "GET", WARM_UP_PATH)


async def rehearse_once() -> None:
    """A chat turn rehearsed on a scratch database (``api.rehearsal``), once per process: what it
    warms is the process's code, so a second app in the same process (tests) has nothing to gain."""
    global _rehearsed
    if _rehearsed:
        return
    try:
        await rehearsal.rehearse(create_app)
    except Exception:  # the first participant's turn will build what the rehearsal would have
        log.exception("could not rehearse a chat turn at start-up")
    _rehearsed = True


def create_app(engine: Engine | None = None, gateway: Gateway | None = None) -> FastAPI:
    wiring.wire()  # what withdrawal and completion must do, registered before the first request
    database = engine or get_engine()

    async def run(work: Callable[[Session], T]) -> T:
        return await run_unit_on(database, work)
    replies = Replies(run)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Replies a process that died left unfinished are released before this one serves; its own
        # unfinished ones when it stops (after uvicorn's grace period for open requests).
        try:
            await replies.take_over_abandoned()
        except Exception:  # the database may not answer yet: requests take such claims over as they meet them
            log.exception("could not look for abandoned reply claims at start-up")
        # The crisis encoder (~1-2 s) and the other monitors, the gateway (LiteLLM's first call, ~2 s)
        # and the routes (warm_routes) are ready before the process serves, so no participant's first
        # message waits for them (bench/first_reply.py); /healthz says whether the encoder is loaded.
        if app.state.gateway is None:
            app.state.gateway = Gateway(get_settings())
        encoder: object
        gateway: object
        encoder, gateway = await asyncio.gather(asyncio.to_thread(steps.warm_up), app.state.gateway.warm_up(),
                                                return_exceptions=True)
        if isinstance(encoder, BaseException):  # the model files are missing: each message will say so
            log.error("could not load the crisis encoder at start-up", exc_info=encoder)
        if isinstance(gateway, BaseException):
            log.error("could not warm the LLM gateway up at start-up", exc_info=gateway)
        await warm_routes(app)
        await rehearse_once()
        yield
        await replies.stop()

    app = FastAPI(
        lifespan=lifespan,
        title="Afterward",
        version="0.1.0",
        summary="Longitudinal well-being studies of LLM chat",
        docs_url=None,  # api.docs serves /docs and /redoc from local files (no CDN)
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.router.route_class = errors.DocumentedRoute  # /healthz
    app.state.engine = database
    app.state.gateway = gateway  # built from settings on first use when None
    app.state.replies = replies  # replies in flight, stored whether or not anyone still waits
    errors.install(app)
    app.include_router(participants.router, prefix=API_PREFIX)
    app.include_router(sign_in.router, prefix=API_PREFIX)
    app.include_router(staff.router, prefix=API_PREFIX)
    app.include_router(surveys.router, prefix=API_PREFIX)
    app.include_router(surveys.staff_router, prefix=API_PREFIX)
    app.include_router(chat.router, prefix=API_PREFIX)
    app.include_router(chat.staff_router, prefix=API_PREFIX)
    app.include_router(followups.router, prefix=API_PREFIX)
    app.include_router(followups.staff_router, prefix=API_PREFIX)
    app.include_router(transcripts.staff_router, prefix=API_PREFIX)
    app.include_router(exports.staff_router, prefix=API_PREFIX)
    app.include_router(recruitment.staff_router, prefix=API_PREFIX)

    pages.install(app)
    app.include_router(chat_pages.router)
    docs.install(app)
    app.add_middleware(Edge, max_body_bytes=get_settings().max_body_bytes)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(FAVICON, media_type="image/vnd.microsoft.icon")

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, str]:
        """Liveness, database reachability and whether the crisis encoder is loaded (``loaded``, or
        ``not loaded``: the first message will load it). A worker thread; answers while other requests wait."""
        with session_scope(app.state.engine, read_only=True) as session:  # never waits for a writer
            session.execute(text("SELECT 1"))
        return {"status": "ok", "database": app.state.engine.dialect.name,
                "encoder": "loaded" if semantic.loaded() else "not loaded"}

    return app

