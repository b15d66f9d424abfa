"""One error shape for every 4xx and 5xx:
``{"error": {"code": "...", "message": "...", "fields": [{"field": "...", "message": "..."}]}}``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.edge import security_headers
from study.db import is_contention
from study.errors import (
    Conflict,
    DomainError,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    TooManyAttempts,
    Unavailable,
)
from study.protocol import ProtocolError

log = logging.getLogger("afterward.api")

STATUS_BY_ERROR: list[tuple[type[DomainError], int]] = [
    (NotFound, 404),
    (Conflict, 409),
    (Gone, 410),
    (Forbidden, 403),
    (Invalid, 422),
    (TooManyAttempts, 429),
    (Unavailable, 503),
]


def status_of(exc: DomainError) -> int:
    return next((s for cls, s in STATUS_BY_ERROR if isinstance(exc, cls)), 400)


def error_body(code: str, message: str, fields: list[dict[str, str]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return {"error": body}


def _field_name(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "cookie")]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        status = status_of(exc)
        retry_after = getattr(exc, "retry_after_seconds", None)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return JSONResponse(error_body(exc.code, exc.message, getattr(exc, "fields", None)),
                            status_code=status, headers=headers)

    @app.exception_handler(ProtocolError)
    async def _protocol(_: Request, exc: ProtocolError) -> JSONResponse:
        return JSONResponse(error_body("invalid_protocol", str(exc)), status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [{"field": "body", "message": f"the body is not valid JSON (near character {e['loc'][-1]})"}
                  if e["type"] == "json_invalid" else
                  {"field": _field_name(tuple(e["loc"])), "message": str(e["msg"]).removeprefix("Value error, ")}
                  for e in exc.errors()]
        summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
        return JSONResponse(error_body("validation_error", summary, fields), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {400: "invalid_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
                405: "method_not_allowed", 413: "body_too_large", 422: "validation_error"}.get(exc.status_code,
                                                                                            "http_error")
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(SQLAlchemyError)
    async def _database(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        if is_contention(exc):
            log.warning("database busy on %s %s: %s", request.method, request.url.path, exc)
            return JSONResponse(error_body("busy", "the study's database is busy; nothing was changed, please "
                                           "try again in a moment"), status_code=503, headers={"Retry-After": "1"})
        if isinstance(exc, DataError):
            # Validation at the edge should have caught it; refuse the value rather than fail.
            log.warning("value refused by the database on %s %s: %s", request.method, request.url.path, exc)
            return JSONResponse(error_body("invalid_value", "a value in this request cannot be stored (out of "
                                           "range or with characters that are not allowed)"), status_code=422)
        return await _unexpected(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette answers this one outside every middleware, so the edge's headers are added here.
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse(error_body("internal_error", "something went wrong on our side; "
                                       "nothing you sent was lost, please try again"), status_code=500,
                            headers=security_headers(request.url.path))
