"""``afterward api``, ``scheduler`` and ``dashboard``: the platform's long-running processes."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from api.cli.common import fail
from study.settings import PROJECT_ROOT, get_settings


def scheduler_process(name: str | None = None, poll_seconds: float | None = None) -> None:
    """Run the follow-up dispatcher (its own process; several may run against PostgreSQL)."""
    import logging

    from scheduler.process import run
    from study.db import get_engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # not a line per tick
    settings = get_settings()
    if poll_seconds is not None:
        settings = settings.model_copy(update={"scheduler_poll_seconds": poll_seconds})
    typer.echo(f"links in follow-up messages point at {settings.base_url}")
    run(get_engine(), settings, name)


def api(
    host: Annotated[str | None, typer.Option(help="Default: AFTERWARD_API_HOST (127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Default: AFTERWARD_API_PORT (8000)")] = None,
    workers: int = 1,
    access_log: bool = True,
) -> None:
    """Serve the HTTP API (and the participant pages) with uvicorn; links for participants point at this
    address unless AFTERWARD_BASE_URL says otherwise."""
    import os

    import uvicorn

    from study.client_address import trusted_networks

    settings = get_settings()
    host = settings.api_host if host is None else host
    port = settings.api_port if port is None else port
    # The app (in every worker process) takes the address it is served on as the default base URL.
    os.environ["AFTERWARD_API_HOST"], os.environ["AFTERWARD_API_PORT"] = host, str(port)
    get_settings.cache_clear()
    try:
        settings = get_settings()
        trusted_networks(tuple(settings.trusted_proxies))
    except ValueError as exc:
        fail(str(exc))
    typer.echo(f"links for participants point at {settings.base_url}")
    # X-Forwarded-For is read in one place only, api.client_address (study.client_address's rule, from
    # AFTERWARD_TRUSTED_PROXIES); uvicorn's own handling would otherwise believe it from any local client.
    # SIGTERM stops the server within seconds even under load: open requests get a short grace
    # period, then are cancelled (a participant's message is committed before any slow step).
    uvicorn.run("api.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level="info", access_log=access_log, proxy_headers=False, timeout_graceful_shutdown=3)


def dashboard(
    host: Annotated[str, typer.Option(help="Address to serve the staff dashboard on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the staff dashboard")] = 8501,
) -> None:
    """Serve the staff dashboard (Streamlit): sign in with a staff account; pages by role."""
    import os

    from study.client_address import configured_networks

    app_path = PROJECT_ROOT / "dashboard" / "app.py"
    if not app_path.exists():
        fail(f"the dashboard is missing: {app_path}")
    try:
        configured_networks()  # sign-in resolves the client with them: a bad entry fails here, not there
    except ValueError as exc:
        fail(str(exc))
    typer.echo(f"staff dashboard at http://{host}:{port}")
    sys.stdout.flush()
    # Streamlit serves with uvicorn, whose proxy handling would rewrite the peer from X-Forwarded-For
    # for any local client; the dashboard resolves it itself by AFTERWARD_TRUSTED_PROXIES, as the API
    # does (dashboard.auth.client_address), so uvicorn trusts no one.
    os.environ["FORWARDED_ALLOW_IPS"] = ""
    # Streamlit takes over this process (make run stops it by its process id).
    os.execv(sys.executable, [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.address", host,
                              "--server.port", str(port), "--server.headless", "true",
                              "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer"])
