"""A live server (uvicorn, in this process, so tests can move the clock) and headless Chromium
(Debian's package, driven by Playwright with ``executable_path``)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import uvicorn
from playwright.sync_api import Browser, BrowserContext, Page, Request, expect, sync_playwright
from sqlalchemy.engine import Engine

from api.app import create_app
from study.settings import get_settings
from tests.mail import free_port
from tests.waiting import WAIT_SECONDS, until

# A bound on waiting for what a page shows, not a claim about speed: with both cores busy a reply
# took longer than Playwright's default 5 s (the state waited for still arrives; only the machine differs).
expect.set_options(timeout=30_000)

CHROMIUM = os.environ.get("AFTERWARD_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).parent / "artifacts"
AXE = Path(__file__).parent / "node_modules" / "axe-core" / "axe.min.js"
# Chromium as root in a container, with no background calls to Google's services.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


# Nothing the platform serves loads from outside (a font service, a CDN): every request of every page
# of every browser test, participant and staff, is recorded, and one to a host other than this
# machine fails the test (``nothing_from_outside``), whether or not it would have been answered.
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
OUTSIDE: list[str] = []


def _record_outside(request: Request) -> None:
    url = urlsplit(request.url)
    if url.scheme in ("http", "https", "ws", "wss") and url.hostname not in LOOPBACK:
        OUTSIDE.append(f"{request.resource_type} {request.url} (from {request.frame.url if request.frame else '?'})")


def _watched(launched: Browser) -> Browser:
    """``launched``, each of whose new contexts records requests that leave this machine."""
    new_context = launched.new_context

    def watched_context(**options: Any) -> BrowserContext:
        context = new_context(**options)
        context.on("request", _record_outside)
        return context

    launched.new_context = watched_context  # type: ignore[method-assign]
    return launched


@pytest.fixture(autouse=True)
def nothing_from_outside() -> Iterator[None]:
    OUTSIDE.clear()
    yield
    assert OUTSIDE == [], f"pages requested {len(OUTSIDE)} resource(s) from outside this machine: {OUTSIDE[:10]}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Per module, not per session: Playwright's sync API keeps an event loop running in this thread
    # while it is open, and tests collected after tests/e2e (tests/evals) call asyncio.run.
    if not Path(CHROMIUM).exists() or not AXE.exists():
        message = (f"browser tests need {CHROMIUM} (Debian package chromium) and axe-core in tests/e2e "
                   "(npm ci --prefix tests/e2e); `make test` installs both")
        if os.environ.get("AFTERWARD_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as playwright:
        launched = _watched(playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS))
        yield launched
        launched.close()


@pytest.fixture
def live_server(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AFTERWARD_BASE_URL", base)
    get_settings.cache_clear()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started or not thread.is_alive(), "the live server to start")
    assert server.started, "the live server did not start"
    yield base
    server.should_exit = True
    thread.join(WAIT_SECONDS)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS


class Camera:
    """Screenshots of each step at phone and desktop width."""

    def __init__(self, page: Page, folder: Path, prefix: str) -> None:
        self.page, self.folder, self.prefix, self.count = page, folder, prefix, 0

    def shot(self, name: str) -> None:
        self.count += 1
        for width, height in ((375, 812), (1280, 900)):
            self.page.set_viewport_size({"width": width, "height": height})
            path = self.folder / f"{self.prefix}-{self.count:02d}-{name}-{width}.png"
            self.page.screenshot(path=path, full_page=True)
        self.page.set_viewport_size({"width": 375, "height": 812})
