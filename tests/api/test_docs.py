"""The API explorer works without internet, and /favicon.ico is an icon (not a 404)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient


def test_the_api_explorer_loads_nothing_from_elsewhere(app_client: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        response = app_client.get(page)
        assert response.status_code == 200, response.text
        sources = re.findall(r'(?:src|href)="([^"]+)"', response.text) + re.findall(r"url: '([^']+)'", response.text)
        assert sources, response.text
        assert not [s for s in sources if not s.startswith("/")], sources  # every file comes from this server
        assert "http://" not in response.text
        assert "https://" not in response.text
        for source in sources:
            fetched = app_client.get(source)
            assert fetched.status_code == 200, source
            assert len(fetched.content) > 0
    swagger = app_client.get("/docs").text
    assert '"validatorUrl": null' in swagger  # the description is not sent to validator.swagger.io
    asset = app_client.get("/docs/assets/swagger-ui-bundle.js")
    assert asset.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert asset.headers["cache-control"] == "public, max-age=3600"
    assert app_client.get("/openapi.json").json()["info"]["title"] == "Afterward"


def test_favicon_is_an_icon(app_client: TestClient) -> None:
    for path in ("/favicon.ico", "/static/favicon.ico"):
        response = app_client.get(path)
        assert response.status_code == 200, path
        assert response.content[:4] == b"\x00\x00\x01\x00"  # the ICO header
    assert '<link rel="icon" href="/static/favicon.ico">' in app_client.get("/").text
