"""One error shape for every 4xx and 5xx (``ErrorRead``):
``{"error": {"code": "...", "message": "...", "fields": [{"field": "...", "message": "..."}]}}``,
and how the OpenAPI document states which operation answers which: a dependency declares its
refusals once (``refuses``), and every route built by ``DocumentedRoute`` lists those of the
dependencies it uses, with the ones every operation can give and its own."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import get_dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

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


class ErrorField(BaseModel):
    field: str = Field(description="the refused field: a body field (dotted when nested), a parameter, or 'body'")
    message: str


class ErrorDetail(BaseModel):
    code: str = Field(description="stable, for programs: e.g. validation_error, not_found, already_completed")
    message: str = Field(description="for people: what was refused and what to do about it")
    fields: list[ErrorField] | None = Field(default=None, description="one entry per refused field")


class ErrorRead(BaseModel):
    """The body of every 4xx and 5xx answer."""

    error: ErrorDetail


def error_body(code: str, message: str, fields: list[dict[str, str]] | None = None) -> dict[str, Any]:
    detail = ErrorDetail(code=code, message=message, fields=[ErrorField(**f) for f in fields] if fields else None)
    return ErrorRead(error=detail).model_dump(exclude_none=True)


# What the OpenAPI document says each operation may answer.

Responses = dict[int | str, dict[str, Any]]
D = TypeVar("D", bound=Callable[..., Any])

# What any operation may answer, whatever it does (the edge's checks, a busy database).
FASTAPI_BODY_UNREADABLE = "There was an error parsing the body"  # FastAPI's words for a body it cannot decode
BODY_UNREADABLE = "the body cannot be read: send JSON text in UTF-8"
EVERY_OPERATION = {
    400: "the request cannot be read: a body that is not UTF-8 text, a NUL (%00) in the address, or a "
         "Content-Length that is not a number",
    413: "the body is larger than the server accepts",
    503: "the database is busy or the server is restarting; nothing was changed: retry after Retry-After seconds",
}
VALIDATION = "a parameter or the body does not fit this description, one entry per field (code validation_error)"


def refusals(reasons: dict[int, str]) -> Responses:
    """FastAPI's ``responses=`` for these statuses, each answered with ``ErrorRead``."""
    return {status: {"model": ErrorRead, "description": reason} for status, reason in reasons.items()}


@dataclass(frozen=True)
class _Declared:
    reasons: dict[int, str]
    on_writes: dict[int, str]  # only for methods that change something
    sign_in_optional: bool


_DECLARED: dict[Callable[..., Any], _Declared] = {}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def refuses(reasons: dict[int, str], *, on_writes: dict[int, str] | None = None,
            sign_in_optional: bool = False) -> Callable[[D], D]:
    """Declare what a dependency refuses with (``on_writes``: only for a method that is not GET,
    HEAD or OPTIONS; ``sign_in_optional``: it reads credentials when they are sent, and needs
    none); every ``DocumentedRoute`` that uses it documents the same."""
    def declare(dependency: D) -> D:
        _DECLARED[dependency] = _Declared(reasons, on_writes or {}, sign_in_optional)
        return dependency
    return declare


def _merge(into: dict[int, list[str]], reasons: dict[int, str]) -> None:
    for status, reason in reasons.items():
        if reason not in into.setdefault(status, []):
            into[status].append(reason)


def _walk(dependant: Dependant) -> list[Dependant]:
    found = [dependant]
    for sub in dependant.dependencies:
        found += _walk(sub)
    return found


class DocumentedRoute(APIRoute):
    """A route whose OpenAPI answers are what it can refuse with: what every operation can give,
    what its dependencies declare (``refuses``), 404 when its handler looks up a path parameter
    (one no dependency takes), 422 when it has parameters, and its own ``responses=``."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        dependant = get_dependant(path=path, call=endpoint)
        for depends in kwargs.get("dependencies") or []:
            dependant.dependencies.append(get_dependant(path=path, call=depends.dependency))
        writes = not set(kwargs.get("methods") or ["GET"]) <= SAFE_METHODS
        reasons: dict[int, list[str]] = {}
        _merge(reasons, EVERY_OPERATION)
        optional_sign_in = False
        nodes = _walk(dependant)
        for declared in (_DECLARED.get(node.call) for node in nodes if node.call is not None):
            if declared is not None:
                _merge(reasons, {**declared.reasons, **(declared.on_writes if writes else {})})
                optional_sign_in = optional_sign_in or declared.sign_in_optional
        taken_by_dependencies = {p.name for node in nodes[1:] for p in node.path_params}
        looked_up = [p.name for p in dependant.path_params if p.name not in taken_by_dependencies]
        if looked_up:
            _merge(reasons, {404: f"nothing found for this {' and '.join(looked_up)} (or it is not yours)"})
        if any(node.path_params or node.query_params or node.header_params or node.cookie_params
               or node.body_params for node in nodes):
            _merge(reasons, {422: VALIDATION})
        own: Responses = dict(kwargs.get("responses") or {})
        for status, response in own.items():
            if isinstance(status, int) and status >= 400 and "description" in response:
                _merge(reasons, {status: response["description"]})
        documented = refusals({status: "; ".join(texts) for status, texts in sorted(reasons.items())})
        kwargs["responses"] = {**{s: r for s, r in own.items() if s not in documented}, **documented}
        if optional_sign_in:  # anyone with the link; a signed-in participant is checked against it
            extra = kwargs.get("openapi_extra") or {}
            kwargs["openapi_extra"] = {**extra, "security": [*extra.get("security", []), {}]}
        super().__init__(path, endpoint, **kwargs)


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> str:
    """Every method some route answers at this address (Starlette's 405 names one route's only)."""
    routes = request.app.router.routes
    return ", ".join(method for method in HTTP_METHODS if any(
        route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes))


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
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {400: "invalid_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
                405: "method_not_allowed", 413: "body_too_large", 422: "validation_error"}.get(exc.status_code,
                                                                                            "http_error")
        detail = BODY_UNREADABLE if exc.detail == FASTAPI_BODY_UNREADABLE else str(exc.detail)
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request)
        return JSONResponse(error_body(code, detail), status_code=exc.status_code, headers=headers)

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
