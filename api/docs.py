"""The API explorer without internet: /docs (Swagger UI) and /redoc (ReDoc) load their scripts and styles from
files installed with the app (the copies fastapi-offline ships, a locked dependency), never from a CDN."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs/assets"
FAVICON = "/static/favicon.ico"
# ReDoc's footer shows its maker's logo from a CDN, whatever its options say: served from here instead.
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def assets_folder() -> Path | None:
    """Where Swagger UI's and ReDoc's files are installed (None when the package is missing)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "static"
    wanted = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js")
    return folder if all((folder / name).is_file() for name in wanted) else None


def _not_installed(openapi_url: str) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><title>API explorer not installed</title><p>The API explorer's files are not installed "
        "(the locked dependency fastapi-offline: <code>make run</code> installs it). The API's description is at "
        f'<a href="{openapi_url}">{openapi_url}</a>.</p>', status_code=503)


def install(app: FastAPI) -> None:
    """Serve /docs and /redoc from local files; create the app with ``docs_url=None, redoc_url=None``."""
    openapi_url = app.openapi_url or "/openapi.json"
    folder = assets_folder()
    if folder is not None:
        redoc_js = (folder / "redoc.standalone.js").read_text(encoding="utf-8").replace(REDOC_LOGO, FAVICON)

        @app.get(f"{ASSETS_PATH}/redoc.standalone.js", include_in_schema=False)
        def redoc_script() -> Response:  # before the mount below, which would serve the file as it is
            return Response(redoc_js, media_type="text/javascript")

        app.mount(ASSETS_PATH, StaticFiles(directory=folder), name="api-explorer")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        if folder is None:
            return _not_installed(openapi_url)
        # No validator: Swagger UI would otherwise send the whole description to validator.swagger.io.
        return get_swagger_ui_html(openapi_url=openapi_url, title=f"{app.title}: API",
                                   swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css", swagger_favicon_url=FAVICON,
                                   swagger_ui_parameters={"validatorUrl": None})

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        if folder is None:
            return _not_installed(openapi_url)
        return get_redoc_html(openapi_url=openapi_url, title=f"{app.title}: API",
                              redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js", redoc_favicon_url=FAVICON,
                              with_google_fonts=False)
